// Verified weight sync between the learner and the samplers (docs/design.md system #1).
//
// The learner publishes a versioned payload: the served weights (after the export rule) as a
// safetensors image in memory — each parameter in the dtype the sampler's policy serves it
// (policy.served_weights: bf16 values stay bf16 bytes, f32 stays f32) — with metadata:
//   concord.sync.version     the learner step that produced these weights
//   concord.sync.manifest    JSON {"tensors": [{"name", "shape", "dtype"} | {"name", "shape",
//                            "dtype", "tied_to"}]}: every learner tensor, in params() order; a
//                            tied lm_head is listed with "tied_to" and carries no bytes
//   concord.sync.plan        JSON: the sampler-side precision of every GEMM weight's forward
//                            operands ({"name", "a", "b", "high"}: QuantDesc names or "f32";
//                            high = both operands at 16 bits or more), norms ("f32"), the
//                            embedding lookup and the last-layers override, from the policy
//   concord.sync.content     JSON {name: "0x<16 hex>"}: per GEMM weight, XXH3-64 of the codes,
//                            scales and tensor scale the learner's quantizer (the sampler's
//                            descriptors) makes of it (of the fp32 values when unquantized)
//   concord.sync.probe       JSON: the probe batch (token ids, `sequences` x `length`); the
//                            learner's log-probs on it at the sampler's precision (check 7's
//                            reference) are the F32 tensor kProbeTensor, one full-vocabulary
//                            row (serve::full_logprobs) per position but each sequence's last
// The learner makes its hashes and probe log-probs with a model at the SAMPLER's policy holding
// exactly the payload's values, so a clean sync compares equal bit for bit.
//
// A sampler receives into a STAGING model (same config, its own policy), runs the seven checks
// there, and only when all pass copies the staging weights into the model it serves (atomic: a
// failed or partial sync leaves the previous version serving and reports the check that
// failed):
//   1 version         the payload's version is the one announced, not older than the serving one
//   2 manifest        the payload parses (strict reader; a cut-short payload fails here); every
//                     learner tensor maps to exactly one sampler tensor: name, shape, dtype;
//                     nothing missing or extra; tied embeddings stay tied
//   3 precision_plan  the sampler's configured plan (its policy) equals the learner's: the same
//                     weights kept in high precision (lm_head, last layers), the same forward
//                     formats, norms and embedding lookup
//   4 content         XXH3-64 over what the sampler's kernels read (Model::visit_derived_weights:
//                     codes and scales of the prepared operands) equals the learner's hashes
//   5 derived_state   every derived copy (prepared / pre-packed weights, cached scales) was built
//                     from the new weights (its source hash = the hash of the fp32 values
//                     installed)
//   6 scale_sanity    no NaN or Inf block scale, no zero or placeholder (e8m0 2^-127) scale on a
//                     block with nonzero elements; NVFP4 and per-tensor FP8 tensor scales equal
//                     the ones the staged values' amax gives, and an NVFP4 tensor's largest block
//                     scale is the one its amax block gets
//   7 probe           teacher-forced replay of the probe batch on the staged weights: the
//                     sampler's log-probs against the learner's stay inside a kernel contract
//                     (audit/contract.h; by default osc max 1e-4 nats and k3 KL ≤ 1e-6)
// They run in the order 1, 2, 3, 5, 6, 4, 7 and stop at the first failure: the staged model's
// own consistency (copies current, scales sane) comes before the comparison with the learner's
// hashes, so a stale copy or a corrupted scale is named as such rather than as a content
// mismatch; the probe, the costliest, runs last.
// Cost (bench/README.md, "Weight sync": checks 1-6 against a memcpy of the weights). A check
// that re-read the weights would cost more than the copy (XXH3 runs at about half memcpy's
// speed here), so each full pass over the weights happens where the bytes are written anyway,
// in cache, and the checks compare what those passes recorded:
//   5, 6  installing the payload decodes each tensor in L1-sized chunks and hashes (XXH3
//         streaming, the same hash as one call) and scans (amax) every chunk right after writing
//         it; check 5 compares that hash with each copy's source hash (Model::Impl::weight takes
//         it when it builds the copy), check 6 derives the expected tensor scale from that amax:
//         both O(tensors). Check 6 still reads every block scale (1/16 or 1/32 of the codes),
//         in a branch-free min/max pass, walking blocks only where a code is 0 or NaN.
//   4     the codes are hashed in the visit that builds each copy (visit_derived_weights hands
//         a weight over right after preparing it, its codes a few MB back in the caches); at check time the scales and tensor scale are re-hashed in
//         full and the codes re-sampled (one 64-byte line per 64 KiB against the same sample
//         taken at build time). What that gives up: a few code bytes changed in the staging copy
//         after it was built and hashed (not a whole buffer) would go unseen by check 4; nothing
//         in concord writes there between the build and the swap, and the probe (check 7) runs
//         on those very copies afterwards. Scales, where one bad byte hurts most, are
//         re-verified in full (and named by check 6 first).
//   2, 3, 4  the sampler makes the manifest, plan and content texts it expects with the
//         learner's own code; byte-equal metadata passes without parsing, any other text is
//         parsed and checked entry by entry (same verdict, and the entry that differs named).
// The payload's values can still change between install and swap unseen (as between check 5
// and the swap before): nothing in this process writes them there.
// Each failure message names the check, the tensor (or probe row) and what differed:
//   "[sync] check 4 content: model.layers.0.mlp.up_proj.weight codes/scales hash 0x... !=
//    learner 0x...".
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "concord/audit/contract.h"
#include "concord/model/model.h"
#include "concord/model/policy.h"
#include "concord/numerics/block.h"

