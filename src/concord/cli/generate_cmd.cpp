// `concord generate`: load a model (HF folder or GGUF), tokenize a prompt (optionally through the
// model's chat template), and stream sampled tokens to stdout (or, with --json, print one JSON
// object: tokens, text, log-probs); stop strings; a throughput summary on stderr.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "concord/cli/commands.h"
#include "concord/cli/draft.h"
#include "concord/cli/expert_cap.h"
#include "concord/cli/expert_parallel.h"
#include "concord/cli/flags.h"
#include "concord/io/atomic_file.h"
#include "concord/model/expert_pager.h"
#include "concord/model/files.h"
#include "concord/numerics/check.h"
#include "concord/rl/channel.h"
#include "concord/serve/engine.h"
#include "concord/serve/ep_sim.h"
#include "concord/serve/eplb.h"
#include "concord/serve/prefix_cache.h"
#include "concord/serve/speculative.h"
#include "concord/serve/text.h"

namespace concord::cli {
namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// [[id, logp], ...] per position.
nlohmann::ordered_json top_json(const std::vector<std::vector<serve::TopLogprob>>& lists) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& list : lists) {
    nlohmann::ordered_json entries = nlohmann::ordered_json::array();
    for (const serve::TopLogprob& t : list) entries.push_back({t.token, t.logprob});
    out.push_back(std::move(entries));
  }
  return out;
}
// A placement's rank lists reassigned to ranks (a permutation) so that each rank keeps as many of
// the experts it holds now as it can: greedily, the (new list, rank) pair sharing the most experts
// first (ties: the lower list, then the lower rank).
std::vector<std::vector<int64_t>> keep_most(const std::vector<std::vector<int64_t>>& now,
                                           std::vector<std::vector<int64_t>> next) {
  const size_t R = next.size();
  if (now.size() != R) return next;
  auto as_set = [](std::vector<int64_t> v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
  };
  std::vector<std::vector<int64_t>> next_set(R), now_set(R);
  for (size_t i = 0; i < R; ++i) {
    next_set[i] = as_set(next[i]);
    now_set[i] = as_set(now[i]);
  }
  std::vector<std::vector<size_t>> shared(R, std::vector<size_t>(R, 0));
  for (size_t i = 0; i < R; ++i)
    for (size_t q = 0; q < R; ++q) {
      std::vector<int64_t> both;
      std::set_intersection(next_set[i].begin(), next_set[i].end(), now_set[q].begin(), now_set[q].end(),
                            std::back_inserter(both));
      shared[i][q] = both.size();
    }
  std::vector<std::vector<int64_t>> out(R);
  std::vector<bool> list_used(R, false), rank_used(R, false);
  for (size_t step = 0; step < R; ++step) {
    size_t bi = R, bq = R;
    for (size_t i = 0; i < R; ++i)
      for (size_t q = 0; q < R; ++q)
        if (!list_used[i] && !rank_used[q] && (bi == R || shared[i][q] > shared[bi][bq])) {
          bi = i;
          bq = q;
        }
    list_used[bi] = rank_used[bq] = true;
    out[bq] = std::move(next[bi]);
  }
  return out;
}

// Expert parallelism's measurements (model::ExpertParallel), gathered at rank 0: one JSON line per
// MoE layer and rank to `path` (when given) and a summary on stderr. Collective: every rank calls it.
// The pager's counters over a phase (after - before), as one line and as JSON.
model::ExpertPagingStats paging_delta(const model::ExpertPagingStats& after, const model::ExpertPagingStats& before) {
  model::ExpertPagingStats d = after;
  d.uses -= before.uses;
  d.hits -= before.hits;
  d.waits -= before.waits;
  d.loads -= before.loads;
  d.loaded_bytes -= before.loaded_bytes;
  d.prefetched -= before.prefetched;
  d.prefetch_used -= before.prefetch_used;
  d.evictions -= before.evictions;
  d.load_s -= before.load_s;
  d.stall_s -= before.stall_s;
  return d;
}
std::string paging_line(const model::ExpertPagingStats& s) {
  return fmt::format("{} expert uses, {:.1f}% resident, {} waited for the prefetcher; {} read ({:.2f} MiB, {:.3f} s), {} by "
                     "the prefetcher ({} used), {} evicted; stalled {:.3f} s",
                     s.uses, s.uses ? 100.0 * static_cast<double>(s.hits) / static_cast<double>(s.uses) : 0.0, s.waits, s.loads,
                     static_cast<double>(s.loaded_bytes) / (1024.0 * 1024.0), s.load_s, s.prefetched, s.prefetch_used,
                     s.evictions, s.stall_s);
}
nlohmann::ordered_json paging_json(const model::ExpertPagingStats& s) {
  return {{"uses", s.uses},           {"hits", s.hits},       {"waits", s.waits},
          {"loads", s.loads},         {"loaded_bytes", s.loaded_bytes}, {"prefetched", s.prefetched},
          {"prefetch_used", s.prefetch_used}, {"evictions", s.evictions}, {"load_s", s.load_s},
          {"stall_s", s.stall_s}};
}

