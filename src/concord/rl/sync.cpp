// Verified weight sync: the payload the learner publishes and the seven checks a sampler runs.
#include "concord/rl/sync.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/audit/measure.h"
#include "concord/io/safetensors.h"
#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/numerics/convert.h"
#include "concord/numerics/scalar.h"
#include "concord/serve/logprob.h"
#include "concord/tensor/qgemm.h"

namespace concord::rl {
namespace {

using json = nlohmann::json;
using numerics::Format;
using numerics::QuantDesc;
using Clock = std::chrono::steady_clock;

constexpr const char* kVersionKey = "concord.sync.version";
constexpr const char* kManifestKey = "concord.sync.manifest";
constexpr const char* kPlanKey = "concord.sync.plan";
constexpr const char* kContentKey = "concord.sync.content";
constexpr const char* kProbeKey = "concord.sync.probe";

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string hex64(uint64_t h) { return fmt::format("0x{:016x}", h); }

struct FaultEntry {
  Fault fault;
  std::string_view name;
  bool learner;
};
constexpr FaultEntry kFaults[] = {
    {Fault::none, "none", false},
    {Fault::stale_version, "stale_version", true},
    {Fault::dropped_tensor, "dropped_tensor", true},
    {Fault::swapped_tensors, "swapped_tensors", true},
    {Fault::transposed_tensor, "transposed_tensor", true},
    {Fault::untied_lm_head, "untied_lm_head", false},
    {Fault::stale_derived, "stale_derived", false},
    {Fault::zeroed_scales, "zeroed_scales", false},
    {Fault::partial_sync, "partial_sync", true},
    {Fault::wrong_rounding, "wrong_rounding", false},
    {Fault::flipped_bit, "flipped_bit", true},
    {Fault::stale_weights, "stale_weights", true},
    {Fault::overwritten_codes, "overwritten_codes", false},
    {Fault::wrong_tensor_scale, "wrong_tensor_scale", false},
    {Fault::stale_router, "stale_router", false},
};

// ---- payload encoding ----------------------------------------------------------------------

// The payload dtype of a parameter: matrices in the served format, 1-D parameters (norms,
// biases) and MoE routers (served in fp32, never quantized: train::TrainState) in f32, as the
// export rule serves them.
io::Dtype payload_dtype(Format served, const model::ParamSpec& spec) {
  if (spec.served_in_f32()) return io::Dtype::F32;
  switch (served) {
    case Format::f32: return io::Dtype::F32;
    case Format::bf16: return io::Dtype::BF16;
    case Format::fp16: return io::Dtype::F16;
    default:
      throw InputError(fmt::format("[sync] served weight format {} has no safetensors dtype the "
                                   "payload can carry (use f32, bf16 or fp16)",
                                   numerics::traits(served).name));
  }
}

Format dtype_format(io::Dtype d) {
  return d == io::Dtype::BF16 ? Format::bf16 : d == io::Dtype::F16 ? Format::fp16 : Format::f32;
}

std::vector<uint8_t> encode_values(std::span<const float> values, io::Dtype dtype) {
  const size_t element = static_cast<size_t>(io::dtype_traits(dtype).bits / 8);
  std::vector<uint8_t> bytes(values.size() * element);
  if (dtype == io::Dtype::F32) {
    std::memcpy(bytes.data(), values.data(), bytes.size());
  } else {  // a cast with RNE: exact for values the export rule already put on the grid
    numerics::encode_array(dtype_format(dtype), numerics::Rounding::rne, numerics::Overflow::ieee,
                           values.data(), bytes.data(), values.size());
  }
  return bytes;
}

// Payload bytes of an F32 / BF16 / F16 tensor into fp32 values (any alignment). BF16 widens by
// a shift (the top half of the fp32 bits, exact), a loop the compiler vectorizes; per 4K-element
// chunk (install_values) it runs about 4x faster here than numerics::decode_array.
void decode_values(std::span<const uint8_t> bytes, io::Dtype dtype, std::span<float> out) {
  if (dtype == io::Dtype::F32) {
    std::memcpy(out.data(), bytes.data(), bytes.size());
    return;
  }
  if (dtype == io::Dtype::BF16) {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t half;
      std::memcpy(&half, bytes.data() + 2 * i, sizeof half);
      out[i] = std::bit_cast<float>(static_cast<uint32_t>(half) << 16);
    }
    return;
  }
  if (reinterpret_cast<uintptr_t>(bytes.data()) % 2 == 0) {
    numerics::decode_array(dtype_format(dtype), bytes.data(), out.data(), out.size());
    return;
  }
  std::vector<uint16_t> aligned(out.size());
  std::memcpy(aligned.data(), bytes.data(), bytes.size());
  numerics::decode_array(dtype_format(dtype), aligned.data(), out.data(), out.size());
}

// What installing one tensor saw: the XXH3-64 and max |x| of the fp32 values written.
struct Installed {
  uint64_t hash = 0;
  float amax = 0;
};

// max |x| over the values, NaN when one is NaN (numerics::amax_ref's result). On the bits:
// for non-NaN values |x|'s bit pattern orders as |x| does, and NaNs lie above +Inf's; the
// integer max vectorizes where a float max with NaN semantics does not.
uint32_t amax_bits(std::span<const float> values, uint32_t top = 0) {
  for (const float x : values) {
    const uint32_t a = std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu;
    top = a > top ? a : top;
  }
  return top;
}
float amax_from_bits(uint32_t top) {
  return top > 0x7F800000u ? std::numeric_limits<float>::quiet_NaN() : std::bit_cast<float>(top);
}

// decode_values in chunks small enough to stay in L1/L2, each hashed (XXH3 streaming: the same
// hash as one call over the whole tensor) and scanned for its amax right after it is written:
// checks 5 and 6 then need no pass of their own over the fp32 values.
Installed install_values(std::span<const uint8_t> bytes, io::Dtype dtype, std::span<float> out) {
  constexpr size_t kChunk = 4096;
  const size_t element = static_cast<size_t>(io::dtype_traits(dtype).bits / 8);
  const std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  CONCORD_CHECK(state && XXH3_64bits_reset(state.get()) == XXH_OK, "XXH3 state");
  uint32_t top = 0;
  for (size_t at = 0; at < out.size(); at += kChunk) {
    const size_t n = std::min(kChunk, out.size() - at);
    const std::span<float> chunk = out.subspan(at, n);
    decode_values(bytes.subspan(at * element, n * element), dtype, chunk);
    XXH3_64bits_update(state.get(), chunk.data(), chunk.size_bytes());
    top = amax_bits(chunk, top);
  }
  return {XXH3_64bits_digest(state.get()), amax_from_bits(top)};
}

// ---- hashes ----------------------------------------------------------------------------------

// What a forward GEMM reads of a prepared weight: the codes, block scales and tensor scale when
// it is quantized, the fp32 values otherwise. Its content hash (the payload's, check 4) is
// XXH3-64 over the codes (values), continued (as seed) over the scales, then the tensor scale's
// bits; split so that check 4 can take the codes' part from when the copy was built.
std::span<const uint8_t> operand_codes(const tensor::PreparedOperand& op) {
  if (!op.desc)
    return {reinterpret_cast<const uint8_t*>(op.data), sizeof(float) * static_cast<size_t>(op.rows * op.cols)};
  return op.quantized.codes;
}
uint64_t scales_hash(std::span<const uint8_t> scales, float tensor_scale, uint64_t codes_hash) {
  const uint64_t h = XXH3_64bits_withSeed(scales.data(), scales.size(), codes_hash);
  const uint32_t scale_bits = std::bit_cast<uint32_t>(tensor_scale);
  return XXH3_64bits_withSeed(&scale_bits, sizeof scale_bits, h);
}
uint64_t content_hash(const tensor::PreparedOperand& op, uint64_t codes_hash) {
  if (!op.desc) return codes_hash;
  return scales_hash(op.quantized.scales, op.quantized.tensor_scale, codes_hash);
}
uint64_t hash_operand(const tensor::PreparedOperand& op) {
  const std::span<const uint8_t> codes = operand_codes(op);
  return content_hash(op, XXH3_64bits(codes.data(), codes.size()));
}

// concord.sync.content's text, {"<name>":"0x<16 hex>",...} in name order (what json::dump
// makes of the object): the learner writes it, and a sampler whose own hashes give the same
// text passes check 4 without parsing the learner's.
std::string content_text(std::vector<std::pair<std::string_view, uint64_t>> hashes) {
  std::sort(hashes.begin(), hashes.end());
  std::string text = "{";
  for (const auto& [name, hash] : hashes) {
    if (text.size() > 1) text += ',';
    const bool plain = std::all_of(name.begin(), name.end(), [](char ch) {
      return static_cast<unsigned char>(ch) >= 0x20 && ch != '"' && ch != '\\';
    });
    if (plain) {
      fmt::format_to(std::back_inserter(text), "\"{}\"", name);
    } else {
      text += json(name).dump();
    }
    fmt::format_to(std::back_inserter(text), ":\"0x{:016x}\"", hash);
  }
  return text + "}";
}

// XXH3-64 of a sparse sample of the codes: one 64-byte line every 64 KiB, and the last line.
// Check 4 re-takes it to see that the codes hashed when the copy was built are still the ones
// in place (a buffer wiped, swapped or overwritten after the build) at ~1/1000 of a full pass.
// The lines are gathered first (independent loads the core overlaps), then hashed at once.
uint64_t sample_hash(std::span<const uint8_t> codes) {
  constexpr size_t kStride = 65536, kLine = 64;
  if (codes.size() <= 2 * kLine) return XXH3_64bits(codes.data(), codes.size());
  std::vector<uint8_t> lines;
  lines.reserve((codes.size() / kStride + 2) * kLine);
  for (size_t at = 0; at + kLine <= codes.size(); at += kStride)
    lines.insert(lines.end(), codes.begin() + static_cast<std::ptrdiff_t>(at),
                 codes.begin() + static_cast<std::ptrdiff_t>(at + kLine));
  lines.insert(lines.end(), codes.end() - kLine, codes.end());
  return XXH3_64bits(lines.data(), lines.size());
}

// ---- precision plan --------------------------------------------------------------------------

std::string desc_name(const std::optional<QuantDesc>& d) { return d ? d->to_string() : "f32"; }
bool high_precision(const std::optional<QuantDesc>& d) {
  return !d || (!d->has_scale && numerics::traits(d->element).bits >= 16);
}

using Plan = PrecisionPlan;

// What a policy does to every GEMM weight's forward operands under config c.
Plan make_plan(const model::ModelConfig& c, const model::PrecisionPolicy& policy) {
  using model::GemmRole;
  using model::LayerClass;
  Plan plan;
  const int L = static_cast<int>(c.num_hidden_layers);
  plan.embedding = desc_name(policy.layer_class[static_cast<int>(LayerClass::embedding)][GemmRole::forward].b);
  plan.last_layers = policy.high_precision_last_layers;
  auto add = [&](std::string name, const model::LayerPrecision& lp) {
    const model::OperandPrecision& f = lp[GemmRole::forward];
    plan.weights.push_back({std::move(name), desc_name(f.a), desc_name(f.b),
                            high_precision(f.a) && high_precision(f.b)});
  };
  // Every GEMM weight in parameter order (per layer q k v o gate up down), then the head's: the
  // tied embedding's when there is no lm_head.
  const std::vector<model::ParamSpec> specs = model::parameter_specs(c);
  for (const model::ParamSpec& spec : specs) {
    if (spec.gemm_class() == LayerClass::attention || spec.gemm_class() == LayerClass::mlp)
      add(spec.name, policy.for_layer(*spec.gemm_class(), spec.layer, L));
    if (spec.kind == model::ParamKind::router)  // its own class: fp32 under every policy
      plan.weights.push_back({spec.name, "f32", "f32", true});
  }
  const int head = model::find_param(specs, model::ParamKind::lm_head);
  const int embed = model::require_param(specs, model::ParamKind::embed);
  add(specs[static_cast<size_t>(head >= 0 ? head : embed)].name, policy.for_layer(LayerClass::lm_head, 0, L));
  return plan;
}

// ---- manifest ----------------------------------------------------------------------------

// The manifest (concord.sync.manifest) of a model's tensors served in `served`: what the
// learner sends, and what a sampler of the same config and served format expects byte for byte.
std::string manifest_text(const model::ModelConfig& c, const std::vector<model::ParamSpec>& specs,
                          Format served) {
  json manifest = json::array();
  for (const model::ParamSpec& spec : specs)
    manifest.push_back({{"name", spec.name}, {"shape", spec.shape},
                        {"dtype", io::dtype_name(payload_dtype(served, spec))}});
  if (c.tie_word_embeddings) {
    const model::ParamSpec& embed = specs[static_cast<size_t>(model::require_param(specs, model::ParamKind::embed))];
    manifest.push_back({{"name", model::hf_param_name(model::ParamKind::lm_head)},
                        {"shape", {c.vocab_size, c.hidden_size}},
                        {"dtype", io::dtype_name(payload_dtype(served, embed))},
                        {"tied_to", embed.name}});
  }
  return json{{"tensors", std::move(manifest)}}.dump();
}

// ---- the probe -------------------------------------------------------------------------------

std::vector<audit::EvalSequence> probe_sequences(std::span<const int32_t> tokens, int64_t sequences,
                                                 int64_t length) {
  std::vector<audit::EvalSequence> seqs(static_cast<size_t>(sequences));
  for (int64_t s = 0; s < sequences; ++s) {
    const auto first = tokens.begin() + s * length;
    seqs[static_cast<size_t>(s)].tokens.assign(first, first + length);
  }
  return seqs;
}

// Teacher-forced log-prob rows (serve::full_logprobs, T = 1) of every position but each
// sequence's last, through the sampler's kernel path (Model::forward_cached).
std::vector<float> probe_logprobs(model::Model& m, std::span<const audit::EvalSequence> seqs,
                                  std::vector<audit::RowInfo>* infos = nullptr) {
  const auto V = static_cast<size_t>(m.config().vocab_size);
  std::vector<float> rows;
  audit::teacher_forced_logits(m, seqs, static_cast<int64_t>(seqs.size()),
                               [&](const audit::RowInfo& row, std::span<const float> logits) {
                                 const size_t at = rows.size();
                                 rows.resize(at + V);
                                 serve::full_logprobs(logits, 1.0f, std::span<float>(rows).subspan(at, V));
                                 if (infos) infos->push_back(row);
                               });
  return rows;
}

audit::Contract default_probe_contract() {
  audit::Contract c;
  c.ref = "learner";
  c.cand = "sampler";
  c.slices.push_back({"all", 0, 0.99, 1e-4, 1e-4});
  return c;
}

// ---- the staged model's derived copies -------------------------------------------------------

struct Derived {
  std::string name;
  uint64_t source_hash = 0;
  const tensor::PreparedOperand* forward = nullptr;
  uint64_t codes_hash = 0, codes_sample = 0;  // taken as the copy was built (check 4)
};

// The staged model's GEMM weights, each hashed in the visit that builds its copy (visit_derived_
// weights prepares a weight just before handing it over): the codes are still in cache.
std::vector<Derived> derived_weights(model::Model& m) {
  std::vector<Derived> out;
  m.visit_derived_weights([&](const model::Model::DerivedWeight& w) {
    const std::span<const uint8_t> codes = operand_codes(*w.forward);
    out.push_back({std::string(w.name), w.source_hash, w.forward, XXH3_64bits(codes.data(), codes.size()),
                   sample_hash(codes)});
  });
  return out;
}

// Whether any element code of block (gr, gc) is nonzero in magnitude.
bool block_has_nonzero(const numerics::QuantizedTensor& q, int64_t gr, int64_t gc) {
  const numerics::BlockShape b = numerics::effective_block(q.desc);
  const uint32_t magnitude = (1u << (numerics::traits(q.desc.element).bits - 1)) - 1u;
  for (int64_t r = gr * b.rows; r < std::min(q.rows, (gr + 1) * b.rows); ++r)
    for (int64_t c = gc * b.cols; c < std::min(q.cols, (gc + 1) * b.cols); ++c)
      if (numerics::get_code(q.desc.element, q.codes, r * q.cols + c) & magnitude) return true;
  return false;
}

// The block-scale scan of check 6: the first NaN code (e8m0 0xFF; ue4m3 0x7F, or the sign bit
// ue4m3 lacks) and the first zero / placeholder code (e8m0 0x00 = 2^-127, ue4m3 0) on a block with
// nonzero elements, "" when none. Both suspects lie at the ends of the code range, so a
// branch-free min/max pass (it vectorizes; the max also orders ue4m3 values, as codes below
// 0x7F do) clears the common case at memory speed; the per-block walk runs only when the
// smallest code is 0 or the largest invalid (an all-zero block rightly has a zero scale).
std::string block_scale_problem(const numerics::QuantizedTensor& q, uint8_t& largest_code) {
  const bool mx = q.desc.is_mx();
  const uint8_t invalid_from = mx ? 0xFF : 0x7F;
  const uint8_t* codes = q.scales.data();
  uint8_t low = 0xFF, top = 0;
  for (size_t i = 0; i < q.scales.size(); ++i) {
    low = codes[i] < low ? codes[i] : low;
    top = codes[i] > top ? codes[i] : top;
  }
  largest_code = top;
  if (low != 0 && top < invalid_from) return "";
  const int64_t grid_cols = q.block_grid_cols();
  for (size_t i = 0; i < q.scales.size(); ++i) {
    const uint8_t code = q.scales[i];
    const int64_t gr = static_cast<int64_t>(i) / grid_cols, gc = static_cast<int64_t>(i) % grid_cols;
    if (code >= invalid_from)
      return fmt::format("block ({}, {}) has the invalid scale code 0x{:02x} (NaN)", gr, gc, code);
    if (code == 0x00 && block_has_nonzero(q, gr, gc))
      return fmt::format("block ({}, {}) has a {} scale but nonzero elements", gr, gc,
                         mx ? "placeholder 2^-127" : "zero");
  }
  return "";
}

// Check 6 for one weight: "" when its scales are sane, else the problem. amax: max |x| of the
// staged values the copy was built from (taken when they were installed; check 5 has proved
// the copy was built from them).
std::string operand_scale_problem(const tensor::PreparedOperand& op, float amax) {
  if (!op.desc || !op.desc->has_scale) return "";
  return scale_problem(op.quantized, amax);
}

// A copy of `policy` whose weight quantizers round toward zero (Fault::wrong_rounding).
model::PrecisionPolicy with_weight_rounding_rtz(model::PrecisionPolicy policy) {
  auto flip = [](model::LayerPrecision& lp) {
    for (auto& role : lp.role)
      if (role.b && role.b->rounding == numerics::Rounding::rne) role.b->rounding = numerics::Rounding::rtz;
  };
  for (auto& lp : policy.layer_class) flip(lp);
  flip(policy.high_precision);
  return policy;
}

// Zeroes the scale of the block holding the weight's largest element, in the first quantized
// weight with scales (Fault::zeroed_scales). Corrupts the staged copy in place, as a bad copy
// into the sampler's scale buffer would.
void zero_scales(model::Model& stage, const std::vector<Derived>& derived) {
  for (const Derived& w : derived) {
    auto& op = const_cast<tensor::PreparedOperand&>(*w.forward);
    if (!op.desc || !op.desc->has_scale) continue;
    numerics::QuantizedTensor& q = op.quantized;
    if (q.scales.empty()) {  // per-tensor: the only scale there is
      q.tensor_scale = 0.0f;
      op.tensor_scale = 0.0f;
      return;
    }
    const std::span<const float> v = stage.param(w.name);
    const auto top = std::max_element(v.begin(), v.end(), [](float x, float y) {
      return std::fabs(x) < std::fabs(y);
    }) - v.begin();
    const numerics::BlockShape b = numerics::effective_block(q.desc);
    const int64_t r = top / q.cols, c = top % q.cols;
    q.scales[static_cast<size_t>((r / b.rows) * q.block_grid_cols() + c / b.cols)] = 0;
    return;
  }
}

// Changes one 64-byte line (the first, which check 4's sample covers) of the codes (values,
// when unquantized) of the last GEMM weight in visit order, after the copy was built and its
// codes hashed (Fault::overwritten_codes): a stray write into the staged copy.
void overwrite_codes(const std::vector<Derived>& derived) {
  CONCORD_CHECK(!derived.empty(), "overwritten_codes: the model has no GEMM weight");
  const std::span<const uint8_t> codes = operand_codes(*derived.back().forward);
  auto* bytes = const_cast<uint8_t*>(codes.data());
  for (size_t i = 0; i < std::min<size_t>(64, codes.size()); ++i) bytes[i] ^= 0x01;
}

// Doubles the tensor scale of the first weight that has one (per-tensor FP8, NVFP4), in the
// staged copy (Fault::wrong_tensor_scale): positive and finite, but not the amax's.
void double_tensor_scale(const std::vector<Derived>& derived) {
  for (const Derived& w : derived) {
    auto& op = const_cast<tensor::PreparedOperand&>(*w.forward);
    if (!op.desc || !(op.desc->is_per_tensor() || op.desc->is_nvfp4())) continue;
    op.quantized.tensor_scale *= 2.0f;
    op.tensor_scale *= 2.0f;
    return;
  }
}

json metadata_json(const io::SafetensorsFile& file, const char* key) {
  const auto it = file.metadata().find(key);
  if (it == file.metadata().end()) throw InputError(fmt::format("the payload has no {}", key));
  try {
    return json::parse(it->second);
  } catch (const json::exception& e) {
    throw InputError(fmt::format("{} is not valid JSON ({})", key, e.what()));
  }
}

}  // namespace