namespace concord::rl {

enum class SyncCheck : uint8_t {
  version = 1, manifest, precision_plan, content, derived_state, scale_sanity, probe
};
inline constexpr int kSyncChecks = 7;
std::string_view sync_check_name(SyncCheck c);  // "version", "manifest", ...

// Injected faults (tests, `concord rl --fault`, the results table). Each happens where it
// happens in real systems: on the learner's side (what is sent) or the sampler's (what is
// installed). After each: the check that catches it (tests/rl/sync_test.cpp proves it per preset).
enum class Fault : uint8_t {
  none,
  stale_version,     // the learner re-sends the previous step's payload (its version inside)
                     // announced as the new version                                  → 1
  dropped_tensor,    // one tensor (layer 0 up_proj) missing from the payload         → 2
  swapped_tensors,   // two same-shape tensors (layer 0 gate/up_proj) exchanged        → 4
  transposed_tensor, // a square matrix (the first: layer 0 q_proj) sent transposed    → 4
  untied_lm_head,    // the sampler unties lm_head from the embeddings (a copy that then
                     // drifts)                                    → 2; tied configs only
  stale_derived,     // the sampler updates fp32 values but keeps the old prepared copies
                     //                      → 5; from the second sync (nothing is stale before)
  zeroed_scales,     // one block scale (per-tensor FP8: the tensor scale) of a quantized weight
                     // zeroed on the sampler  → 6; quantized presets (bf16/fp32: no scales)
  partial_sync,      // the payload is cut short in transit (a third dropped)         → 2
  wrong_rounding,    // the sampler's weight quantizer rounds toward zero, not as declared
                     //        → 4; quantized presets (a bf16 cast of bf16 values is exact)
  flipped_bit,       // the sign bit of one weight (layer 0 v_proj's largest; in a Qwen3-MoE,
                     // the first MoE layer's expert 0 down_proj's largest) flipped   → 4
  stale_weights,     // the learner sends the previous step's weights with their own,
                     // self-consistent manifest, plan and hashes under the new version, its
                     // probe reference from the current weights (a publisher reading a stale
                     // snapshot buffer): checks 1-6 pass, only the behaviour probe sees it → 7
  overwritten_codes, // a stray write into the sampler's staged copy after it was built and
                     // hashed: one 64-byte line of the last GEMM weight's codes (values) in
                     // visit_derived_weights order changed → 4, by its re-sample of the codes
                     // alone (the build-time hash still matches the learner's)
  wrong_tensor_scale,// the sampler's tensor scale of the first weight that has one doubled (a
                     // scale copied from elsewhere)  → 6; per-tensor FP8 and NVFP4 presets
  stale_router,      // the sampler installs everything but the MoE routers, which keep their
                     // previous values (fp32, no derived copy)   → 4; Qwen3-MoE models only
};
std::string_view fault_name(Fault f);
Fault fault_from_name(std::string_view name);  // InputError listing the names
std::vector<std::string> fault_names();         // without "none"

// The learner makes the probe batch; a sampler reads it from the payload and uses only the
// threshold (contract, max_k3_kl) of its own options.
struct ProbeOptions {
  int64_t sequences = 4, length = 32;  // the probe batch: fixed token ids (seeded Philox)
  uint64_t seed = 7;
  audit::Contract contract;            // threshold; empty slices: the default above
  double max_k3_kl = 1e-6;
};

struct CheckOutcome {
  SyncCheck check;
  bool pass = true;
  std::string message;  // empty when passed
  double seconds = 0;
};

// The name of the probe's log-prob tensor inside the payload (not a model tensor).
inline constexpr std::string_view kProbeTensor = "concord.sync.probe.logprobs";

struct SyncReport {
  uint64_t version = 0;          // the version offered
  uint64_t serving = 0;          // the version serving after this sync
  bool applied = false;          // the staging weights were swapped in
  std::vector<CheckOutcome> checks;  // in the order run (see above); stops at the first failure
  // decode: parsing the payload, installing it into the staging model and preparing its
  // derived copies; checks: the sum of the checks' seconds; swap: copying into the serving model
  double seconds_decode = 0, seconds_checks = 0, seconds_swap = 0;
  // Parts of decode: install (payload bytes to fp32 values, hashed and scanned for the amax as
  // they are written) and prepare (the derived copies, their codes hashed as they are built).
  double seconds_install = 0, seconds_prepare = 0;
  size_t payload_bytes = 0;
  double probe_max_abs_dlogp = 0, probe_k3_kl = 0;
  std::optional<CheckOutcome> failure() const;
  nlohmann::json to_json() const;
};

// Learner side: serializes the served weights of `served` (the learner's model after export)
// for samplers running `sampler_policy`.
class WeightPublisher {
 public:
  WeightPublisher(model::Model& served, model::PrecisionPolicy sampler_policy,
                  ProbeOptions probe = {});
  // The payload for `version`; `fault` applies a learner-side fault (others are ignored here).
  std::vector<uint8_t> publish(uint64_t version, Fault fault = Fault::none);

