// Drafters: prompt lookup and a draft model with its own KV cache (drafter.h).
#include "concord/serve/drafter.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

#include "concord/numerics/check.h"
#include "concord/serve/speculative.h"

namespace concord::serve {

void PromptLookupDrafter::propose(std::span<DraftRequest> requests) {
  for (DraftRequest& r : requests) {
    r.tokens = r.gamma > 0 ? prompt_lookup_draft(r.context, r.gamma, max_ngram_, min_ngram_) : std::vector<int32_t>{};
    r.q.clear();
    r.logits.clear();
  }
}

ModelDrafter::ModelDrafter(std::shared_ptr<model::Model> model, std::string name, int64_t max_sequences,
                           int64_t capacity)
    : model_(std::move(model)),
      name_(std::move(name)),
      cache_(model_->config(), max_sequences,
             std::min<int64_t>(capacity > 0 ? capacity : model_->config().max_position_embeddings,
                               model_->config().max_position_embeddings)) {}

void ModelDrafter::release(int64_t id) {
  const auto it = tracks_.find(id);
  if (it == tracks_.end()) return;
  cache_.release(it->second.slot);
  tracks_.erase(it);
}

void ModelDrafter::propose(std::span<DraftRequest> requests) {
  const int64_t V = model_->config().vocab_size;
  // Bring each sequence's cache to its context minus the last token, which is fed (again) so
  // its logits give q_0: the cached prefix the context still shares is kept, the rest dropped.
  std::vector<DraftRequest*> active;
  std::vector<std::vector<int32_t>> feed;
  for (DraftRequest& r : requests) {
    r.tokens.clear();
    r.q.clear();
    r.logits.clear();
    const auto L = static_cast<int64_t>(r.context.size());
    if (r.gamma <= 0 || L == 0 || L + r.gamma > cache_.capacity()) continue;  // nothing, or no room
    auto it = tracks_.find(r.id);
    if (it == tracks_.end()) it = tracks_.emplace(r.id, Track{cache_.allocate(), {}}).first;
    Track& t = it->second;
    const auto common = static_cast<int64_t>(
        std::mismatch(t.cached.begin(), t.cached.end(), r.context.begin(), r.context.end()).first - t.cached.begin());
    const int64_t keep = std::min(common, L - 1);
    cache_.truncate(t.slot, keep);
    t.cached.resize(static_cast<size_t>(keep));
    feed.emplace_back(r.context.begin() + keep, r.context.end());
    active.push_back(&r);
  }
  for (int i = 0; !active.empty(); ++i) {
    std::vector<model::CachedInput> inputs;
    for (size_t k = 0; k < active.size(); ++k)
      inputs.push_back({tracks_.at(active[k]->id).slot, feed[k], model::LogitRows::last});
    logits_.resize(static_cast<size_t>(static_cast<int64_t>(inputs.size()) * V));
    model_->forward_cached(cache_, inputs, logits_);
    std::vector<DraftRequest*> next_active;
    std::vector<std::vector<int32_t>> next_feed;
    for (size_t k = 0; k < active.size(); ++k) {
      DraftRequest& r = *active[k];
      Track& t = tracks_.at(r.id);
      t.cached.insert(t.cached.end(), feed[k].begin(), feed[k].end());
      const std::span<const float> row(logits_.data() + k * static_cast<size_t>(V), static_cast<size_t>(V));
      std::vector<double> q = processed_distribution(row, *r.sampling);
      PhiloxChoices draw(r.sampling->seed, kDraftStream);
      const auto d = static_cast<int32_t>(draw.categorical(q, r.position + static_cast<uint64_t>(i)));
      r.tokens.push_back(d);
      r.q.push_back(std::move(q));
      r.logits.emplace_back(row.begin(), row.end());
      if (static_cast<int>(r.tokens.size()) < r.gamma) {
        next_active.push_back(&r);
        next_feed.push_back({d});
      }
    }
    active = std::move(next_active);
    feed = std::move(next_feed);
  }
}

std::shared_ptr<model::Model> self_draft_model(const model::Model& target, const model::PrecisionPolicy& policy,
                                               int64_t layers) {
  if (target.has_stored_weights())
    throw InputError("[speculative] a self drafter needs the target's fp32 weights; this target serves stored "
                     "(GGUF block) weights: load it with --policy fp32 or a preset");
  model::ModelConfig c = target.config();
  if (layers != 0) {
    if (layers < 1 || layers > c.num_hidden_layers)
      throw InputError(fmt::format("[speculative] self:layers={} must lie in 1..{} (the target's layers)", layers,
                                   c.num_hidden_layers));
    if (c.recurrent() || !c.schedule.empty())
      throw InputError(fmt::format("[speculative] self:layers=K needs a plain stack of layers; {} is a {}", c.architecture,
                                   c.recurrent() ? "depth-recurrent model" : "model with a block schedule"));
    c.num_hidden_layers = layers;
  }
  auto m = std::make_shared<model::Model>(c, policy);
  for (const model::ParamSpec& p : m->params()) {
    const std::span<const float> from = target.param(p.name);
    const std::span<float> to = m->param(p.name);
    CONCORD_CHECK(from.size() == to.size(), "self drafter: a parameter of another shape");
    std::copy(from.begin(), from.end(), to.begin());
  }
  m->weights_changed();
  m->prepare_weights();  // quantize now, not inside the first draft
  return m;
}

DrafterSpec parse_drafter_spec(const std::string& spec) {
  DrafterSpec d;
  if (spec == "ngram") {
    d.kind = "ngram";
  } else if (spec.starts_with("self:")) {
    d.kind = "self";
    const std::string what = spec.substr(5);
    if (what.starts_with("layers=")) {
      const std::string k = what.substr(7);
      const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), d.layers);
      if (ec != std::errc() || end != k.data() + k.size() || k.empty())
        throw InputError(fmt::format("[speculative] drafter '{}': give self:layers=K with K an integer", spec));
    } else if (what.empty()) {
      throw InputError(fmt::format("[speculative] drafter '{}': give self:PRESET (e.g. self:mxfp4) or self:layers=K", spec));
    } else {
      d.preset = what;
    }
  } else {
    d.kind = "model";
    d.path = spec;
  }
  return d;
}

std::shared_ptr<Drafter> make_builtin_drafter(const DrafterSpec& spec, const model::Model& target, const std::string& name,
                                              int64_t max_sequences, int64_t capacity) {
  if (spec.kind == "ngram") return std::make_shared<PromptLookupDrafter>();
  if (spec.kind != "self") throw InputError(fmt::format("[speculative] drafter '{}' is a model path, not built in", name));
  std::shared_ptr<model::Model> m =
      spec.preset.empty() ? self_draft_model(target, target.policy(), spec.layers)
                          : self_draft_model(target, model::PrecisionPolicy::from_name_or_file(spec.preset));
  return std::make_shared<ModelDrafter>(std::move(m), name, max_sequences, capacity);
}

void check_drafter_vocabulary(const model::ModelConfig& target, const model::ModelConfig& drafter,
                              const std::string& target_name, const std::string& drafter_name) {
  if (target.vocab_size != drafter.vocab_size)
    throw InputError(fmt::format("[speculative] the drafter {} has a vocabulary of {} tokens, the target {} one of {}: "
                                 "a drafter must share the target's tokenizer",
                                 drafter_name, drafter.vocab_size, target_name, target.vocab_size));
}

}  // namespace concord::serve