// ---- names -----------------------------------------------------------------------------------

std::string_view sync_check_name(SyncCheck c) {
  switch (c) {
    case SyncCheck::version: return "version";
    case SyncCheck::manifest: return "manifest";
    case SyncCheck::precision_plan: return "precision_plan";
    case SyncCheck::content: return "content";
    case SyncCheck::derived_state: return "derived_state";
    case SyncCheck::scale_sanity: return "scale_sanity";
    case SyncCheck::probe: return "probe";
  }
  return "?";
}

std::string_view fault_name(Fault f) {
  for (const FaultEntry& e : kFaults)
    if (e.fault == f) return e.name;
  return "?";
}

Fault fault_from_name(std::string_view name) {
  for (const FaultEntry& e : kFaults)
    if (e.name == name) return e.fault;
  throw InputError(fmt::format("[sync] unknown fault '{}' (faults: none, {})", name,
                               fmt::join(fault_names(), ", ")));
}

std::vector<std::string> fault_names() {
  std::vector<std::string> names;
  for (const FaultEntry& e : kFaults)
    if (e.fault != Fault::none) names.emplace_back(e.name);
  return names;
}

bool learner_side(Fault f) {
  for (const FaultEntry& e : kFaults)
    if (e.fault == f) return e.learner;
  return false;
}