  // Time split of the last publish: encoding the weights, the learner's quantizer and hashes,
  // the probe forward, serializing.
  double seconds_encode = 0, seconds_hash = 0, seconds_probe = 0, seconds_serialize = 0;

 private:
  model::Model& served_;
  model::PrecisionPolicy sampler_policy_;
  ProbeOptions probe_;
  model::Model mirror_;            // the payload's values at the sampler's policy
  std::vector<int32_t> probe_tokens_;
  uint64_t previous_version_ = 0;  // the last version published: stale_version and
                                   // stale_weights re-send its values
  bool has_previous_ = false;      // (the mirror still holds its values)
};

// Sampler side: owns the staging model; `serving` is the model the engine runs. A sync that
// passes swaps the staging model's state (weights, policy, the derived copies the checks
// verified) into `serving` — the Model object stays the same, so an Engine holding it serves the
// new version from its next step; hooks set on `serving` (set_gemm_observer,
// set_forward_gemm_kernel) do not survive a sync: set them again after one.
class WeightReceiver {
 public:
  WeightReceiver(model::Model& serving, ProbeOptions probe = {});
  // Verifies `payload` announced as `version` and swaps it in when every check passes.
  // `fault` applies a sampler-side fault (others are ignored here).
  SyncReport apply(std::span<const uint8_t> payload, uint64_t version, Fault fault = Fault::none);
  // apply() in two halves, for a sampler whose serving model is in use while a sync is checked
  // (`concord serve`'s POST /v1/weights): verify() installs and checks in the staging model
  // only reading `serving` (its config and policy), so it may run beside forwards on it; when
  // every check passed (report.failure() empty) the staged version is pending, and commit()
  // swaps it in — call it where nothing runs on `serving`. A verify() replaces a pending one.
  SyncReport verify(std::span<const uint8_t> payload, uint64_t version, Fault fault = Fault::none);
  // Swaps the pending version in and marks `report` applied (InputError when none is pending).
  void commit(SyncReport& report);
  bool pending() const { return pending_.has_value(); }
  uint64_t version() const { return version_; }
  bool has_version() const { return has_version_; }

