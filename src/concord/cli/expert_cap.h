// The memory-cap flags `concord generate` and `concord serve` share: --memory-cap, --pin-loads,
// --pin-share, --no-prefetch (model/expert_pager.h; docs/serve.md "Experts under a memory cap"),
// and the load they choose.
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "concord/cli/flags.h"
#include "concord/model/files.h"

namespace concord::cli {

struct ExpertCapArgs {
  std::optional<MemoryCap> memory_cap;  // --memory-cap
  std::string pin_loads;                // --pin-loads
  double pin_share = 0.5;               // --pin-share
  bool no_prefetch = false;             // --no-prefetch
  // InputError "[command] ..." for a cap flag without --memory-cap, --pin-share without
  // --pin-loads, or a cap under a policy other than native.
  void check(const char* command, const std::string& policy) const;
  // load_model(path, policy) without a cap; load_model_paged under it.
  model::LoadedModel load(const std::string& path, const std::string& policy) const;
};

// `what`: what stays bit for bit ("tokens", "responses").
void add_expert_cap_flags(CLI::App* cmd, ExpertCapArgs& args, const char* what);

}  // namespace concord::cli