// ---- the checks' comparisons (sync.h): shared by WeightReceiver and the Python package -------

std::string sync_check_message(SyncCheck check, std::string_view problem) {
  return fmt::format("[sync] check {} {}: {}", static_cast<int>(check), sync_check_name(check), problem);
}

std::string manifest_problem(std::span<const ManifestEntry> learner, std::span<const ManifestEntry> sampler,
                             const ManifestEntryCheck& entry_check) {
  std::unordered_map<std::string_view, const ManifestEntry*> in_sampler;
  for (const ManifestEntry& s : sampler) in_sampler.emplace(s.name, &s);
  std::set<std::string> listed;
  for (const ManifestEntry& entry : learner) {
    const std::string& name = entry.name;
    if (!listed.insert(name).second) return fmt::format("{} is listed twice", name);
    const auto it = in_sampler.find(name);
    const ManifestEntry* spec = it == in_sampler.end() ? nullptr : it->second;
    if (entry_check) {
      if (std::optional<std::string> problem = entry_check(entry, spec)) {
        if (problem->empty()) continue;
        return *problem;
      }
    }
    if (!spec) return fmt::format("{}: the sampler has no tensor of that name", name);
    if (spec->shape != entry.shape)
      return fmt::format("{}: learner shape {} != sampler shape {}", name, io::shape_text(entry.shape),
                         io::shape_text(spec->shape));
    if (entry.dtype != spec->dtype)
      return fmt::format("{}: learner dtype {} != the sampler's served dtype {}", name, entry.dtype,
                         spec->dtype);
  }
  for (const ManifestEntry& s : sampler)
    if (!listed.count(s.name)) return fmt::format("{}: the sampler's tensor has no learner tensor", s.name);
  return "";
}