void report_expert_parallel(const model::ExpertParallel& ep, const model::ModelConfig& c, const std::string& path,
                            int64_t held_bytes, int64_t total_bytes) {
  std::vector<int64_t> apps;
  for (int64_t a = 0; a < static_cast<int64_t>(ep.layers.size()); ++a)
    if (ep.layers[static_cast<size_t>(a)].passes > 0) apps.push_back(a);
  // Per application: compute, exchange, rows, layer rows, passes, slow factor, then each pass's
  // compute and exchange (every rank ran the same passes, so the layout is the same everywhere).
  constexpr size_t kFields = 6;
  std::vector<double> mine;
  std::vector<size_t> offset;
  for (int64_t a : apps) {
    const model::ExpertParallel::Layer& l = ep.layers[static_cast<size_t>(a)];
    offset.push_back(mine.size());
    mine.insert(mine.end(), {l.compute_s, l.exchange_s, static_cast<double>(l.rows), static_cast<double>(l.layer_rows),
                             static_cast<double>(l.passes), ep.slow_factor});
    mine.insert(mine.end(), l.pass_compute_s.begin(), l.pass_compute_s.end());
    mine.insert(mine.end(), l.pass_exchange_s.begin(), l.pass_exchange_s.end());
  }
  const std::vector<double> moves = rl::mpi_gather_doubles(std::vector<double>{
      static_cast<double>(ep.replans), static_cast<double>(ep.moved_in), static_cast<double>(ep.moved_bytes), ep.move_s,
      static_cast<double>(held_bytes), static_cast<double>(ep.rows_sent), static_cast<double>(ep.rows_received),
      static_cast<double>(ep.placements_kept)});
  const std::vector<double> all = rl::mpi_gather_doubles(mine);
  if (ep.rank != 0) return;
  std::string held_text;
  {
    double moved = 0, bytes = 0, seconds = 0;
    std::string per_rank, dispatched;
    for (int q = 0; q < ep.ranks; ++q) {
      const double* v = moves.data() + static_cast<size_t>(q) * 8;
      moved += v[1];
      bytes += v[2];
      seconds = std::max(seconds, v[3]);
      per_rank += fmt::format("{}{:.0f}", q ? ", " : "", v[4] / 1024.0);
      dispatched += fmt::format("{}rank {}: {:.0f} / {:.0f}", q ? ", " : "", q, v[5], v[6]);
    }
    held_text = fmt::format("; expert weights held per rank: {} KiB of {:.0f}", per_rank, static_cast<double>(total_bytes) / 1024.0);
    if (ep.replan_every > 0)
      held_text += fmt::format("; placed again {:.0f} times, {:.0f} experts moved ({:.0f} KiB, each content-checked, {:.1f} ms)",
                               moves[0], moved, bytes / 1024.0, 1e3 * seconds);
    if (ep.replan_every > 0 && ep.plan && moves[7] > 0)
      held_text += fmt::format("; {:.0f} layer placements kept (the move would not pay)", moves[7]);
    if (ep.data_parallel)
      held_text += fmt::format("; data-parallel attention, rows sent to / received from other ranks: {}", dispatched);
  }
  const size_t per_rank = mine.size();
  auto at = [&](int q, size_t i) { return all.data() + static_cast<size_t>(q) * per_rank + offset[i]; };
  std::string lines;
  double wait_total = 0, busy_total = 0, worst_imbalance = 0;
  std::vector<double> layer_times;  // per pass and MoE layer: the mean over ranks of compute + wait
  for (size_t i = 0; i < apps.size(); ++i) {
    double max_rows = 0, sum_rows = 0;
    const auto passes = static_cast<size_t>(at(0, i)[4]);
    std::vector<double> pass_time(passes, 0.0);
    for (int q = 0; q < ep.ranks; ++q) {
      const double* v = at(q, i);
      const double* pc = v + kFields;
      const double* pw = pc + passes;
      // The experts on the rank's slots (the contiguous range, or the placement's).
      std::vector<int64_t> slots;
      if (ep.rank_experts.empty()) {
        for (int64_t e = ep.first_expert(c.num_experts, q); e < ep.first_expert(c.num_experts, q + 1); ++e) slots.push_back(e);
      } else {
        slots = ep.rank_experts[static_cast<size_t>(apps[i])][static_cast<size_t>(q)];
      }
      std::string pcs, pws;
      for (size_t k = 0; k < passes; ++k) {
        pcs += fmt::format("{}{:.7f}", k ? ", " : "", pc[k]);
        pws += fmt::format("{}{:.7f}", k ? ", " : "", pw[k]);
        pass_time[k] += (pc[k] + pw[k]) / ep.ranks;
      }
      lines += fmt::format("{{\"application\": {}, \"rank\": {}, \"slots\": [{}], \"passes\": {}, \"rows\": {}, "
                           "\"layer_rows\": {}, \"compute_s\": {:.6f}, \"wait_s\": {:.6f}, \"slow_factor\": {}, "
                           "\"pass_compute_s\": [{}], \"pass_wait_s\": [{}]}}\n",
                           apps[i], q, fmt::join(slots, ", "), static_cast<int64_t>(v[4]), static_cast<int64_t>(v[2]),
                           static_cast<int64_t>(v[3]), v[0], v[1], v[5], pcs, pws);
      max_rows = std::max(max_rows, v[2]);
      sum_rows += v[2];
      wait_total += v[1];
      busy_total += v[0] + v[1];
    }
    layer_times.insert(layer_times.end(), pass_time.begin(), pass_time.end());
    const double mean_rows = sum_rows / ep.ranks;
    if (mean_rows > 0) worst_imbalance = std::max(worst_imbalance, max_rows / mean_rows);
  }
  if (!path.empty()) io::write_file_atomic(path, lines);
  std::string ranks_text;
  for (int q = 0; q < ep.ranks; ++q) {
    double compute = 0, wait = 0, rows = 0;
    for (size_t i = 0; i < apps.size(); ++i) {
      const double* v = at(q, i);
      compute += v[0];
      wait += v[1];
      rows += v[2];
    }
    ranks_text += fmt::format("{}rank {}: {:.0f} rows, compute {:.1f} ms, wait {:.1f} ms ({:.0f}%)", q ? "; " : "", q, rows,
                            1e3 * compute, 1e3 * wait, compute + wait > 0 ? 100.0 * wait / (compute + wait) : 0.0);
  }
  std::fprintf(stderr, "%s\n",
               fmt::format("expert parallel: {} ranks, {} MoE layers; {:.1f}% of the MoE layers' time spent waiting at "
                           "the exchange; layer time p50 {:.1f} us, p99 {:.1f} us; load imbalance (max/mean rows of a "
                           "layer) up to {:.2f}; {}{}",
                           ep.ranks, apps.size(), busy_total > 0 ? 100.0 * wait_total / busy_total : 0.0,
                           1e6 * serve::epsim::quantile(layer_times, 0.5), 1e6 * serve::epsim::quantile(layer_times, 0.99),
                           worst_imbalance, ranks_text + held_text, path.empty() ? "" : fmt::format("; per layer and rank: {}", path))
                   .c_str());
}

// This process's own command line (/proc/self/cmdline), for the decode worker `--disaggregate shm`
// starts: the same arguments plus its rank and the segment's name.
std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  for (size_t at = 0; at < all.size();) {
    const size_t end = all.find('\0', at);
    args.push_back(all.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  if (args.empty()) throw InputError("[generate] --disaggregate shm: cannot read this process's command line");
  return args;
}

// The bytes PrefixCache::export_prompt can take for a prompt of n tokens (the shm segment's size):
// the message header, and per record (at most n / block + 2) its length, header, tokens and rows.
size_t hand_over_capacity(const model::ModelConfig& c, int64_t n, int64_t block) {
  const auto records = static_cast<size_t>(n / block + 2);
  const auto per_token = 4 + 8 * static_cast<size_t>(c.applications() * c.num_key_value_heads * c.head_dim);
  return 16 + records * (8 + 72) + static_cast<size_t>(n) * per_token;
}
}  // namespace

