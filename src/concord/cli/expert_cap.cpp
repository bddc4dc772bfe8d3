// ExpertCapArgs (expert_cap.h).
#include "concord/cli/expert_cap.h"

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::cli {

void add_expert_cap_flags(CLI::App* cmd, ExpertCapArgs& a, const char* what) {
  add_memory_cap_flag(cmd, "--memory-cap", a.memory_cap,
                      fmt::format("a GGUF MoE with Q4_0/Q4_1/Q8_0 experts: hold at most this many bytes of expert blocks (a "
                                  "percentage: of all of them), reading each expert from the file when a layer routes to "
                                  "it; the same {} bit for bit (docs/serve.md, experts under a memory cap)",
                                  what));
  cmd->add_option("--pin-loads", a.pin_loads,
                  "with --memory-cap: pin the experts with the most tokens in this `concord generate --router-stats` file "
                  "(never evicted)");
  add_real_flag(cmd, "--pin-share", a.pin_share, real_in(0, 1, false, false),
                "with --pin-loads: the share of the cap the pinned experts may take (default 0.5)");
  cmd->add_flag("--no-prefetch", a.no_prefetch,
                "with --memory-cap: read experts only when a layer needs them (no prefetch thread)");
}

void ExpertCapArgs::check(const char* command, const std::string& policy) const {
  if (!memory_cap && (!pin_loads.empty() || no_prefetch || pin_share != 0.5))
    throw InputError(fmt::format("[{}] --pin-loads, --pin-share and --no-prefetch are for --memory-cap", command));
  if (pin_share != 0.5 && pin_loads.empty()) throw InputError(fmt::format("[{}] --pin-share needs --pin-loads", command));
  if (memory_cap && policy != "native")
    throw InputError(fmt::format("[{}] --memory-cap pages a GGUF's quantized experts as stored (--policy native), not "
                                 "under --policy {}",
                                 command, policy));
}

model::LoadedModel ExpertCapArgs::load(const std::string& path, const std::string& policy) const {
  if (!memory_cap) return model::load_model(path, policy);
  model::ExpertPaging paging;
  paging.cap_bytes = memory_cap->bytes;
  paging.cap_share = memory_cap->share;
  paging.prefetch = !no_prefetch;
  paging.pin_share = pin_share;
  if (!pin_loads.empty()) paging.pin_loads = read_router_loads(pin_loads, "--pin-loads");
  return model::load_model_paged(path, paging);
}

}  // namespace concord::cli