json PrecisionPlan::to_json() const {
  json w = json::array();
  for (const PlanWeight& p : weights) w.push_back({{"name", p.name}, {"a", p.a}, {"b", p.b}, {"high", p.high}});
  return {{"norms", norms}, {"embedding_lookup", embedding},
          {"high_precision_last_layers", last_layers}, {"weights", std::move(w)}};
}

PrecisionPlan PrecisionPlan::from_json(const json& j) {
  PrecisionPlan p;
  p.norms = j.at("norms").get<std::string>();
  p.embedding = j.at("embedding_lookup").get<std::string>();
  p.last_layers = j.at("high_precision_last_layers").get<int>();
  for (const json& w : j.at("weights"))
    p.weights.push_back({w.at("name").get<std::string>(), w.at("a").get<std::string>(),
                         w.at("b").get<std::string>(), w.at("high").get<bool>()});
  return p;
}

PrecisionPlan make_precision_plan(const model::ModelConfig& c, const model::PrecisionPolicy& policy) {
  return make_plan(c, policy);
}

std::string precision_plan_problem(const PrecisionPlan& learner, const PrecisionPlan& sampler) {
  if (learner.norms != sampler.norms)
    return fmt::format("norms: learner {}, sampler {}", learner.norms, sampler.norms);
  if (learner.embedding != sampler.embedding)
    return fmt::format("embedding lookup: learner {}, sampler {}", learner.embedding, sampler.embedding);
  std::map<std::string, const PlanWeight*> by_name;
  for (const PlanWeight& w : sampler.weights) by_name[w.name] = &w;
  for (const PlanWeight& l : learner.weights) {
    const auto it = by_name.find(l.name);
    if (it == by_name.end()) return fmt::format("{}: planned by the learner, not a sampler GEMM weight", l.name);
    const PlanWeight& s = *it->second;
    if (l.high != s.high)
      return fmt::format("{}: the learner keeps it in {} precision (a {}, b {}), the sampler "
                         "in {} (a {}, b {})", l.name, l.high ? "high" : "low", l.a, l.b,
                         s.high ? "high" : "low", s.a, s.b);
    if (l.a != s.a || l.b != s.b)
      return fmt::format("{}: forward formats differ: learner a {}, b {}; sampler a {}, b {}",
                         l.name, l.a, l.b, s.a, s.b);
    by_name.erase(it);
  }
  if (!by_name.empty())
    return fmt::format("{}: a sampler GEMM weight the learner's plan does not cover", by_name.begin()->first);
  if (learner.last_layers != sampler.last_layers)
    return fmt::format("high-precision last layers: learner {}, sampler {}", learner.last_layers,
                       sampler.last_layers);
  return "";
}

std::vector<std::pair<std::string, uint64_t>> sync_content_hashes(model::Model& m) {
  std::vector<std::pair<std::string, uint64_t>> hashes;
  m.visit_derived_weights([&](const model::Model::DerivedWeight& w) {
    hashes.emplace_back(std::string(w.name), hash_operand(*w.forward));
  });
  // MoE routers: their GEMM reads the fp32 values themselves (no derived copy).
  for (const model::ParamSpec& spec : m.params())
    if (spec.kind == model::ParamKind::router) hashes.emplace_back(spec.name, sync_content_hash(m.param(spec.name)));
  return hashes;
}

json served_weights_json(model::Model& m) {
  json content = json::object();
  for (const auto& [name, hash] : sync_content_hashes(m)) content[name] = hex64(hash);
  return {{"manifest", json::parse(manifest_text(m.config(), m.params(), m.policy().served_weights))},
          {"plan", make_precision_plan(m.config(), m.policy()).to_json()},
          {"content", std::move(content)}};
}

uint64_t sync_content_hash(const numerics::QuantizedTensor& q) {
  return sync_content_hash(q.codes, q.scales, q.tensor_scale);
}

uint64_t sync_content_hash(std::span<const uint8_t> codes, std::span<const uint8_t> scales, float tensor_scale) {
  return scales_hash(scales, tensor_scale, XXH3_64bits(codes.data(), codes.size()));
}

uint64_t sync_content_hash(std::span<const float> values) {
  return XXH3_64bits(values.data(), values.size_bytes());
}

uint64_t sync_content_hash(std::span<const float> values, int64_t rows, int64_t cols,
                           const std::optional<numerics::QuantDesc>& desc) {
  if (rows < 0 || cols < 0 || static_cast<int64_t>(values.size()) != rows * cols)
    throw InputError(fmt::format("[sync] content hash: {} values are not a ({}, {}) weight",
                                 values.size(), rows, cols));
  if (!desc) return sync_content_hash(values);
  tensor::PreparedOperand op;  // as Model::Impl::weight prepares a forward weight
  tensor::prepare_operand(op, desc, tensor::Operand::b, tensor::Trans::yes, values.data(), rows, cols);
  return hash_operand(op);
}