void add_generate_command(CLI::App& app) {
  struct Args {
    std::string model, prompt, system, policy = "native", router_stats, routing_trace, prefix_cache_dir, activation_arena = "planned";
    std::string disaggregate, shm_name, slow_rank, ep_stats, placement = "contiguous", placement_loads, router = "even",
        ep_cost, placement_trace;
    std::vector<double> rank_speeds;
    int64_t slots_per_rank = 0, replan_every = 0;
    int rank = 0;
    bool expert_parallel = false, data_parallel = false, move_aware = false;
    ExpertCapArgs cap;
    DraftArgs draft;
    std::optional<int64_t> depth, max_depth, kv_core_slots;
    std::optional<double> exit_kl;
    bool chat = false, no_think = false, json = false, echo = false;
    std::vector<std::string> stops;
    std::optional<int32_t> top_logprobs;
    int64_t max_tokens = 256, prefill_chunk = 512;
    float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f;
    int32_t top_k = 0;
    uint64_t seed = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Generate text from a prompt with a model folder (config.json + safetensors + tokenizer) or "
      "a GGUF file; tokens stream to stdout (--json: one JSON object with tokens, text and "
      "log-probs), a summary (prompt tokens, prefill tok/s, generated tokens, decode tok/s) goes "
      "to stderr.");
  cmd->add_option("--model", a->model, "model folder or .gguf file")->required();
  cmd->add_option("--prompt", a->prompt, "prompt text")->required();
  cmd->add_flag("--chat", a->chat, "wrap the prompt in the model's chat template (ChatML, Llama 3)");
  cmd->add_option("--system", a->system, "system message (with --chat)");
  cmd->add_flag("--no-think", a->no_think, "Qwen3 chat: thinking off (an empty <think> block)");
  add_integer_flag(cmd, "--max-tokens", a->max_tokens, at_least(1), "tokens to generate at most (default 256)");
  add_real_flag(cmd, "--temp", a->temperature, non_negative(), "temperature (0: greedy; default 1)");
  add_integer_flag(cmd, "--top-k", a->top_k, at_least(0), "keep the k most probable tokens (0: off)");
  add_real_flag(cmd, "--top-p", a->top_p, real_in(0, 1, true, false),
                "keep the smallest set with this probability (1: off)");
  add_real_flag(cmd, "--min-p", a->min_p, real_in(0, 1, false, false),
                "drop tokens below min_p x the top probability (0: off)");
  add_seed_flag(cmd, "--seed", a->seed, "sampling seed (default 0)");
  cmd->add_option("--policy", a->policy,
                  "native (default: a GGUF's Q4_0/Q4_1/Q8_0 weights served as stored, W4A8), a "
                  "precision preset on the dequantized weights (fp32, bf16, mxfp8, fp8-tensor, "
                  "nvfp4, mxfp4), or a policy JSON");
  add_integer_flag(cmd, "--prefill-chunk", a->prefill_chunk, at_least(1),
                   "prompt tokens per forward pass (default 512)");
  cmd->add_flag("--json", a->json,
                "print one JSON object (prompt_tokens, tokens, text, logprobs, finish_reason, ...) "
                "instead of streaming the text");
  cmd->add_option("--stop", a->stops,
                  "stop when the generated text contains this string (repeatable); the text ends "
                  "before it")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  add_integer_flag(cmd, "--top-logprobs", a->top_logprobs, between(0, serve::kMaxTopLogprobs),
                   "with --json: the N most probable tokens and their log-probs per generated token");
  cmd->add_flag("--echo", a->echo, "with --json: the log-prob of every prompt token after the first");
  cmd->add_option("--router-stats", a->router_stats,
                  "an MoE model (Qwen3-MoE): write the tokens routed to each expert of each MoE layer, "
                  "prompt and generated tokens together, to this JSON file");
  cmd->add_option("--routing-trace", a->routing_trace,
                  "an MoE model: write every token's top-k experts per MoE layer and the passes' sizes, as JSON "
                  "lines, to this file (the trace `concord ep-sim` replays; docs/moe.md)");
  add_integer_flag(cmd, "--depth", a->depth, between(1, 4096),
                   "a depth-recurrent model: core iterations per token (default: its mean_recurrence)");
  add_real_flag(cmd, "--exit-kl", a->exit_kl, non_negative(),
                "a depth-recurrent model: adaptive exit, stop iterating a token once the KL divergence of "
                "successive iterates' next-token distributions falls below this (the prompt then runs token "
                "by token); iterations per token go to stderr");
  add_integer_flag(cmd, "--max-depth", a->max_depth, between(1, 4096),
                   "with --exit-kl: the most iterations a token may run (default: --depth)");
  add_integer_flag(cmd, "--kv-core-slots", a->kv_core_slots, between(1, 4096),
                   "a depth-recurrent model: KV-cache slots per core layer (default: one per iteration up to "
                   "max_recurrence; fewer: Huginn's fixed budget, iterations share slots)");
  cmd->add_option("--prefix-cache-dir", a->prefix_cache_dir,
                  "keep the prompt's KV rows as snapshot files in this folder (per model) and resume from the "
                  "longest stored prefix of the next prompt: a repeated long prompt skips its prefill; output "
                  "unchanged bit for bit (docs/serve.md, the prefix snapshot cache)");
  cmd->add_option("--activation-arena", a->activation_arena,
                  "where a step's activations live: planned (default: the memory scheduler's plan of the step; "
                  "docs/sched.md) or bump (forward_cached's bump allocator); the same tokens bit for bit");
  cmd->add_option("--disaggregate", a->disaggregate,
                  "run the prompt and the generation in two workers: a prefill worker (the batched GEMM path) "
                  "computes the prompt's KV rows and hands them to a decode worker (the one-row GEMV path), "
                  "which generates; the same tokens bit for bit. The transport: in-process (two engines in "
                  "this process), shm (a second process over shared memory), mpi (under mpirun -np 2: rank 0 "
                  "prefills, rank 1 decodes and prints). docs/serve.md, disaggregated prefill and decode");
  add_integer_flag(cmd, "--rank", a->rank, between(1, 1), "internal: the decode worker of --disaggregate shm")->group("");
  cmd->add_option("--shm-name", a->shm_name, "internal: --disaggregate shm's segment")->group("");
  cmd->add_flag("--expert-parallel", a->expert_parallel,
                "an MoE model under mpirun -np R: each rank computes R-th of every MoE layer's experts, the "
                "outputs are exchanged (MPI_Allgatherv) and every rank combines them as one process would: the "
                "same tokens bit for bit; rank 0 prints. Measures each layer's compute and wait per rank "
                "(docs/moe.md, expert parallelism)");
  cmd->add_flag("--data-parallel", a->data_parallel,
                "with --expert-parallel: data-parallel attention — each rank generates its own sample of the prompt "
                "(seed + rank) with its own KV cache, and an MoE layer sends each rank's rows to the ranks of their "
                "experts and the outputs back (MPI_Alltoallv); rank 0 prints every rank's output in rank order, each "
                "the one-process output of its seed bit for bit (docs/moe.md)");
  cmd->add_option("--slow-rank", a->slow_rank,
                  "with --expert-parallel: RANK:FACTOR makes that rank's experts take FACTOR times as long "
                  "(busy-waiting), as a slower device would");
  cmd->add_option("--ep-stats", a->ep_stats,
                  "with --expert-parallel: write one JSON line per MoE layer and rank (rows, compute and wait "
                  "seconds) to this file");
  cmd->add_option("--placement", a->placement,
                  "with --expert-parallel: contiguous (default: rank r holds experts [rE/R, (r+1)E/R)), eplb "
                  "(DeepSeek's EPLB from --placement-loads: hot experts replicated, replicas packed evenly) or "
                  "speed (the same loads, placed for ranks of unequal speed: --rank-speeds, or the --slow-rank) or "
                  "search (ep-sim's tail search from EPLB's or the speed-aware placement, planned on the passes of "
                  "--placement-trace under --ep-cost and --router; docs/moe.md, placement)");
  cmd->add_option("--placement-trace", a->placement_trace,
                  "with --placement search: a routing trace (`concord generate --routing-trace`) whose passes the "
                  "search plans on");
  add_real_list_flag(cmd, "--rank-speeds", a->rank_speeds, positive(),
                     "with --placement speed: each rank's relative speed, comma-separated (default: 1, and 1/FACTOR "
                     "for the --slow-rank)");
  cmd->add_option("--placement-loads", a->placement_loads,
                  "with --placement eplb or speed: the tokens per expert of each MoE layer, as `concord generate "
                  "--router-stats` writes them");
  add_integer_flag(cmd, "--replan-every", a->replan_every, between(0, 1 << 20),
                   "with --placement eplb or speed: every N passes, place the experts again from the tokens routed "
                   "since the last placement and move the experts a rank newly holds from another rank over MPI, "
                   "content-checked (default 0: the placement stays; docs/moe.md)");
  cmd->add_option("--router", a->router,
                  "with --placement eplb, speed or search: how a replicated expert's rows are split among its holders each "
                  "pass — even (default: in order, equal shares) or balanced (levelling the ranks' predicted "
                  "finishing times under --ep-cost and the ranks' speeds, the per-batch re-routing of ep-sim's "
                  "balanced router); the same tokens bit for bit");
  cmd->add_option("--ep-cost", a->ep_cost,
                  "with --router balanced, --placement search or --move-aware: the cost model they predict layer times "
                  "with (`concord ep-sim --calibrate --cost-out`; default: ep-sim's GPU-like one)");
  cmd->add_flag("--move-aware", a->move_aware,
                "with --replan-every: keep a layer's placement when moving to the new one would cost more than it "
                "saves — the saving, the predicted layer time of the last window's rows under the current and the new "
                "placement (--ep-cost, the ranks' speeds, --router), against the transfer of the experts it moves (the "
                "cost model's exchange per row's bytes and per message)");
  add_integer_flag(cmd, "--slots-per-rank", a->slots_per_rank, between(0, 1 << 20),
                   "with --placement eplb: expert slots on each rank (default 0: one more than the contiguous share)");
  add_expert_cap_flags(cmd, a->cap, "tokens");
  add_draft_flags(cmd, a->draft, true);
  cmd->callback([a]() {
    a->cap.check("generate", a->policy);
    if (a->cap.memory_cap && a->expert_parallel)
      throw InputError("[generate] --memory-cap with --expert-parallel: choose one (a rank already holds only its experts)");
    if ((!a->slow_rank.empty() || !a->ep_stats.empty() || a->placement != "contiguous") && !a->expert_parallel)
      throw InputError("[generate] --slow-rank, --ep-stats and --placement need --expert-parallel");
    if (a->placement != "contiguous" && a->placement != "eplb" && a->placement != "speed" && a->placement != "search")
      throw InputError(fmt::format("[generate] unknown --placement '{}' (contiguous, eplb, speed, search)", a->placement));
    if (a->replan_every > 0 && a->placement != "eplb" && a->placement != "speed")
      throw InputError("[generate] --replan-every places the experts again with --placement eplb or speed");
    if ((a->placement == "eplb" || a->placement == "speed") != !a->placement_loads.empty())
      throw InputError("[generate] --placement eplb and speed take their loads from --placement-loads (and only they do)");
    if ((a->placement == "search") != !a->placement_trace.empty())
      throw InputError("[generate] --placement search plans on --placement-trace (and only it does)");
    if (a->router != "even" && a->router != "balanced")
      throw InputError(fmt::format("[generate] unknown --router '{}' (even, balanced)", a->router));
    if (a->router == "balanced" && a->placement == "contiguous")
      throw InputError("[generate] --router balanced splits replicated experts' rows: use --placement eplb or speed");
    if (!a->ep_cost.empty() && a->router != "balanced" && a->placement != "search" && !a->move_aware)
      throw InputError("[generate] --ep-cost is for --router balanced, --placement search and --move-aware");
    if (a->move_aware && a->replan_every == 0) throw InputError("[generate] --move-aware weighs --replan-every's moves");
    if (a->router == "balanced" && a->data_parallel)
      throw InputError("[generate] --router balanced with --data-parallel: each rank sees only its own tokens' loads");
    if (!a->rank_speeds.empty() && a->placement != "speed" && a->placement != "search")
      throw InputError("[generate] --rank-speeds is for --placement speed and search");
    if (a->data_parallel) {
      if (!a->expert_parallel) throw InputError("[generate] --data-parallel is the attention of --expert-parallel");
      if (a->echo || !a->draft.spec.empty() || !a->prefix_cache_dir.empty() || !a->router_stats.empty() ||
          !a->routing_trace.empty() || a->replan_every > 0)
        throw InputError("[generate] --data-parallel runs one plain sample per rank: not with --echo, --draft, "
                         "--prefix-cache-dir, --router-stats, --routing-trace or --replan-every");
    }
    if (a->expert_parallel && !a->disaggregate.empty())
      throw InputError("[generate] --expert-parallel with --disaggregate: choose one (both use the MPI ranks)");
    if (!a->disaggregate.empty() && a->disaggregate != "in-process" && a->disaggregate != "shm" && a->disaggregate != "mpi")
      throw InputError(fmt::format("[generate] unknown --disaggregate transport '{}' (in-process, shm, mpi)", a->disaggregate));
    if (a->rank != 0 && (a->disaggregate != "shm" || a->shm_name.empty()))
      throw InputError("[generate] --rank is for the decode worker `--disaggregate shm` starts");
    a->draft.check("generate");
    const serve::ActivationArena arena = serve::activation_arena_from_name(a->activation_arena);
    if (!a->system.empty() && !a->chat) throw InputError("[generate] --system needs --chat");
    if (a->top_logprobs && !a->json) throw InputError("[generate] --top-logprobs needs --json");
    if (a->echo && !a->json) throw InputError("[generate] --echo needs --json");
    std::optional<serve::StopStrings> stop;
    if (!a->stops.empty()) stop.emplace(a->stops);
    serve::SamplingParams sampling;
    sampling.temperature = a->temperature;
    sampling.top_k = a->top_k;
    sampling.top_p = a->top_p;
    sampling.min_p = a->min_p;
    sampling.seed = a->seed;
    sampling.validate();
    // Load and prepare every weight up front (not inside the first request's prefill), timed
    // apart from the request.
    const auto load_start = Clock::now();
    model::LoadedModel loaded = a->cap.load(a->model, a->policy);
    {
      const bool tty = ::isatty(::fileno(stderr)) != 0;
      bool drawn = false;
      loaded.model.prepare_weights([&](int64_t done, int64_t total) {
        if (!tty || seconds_since(load_start) < 0.5) return;
        std::fprintf(stderr, "\r[generate] preparing weights %lld/%lld",
                     static_cast<long long>(done), static_cast<long long>(total));
        drawn = true;
      });
      if (drawn) std::fputc('\n', stderr);
    }
    const double load_seconds = seconds_since(load_start);
    if (!loaded.source.tokenizer)
      throw InputError(fmt::format("[generate] {}: the model has no tokenizer", a->model));
    const io::Tokenizer& tokenizer = *loaded.source.tokenizer;
    std::string text = a->prompt;
    if (a->chat) {
      serve::ChatOptions chat;
      if (!a->system.empty()) chat.system = a->system;
      chat.enable_thinking = !a->no_think;
      text = serve::render_chat(loaded.source.chat_template, a->prompt, chat);
    }
    serve::Request request;
    request.prompt = tokenizer.encode_for_model(text);  // BOS where the vocabulary adds one
    request.sampling = sampling;
    request.max_tokens = a->max_tokens;
    request.stop_tokens = loaded.source.stop_token_ids;
    request.top_logprobs = a->top_logprobs.value_or(0);
    request.prompt_logprobs = a->echo;
    if (request.prompt.empty()) throw InputError("[generate] the prompt encodes to no tokens");

    if (!a->router_stats.empty()) {
      if (!loaded.model.config().moe())
        throw InputError(fmt::format("[generate] --router-stats: {} is a {}, which has no router (Qwen3-MoE "
                                     "models do)", a->model, loaded.model.config().architecture));
      loaded.model.set_router_stats(true);
    }
    if (!a->routing_trace.empty()) {
      if (!loaded.model.config().moe())
        throw InputError(fmt::format("[generate] --routing-trace: {} is a {}, which has no router (Qwen3-MoE "
                                     "models do)", a->model, loaded.model.config().architecture));
      loaded.model.set_router_trace(true);
    }
    const bool recurrent = loaded.model.config().recurrent();
    if (!recurrent && (a->depth || a->exit_kl || a->max_depth || a->kv_core_slots))
      throw InputError(fmt::format("[generate] --depth, --exit-kl, --max-depth and --kv-core-slots are for a "
                                   "depth-recurrent model; {} is a {}", a->model, loaded.model.config().architecture));
    if (a->max_depth && !a->exit_kl) throw InputError("[generate] --max-depth needs --exit-kl");
    int64_t prefill_chunk = a->prefill_chunk;
    if (recurrent) {
      if (a->depth) loaded.model.set_depth(*a->depth);
      if (a->exit_kl) {
        loaded.model.set_adaptive_exit(model::Model::AdaptiveExit{*a->exit_kl, a->max_depth.value_or(0)});
        prefill_chunk = 1;  // adaptive exit decides per token
      }
    }
    std::shared_ptr<model::ExpertParallel> ep;
    int64_t expert_bytes_all = 0;  // every expert's weights, before a rank releases the others'
    if (a->expert_parallel) {
      if (!loaded.model.config().moe())
        throw InputError(fmt::format("[generate] --expert-parallel: {} is a {}, which has no experts", a->model,
                                     loaded.model.config().architecture));
      if (a->data_parallel) {  // before MPI starts: a refusal then needs no job to end
        if (!serve::rows_quantize_alone(loaded.model.policy()))
          throw InputError(fmt::format("[generate] --data-parallel batches each expert's rows from every rank, and the {} "
                                       "policy quantizes rows with a shared scale (the bits would change)",
                                       loaded.model.policy().name));
        if (recurrent) throw InputError("[generate] --data-parallel: a depth-recurrent model's passes differ in depth");
      }
      ep = rl::make_mpi_expert_parallel();
      SlowRank slow;  // --slow-rank's rank and factor
      if (!a->slow_rank.empty()) {
        slow = parse_slow_rank("generate", a->slow_rank, ep->ranks);
        if (slow.rank == ep->rank) ep->slow_factor = slow.factor;
      }
      if (a->placement != "contiguous") {
        const model::ModelConfig& mc = loaded.model.config();
        if (!serve::rows_quantize_alone(loaded.model.policy()))
          throw InputError(fmt::format("[generate] --placement {} splits a replicated expert's rows, and the {} policy "
                                       "quantizes rows with a shared scale (the bits would change): use the contiguous "
                                       "placement", a->placement, loaded.model.policy().name));
        const int64_t slots = a->slots_per_rank > 0 ? a->slots_per_rank : (mc.num_experts + ep->ranks - 1) / ep->ranks + 1;
        std::vector<double> speeds(static_cast<size_t>(ep->ranks), 1.0);
        if (!a->rank_speeds.empty()) {
          if (static_cast<int>(a->rank_speeds.size()) != ep->ranks)
            throw InputError(fmt::format("[generate] --rank-speeds has {} speeds for {} ranks", a->rank_speeds.size(),
                                         ep->ranks));
          speeds = a->rank_speeds;
        } else if (slow.rank >= 0) {
          speeds[static_cast<size_t>(slow.rank)] = 1.0 / slow.factor;
        }
        const serve::epsim::CostModel cost =
            a->ep_cost.empty() ? serve::epsim::default_gpu_cost() : read_ep_cost(a->ep_cost, "generate");
        const serve::epsim::Router router =
            a->router == "balanced" ? serve::epsim::Router::balanced : serve::epsim::Router::even;
        if (a->placement == "search") {  // planned on the trace's passes, per MoE application
          const serve::epsim::Trace trace = serve::epsim::read_trace(a->placement_trace);
          if (trace.experts != mc.num_experts)
            throw InputError(fmt::format("[generate] --placement-trace {}: a trace of {} experts, the model has {}",
                                         a->placement_trace, trace.experts, mc.num_experts));
          const std::vector<serve::epsim::Batch> passes = serve::epsim::passes_of(trace);
          const std::vector<std::vector<double>> trace_loads = serve::epsim::layer_loads(passes);
          const bool uneven = std::any_of(speeds.begin(), speeds.end(), [&](double v) { return v != speeds[0]; });
          ep->rank_experts.assign(static_cast<size_t>(mc.applications()), {});
          for (int64_t application = 0; application < mc.applications(); ++application) {
            if (!mc.is_moe_layer(mc.block_of(application))) continue;
            size_t layer = trace.layers.size();
            for (size_t l = 0; l < trace.layers.size(); ++l)
              if (trace.layers[l].application == application) layer = l;
            if (layer == trace.layers.size())
              throw InputError(fmt::format("[generate] --placement-trace {}: no routing of MoE application {}",
                                           a->placement_trace, application));
            std::vector<std::vector<int64_t>> plan_counts;
            for (const serve::epsim::Batch& b : passes) plan_counts.push_back(b.counts[layer]);
            const serve::eplb::Placement start = uneven ? serve::eplb::speed_aware(trace_loads[layer], speeds, slots)
                                                        : serve::eplb::eplb(trace_loads[layer], ep->ranks, slots);
            ep->rank_experts[static_cast<size_t>(application)] = serve::eplb::rank_slots(serve::epsim::tail_search(
                start, plan_counts, speeds, cost, router, 400, static_cast<uint64_t>(application)));
          }
        }
        const std::map<int64_t, std::vector<double>> loads =
            a->placement == "search" ? std::map<int64_t, std::vector<double>>{}
                                     : read_router_loads(a->placement_loads, "--placement-loads");
        // Each MoE application's placement from its loads: per rank, the experts on its slots.
        auto place = [&mc, ranks = ep->ranks, slots, speeds, policy = a->placement](
                         const std::map<int64_t, std::vector<double>>& by_app, const std::string& source) {
          std::vector<std::vector<std::vector<int64_t>>> out(static_cast<size_t>(mc.applications()));
          for (int64_t application = 0; application < mc.applications(); ++application) {
            if (!mc.is_moe_layer(mc.block_of(application))) continue;
            const auto it = by_app.find(application);
            if (it == by_app.end() || static_cast<int64_t>(it->second.size()) != mc.num_experts)
              throw InputError(fmt::format("{}: no loads of {} experts for MoE application {}", source, mc.num_experts,
                                           application));
            const serve::eplb::Placement pl = policy == "eplb" ? serve::eplb::eplb(it->second, ranks, slots)
                                                               : serve::eplb::speed_aware(it->second, speeds, slots);
            out[static_cast<size_t>(application)] = serve::eplb::rank_slots(pl);
          }
          return out;
        };
        if (a->placement != "search") ep->rank_experts = place(loads, a->placement_loads);
        if (a->router == "balanced") {
          ep->split = [current = ep.get(), speeds, cost](int64_t application, const std::vector<int64_t>& counts) {
            return serve::epsim::row_shares(current->rank_experts[static_cast<size_t>(application)], counts, speeds, cost,
                                            serve::epsim::Router::balanced);
          };
        }
        if (a->replan_every > 0) {
          if (mc.applications() != mc.num_hidden_layers)
            throw InputError("[generate] --replan-every: a model whose blocks run more than once moves experts per block, "
                             "not per application");
          ep->replan_every = a->replan_every;
          // --move-aware: a layer's move pays when the last window's rows would have taken less time
          // under the new placement by more than its experts' transfer takes (fp32 values: gate, up
          // and down, 3·F·C floats an expert; the link at the cost model's exchange per row of C
          // floats, and a message per expert). Deterministic: every rank decides from the same
          // (replicated) counts and constants.
          const double expert_bytes = 3.0 * static_cast<double>(mc.moe_intermediate_size * mc.hidden_size) * 4.0;
          const double byte_s = cost.exchange_row_s / (4.0 * static_cast<double>(mc.hidden_size));
          ep->plan = [place, current = ep.get(), movable = a->placement == "eplb", move_aware = a->move_aware, speeds, cost,
                      router, expert_bytes, byte_s](const std::vector<std::vector<int64_t>>& window) {
            std::map<int64_t, std::vector<double>> by_app;
            for (size_t i = 0; i < window.size(); ++i)
              if (!window[i].empty()) by_app[static_cast<int64_t>(i)] = std::vector<double>(window[i].begin(), window[i].end());
            std::vector<std::vector<std::vector<int64_t>>> next = place(by_app, "the tokens routed since the last placement");
            // EPLB's ranks are interchangeable (equal speeds): each new rank's slots go to the rank
            // that already holds most of them, so fewer experts move.
            if (movable)
              for (size_t i = 0; i < next.size(); ++i)
                if (!next[i].empty()) next[i] = keep_most(current->rank_experts[i], std::move(next[i]));
            if (move_aware)
              for (size_t i = 0; i < next.size(); ++i) {
                if (next[i].empty() || window[i].empty()) continue;
                const std::vector<std::vector<int64_t>>& now = current->rank_experts[i];
                int64_t moves = 0;
                for (size_t q = 0; q < next[i].size(); ++q)
                  for (int64_t e : next[i][q])
                    if (std::find(now[q].begin(), now[q].end(), e) == now[q].end()) ++moves;
                if (moves == 0) continue;
                const double saved =
                    serve::epsim::layer_time_of_slots(now, window[i], speeds, cost, router).layer_s -
                    serve::epsim::layer_time_of_slots(next[i], window[i], speeds, cost, router).layer_s;
                const double move = static_cast<double>(moves) * (cost.exchange_pass_s + expert_bytes * byte_s);
                if (saved <= move) {
                  next[i] = now;
                  ++current->placements_kept;
                }
              }
            return next;
          };
        }
      }
      if (a->data_parallel) {
        ep->data_parallel = true;
        request.sampling.seed = a->seed + static_cast<uint64_t>(ep->rank);  // each rank its own sample
      }
      expert_bytes_all = loaded.model.expert_bytes_held();
      try {
        hold_own_experts(loaded.model, *ep, a->replan_every > 0);
      } catch (const InputError& e) {
        throw InputError(fmt::format("[generate] {}", e.what()));
      }
      loaded.model.set_expert_parallel(ep);
      if (ep->rank != 0 && std::freopen("/dev/null", "w", stdout) == nullptr)
        throw InputError("[generate] --expert-parallel: cannot quiet a rank's stdout");
    }
    serve::Engine engine(loaded.model, {.max_sequences = 1, .prefill_chunk = prefill_chunk,
                                        .kv_core_slots = a->kv_core_slots.value_or(0), .activation_arena = arena});
    if (!a->prefix_cache_dir.empty()) {
      if (recurrent) throw InputError("[generate] --prefix-cache-dir: a depth-recurrent model's state is not only KV rows");
      serve::PrefixCacheOptions o;
      o.dir = a->prefix_cache_dir;
      o.block = serve::rows_quantize_alone(loaded.model.policy()) ? 64 : prefill_chunk;
      engine.set_prefix_cache(std::make_shared<serve::PrefixCache>(
          loaded.model.config(), serve::PrefixCache::fingerprint_of(loaded.model), o));
    }
    if (!a->disaggregate.empty()) {
      if (recurrent) throw InputError("[generate] --disaggregate: a depth-recurrent model's state is not only KV rows");
      if (a->echo) throw InputError("[generate] --disaggregate with --echo: scoring the prompt needs every prompt row's logits "
                                    "on the decode worker");
      const int64_t align = serve::rows_quantize_alone(loaded.model.policy()) ? 1 : prefill_chunk;
      const int64_t block = serve::rows_quantize_alone(loaded.model.policy()) ? 64 : prefill_chunk;
      const uint64_t fingerprint = serve::PrefixCache::fingerprint_of(loaded.model);
      // A memory cache that keeps one prompt's rows whole (no eviction).
      auto hand_over_cache = [&] {
        serve::PrefixCacheOptions o;
        o.block = block;
        o.max_bytes = size_t{1} << 40;
        return std::make_shared<serve::PrefixCache>(loaded.model.config(), fingerprint, o);
      };
      if (!engine.prefix_cache()) engine.set_prefix_cache(hand_over_cache());  // the decode worker's
      // The prefill worker: an engine of its own with a memory cache, the prompt run (its one
      // sampled token dropped), its rows exported as one message.
      auto prefill = [&]() {
        const auto t0 = Clock::now();
        serve::Engine worker(loaded.model, engine.options());
        auto cache = hand_over_cache();
        worker.set_prefix_cache(cache);
        serve::Request r = request;
        r.max_tokens = 1;
        r.top_logprobs = 0;
        (void)worker.generate({r});
        std::vector<uint8_t> message = cache->export_prompt(request.prompt, align);
        const serve::EngineStats& ws = worker.stats();
        std::fprintf(stderr, "%s\n",
                     fmt::format("[generate] prefill worker: {} prompt tokens, prefill {:.1f} tok/s, {:.2f} s; hand-over "
                                 "{:.2f} MiB ({} snapshot records)",
                                 request.prompt.size(), ws.prefill_seconds > 0 ? static_cast<double>(ws.prefill_tokens) / ws.prefill_seconds : 0.0,
                                 seconds_since(t0), static_cast<double>(message.size()) / (1024.0 * 1024.0),
                                 cache->stats().stored)
                         .c_str());
        return message;
      };
      auto take = [&](const rl::WeightMessage& m, const std::string& how, double seconds) {
        const int64_t records = engine.prefix_cache()->import_prompt(m.payload, "the hand-over from the prefill worker");
        std::fprintf(stderr, "%s\n",
                     fmt::format("[generate] decode worker: took {} snapshot records ({:.2f} MiB) over {}, {:.1f} ms after it "
                                 "asked (the prefill included where it ran beside)",
                                 records, static_cast<double>(m.payload.size()) / (1024.0 * 1024.0), how, 1e3 * seconds)
                         .c_str());
      };
      if (a->disaggregate == "in-process") {
        auto channel = rl::make_in_process_channel();
        const std::vector<uint8_t> message = prefill();
        const auto t0 = Clock::now();
        channel->publish(1, message);
        const rl::WeightMessage m = channel->receive();
        take(m, "in-process", seconds_since(t0));
      } else if (a->disaggregate == "shm") {
        if (a->rank == 0) {
          const std::string name = a->shm_name.empty() ? rl::default_shm_name() : a->shm_name;
          rl::ShmOptions o;
          o.capacity = hand_over_capacity(loaded.model.config(), static_cast<int64_t>(request.prompt.size()), block);
          o.rollout_capacity = 64;
          auto channel = rl::make_shm_channel(name, 0, 1, o);
          std::vector<std::string> args = own_command_line();
          args.insert(args.end(), {"--shm-name", name});
          rl::SamplerProcesses decoder = rl::spawn_samplers(args, 1);  // it loads while this one prefills
          const std::vector<uint8_t> message = prefill();
          channel->publish(1, message);
          decoder.wait(24 * 3600.0);
          return;  // the decode worker printed the text
        }
        rl::ShmOptions o;  // capacities 0: the prefill worker's
        auto channel = rl::make_shm_channel(a->shm_name, 1, 1, o);
        const auto t0 = Clock::now();
        const rl::WeightMessage m = channel->receive();
        take(m, "shared memory", seconds_since(t0));
      } else {  // mpi: every rank runs this command; an error on one ends the job (rl/channel.h)
        try {
          auto channel = rl::make_mpi_channel();
          if (channel->samplers() != 1)
            throw InputError(fmt::format("[generate] --disaggregate mpi runs on 2 ranks (mpirun -np 2), not {}",
                                         channel->samplers() + 1));
          if (channel->rank() == 0) {
            const std::vector<uint8_t> message = prefill();
            channel->publish(1, message);
            return;
          }
          const auto t0 = Clock::now();
          const rl::WeightMessage m = channel->receive();
          take(m, "MPI", seconds_since(t0));
        } catch (const InputError& e) {
          std::fprintf(stderr, "concord: %s\n", e.what());
          rl::mpi_abort(2);
        }
      }
    }
    if (!a->draft.spec.empty()) {
      if (recurrent && a->exit_kl)
        throw InputError("[generate] --draft with --exit-kl: adaptive exit decodes one token per forward");
      engine.set_drafter(make_drafter(a->draft, loaded, a->model, 1, engine.options().max_context),
                         a->draft.options());
    }
    serve::Utf8Stream out;
    std::string generated;  // --json: the whole text
    // Text through the UTF-8 stream, then the stop strings; streamed, or kept for --json.
    const bool data_parallel = ep && ep->data_parallel;  // every rank's output printed by rank 0 at the end
    auto emit = [&](std::string piece) {
      if (stop) piece = stop->push(piece);
      if (a->json || data_parallel) {
        generated += piece;
      } else {
        std::fwrite(piece.data(), 1, piece.size(), stdout);
        std::fflush(stdout);
      }
    };
    double first_token_seconds = -1;
    const auto request_start = Clock::now();
    model::ExpertPager* pager = loaded.model.expert_pager();
    model::ExpertPagingStats paging_start, paging_prefill;  // the pager's counters before and after the prefill
    if (pager) paging_start = paging_prefill = pager->stats();
    engine.set_token_callback([&](const serve::TokenEvent& event) {
      const int32_t token = event.token;
      if (first_token_seconds < 0) {
        first_token_seconds = seconds_since(request_start);
        if (pager) paging_prefill = pager->stats();
      }
      if (tokenizer.is_special(token)) return;  // stop tokens and other control tokens
      if (stop && stop->stopped()) return;
      emit(out.push(tokenizer.token_bytes(token)));
      // The token that completed a stop string is the completion's last.
      if (stop && stop->stopped()) engine.cancel(event.id);
    });
    const int64_t id = engine.submit(request);
    if (data_parallel) {
      // The ranks in step: a pass each while any rank has work; a rank whose sample has ended joins
      // the others' MoE layers with idle passes.
      while (true) {
        const bool mine = engine.running() + engine.waiting() > 0;
        if (!rl::mpi_any(mine)) break;
        if (mine) {
          engine.step();
        } else {
          loaded.model.expert_parallel_idle_pass();
        }
      }
    } else {
      engine.run();
    }
    const serve::Completion done = engine.take(id);
    emit(out.flush());
    if (stop) emit(stop->flush());
    const bool stopped_by_string = stop && stop->stopped();
    if (a->json) {
      // OpenAI's reasons: a stop token or string is "stop"; max_tokens and a full context "length".
      const bool stopped = stopped_by_string || done.finish == serve::FinishReason::stop;
      nlohmann::ordered_json j;
      j["prompt_tokens"] = request.prompt;
      j["tokens"] = done.tokens;
      j["text"] = generated;
      j["logprobs"] = done.logprobs;
      if (a->top_logprobs) j["top_logprobs"] = top_json(done.top_logprobs);
      j["finish_reason"] = stopped ? "stop" : "length";
      if (a->echo) {
        j["prompt_logprobs"] = done.prompt_logprobs;
        if (a->top_logprobs) j["prompt_top_logprobs"] = top_json(done.prompt_top_logprobs);
      }
      if (pager) {
        pager->drain();
        const model::ExpertPagingStats end = pager->stats();
        j["memory_cap"] = {{"cap_bytes", end.cap},
                           {"expert_bytes", end.expert_bytes},
                           {"high_water_bytes", end.high_water},
                           {"pinned", end.pinned},
                           {"pinned_bytes", end.pinned_bytes},
                           {"prefetch", pager->prefetch()},
                           {"prefill", paging_json(paging_delta(paging_prefill, paging_start))},
                           {"decode", paging_json(paging_delta(end, paging_prefill))}};
        const serve::EngineStats& es = engine.stats();
        j["memory_cap"]["prefill"]["tokens"] = es.prefill_tokens;
        j["memory_cap"]["prefill"]["seconds"] = es.prefill_seconds;
        j["memory_cap"]["decode"]["tokens"] = es.decode_tokens;
        j["memory_cap"]["decode"]["seconds"] = es.decode_seconds;
      }
      const std::string line = j.dump();
      if (data_parallel) {
        generated = line;
      } else {
        std::fwrite(line.data(), 1, line.size(), stdout);
      }
    }
    if (data_parallel) {  // rank 0 prints each rank's text or JSON line, in rank order
      for (const std::string& output : rl::mpi_gather_strings(generated)) {
        std::fwrite(output.data(), 1, output.size(), stdout);
        std::fputc('\n', stdout);
      }
    } else {
      std::fputc('\n', stdout);
    }
    std::fflush(stdout);

    if (!a->router_stats.empty()) {
      // {"model", "tokens": rows routed per layer, "layers": [{"application", "block",
      // "tokens_per_expert"}]}: the prompt's rows and every generated token's.
      const model::Model::RouterStats stats = loaded.model.router_stats();
      const model::ModelConfig& c = loaded.model.config();
      nlohmann::ordered_json j;
      j["model"] = a->model;
      j["num_experts"] = c.num_experts;
      j["num_experts_per_tok"] = c.num_experts_per_tok;
      j["tokens"] = stats.rows;
      j["layers"] = nlohmann::ordered_json::array();
      for (size_t application = 0; application < stats.counts.size(); ++application) {
        if (stats.counts[application].empty()) continue;
        j["layers"].push_back({{"application", application}, {"block", c.block_of(static_cast<int64_t>(application))},
                               {"tokens_per_expert", stats.counts[application]}});
      }
      io::write_file_atomic(a->router_stats, j.dump(1) + "\n");
    }
    if (!a->routing_trace.empty() && (!ep || ep->rank == 0)) {
      const model::Model::RouterTrace& rt = loaded.model.router_trace();
      const model::ModelConfig& c = loaded.model.config();
      serve::epsim::Trace trace;
      trace.experts = c.num_experts;
      trace.top_k = c.num_experts_per_tok;
      for (size_t application = 0; application < rt.selected.size(); ++application)
        if (!rt.pass_rows[application].empty())
          trace.layers.push_back({static_cast<int64_t>(application), rt.selected[application], rt.pass_rows[application]});
      serve::epsim::write_trace(a->routing_trace, trace, a->model);
    }
    if (ep) {
      report_expert_parallel(*ep, loaded.model.config(), a->ep_stats, loaded.model.expert_bytes_held(), expert_bytes_all);
      if (ep->rank != 0) return;  // rank 0 reports the run
    }
    const serve::EngineStats& s = engine.stats();
    auto rate = [](int64_t n, double sec) { return sec > 0 ? static_cast<double>(n) / sec : 0.0; };
    std::fprintf(stderr, "%s\n",
                 fmt::format("load: {:.2f} s, prompt tokens: {}, prefill: {:.1f} tok/s, time to "
                             "first token: {:.0f} ms, generated tokens: {} ({}), decode: {:.1f} "
                             "tok/s [{}], activation arena: {} {:.2f} MiB{}{}",
                             load_seconds, request.prompt.size(),
                             rate(s.prefill_tokens, s.prefill_seconds),
                             1e3 * std::max(first_token_seconds, 0.0), done.tokens.size(),
                             stopped_by_string ? "stop" : serve::finish_reason_name(done.finish),
                             rate(s.decode_tokens, s.decode_seconds), loaded.model.policy().name,
                             s.activation_plans > 0 ? "planned" : "bump",
                             static_cast<double>(s.activation_arena_bytes) / (1024.0 * 1024.0),
                             s.activation_plans > 0 ? fmt::format(" ({} step plans)", s.activation_plans) : std::string(),
                             engine.prefix_cache()
                                 ? fmt::format(", prefix cache: {} prompt tokens resumed", s.prefix_reused_tokens)
                                 : std::string())
                     .c_str());
    if (pager) {
      pager->drain();
      const model::ExpertPagingStats end = pager->stats();
      auto mib = [](int64_t b) {
        return b < (1 << 20) ? fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024.0)
                             : fmt::format("{:.2f} MiB", static_cast<double>(b) / (1024.0 * 1024.0));
      };
      std::fprintf(stderr, "%s\n",
                   fmt::format("memory cap: {} of {} of expert blocks ({:.0f}%), held at most {}; {} experts pinned ({}); "
                               "prefetch {}",
                               mib(end.cap), mib(end.expert_bytes),
                               100.0 * static_cast<double>(end.cap) / static_cast<double>(end.expert_bytes),
                               mib(end.high_water), end.pinned, mib(end.pinned_bytes), pager->prefetch() ? "on" : "off")
                       .c_str());
      std::fprintf(stderr, "%s\n", ("  prefill: " + paging_line(paging_delta(paging_prefill, paging_start))).c_str());
      std::fprintf(stderr, "%s\n", ("  decode:  " + paging_line(paging_delta(end, paging_prefill))).c_str());
    }
    if (!a->draft.spec.empty()) {
      const serve::SpeculationStats& sp = s.speculation;
      std::string by_position;
      for (size_t i = 0; i < sp.verified_at.size(); ++i)
        by_position += fmt::format("{}{:.3f}", i ? " " : "",
                                   sp.verified_at[i] ? static_cast<double>(sp.accepted_at[i]) / static_cast<double>(sp.verified_at[i]) : 0.0);
      std::fprintf(stderr, "%s\n",
                   fmt::format("speculation: drafter {}, {} draft tokens{}: {} verifications, {} of {} drafts accepted "
                               "({:.1f}%), {:.2f} tokens per verification",
                               a->draft.spec, a->draft.tokens, a->draft.adaptive ? " (adaptive)" : "", sp.rounds, sp.accepted,
                               sp.drafted, sp.drafted ? 100.0 * static_cast<double>(sp.accepted) / static_cast<double>(sp.drafted) : 0.0,
                               sp.rounds ? static_cast<double>(sp.emitted) / static_cast<double>(sp.rounds) : 0.0)
                       .c_str());
      if (a->draft.stats) {
        std::string alpha;
        for (size_t i = 0; i < sp.alpha_at.size(); ++i)
          alpha += fmt::format("{}{:.3f}", i ? " " : "",
                               sp.verified_at[i] ? sp.alpha_at[i] / static_cast<double>(sp.verified_at[i]) : 0.0);
        std::fprintf(stderr, "%s\n", fmt::format("acceptance by draft position: {}", by_position).c_str());
        std::fprintf(stderr, "%s\n", fmt::format("expected (mean α = Σ min(p, q)):  {}", alpha).c_str());
        std::fprintf(stderr, "%s\n", fmt::format("drafter: {} tokens proposed in {:.3f} s ({:.2f} ms per token); decode "
                                                 "steps: {} tokens in {:.3f} s, {} of them from verifications",
                                                 sp.proposed, sp.draft_seconds,
                                                 sp.proposed ? 1e3 * sp.draft_seconds / static_cast<double>(sp.proposed) : 0.0,
                                                 s.decode_tokens, s.decode_seconds, sp.emitted)
                                         .c_str());
        if (sp.contract_checked > 0)
          std::fprintf(stderr, "%s\n", fmt::format("contract link α >= 1 - tanh(osc/4): {} positions, {} violations, "
                                                   "min slack {:.3g}", sp.contract_checked, sp.contract_violations,
                                                   sp.contract_min_slack).c_str());
      }
    }
    if (recurrent && s.iterated_tokens > 0)
      std::fprintf(stderr, "%s\n",
                   fmt::format("depth: {} core iterations per token{} ({:.2f} on average over {} tokens)",
                               a->exit_kl ? fmt::format("at most {}", a->max_depth.value_or(loaded.model.depth()))
                                          : std::to_string(loaded.model.depth()),
                               a->exit_kl ? fmt::format(", adaptive exit at KL < {:g}", *a->exit_kl) : "",
                               static_cast<double>(s.core_iterations) / static_cast<double>(s.iterated_tokens),
                               s.iterated_tokens)
                       .c_str());
  });
}

}  // namespace concord::cli
