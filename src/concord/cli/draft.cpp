// The speculative-decoding flags and the drafter they name (draft.h).
#include "concord/cli/draft.h"

#include <optional>

#include <fmt/format.h>

#include "concord/cli/flags.h"
#include "concord/numerics/check.h"

namespace concord::cli {

void DraftArgs::check(const char* command) const {
  if (spec.empty() && (stats || adaptive || tokens != 4 || policy != "native"))
    throw InputError(fmt::format("[{}] --draft-tokens, --draft-adaptive, --draft-policy and --stats need --draft", command));
}

void add_draft_flags(CLI::App* cmd, DraftArgs& a, bool with_stats) {
  cmd->add_option("--draft", a.spec,
                  "speculative decoding with this drafter: ngram (prompt lookup), self:PRESET (the model's own "
                  "weights under a cheaper precision preset, e.g. self:mxfp4), self:layers=K (its first K layers "
                  "and its head), or a draft model (folder or GGUF with the same tokenizer); the output follows the "
                  "model's own distribution (greedy: the same tokens)");
  cmd->add_option("--draft-policy", a.policy,
                  "with --draft MODEL: the draft model's precision (as --policy; default native)");
  add_integer_flag(cmd, "--draft-tokens", a.tokens, between(1, 64),
                   "with --draft: tokens drafted per verification (default 4)");
  cmd->add_flag("--draft-adaptive", a.adaptive,
                "with --draft: adapt the draft length per sequence (+2 after a fully accepted round, -1 "
                "otherwise, at most --draft-tokens)");
  if (with_stats)
    cmd->add_flag("--stats", a.stats,
                  "with --draft: print to stderr the acceptance per draft position beside its expectation "
                  "(mean α = Σ min(p, q)), the tokens per verification and the kernel-contract check");
}

// The drafter --draft names: "ngram", "self:PRESET", "self:layers=K", or a model path (a folder
// or a GGUF sharing the target's tokenizer).
std::shared_ptr<serve::Drafter> make_drafter(const DraftArgs& args, model::LoadedModel& target,
                                             const std::string& target_name, int64_t max_sequences, int64_t capacity) {
  const std::string& spec = args.spec;
  const serve::DrafterSpec parsed = serve::parse_drafter_spec(spec);
  if (parsed.kind != "model") return serve::make_builtin_drafter(parsed, target.model, spec, max_sequences, capacity);
  std::optional<model::LoadedModel> loaded_draft;
  try {
    loaded_draft.emplace(model::load_model(spec, args.policy));
  } catch (const InputError& e) {
    throw InputError(fmt::format("[draft] --draft: not ngram, self:PRESET or self:layers=K, and not a model: {}",
                                 e.what()));
  }
  model::LoadedModel& draft = *loaded_draft;
  serve::check_drafter_vocabulary(target.model.config(), draft.model.config(), target_name, spec);
  if (target.source.tokenizer && draft.source.tokenizer) {
    const io::Tokenizer &a = *target.source.tokenizer, &b = *draft.source.tokenizer;
    if (a.vocab_size() != b.vocab_size())
      throw InputError(fmt::format("[draft] the drafter {} has a tokenizer of {} tokens, the target {} one of {}",
                                   spec, b.vocab_size(), target_name, a.vocab_size()));
    for (int32_t id = 0; id < a.vocab_size(); ++id)
      if (a.token_bytes(id) != b.token_bytes(id))
        throw InputError(fmt::format("[draft] the drafter {} and the target {} have different tokenizers "
                                     "(token {} differs)", spec, target_name, id));
  }
  draft.model.prepare_weights();
  auto m = std::make_shared<model::Model>(std::move(draft.model));
  return std::make_shared<serve::ModelDrafter>(std::move(m), spec, max_sequences, capacity);
}

}  // namespace concord::cli