std::string content_problem(std::span<const ContentHash> sampler, const LearnerHashLookup& learner,
                            size_t learner_count) {
  for (const ContentHash& w : sampler) {
    const std::optional<std::string> theirs = learner(w.name);
    if (!theirs) return fmt::format("{}: the learner sent no hash for it", w.name);
    if (hex64(w.hash) != *theirs)
      return fmt::format("{} {} hash {} != learner {}", w.name, w.quantized ? "codes/scales" : "values",
                         hex64(w.hash), *theirs);
  }
  if (sampler.size() != learner_count)
    return fmt::format("the learner hashed {} weights, the sampler's kernels read {}", learner_count,
                       sampler.size());
  return "";
}

std::string scale_problem(const numerics::QuantizedTensor& q, std::optional<float> known_amax) {
  const QuantDesc& d = q.desc;
  if (!d.has_scale) return "";
  float largest = 0;  // NVFP4: the largest decoded block scale
  if (d.is_mx() || d.is_nvfp4()) {
    uint8_t largest_code = 0;
    if (std::string problem = block_scale_problem(q, largest_code); !problem.empty()) return problem;
    if (!d.is_nvfp4()) return "";
    largest = numerics::decode_ref(Format::ue4m3, largest_code);
  }
  if (!std::isfinite(q.tensor_scale) || !(q.tensor_scale > 0))
    return fmt::format("tensor scale {} is not a positive finite number", q.tensor_scale);
  if (!known_amax) return "";
  const float amax = *known_amax;
  float expected;
  if (d.is_nvfp4()) {
    const float encode = numerics::nvfp4_global_encode_scale(amax);
    expected = 1.0f / encode;
    const float top = numerics::decode_ref(Format::ue4m3, numerics::nvfp4_block_scale_code(amax, encode));
    if (q.tensor_scale == expected && std::isfinite(amax) && largest != top)
      return fmt::format("largest block scale {} does not match the tensor scale 1/S_enc = {:.9g} "
                         "(amax {:.9g} gives {})", largest, q.tensor_scale, amax, top);
  } else {  // per-tensor FP8
    const auto max_elem = static_cast<float>(numerics::traits(d.element).max_finite);
    expected = 1.0f / ((amax > 0.0f && std::isfinite(amax)) ? max_elem / amax : 1.0f);
  }
  if (q.tensor_scale != expected)
    return fmt::format("tensor scale {:.9g} != {:.9g}, the one the staged values' amax {:.9g} gives",
                       q.tensor_scale, expected, amax);
  return "";
}

std::optional<CheckOutcome> SyncReport::failure() const {
  for (const CheckOutcome& c : checks)
    if (!c.pass) return c;
  return std::nullopt;
}

json SyncReport::to_json() const {
  json cs = json::array();
  for (const CheckOutcome& c : checks)
    cs.push_back({{"check", sync_check_name(c.check)}, {"id", static_cast<int>(c.check)},
                  {"pass", c.pass}, {"message", c.message}, {"seconds", c.seconds}});
  return {{"version", version}, {"serving", serving}, {"applied", applied}, {"checks", std::move(cs)},
          {"seconds", {{"decode", seconds_decode}, {"install", seconds_install},
                       {"prepare", seconds_prepare}, {"checks", seconds_checks}, {"swap", seconds_swap}}},
          {"payload_bytes", payload_bytes},
          {"probe", {{"max_abs_dlogp", probe_max_abs_dlogp}, {"k3_kl", probe_k3_kl}}}};
}

// ---- learner ---------------------------------------------------------------------------------

WeightPublisher::WeightPublisher(model::Model& served, model::PrecisionPolicy sampler_policy,
                                 ProbeOptions probe)
    : served_(served),
      sampler_policy_(std::move(sampler_policy)),
      probe_(std::move(probe)),
      mirror_(served.config(), sampler_policy_) {
  const model::ModelConfig& c = served.config();
  if (probe_.sequences < 1 || probe_.length < 2 || probe_.length > c.max_position_embeddings)
    throw InputError(fmt::format("[sync] probe of {} sequences x {} tokens: needs at least 1 "
                                 "sequence of 2..{} tokens (max_position_embeddings)",
                                 probe_.sequences, probe_.length, c.max_position_embeddings));
  for (const model::ParamSpec& spec : served.params()) payload_dtype(sampler_policy_.served_weights, spec);
  // Fixed probe tokens: Philox words keyed by the seed, the same on every machine.
  const numerics::RandomStream rng{probe_.seed, 0};
  probe_tokens_.resize(static_cast<size_t>(probe_.sequences * probe_.length));
  for (size_t i = 0; i < probe_tokens_.size(); ++i)
    probe_tokens_[i] = static_cast<int32_t>(rng.word(i) % static_cast<uint64_t>(c.vocab_size));
}

