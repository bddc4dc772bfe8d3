// `concord cap-plan`: what a memory cap on a GGUF MoE's experts costs, before running under it
// (issue 25; docs/serve.md "Experts under a memory cap"). A routing trace of the workload is
// replayed under each cap by the pager's rules (serve/cap_model.h) — the expert reads per phase —
// and, with --calibrate (one `concord generate --json --memory-cap X --no-prefetch` run), the
// time model turns the reads into predicted prefill and decode tokens/s.
#include <cstdio>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/cli/commands.h"
#include "concord/cli/flags.h"
#include "concord/io/json_file.h"
#include "concord/model/expert_pager.h"
#include "concord/model/files.h"
#include "concord/numerics/check.h"
#include "concord/serve/cap_model.h"
#include "concord/serve/ep_sim.h"

namespace concord::cli {
namespace {

namespace capmodel = serve::capmodel;
using nlohmann::ordered_json;

struct Args {
  std::string model, trace, caps = "100%,75%,50%,25%,10%", pin_loads;
  std::vector<std::string> calibrate;
  double pin_share = 0.5;
  int64_t prefill_passes = 1;
  bool json = false;
};

// One phase of a calibration run's "memory_cap" object (concord generate --json).
capmodel::PhaseRun phase_of(const nlohmann::json& mc, const char* phase, const std::string& path) {
  try {
    const nlohmann::json& p = mc.at(phase);
    capmodel::PhaseRun r;
    r.tokens = p.at("tokens").get<int64_t>();
    r.seconds = p.at("seconds").get<double>();
    r.stall_s = p.at("stall_s").get<double>();
    r.read_s = p.at("load_s").get<double>();
    r.reads = p.at("loads").get<int64_t>();  // every read, the prefetcher's too
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("[cap-plan] {}: memory_cap.{} lacks what a calibration needs ({}); use the --json output "
                                 "of `concord generate --memory-cap X --no-prefetch`",
                                 path, phase, e.what()));
  }
}

void run(const Args& a) {
  // The experts' packed bytes, from the file's types and shapes (nothing of them is read).
  model::ExpertPaging probe;
  probe.cap_share = 1.0;
  probe.prefetch = false;
  model::LoadedModel loaded = model::load_model_paged(a.model, probe);
  const model::ModelConfig& c = loaded.model.config();
  const model::ExpertPager& pager = *loaded.model.expert_pager();
  capmodel::Experts experts;
  experts.num_experts = c.num_experts;
  experts.bytes.assign(static_cast<size_t>(c.num_hidden_layers * c.num_experts), 0);
  int64_t total = 0, largest = 0;
  for (const model::ExpertPager::Expert& x : pager.experts()) {
    experts.bytes[static_cast<size_t>(x.block * c.num_experts + x.expert)] = x.bytes;
    total += x.bytes;
    largest = std::max(largest, x.bytes);
  }
  for (int64_t app = 0; app < c.applications(); ++app) experts.block_of_application.push_back(c.block_of(app));
  const serve::epsim::Trace trace = serve::epsim::read_trace(a.trace);
  std::vector<std::pair<int64_t, int64_t>> hottest;
  if (!a.pin_loads.empty()) hottest = model::hottest_experts(c, read_router_loads(a.pin_loads, "--pin-loads"));

  std::optional<capmodel::Cost> cost;
  std::string calibration;
  std::vector<std::pair<capmodel::PhaseRun, capmodel::PhaseRun>> runs;
  bool any_prefetch = false;
  for (const std::string& path : a.calibrate) {
    const nlohmann::json run = io::read_json_file(path, "cap-plan", "the calibration run");
    if (!run.contains("memory_cap") || !run["memory_cap"].is_object())
      throw InputError(fmt::format("[cap-plan] {}: no memory_cap object; calibrate from `concord generate --json --memory-cap X`",
                                   path));
    const nlohmann::json& mc = run["memory_cap"];
    any_prefetch = any_prefetch || mc.value("prefetch", true);
    runs.emplace_back(phase_of(mc, "prefill", path), phase_of(mc, "decode", path));
  }
  if (runs.size() == 1) {
    if (any_prefetch)
      throw InputError(fmt::format("[cap-plan] {}: a run with prefetch (its stalls are not its reads); calibrate from a "
                                   "--no-prefetch run, or fit from two or more runs",
                                   a.calibrate[0]));
    cost = capmodel::calibrate(runs[0].first, runs[0].second);
  } else if (runs.size() > 1) {
    cost = capmodel::fit(runs);
  }
  if (cost)
    calibration = fmt::format("{} from {} run{}: prefill {:.4f} s + {:.1f} us per expert read, decode {:.4f} s + {:.1f} us per "
                              "read",
                              runs.size() == 1 ? "calibrated" : "fitted", runs.size(), runs.size() == 1 ? "" : "s",
                              cost->prefill_compute_s, 1e6 * cost->prefill_read_s, cost->decode_compute_s,
                              1e6 * cost->decode_read_s);

  std::vector<std::string> caps;
  {
    std::stringstream ss(a.caps);
    for (std::string item; std::getline(ss, item, ',');)
      if (!item.empty()) caps.push_back(item);
  }
  if (caps.empty()) throw InputError("[cap-plan] --caps lists no cap");
  if (!a.json) {
    std::printf("%s\n", fmt::format("{}: {} MoE applications x {} experts, {} bytes of expert blocks (largest expert {}); "
                                     "trace {}: {} tokens in {} passes",
                                     a.model, trace.layers.size(), c.num_experts, total, largest, a.trace, trace.tokens(),
                                     trace.layers.empty() ? 0 : trace.layers[0].pass_rows.size())
                            .c_str());
    if (cost) std::printf("%s\n", calibration.c_str());
    std::printf("| cap | bytes | pinned | prefill reads | decode reads | decode reads/token | evictions |%s\n",
                cost ? " predicted prefill tok/s | predicted decode tok/s |" : "");
    std::printf("|---|---:|---:|---:|---:|---:|---:|%s\n", cost ? "---:|---:|" : "");
  }
  for (const std::string& text : caps) {
    const MemoryCap mc = parse_memory_cap("--caps", text);
    const int64_t cap = mc.bytes > 0 ? mc.bytes : static_cast<int64_t>(std::llround(mc.share * static_cast<double>(total)));
    std::vector<std::pair<int64_t, int64_t>> pinned;
    if (!hottest.empty())
      pinned = model::ExpertPager::select_pins(
          hottest, [&](int64_t block, int64_t e) { return experts.bytes[static_cast<size_t>(block * c.num_experts + e)]; },
          static_cast<int64_t>(a.pin_share * static_cast<double>(cap)), cap, largest);
    const capmodel::Replay r = capmodel::replay(trace, experts, cap, pinned, a.prefill_passes);
    const double per_token = r.decode_tokens > 0 ? static_cast<double>(r.decode_reads) / static_cast<double>(r.decode_tokens) : 0.0;
    double prefill_rate = 0, decode_rate = 0;
    if (cost) {
      const auto [ps, ds] = capmodel::predict_seconds(*cost, r);
      prefill_rate = ps > 0 ? static_cast<double>(r.prefill_tokens) / ps : 0.0;
      decode_rate = ds > 0 ? static_cast<double>(r.decode_tokens) / ds : 0.0;
    }
    if (a.json) {
      ordered_json j = {{"cap", text},
                        {"cap_bytes", cap},
                        {"expert_bytes", total},
                        {"pinned", r.pinned},
                        {"prefill_tokens", r.prefill_tokens},
                        {"prefill_uses", r.prefill_uses},
                        {"prefill_reads", r.prefill_reads},
                        {"decode_tokens", r.decode_tokens},
                        {"decode_uses", r.decode_uses},
                        {"decode_reads", r.decode_reads},
                        {"evictions", r.evictions},
                        {"high_water_bytes", r.high_water}};
      if (cost) {
        j["predicted_prefill_tokens_per_s"] = prefill_rate;
        j["predicted_decode_tokens_per_s"] = decode_rate;
      }
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s\n", fmt::format("| {} | {} | {} | {} | {} | {:.2f} | {} |{}", text, cap, r.pinned, r.prefill_reads,
                                      r.decode_reads, per_token, r.evictions,
                                      cost ? fmt::format(" {:.0f} | {:.0f} |", prefill_rate, decode_rate) : std::string())
                              .c_str());
    }
  }
}

}  // namespace

