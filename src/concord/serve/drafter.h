// Drafters for speculative decoding (speculative.h): what proposes the γ tokens the target
// verifies. Behind one interface, so the engine speculates with any of them:
//   - PromptLookupDrafter: n-gram lookup in the sequence's own context (no model; q one-hot).
//   - ModelDrafter: a second model sharing the target's vocabulary — a small trained draft model,
//     or the target's own weights on a cheaper path (another precision preset) — sampling each
//     draft from its processed distribution q under the request's sampling parameters, with its
//     own KV cache that follows each sequence's accepted context.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "concord/model/kv_cache.h"
#include "concord/model/model.h"
#include "concord/serve/sampling.h"

namespace concord::serve {

// One sequence's draft: in, its id, whole context (prompt and generated tokens so far, the last
// of which the target has not consumed yet), sampling parameters, the index among its
// generated tokens of the first draft (its Philox position) and the most drafts wanted; out,
// the drafts and, for a sampling drafter, q per draft (dense, processed; empty: one-hot).
struct DraftRequest {
  int64_t id = 0;
  std::span<const int32_t> context;
  const SamplingParams* sampling = nullptr;
  uint64_t position = 0;
  int gamma = 0;
  std::vector<int32_t> tokens;
  std::vector<std::vector<double>> q;
  std::vector<std::vector<float>> logits;  // a model drafter: its raw logits per draft (the
                                           // engine checks α against the contract bound)
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  // Fills tokens (at most gamma) and q of every request, all sequences at once.
  virtual void propose(std::span<DraftRequest> requests) = 0;
  // The sequence ended: forget its state.
  virtual void release(int64_t id) { (void)id; }
};

class PromptLookupDrafter final : public Drafter {
 public:
  explicit PromptLookupDrafter(int max_ngram = 3, int min_ngram = 1) : max_ngram_(max_ngram), min_ngram_(min_ngram) {}
  std::string name() const override { return "ngram"; }
  void propose(std::span<DraftRequest> requests) override;

 private:
  int max_ngram_, min_ngram_;
};

// Drafts with `model`'s cached forward, one batched forward per draft position. Its vocabulary
// must equal the target's (checked by the engine: check_drafter_vocabulary). Each draft is drawn
// from q = processed_distribution(its logits, the request's sampling) with the uniform of
// PhiloxChoices{seed, kDraftStream} at the draft's position — independent of batch and threads.
class ModelDrafter final : public Drafter {
 public:
  ModelDrafter(std::shared_ptr<model::Model> model, std::string name, int64_t max_sequences, int64_t capacity);
  std::string name() const override { return name_; }
  void propose(std::span<DraftRequest> requests) override;
  void release(int64_t id) override;
  const model::Model& model() const { return *model_; }

 private:
  struct Track {
    int slot = -1;
    std::vector<int32_t> cached;  // the tokens in the drafter's cache for this sequence
  };
  std::shared_ptr<model::Model> model_;
  std::string name_;
  model::KvCache cache_;
  std::map<int64_t, Track> tracks_;
  std::vector<float> logits_;
};

// The target's own weights as a draft model (the self drafter: never out of sync with the
// target, as it is built from its weights): under `policy` (self:PRESET), and with only its
// first `layers` decoder layers plus the shared embedding, final norm and head (self:layers=K;
// 0: all). The weights are copied now: rebuild it after the target's weights change. InputError
// for a target served from stored (GGUF block) weights, and for layers outside
// 1..num_hidden_layers or a model whose layers are not a plain stack (recurrent, scheduled).
std::shared_ptr<model::Model> self_draft_model(const model::Model& target, const model::PrecisionPolicy& policy,
                                               int64_t layers = 0);

// What a --draft value names: "ngram"; "self:PRESET" or "self:layers=K" (the target's own
// weights); anything else is the path of a draft model. InputError for a malformed self:.
struct DrafterSpec {
  std::string kind;    // "ngram", "self" or "model"
  std::string preset;  // self:PRESET ("" for self:layers=K)
  int64_t layers = 0;  // self:layers=K
  std::string path;    // model
};
DrafterSpec parse_drafter_spec(const std::string& spec);
// The drafter of an "ngram" or "self" spec for `target` (named `name` in stats); InputError for
// a "model" spec (the caller loads the model and checks its tokenizer).
std::shared_ptr<Drafter> make_builtin_drafter(const DrafterSpec& spec, const model::Model& target, const std::string& name,
                                              int64_t max_sequences, int64_t capacity);

// InputError naming both when a drafter model's vocabulary differs from the target's.
void check_drafter_vocabulary(const model::ModelConfig& target, const model::ModelConfig& drafter,
                              const std::string& target_name, const std::string& drafter_name);

}  // namespace concord::serve