std::vector<uint8_t> WeightPublisher::publish(uint64_t version, Fault fault) {
  const std::vector<model::ParamSpec>& specs = served_.params();
  const Format served_format = sampler_policy_.served_weights;
  const bool stale = fault == Fault::stale_version;           // previous values and version
  const bool stale_values = stale || fault == Fault::stale_weights;  // previous values
  if (stale_values && !has_previous_)
    throw InputError(fmt::format("[sync] fault {}: nothing was published before to re-send",
                                 fault_name(fault)));
  const uint64_t payload_version = stale ? previous_version_ : version;

  // The payload's values: the served copy in the payload dtypes; the mirror holds exactly them.
  // A stale re-send encodes the mirror as it is (the previous step's values).
  auto t0 = Clock::now();
  std::vector<std::vector<uint8_t>> bytes(specs.size());
  std::vector<io::Dtype> dtypes(specs.size());
  for (size_t p = 0; p < specs.size(); ++p) {
    dtypes[p] = payload_dtype(served_format, specs[p]);
    bytes[p] = encode_values(stale_values ? mirror_.param(specs[p].name) : served_.param(specs[p].name), dtypes[p]);
    if (!stale_values) decode_values(bytes[p], dtypes[p], mirror_.param(specs[p].name));
  }
  if (!stale_values) mirror_.weights_changed();
  seconds_encode = seconds_since(t0);

  t0 = Clock::now();
  const std::vector<std::pair<std::string, uint64_t>> hashes = sync_content_hashes(mirror_);
  std::vector<std::pair<std::string_view, uint64_t>> content(hashes.begin(), hashes.end());
  seconds_hash = seconds_since(t0);
  // stale_weights: the hashes above are the stale values' own; the probe reference is the
  // current weights' (the mirror takes them now).
  if (fault == Fault::stale_weights) {
    for (size_t p = 0; p < specs.size(); ++p)
      decode_values(encode_values(served_.param(specs[p].name), dtypes[p]), dtypes[p],
                    mirror_.param(specs[p].name));
    mirror_.weights_changed();
  }

  t0 = Clock::now();
  const auto seqs = probe_sequences(probe_tokens_, probe_.sequences, probe_.length);
  const std::vector<float> logprobs = probe_logprobs(mirror_, seqs);
  seconds_probe = seconds_since(t0);

  t0 = Clock::now();
  const model::ModelConfig& c = served_.config();
  json tokens = json::array();
  for (const auto& s : seqs) tokens.push_back(s.tokens);
  const json probe = {{"sequences", probe_.sequences}, {"length", probe_.length},
                      {"seed", probe_.seed}, {"tokens", std::move(tokens)},
                      {"tensor", kProbeTensor}};
  const std::map<std::string, std::string> metadata = {
      {kVersionKey, std::to_string(payload_version)},
      {kManifestKey, manifest_text(c, specs, served_format)},
      {kPlanKey, make_plan(c, sampler_policy_).to_json().dump()},
      {kContentKey, content_text(std::move(content))},
      {kProbeKey, probe.dump()}};

  // Learner-side faults on what is sent (the hashes and manifest above stay the true ones).
  auto index_of = [&](model::ParamKind kind, int layer, int expert = -1) {
    const int p = model::find_param(specs, kind, layer, expert);
    if (p < 0)
      throw InputError(fmt::format("[sync] fault {}: the model has no {}", fault_name(fault),
                                   model::hf_param_name(kind, layer, expert)));
    return static_cast<size_t>(p);
  };
  size_t dropped = specs.size();
  if (fault == Fault::dropped_tensor) dropped = index_of(model::ParamKind::up, 0);
  if (fault == Fault::swapped_tensors)
    std::swap(bytes[index_of(model::ParamKind::gate, 0)], bytes[index_of(model::ParamKind::up, 0)]);
  if (fault == Fault::transposed_tensor) {
    const auto square = std::find_if(specs.begin(), specs.end(), [](const model::ParamSpec& s) {
      return s.is_matrix() && s.shape[0] == s.shape[1];
    });
    if (square == specs.end())
      throw InputError("[sync] fault transposed_tensor: the model has no square matrix");
    const size_t p = static_cast<size_t>(square - specs.begin());
    const auto n = static_cast<size_t>(square->shape[0]);
    const size_t es = static_cast<size_t>(io::dtype_traits(dtypes[p]).bits / 8);
    std::vector<uint8_t> t(bytes[p].size());
    for (size_t r = 0; r < n; ++r)
      for (size_t col = 0; col < n; ++col)
        std::memcpy(&t[(col * n + r) * es], &bytes[p][(r * n + col) * es], es);
    bytes[p] = std::move(t);
  }
  if (fault == Fault::flipped_bit) {
    // The sign bit of the largest element: a flip every quantizer keeps (the top bit of a
    // little-endian F32/BF16/F16 value's last byte).
    int moe_layer = -1;
    for (int64_t i = 0; i < c.num_hidden_layers && moe_layer < 0; ++i)
      if (c.is_moe_layer(i)) moe_layer = static_cast<int>(i);
    const size_t p = moe_layer >= 0 ? index_of(model::ParamKind::expert_down, moe_layer, 0)
                                    : index_of(model::ParamKind::v, 0);
    const std::span<const float> v = mirror_.param(specs[p].name);
    const auto top = static_cast<size_t>(std::max_element(v.begin(), v.end(), [](float x, float y) {
                                           return std::fabs(x) < std::fabs(y);
                                         }) - v.begin());
    const size_t es = static_cast<size_t>(io::dtype_traits(dtypes[p]).bits / 8);
    bytes[p][top * es + es - 1] ^= 0x80;
  }

  std::vector<io::TensorToWrite> tensors;
  for (size_t p = 0; p < specs.size(); ++p)
    if (p != dropped) tensors.push_back({specs[p].name, dtypes[p], specs[p].shape, bytes[p]});
  const auto rows = static_cast<int64_t>(logprobs.size()) / c.vocab_size;
  tensors.push_back({std::string(kProbeTensor), io::Dtype::F32, {rows, c.vocab_size},
                     std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(logprobs.data()),
                                              logprobs.size() * sizeof(float))});
  std::vector<uint8_t> payload = io::serialize_safetensors(std::move(tensors), metadata);
  if (fault == Fault::partial_sync) payload.resize(payload.size() * 2 / 3);  // cut in transit
  seconds_serialize = seconds_since(t0);
  if (!stale) {  // the mirror holds this version's values (stale_weights: since the probe)
    previous_version_ = version;
    has_previous_ = true;
  }
  return payload;
}

// ---- sampler ---------------------------------------------------------------------------------

WeightReceiver::WeightReceiver(model::Model& serving, ProbeOptions probe)
    : serving_(serving), probe_(std::move(probe)) {
  if (probe_.contract.slices.empty()) probe_.contract = default_probe_contract();
  try {
    refresh_expected();
  } catch (const InputError&) {  // a served format no payload can carry: check 2 will say so
  }
}

void WeightReceiver::refresh_expected() {
  if (expected_for_ && *expected_for_ == serving_.policy()) return;
  expected_for_.reset();
  expected_manifest_ = manifest_text(serving_.config(), serving_.params(), serving_.policy().served_weights);
  expected_plan_ = make_plan(serving_.config(), serving_.policy()).to_json().dump();
  expected_for_ = serving_.policy();
}

SyncReport WeightReceiver::apply(std::span<const uint8_t> payload, uint64_t version, Fault fault) {
  SyncReport report = verify(payload, version, fault);
  if (!report.failure()) commit(report);
  return report;
}