void add_cap_plan_command(CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "cap-plan",
      "What a memory cap on a GGUF MoE's experts costs (concord generate --memory-cap), before running under it: a "
      "routing trace of the workload replayed under each cap by the pager's rules gives the expert reads of prefill "
      "and decode; with --calibrate (one --no-prefetch run under any cap), predicted tokens/s too (docs/serve.md)");
  cmd->add_option("--model", a->model, "the GGUF MoE (Q4_0/Q4_1/Q8_0 experts)")->required();
  cmd->add_option("--trace", a->trace, "a routing trace of the workload (concord generate --routing-trace)")->required();
  cmd->add_option("--caps", a->caps,
                  "caps to plan, comma-separated: sizes (bytes, KiB, MiB, GiB) or percentages of the expert bytes "
                  "(default 100%,75%,50%,25%,10%)");
  cmd->add_option("--pin-loads", a->pin_loads, "pin the hottest experts of this --router-stats file, as generate does");
  add_real_flag(cmd, "--pin-share", a->pin_share, real_in(0, 1, false, false),
                "with --pin-loads: the share of the cap the pinned experts may take (default 0.5)");
  add_integer_flag(cmd, "--prefill-passes", a->prefill_passes, between(0, 1 << 20),
                   "the trace's first passes that are the prompt's prefill (default 1: one prefill chunk)");
  cmd->add_option("--calibrate", a->calibrate,
                  "the --json output of a `concord generate --memory-cap X` run of the same workload (repeatable): one "
                  "--no-prefetch run gives the compute time and seconds per read; two or more runs at caps that read "
                  "differently are fitted (seconds = compute + reads x cost per read, per phase); then tokens/s are "
                  "predicted for every cap")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_flag("--json", a->json, "one JSON object per cap instead of the table");
  cmd->callback([a]() {
    if (a->pin_share != 0.5 && a->pin_loads.empty()) throw InputError("[cap-plan] --pin-share needs --pin-loads");
    run(*a);
  });
}

}  // namespace concord::cli