 private:
  model::Model& serving_;
  ProbeOptions probe_;
  std::optional<model::Model> staging_;  // kept across syncs (its prepared copies persist)
  // Fault::untied_lm_head stages into a model of its own (the sampler holds its own lm_head).
  std::optional<model::Model> untied_;
  std::optional<uint64_t> pending_;      // the version verify() passed, not yet committed
  uint64_t version_ = 0;
  bool has_version_ = false;
  // The manifest and plan texts this sampler expects (the learner makes them with the same
  // code), for the policy they were made for: a payload carrying them passes checks 2-3 unparsed.
  // Made when constructed, remade when the serving policy has changed.
  void refresh_expected();
  std::optional<model::PrecisionPolicy> expected_for_;
  std::string expected_manifest_, expected_plan_;
};

// Whether the fault happens on the learner's side (publish) or the sampler's (apply).
bool learner_side(Fault f);

// ---- The checks' comparisons, on tensors rather than on a payload ---------------------------
// WeightReceiver runs checks 2, 3, 4 and 6 through these functions, and so does the Python
// package on a pair of state dicts (python/src/bind_sync.cpp): both give the same verdict and
// the same text. Each returns "" when the check passes, else the problem; sync_check_message
// turns a problem into the message a failed check reports.

// "[sync] check N NAME: PROBLEM".
std::string sync_check_message(SyncCheck check, std::string_view problem);

// One tensor of a manifest (concord.sync.manifest): name, shape and safetensors dtype name
// ("F32", "BF16", ...); a tied tensor names the tensor it is tied to and carries no bytes.
struct ManifestEntry {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;
  std::optional<std::string> tied_to;
};
// Check 2's entry-by-entry comparison, in the learner's order: an entry listed twice; then,
// when given, `entry_check` on the entry and the sampler's entry of that name (nullptr: none)
// — nullopt: compare as below, "": the entry is settled, text: that problem; then a name the
// sampler lacks, a shape, a dtype; last, a sampler tensor no learner entry lists.
using ManifestEntryCheck =
    std::function<std::optional<std::string>(const ManifestEntry& learner, const ManifestEntry* sampler)>;
std::string manifest_problem(std::span<const ManifestEntry> learner, std::span<const ManifestEntry> sampler,
                             const ManifestEntryCheck& entry_check = {});

// concord.sync.plan: the sampler-side precision of every GEMM weight's forward operands (a, b:
// QuantDesc::to_string() names or "f32"; high: both at 16 bits or more, unscaled), the norms,
// the embedding lookup and the high-precision last layers of a policy.
struct PlanWeight {
  std::string name, a, b;
  bool high = false;
};
struct PrecisionPlan {
  std::string norms = "f32", embedding;
  int last_layers = 0;
  std::vector<PlanWeight> weights;
  nlohmann::json to_json() const;
  static PrecisionPlan from_json(const nlohmann::json& j);  // json::exception when malformed
};
// What `policy` does to every GEMM weight of config `c` (the plan the learner publishes).
PrecisionPlan make_precision_plan(const model::ModelConfig& c, const model::PrecisionPolicy& policy);
// Check 3: the learner's plan against the sampler's.
std::string precision_plan_problem(const PrecisionPlan& learner, const PrecisionPlan& sampler);

// Check 4's content hash of what a forward GEMM reads of a weight: XXH3-64 over the codes,
// continued (as seed) over the block scales, then over the tensor scale's 4 bytes (its float
// bits, little-endian) — or, for an unquantized weight, XXH3-64 of its fp32 values.
uint64_t sync_content_hash(const numerics::QuantizedTensor& q);
uint64_t sync_content_hash(std::span<const uint8_t> codes, std::span<const uint8_t> scales, float tensor_scale);
uint64_t sync_content_hash(std::span<const float> values);
// The hash of a weight W (rows, cols) as concord's forward GEMMs read it: prepared with `desc`
// as operand b of Y = X·Wᵀ (a 1-D block runs along cols), nullopt: the fp32 values as they are.
uint64_t sync_content_hash(std::span<const float> values, int64_t rows, int64_t cols,
                           const std::optional<numerics::QuantDesc>& desc);
// The content hash of every GEMM weight of `m` as its forward GEMMs read it (preparing stale
// copies first), in params() order: what a learner publishes as concord.sync.content.
std::vector<std::pair<std::string, uint64_t>> sync_content_hashes(model::Model& m);
// What a sampler serves, as `concord serve`'s GET /v1/weights reports it: {"manifest": the
// concord.sync.manifest a learner must send for `m`, "plan": its concord.sync.plan, "content":
// {name: "0x<16 hex>"} — check 4's hashes of what the forward GEMMs read (sync_content_hashes)}.
nlohmann::json served_weights_json(model::Model& m);
// One weight's hash on the sampler's side; quantized: its kernels read codes and scales.
struct ContentHash {
  std::string_view name;
  uint64_t hash = 0;
  bool quantized = false;
};
// The learner's hash text ("0x<16 hex>") of a weight, nullopt when it sent none.
using LearnerHashLookup = std::function<std::optional<std::string>(std::string_view name)>;
// Check 4's comparison: each sampler weight's hash against the learner's, then the counts.
std::string content_problem(std::span<const ContentHash> sampler, const LearnerHashLookup& learner,
                            size_t learner_count);

// Check 6 for one quantized weight: no NaN/Inf block scale, no zero or placeholder scale on a
// block with nonzero elements, a positive finite tensor scale, and — given amax, the max |x| of
// the values it was quantized from — the NVFP4 / per-tensor FP8 tensor scale (and NVFP4's
// largest block scale) that amax gives. nullopt amax: the checks against it are skipped.
std::string scale_problem(const numerics::QuantizedTensor& q, std::optional<float> amax);

}  // namespace concord::rl