SyncReport WeightReceiver::verify(std::span<const uint8_t> payload, uint64_t version, Fault fault) {
  pending_.reset();
  SyncReport report;
  report.version = version;
  report.serving = version_;
  report.payload_bytes = payload.size();
  // Runs one check: fn returns "" on success or the problem; stops the sync on failure.
  auto run = [&](SyncCheck check, const std::function<std::string()>& fn) {
    const auto t0 = Clock::now();
    std::string problem;
    try {
      problem = fn();
    } catch (const InputError& e) {  // a malformed part of the payload
      problem = e.what();
    } catch (const json::exception& e) {  // metadata JSON of the wrong shape
      problem = fmt::format("malformed sync metadata ({})", e.what());
    }
    CheckOutcome out{check, problem.empty(), "", seconds_since(t0)};
    if (!problem.empty())
      out.message = sync_check_message(check, problem);
    report.seconds_checks += out.seconds;
    report.checks.push_back(std::move(out));
    return report.checks.back().pass;
  };

  // Parse (strict reader): a payload cut short in transit fails here, as check 2.
  auto t0 = Clock::now();
  std::optional<io::SafetensorsFile> file;
  std::string parse_error;
  try {
    file = io::SafetensorsFile::from_bytes(std::vector<uint8_t>(payload.begin(), payload.end()),
                                           "sync payload");
  } catch (const InputError& e) {
    parse_error = e.what();
  }
  report.seconds_decode += seconds_since(t0);
  if (!file) {
    run(SyncCheck::manifest, [&] {
      return fmt::format("the payload ({} bytes) is not a whole safetensors image (cut short in "
                         "transit?): {}", payload.size(), parse_error);
    });
    return report;
  }

  // 1 version
  if (!run(SyncCheck::version, [&]() -> std::string {
        const auto it = file->metadata().find(kVersionKey);
        if (it == file->metadata().end()) return fmt::format("the payload has no {}", kVersionKey);
        uint64_t sent = 0;
        const auto [end, ec] = std::from_chars(it->second.data(), it->second.data() + it->second.size(), sent);
        if (ec != std::errc() || end != it->second.data() + it->second.size())
          return fmt::format("{} '{}' is not a version number", kVersionKey, it->second);
        if (sent != version)
          return fmt::format("payload version {} != announced {} (stale weights)", sent, version);
        if (has_version_ && version < version_)
          return fmt::format("announced version {} is older than the serving version {}", version, version_);
        return "";
      }))
    return report;

  // The staging model: the serving model's config and policy, kept across syncs.
  if (!staging_) staging_.emplace(serving_.config(), serving_.policy());
  untied_.reset();  // Fault::untied_lm_head: the sampler holds its own lm_head
  if (fault == Fault::untied_lm_head && serving_.config().tie_word_embeddings) {
    model::ModelConfig c = serving_.config();
    c.tie_word_embeddings = false;
    untied_.emplace(c, serving_.policy());
  }
  const bool untied = untied_.has_value();
  model::Model& stage = untied ? *untied_ : *staging_;

  // The payload's tensors by name (filled by check 2).
  std::unordered_map<std::string_view, const io::TensorInfo*> in_payload;
  const Format served = serving_.policy().served_weights;

  // 2 manifest. The common case, the learner's manifest byte for byte the one this sampler
  // expects and the payload's tensors as it lists them, passes without parsing; otherwise the
  // manifest is parsed and checked entry by entry to name what differs.
  if (!run(SyncCheck::manifest, [&]() -> std::string {
        for (const io::TensorInfo& t : file->tensors()) in_payload.emplace(t.name, &t);
        refresh_expected();
        const auto sent_manifest = file->metadata().find(kManifestKey);
        if (!untied && sent_manifest != file->metadata().end() && sent_manifest->second == expected_manifest_) {
          bool same = in_payload.size() == stage.params().size() + in_payload.count(kProbeTensor);
          for (const model::ParamSpec& spec : stage.params()) {
            const auto it = in_payload.find(spec.name);
            same = same && it != in_payload.end() && it->second->dtype == payload_dtype(served, spec) &&
                   it->second->shape == spec.shape;
          }
          if (same) return "";
        }
        // The learner's entries as sent, the sampler's as it serves them (payload_dtype).
        std::vector<ManifestEntry> learner, sampler;
        const json manifest = metadata_json(*file, kManifestKey).at("tensors");
        for (const json& entry : manifest) {
          ManifestEntry e{entry.at("name").get<std::string>(), entry.at("shape").get<std::vector<int64_t>>(),
                          entry.at("dtype").get<std::string>(), std::nullopt};
          if (entry.contains("tied_to")) e.tied_to = entry.at("tied_to").get<std::string>();
          learner.push_back(std::move(e));
        }
        for (const model::ParamSpec& spec : stage.params())
          sampler.push_back({spec.name, spec.shape, std::string(io::dtype_name(payload_dtype(served, spec))),
                             std::nullopt});
        // What only a payload has: ties (a tied entry carries no bytes) and the bytes sent, which
        // must be as the manifest lists them.
        auto is_kind = [](std::string_view name, model::ParamKind kind) {
          return model::parse_hf_param_name(name) == model::ParamName{kind, -1};
        };
        auto payload_entry = [&](const ManifestEntry& entry,
                                 const ManifestEntry* spec) -> std::optional<std::string> {
          const std::string& name = entry.name;
          if (entry.tied_to) {
            const std::string& target = *entry.tied_to;
            if (spec)
              return fmt::format("{}: the learner ties it to {}, the sampler holds a separate copy "
                                 "(untied)", name, target);
            if (!is_kind(name, model::ParamKind::lm_head) || !is_kind(target, model::ParamKind::embed) ||
                !stage.config().tie_word_embeddings)
              return fmt::format("{}: tied to {}, a tie the sampler does not have", name, target);
            return "";
          }
          const auto in_payload_it = in_payload.find(name);
          const io::TensorInfo* sent = in_payload_it == in_payload.end() ? nullptr : in_payload_it->second;
          if (!sent) return fmt::format("{} is in the manifest but missing from the payload", name);
          if (io::dtype_name(sent->dtype) != entry.dtype || sent->shape != entry.shape)
            return fmt::format("{}: the payload holds {} {}, the manifest says {} {}", name,
                               io::dtype_name(sent->dtype), io::shape_text(sent->shape), entry.dtype,
                               io::shape_text(entry.shape));
          if (!spec && is_kind(name, model::ParamKind::lm_head) && stage.config().tie_word_embeddings)
            return fmt::format("{}: the learner sends its own lm_head, the sampler ties it to {}",
                               name, model::hf_param_name(model::ParamKind::embed));
          return std::nullopt;
        };
        if (std::string problem = manifest_problem(learner, sampler, payload_entry); !problem.empty())
          return problem;
        std::set<std::string_view> listed;
        for (const ManifestEntry& e : learner) listed.insert(e.name);
        for (const io::TensorInfo& t : file->tensors())
          if (t.name != kProbeTensor && !listed.count(t.name))
            return fmt::format("{} is in the payload but not in the manifest", t.name);
        return "";
      }))
    return report;

  // 3 precision plan: the learner's against the sampler's configured policy (byte-equal text:
  // equal plans; else parsed to name the difference).
  if (!run(SyncCheck::precision_plan, [&]() -> std::string {
        const auto sent_plan = file->metadata().find(kPlanKey);
        if (sent_plan != file->metadata().end() && sent_plan->second == expected_plan_) return "";
        return precision_plan_problem(Plan::from_json(metadata_json(*file, kPlanKey)),
                                      make_plan(serving_.config(), serving_.policy()));
      }))
    return report;

  // Install into the staging model (hashing and scanning each tensor as it is written) and
  // prepare its derived copies (hashing their codes as they are built): what the kernels read.
  t0 = Clock::now();
  const model::PrecisionPolicy policy =
      fault == Fault::wrong_rounding ? with_weight_rounding_rtz(serving_.policy()) : serving_.policy();
  if (!(stage.policy() == policy)) stage.set_policy(policy);
  // Fault::stale_derived keeps the derived copies the staging model holds from its last version
  // (built now if that version never ran: the state a sampler that skips the rebuild is in).
  if (fault == Fault::stale_derived) stage.visit_derived_weights([](const model::Model::DerivedWeight&) {});
  const std::vector<model::ParamSpec>& specs = stage.params();
  std::vector<const io::TensorInfo*> sources(specs.size());
  std::vector<std::span<float>> targets(specs.size());
  std::unordered_map<std::string_view, size_t> param_index;
  int64_t elements = 0;
  for (size_t p = 0; p < specs.size(); ++p) {
    sources[p] = in_payload.at(specs[p].name);
    targets[p] = stage.param(specs[p].name);
    param_index[specs[p].name] = p;
    elements += specs[p].numel();
  }
  // Tensors in parallel (each one's hash runs in order, so the hashes do not depend on the
  // thread count); only where there is enough to share.
  std::vector<Installed> installed(specs.size());
  const auto n_params = static_cast<int64_t>(specs.size());
#pragma omp parallel for schedule(dynamic) if (elements > (int64_t{1} << 20))
  for (int64_t p = 0; p < n_params; ++p) {
    const auto i = static_cast<size_t>(p);
    if (fault == Fault::stale_router && specs[i].kind == model::ParamKind::router) continue;
    installed[i] = install_values(sources[i]->bytes, sources[i]->dtype, targets[i]);
  }
  report.seconds_install = seconds_since(t0);
  const auto t_prepare = Clock::now();
  if (fault != Fault::stale_derived) stage.weights_changed();
  const std::vector<Derived> derived = derived_weights(stage);
  report.seconds_prepare = seconds_since(t_prepare);
  if (fault == Fault::zeroed_scales) zero_scales(stage, derived);
  if (fault == Fault::overwritten_codes) overwrite_codes(derived);
  if (fault == Fault::wrong_tensor_scale) double_tensor_scale(derived);
  report.seconds_decode += seconds_since(t0);
  auto installed_of = [&](const Derived& w) -> const Installed& {
    return installed[param_index.at(w.name)];
  };

  // 5 derived state
  if (!run(SyncCheck::derived_state, [&]() -> std::string {
        for (const Derived& w : derived)
          if (w.source_hash != installed_of(w).hash)
            return fmt::format("{}: the prepared copy was built from values hashing {}, the weights "
                               "installed hash {} (stale copy)", w.name, hex64(w.source_hash),
                               hex64(installed_of(w).hash));
        return "";
      }))
    return report;

  // 6 scale sanity
  if (!run(SyncCheck::scale_sanity, [&]() -> std::string {
        for (const Derived& w : derived) {
          const std::string problem = operand_scale_problem(*w.forward, installed_of(w).amax);
          if (!problem.empty()) return fmt::format("{} ({}): {}", w.name, w.forward->desc->to_string(), problem);
        }
        return "";
      }))
    return report;

  // 4 content: the codes' hash from the build, re-sampled; scales and tensor scale re-hashed.
  if (!run(SyncCheck::content, [&]() -> std::string {
        std::vector<std::pair<std::string_view, uint64_t>> mine;
        std::vector<ContentHash> hashes;
        for (const Derived& w : derived) {
          const uint64_t sample = sample_hash(operand_codes(*w.forward));
          if (sample != w.codes_sample)
            return fmt::format("{}: the {} changed after the copy was built (sampled hash {}, {} when "
                               "built)", w.name, w.forward->desc ? "codes" : "values", hex64(sample),
                               hex64(w.codes_sample));
          mine.emplace_back(w.name, content_hash(*w.forward, w.codes_hash));
          hashes.push_back({w.name, mine.back().second, w.forward->desc.has_value()});
        }
        for (const model::ParamSpec& spec : specs)  // MoE routers, as sync_content_hashes
          if (spec.kind == model::ParamKind::router) {
            mine.emplace_back(spec.name, sync_content_hash(stage.param(spec.name)));
            hashes.push_back({spec.name, mine.back().second, false});
          }
        const auto sent = file->metadata().find(kContentKey);
        if (sent != file->metadata().end() && sent->second == content_text(mine)) return "";
        const json learner = metadata_json(*file, kContentKey);
        return content_problem(
            hashes,
            [&](std::string_view name) -> std::optional<std::string> {
              const std::string key(name);
              if (!learner.contains(key)) return std::nullopt;
              return learner.at(key).get<std::string>();
            },
            learner.size());
      }))
    return report;

  // 7 probe
  if (!run(SyncCheck::probe, [&]() -> std::string {
        const json probe = metadata_json(*file, kProbeKey);
        const int64_t sequences = probe.at("sequences").get<int64_t>();
        const int64_t length = probe.at("length").get<int64_t>();
        const auto rows_of = probe.at("tokens").get<std::vector<std::vector<int32_t>>>();
        const int64_t V = stage.config().vocab_size;
        if (sequences < 1 || length < 2 || static_cast<int64_t>(rows_of.size()) != sequences)
          return fmt::format("the probe batch is not {} sequences of {} tokens", sequences, length);
        std::vector<int32_t> tokens;
        for (const auto& r : rows_of) {
          if (static_cast<int64_t>(r.size()) != length)
            return fmt::format("a probe sequence has {} tokens, not {}", r.size(), length);
          for (int32_t t : r)
            if (t < 0 || t >= V) return fmt::format("probe token {} outside the vocabulary", t);
          tokens.insert(tokens.end(), r.begin(), r.end());
        }
        const io::TensorInfo* sent = file->find(kProbeTensor);
        const int64_t rows = sequences * (length - 1);
        if (!sent || sent->dtype != io::Dtype::F32 || sent->shape != std::vector<int64_t>{rows, V})
          return fmt::format("the payload lacks {} as F32 [{}, {}]", kProbeTensor, rows, V);
        const std::vector<float> ref = io::tensor_to_floats(*sent);
        std::vector<audit::RowInfo> infos;
        const auto seqs = probe_sequences(tokens, sequences, length);
        const std::vector<float> cand = probe_logprobs(stage, seqs, &infos);
        std::vector<audit::RowRecord> records;
        double k3 = 0;
        for (size_t i = 0; i < infos.size(); ++i) {
          const auto at = i * static_cast<size_t>(V);
          const audit::RowDivergence d = audit::row_divergence(
              std::span<const float>(ref).subspan(at, static_cast<size_t>(V)),
              std::span<const float>(cand).subspan(at, static_cast<size_t>(V)), infos[i].next);
          const double r = std::clamp(d.dlogp_token, -20.0, 20.0);  // log learner/sampler
          k3 += std::expm1(r) - r;
          records.push_back({infos[i], d});
        }
        k3 /= static_cast<double>(records.size());
        const audit::Measurement m = audit::measure(records, audit::SliceOptions{}, "learner", "sampler", V);
        const audit::SliceStats& all = *m.find("all");
        report.probe_max_abs_dlogp = all.max_abs_dlogp;
        report.probe_k3_kl = k3;
        const audit::CheckResult verdict = audit::check_contract(probe_.contract, m);
        const std::string summary =
            fmt::format("max |dlogp| {:.3g}, k3 KL {:.3g} over {} rows", all.max_abs_dlogp, k3, records.size());
        if (!verdict.pass) {
          const audit::Violation& v = verdict.violations.front();
          const auto worst = std::max_element(records.begin(), records.end(), [](const auto& a, const auto& b) {
            return a.div.osc < b.div.osc;
          });
          return fmt::format("slice {} {} {:.3g} > contract {:.3g} ({} rows over; worst: sequence {} "
                             "position {}); {}", v.slice, v.what, v.measured, v.allowed, v.rows_over,
                             worst->info.sequence, worst->info.position, summary);
        }
        if (k3 > probe_.max_k3_kl) return fmt::format("k3 KL {:.3g} > {:.3g}; {}", k3, probe_.max_k3_kl, summary);
        return "";
      }))
    return report;

  pending_ = version;
  return report;
}

void WeightReceiver::commit(SyncReport& report) {
  if (!pending_ || *pending_ != report.version)
    throw InputError(fmt::format("[sync] no verified version {} to swap in", report.version));
  const uint64_t version = *pending_;
  pending_.reset();
  model::Model& stage = untied_ ? *untied_ : *staging_;
  // Every check passed: the staged model serves — its weights AND the very derived copies the
  // checks verified (Model's move swaps its state; O(1)). The previous version's state becomes
  // the staging model, which the next install overwrites. Where the staging model is not the
  // serving model's twin (a fault changed its policy or ties), the values are copied instead
  // and the serving model rebuilds its copies from them.
  const auto t0 = Clock::now();
  if (&stage == &*staging_ && stage.policy() == serving_.policy()) {
    std::swap(serving_, *staging_);
  } else {
    for (const model::ParamSpec& spec : serving_.params()) {
      const std::span<const float> from = std::as_const(stage).param(spec.name);
      std::copy(from.begin(), from.end(), serving_.param(spec.name).begin());
    }
    serving_.weights_changed();
  }
  report.seconds_swap = seconds_since(t0);
  untied_.reset();
  version_ = version;
  has_version_ = true;
  report.serving = version;
  report.applied = true;
}

}  // namespace concord::rl
