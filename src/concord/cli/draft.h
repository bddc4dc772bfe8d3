// The speculative-decoding flags `concord generate` and `concord serve` share: --draft,
// --draft-policy, --draft-tokens, --draft-adaptive (and generate's --stats), and the drafter
// they name (docs/speculative.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "concord/model/files.h"
#include "concord/serve/drafter.h"
#include "concord/serve/engine.h"

namespace concord::cli {

struct DraftArgs {
  std::string spec;              // --draft: "" (off), ngram, self:PRESET, self:layers=K, or a model path
  std::string policy = "native";  // --draft-policy, for a draft model
  int tokens = 4;                // --draft-tokens
  bool adaptive = false;         // --draft-adaptive
  bool stats = false;            // --stats (generate)
  // InputError "[command] ..." when a draft flag is given without --draft.
  void check(const char* command) const;
  serve::SpeculationOptions options() const { return {.draft_tokens = tokens, .adaptive = adaptive}; }
};

void add_draft_flags(CLI::App* cmd, DraftArgs& args, bool with_stats);

// The drafter `args.spec` names, for `target` (loaded from `target_name`): prompt lookup, the
// target's own weights (self:PRESET, self:layers=K), or a draft model loaded under args.policy
// whose vocabulary and tokenizer must be the target's (InputError naming both otherwise).
// max_sequences and capacity size a draft model's KV cache (the engine's).
std::shared_ptr<serve::Drafter> make_drafter(const DraftArgs& args, model::LoadedModel& target,
                                             const std::string& target_name, int64_t max_sequences, int64_t capacity);

}  // namespace concord::cli
