// `concord ep-sim`: expert-parallel MoE layers simulated at 8-256 ranks (issue 23; docs/moe.md
// "Simulated scale"), driven by recorded routing traces or a Zipf-skewed bursty router, under the
// placements of serve/eplb.h and the two routers among replicas; and `--calibrate`, which fits
// the simulator's cost model to real `mpirun ... concord generate --expert-parallel` runs and
// states how well it predicts them.
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/audit/svg.h"
#include "concord/cli/commands.h"
#include "concord/cli/expert_parallel.h"
#include "concord/cli/flags.h"
#include "concord/io/atomic_file.h"
#include "concord/io/json_file.h"
#include "concord/numerics/check.h"
#include "concord/serve/ep_sim.h"
#include "concord/serve/eplb.h"

namespace concord::cli {
namespace {

using nlohmann::ordered_json;
namespace epsim = serve::epsim;
namespace eplb = serve::eplb;

struct Args {
  std::vector<std::string> traces, runs;
  std::optional<double> zipf;
  int64_t experts = 256, top_k = 8, layers = 8, batches = 200, plan_batches = 50, fit_runs = 1, search_tries = 400;
  std::optional<int64_t> tokens, slots_per_rank;
  double burst = 0.5;
  std::string batching = "random", slow_rank, policies, cost, cost_out, json, exchange, html;
  std::vector<int32_t> ranks = {8, 64, 256};
  uint64_t seed = 1;
  bool calibrate = false;
};

ordered_json cost_json(const epsim::CostModel& c) {
  return {{"pass_s", c.pass_s},
          {"piece_s", c.piece_s},
          {"row_s", c.row_s},
          {"exchange_pass_s", c.exchange_pass_s},
          {"exchange_row_s", c.exchange_row_s},
          {"exchange", c.alltoall ? "alltoall" : "allgather"}};
}

// A table printed as Markdown on stdout as it grows, and kept for the --html report.
struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  explicit Table(std::vector<std::string> h) : header(std::move(h)) {
    std::string line = "|", rule = "|";
    for (const std::string& x : header) {
      line += " " + x + " |";
      rule += "---|";
    }
    std::printf("%s\n%s\n", line.c_str(), rule.c_str());
  }
  void row(std::vector<std::string> cells) {
    cells.resize(header.size());
    std::string line = "|";
    for (const std::string& x : cells) line += " " + x + " |";
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    rows.push_back(std::move(cells));
  }
  std::string html() const {
    std::string out = "<table><tr>";
    for (const std::string& x : header) out += "<th>" + audit::html_escape(x) + "</th>";
    out += "</tr>\n";
    for (const auto& r : rows) {
      out += "<tr>";
      for (const std::string& x : r) out += "<td>" + audit::html_escape(x) + "</td>";
      out += "</tr>\n";
    }
    return out + "</table>\n";
  }
};

void write_html(const std::string& path, const std::string& title, const std::string& intro, const std::string& body) {
  io::write_file_atomic(path, fmt::format("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{0}</title><style>{1}"
                                          "</style></head><body>\n<h1>{0}</h1>\n<p>{2}</p>\n{3}</body></html>\n",
                                          audit::html_escape(title), audit::report_style(), audit::html_escape(intro), body));
}

void calibrate(const Args& a) {
  if (a.runs.size() % 2 != 0) throw InputError("[ep-sim] --run takes two files: EP_STATS TRACE");
  std::vector<epsim::MeasuredRun> runs;
  for (size_t i = 0; i < a.runs.size(); i += 2) {
    epsim::MeasuredRun r;
    r.name = a.runs[i];
    r.records = epsim::read_ep_stats(a.runs[i]);
    r.trace = epsim::read_trace(a.runs[i + 1]);
    runs.push_back(std::move(r));
  }
  if (a.fit_runs > static_cast<int64_t>(runs.size()))
    throw InputError(fmt::format("[ep-sim] --fit-runs {}: only {} runs given", a.fit_runs, runs.size()));
  const epsim::CostModel cost = epsim::fit(std::span<const epsim::MeasuredRun>(runs.data(), static_cast<size_t>(a.fit_runs)));
  std::printf("%s\n", fmt::format("cost model fitted on {} run(s): pass {:.2f} us, piece {:.2f} us, row {:.3f} us; exchange "
                                  "{:.2f} us + {:.4f} us a received row",
                                  a.fit_runs, 1e6 * cost.pass_s, 1e6 * cost.piece_s, 1e6 * cost.row_s,
                                  1e6 * cost.exchange_pass_s, 1e6 * cost.exchange_row_s)
                          .c_str());
  Table table({"run", "fit on it", "MoE layer", "measured ms", "predicted ms", "error"});
  std::string plots;
  std::vector<double> in_errors, out_errors;
  ordered_json lines = ordered_json::array();
  for (size_t i = 0; i < runs.size(); ++i) {
    const bool fitted = static_cast<int64_t>(i) < a.fit_runs;
    double measured = 0, predicted = 0;
    std::vector<double> mp, pp;  // every pass of every layer
    for (const epsim::Prediction& p : epsim::predict(runs[i], cost)) {
      mp.insert(mp.end(), p.measured_pass_s.begin(), p.measured_pass_s.end());
      pp.insert(pp.end(), p.predicted_pass_s.begin(), p.predicted_pass_s.end());
      const double err = p.measured_s > 0 ? p.predicted_s / p.measured_s - 1.0 : 0.0;
      (fitted ? in_errors : out_errors).push_back(std::abs(err));
      measured += p.measured_s;
      predicted += p.predicted_s;
      table.row({runs[i].name, fitted ? "yes" : "no", std::to_string(p.application), fmt::format("{:.2f}", 1e3 * p.measured_s),
                 fmt::format("{:.2f}", 1e3 * p.predicted_s), fmt::format("{:+.1f}%", 100 * err)});
      lines.push_back({{"run", runs[i].name}, {"fitted", fitted}, {"application", p.application},
                       {"measured_s", p.measured_s}, {"predicted_s", p.predicted_s}});
    }
    table.row({runs[i].name, fitted ? "yes" : "no", "all", fmt::format("{:.2f}", 1e3 * measured),
               fmt::format("{:.2f}", 1e3 * predicted), fmt::format("{:+.1f}%", measured > 0 ? 100 * (predicted / measured - 1) : 0.0)});
    if (!mp.empty()) {
      const double m50 = epsim::quantile(mp, 0.5), m99 = epsim::quantile(mp, 0.99);
      const double p50 = epsim::quantile(pp, 0.5), p99 = epsim::quantile(pp, 0.99);
      table.row({runs[i].name, fitted ? "yes" : "no", "p50 / p99 of a layer, us", fmt::format("{:.1f} / {:.1f}", 1e6 * m50, 1e6 * m99),
                 fmt::format("{:.1f} / {:.1f}", 1e6 * p50, 1e6 * p99),
                 fmt::format("{:+.1f}% / {:+.1f}%", 100 * (p50 / m50 - 1), 100 * (p99 / m99 - 1))});
      std::vector<audit::Series> series(2);
      series[0].name = "measured";
      series[1].name = "predicted";
      for (size_t k = 0; k < mp.size(); ++k) {
        series[0].x.push_back(static_cast<double>(k));
        series[0].y.push_back(1e6 * mp[k]);
        series[1].x.push_back(static_cast<double>(k));
        series[1].y.push_back(1e6 * pp[k]);
      }
      plots += "<figure>" +
               audit::svg_line_plot(series, {.title = runs[i].name + (fitted ? " (fitted on)" : " (predicted)"),
                                             .x_label = "pass of each MoE layer, layer after layer",
                                             .y_label = "layer time, us",
                                             .log_y = true}) +
               "</figure>\n";
      lines.push_back({{"run", runs[i].name}, {"fitted", fitted}, {"measured_p50_s", m50}, {"measured_p99_s", m99},
                       {"predicted_p50_s", p50}, {"predicted_p99_s", p99}});
    }
  }
  auto summary = [](std::vector<double> e) {
    if (e.empty()) return std::string("none");
    return fmt::format("median {:.1f}%, largest {:.1f}% over {} layers", 100 * epsim::quantile(e, 0.5),
                       100 * epsim::quantile(e, 1.0), e.size());
  };
  std::printf("%s\n", fmt::format("prediction error |predicted/measured - 1| per MoE layer: runs fitted on: {}; other runs: {}",
                                  summary(in_errors), summary(out_errors))
                          .c_str());
  if (!a.cost_out.empty()) io::write_file_atomic(a.cost_out, cost_json(cost).dump(1) + "\n");
  if (!a.html.empty())
    write_html(a.html, "concord ep-sim: the cost model against real expert-parallel runs",
               fmt::format("Fitted on the first {} run(s); the others predicted. Measured layer time: the slowest rank's "
                           "compute plus the least wait (the exchange after the last rank arrived).",
                           a.fit_runs),
               table.html() + plots);
  if (!a.json.empty()) io::write_file_atomic(a.json, ordered_json{{"cost", cost_json(cost)}, {"layers", lines}}.dump(1) + "\n");
}

// The ranks' speeds: 1, and 1/FACTOR for the --slow-rank.
std::vector<double> speeds_of(const std::string& slow_rank, int64_t ranks) {
  std::vector<double> speed(static_cast<size_t>(ranks), 1.0);
  if (slow_rank.empty()) return speed;
  const SlowRank slow = parse_slow_rank("ep-sim", slow_rank, ranks);
  speed[static_cast<size_t>(slow.rank)] = 1.0 / slow.factor;
  return speed;
}

void simulate(const Args& a) {
  // The batches to run and the planning window (other batches: what a serving system knew before).
  std::vector<epsim::Batch> run, plan;
  int64_t experts = 0;
  std::string source;
  if (a.zipf) {
    if (!a.traces.empty()) throw InputError("[ep-sim] --zipf or --trace, not both");
    const epsim::Zipf z{a.experts, a.top_k, a.layers, a.tokens.value_or(4096), *a.zipf, a.burst};
    run = epsim::zipf_batches(z, a.batches, a.seed);
    plan = epsim::zipf_batches(z, a.plan_batches, a.seed + 0x9E37);
    experts = z.experts;
    source = fmt::format("Zipf({}) router, {} experts top-{}, {} layers, burst {}, {} tokens a batch", *a.zipf, z.experts,
                         z.top_k, z.layers, z.burst, z.tokens);
  } else {
    if (a.traces.empty()) throw InputError("[ep-sim] give --trace FILE (concord generate --routing-trace) or --zipf SKEW");
    std::vector<epsim::Trace> ts;
    for (const std::string& t : a.traces) ts.push_back(epsim::read_trace(t));
    const epsim::Trace trace = epsim::concat(ts);
    experts = trace.experts;
    if (a.batching == "passes") {
      run = epsim::passes_of(trace);
      plan = run;
    } else {
      if (a.batching != "random" && a.batching != "contiguous")
        throw InputError(fmt::format("[ep-sim] unknown --batching '{}' (random, contiguous, passes)", a.batching));
      const bool contiguous = a.batching == "contiguous";
      const int64_t tokens = a.tokens.value_or(256);
      run = epsim::sample_batches(trace, tokens, a.batches, contiguous, a.seed);
      plan = epsim::sample_batches(trace, tokens, a.plan_batches, contiguous, a.seed + 0x9E37);
    }
    source = fmt::format("{} routing trace(s), {} tokens, {} experts top-{}, {} MoE layers; {} batches{}", a.traces.size(),
                         trace.tokens(), trace.experts, trace.top_k, trace.layers.size(), a.batching,
                         a.batching == "passes" ? "" : fmt::format(" of {} tokens", a.tokens.value_or(256)));
  }
  const std::vector<std::vector<double>> loads = epsim::layer_loads(plan);
  std::vector<std::vector<std::vector<int64_t>>> plan_counts(loads.size());  // per layer, per batch
  for (const epsim::Batch& b : plan)
    for (size_t l = 0; l < b.counts.size(); ++l) plan_counts[l].push_back(b.counts[l]);
  epsim::CostModel cost = a.cost.empty() ? epsim::default_gpu_cost() : read_ep_cost(a.cost, "ep-sim");
  if (!a.exchange.empty()) {
    if (a.exchange != "alltoall" && a.exchange != "allgather")
      throw InputError(fmt::format("[ep-sim] unknown --exchange '{}' (alltoall, allgather)", a.exchange));
    cost.alltoall = a.exchange == "alltoall";
  }
  std::vector<std::string> policies;
  {
    const std::string p =
        a.policies.empty() ? "contiguous,eplb,eplb+balanced,speed,speed+balanced,search+balanced,optimal" : a.policies;
    size_t start = 0;
    while (start <= p.size()) {
      const size_t comma = std::min(p.find(',', start), p.size());
      policies.push_back(p.substr(start, comma - start));
      start = comma + 1;
    }
    for (const std::string& name : policies)
      if (name != "contiguous" && name != "eplb" && name != "eplb+balanced" && name != "speed" && name != "speed+balanced" &&
          name != "optimal" && name != "optimal+balanced" && name != "search" && name != "search+balanced")
        throw InputError(fmt::format("[ep-sim] unknown policy '{}' in --policies (contiguous, eplb, speed, search, "
                                     "optimal, each optionally +balanced)",
                                     name));
  }
  // Slots a rank: the experts' share plus a quarter of it (at least 1), or --slots-per-rank.
  auto slots_for = [&](int64_t R) {
    const int64_t share = (experts + R - 1) / R;
    const int64_t s = a.slots_per_rank.value_or(share + std::max<int64_t>(1, share / 4));
    if (R * s < experts)
      throw InputError(fmt::format("[ep-sim] --slots-per-rank {}: {} ranks hold {} slots, fewer than the {} experts", s, R,
                                   R * s, experts));
    return s;
  };
  for (int32_t R : a.ranks) {  // every rank count's arguments checked before anything is printed
    speeds_of(a.slow_rank, R);
    slots_for(R);
  }
  std::printf("%s\n", fmt::format("{}; planned from {} other batches; cost: pass {:.1f} us, piece {:.1f} us, row {:.3f} us, "
                                  "{} {:.1f} us + {:.4f} us a row",
                                  source, plan.size(), 1e6 * cost.pass_s, 1e6 * cost.piece_s, 1e6 * cost.row_s,
                                  cost.alltoall ? "all-to-all" : "all-gather", 1e6 * cost.exchange_pass_s,
                                  1e6 * cost.exchange_row_s)
                          .c_str());
  Table table({"ranks", "slots/rank", "policy", "p50 ms", "p99 ms", "mean ms", "waiting", "imbalance", "p99 vs EPLB"});
  std::string lines, charts;
  for (int32_t R : a.ranks) {
    const std::vector<double> speed = speeds_of(a.slow_rank, R);
    const bool uneven = std::any_of(speed.begin(), speed.end(), [](double s) { return s != 1.0; });
    const int64_t s = slots_for(R);
    double eplb_p99 = 0;
    std::vector<std::string> names;
    std::vector<double> p99s;
    auto ms = [](double sec) { return fmt::format("{:.3f}", 1e3 * sec); };
    {
      const epsim::Summary b = epsim::bound(run, speed, R, cost);
      table.row({std::to_string(R), std::to_string(s), "(lower bound)", ms(b.p50), ms(b.p99), ms(b.mean)});
      names.push_back("bound");
      p99s.push_back(1e3 * b.p99);
      lines += ordered_json{{"ranks", R}, {"policy", "bound"}, {"p50_s", b.p50}, {"p99_s", b.p99}, {"mean_s", b.mean}}.dump() + "\n";
    }
    for (const std::string& name : policies) {
      const bool balanced = name.ends_with("+balanced");
      const std::string placer = balanced ? name.substr(0, name.size() - 9) : name;
      std::vector<eplb::Placement> placements;
      std::string skipped;
      for (size_t layer = 0; layer < loads.size(); ++layer) {
        const std::vector<double>& w = loads[layer];
        if (placer == "contiguous") {
          if (experts % R != 0) {
            skipped = "the experts do not divide among the ranks";
            break;
          }
          placements.push_back(eplb::contiguous(experts, R));
        } else if (placer == "eplb") {
          placements.push_back(eplb::eplb(w, R, s));
        } else if (placer == "search") {
          // From the speed-aware placement when a rank is slow, unless its greedy is too large
          // (the speed policy's bound below); else from EPLB's.
          const double greedy = static_cast<double>(R * s) * static_cast<double>(experts) * R * static_cast<double>(R * s);
          const eplb::Placement start = uneven && greedy <= 3e9 ? eplb::speed_aware(w, speed, s) : eplb::eplb(w, R, s);
          placements.push_back(epsim::tail_search(start, plan_counts[layer], speed, cost,
                                                  balanced ? epsim::Router::balanced : epsim::Router::even,
                                                  a.search_tries, a.seed + layer));
        } else if (placer == "speed") {
          // O(S·E·R·S): beyond ~3e9 steps per layer (minutes) it is not worth the wait.
          const double work = static_cast<double>(R * s) * static_cast<double>(experts) * R * static_cast<double>(R * s);
          if (work > 3e9) {
            skipped = "too large for the greedy";
            break;
          }
          placements.push_back(eplb::speed_aware(w, speed, s));
        } else {  // optimal
          if (experts > 8 || R * s > 12) {
            skipped = "exhaustive search needs <= 8 experts, <= 12 slots";
            break;
          }
          placements.push_back(eplb::optimal(w, R, s, uneven ? std::span<const double>(speed) : std::span<const double>()));
        }
      }
      if (!skipped.empty()) {
        table.row({std::to_string(R), std::to_string(s), name, "(" + skipped + ")"});
        continue;
      }
      const epsim::Summary sum =
          epsim::simulate(run, placements, speed, cost, balanced ? epsim::Router::balanced : epsim::Router::even);
      if (name == "eplb") eplb_p99 = sum.p99;
      const std::string vs = eplb_p99 > 0 ? fmt::format("{:+.1f}%", 100 * (sum.p99 / eplb_p99 - 1)) : std::string("-");
      table.row({std::to_string(R), std::to_string(s), name, ms(sum.p50), ms(sum.p99), ms(sum.mean),
                 fmt::format("{:.1f}%", 100 * sum.wait_share), fmt::format("{:.2f}", sum.imbalance), vs});
      names.push_back(name);
      p99s.push_back(1e3 * sum.p99);
      ordered_json j{{"ranks", R},         {"slots_per_rank", s},       {"policy", name},
                     {"p50_s", sum.p50},   {"p99_s", sum.p99},          {"mean_s", sum.mean},
                     {"wait_share", sum.wait_share}, {"imbalance", sum.imbalance}, {"layers", sum.layer_s.size()}};
      lines += j.dump() + "\n";
    }
    charts += "<figure>" +
              audit::svg_bar_chart(names, p99s, {.title = fmt::format("{} ranks, {} slots each: p99 layer time", R, s),
                                                 .x_label = "placement (+balanced: per-batch re-routing among replicas)",
                                                 .y_label = "ms"}) +
              "</figure>\n";
  }
  if (!a.json.empty()) io::write_file_atomic(a.json, lines);
  if (!a.html.empty())
    write_html(a.html, "concord ep-sim: expert-parallel MoE layers at scale",
               fmt::format("{}; placements planned from {} other batches; a layer waits for its slowest rank, then "
                           "exchanges. Waiting: the share of rank time spent waiting for the slowest rank; imbalance: the "
                           "busiest rank's rows over the mean.",
                           source, plan.size()),
               table.html() + charts);
}

}  // namespace

void add_ep_sim_command(CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "ep-sim",
      "Expert-parallel MoE layers simulated at many ranks: every layer waits for its slowest rank, then "
      "exchanges. Batches from routing traces (concord generate --routing-trace) or a Zipf-skewed bursty "
      "router; placements contiguous, EPLB, speed-aware and the exact optimum (small instances), each with the "
      "even split of an expert's rows among its replicas or +balanced (per-batch re-routing); prints p50/p99 "
      "layer time, the share of rank time spent waiting and the load imbalance. With --calibrate: fit the cost "
      "model to real expert-parallel runs and state the prediction error (docs/moe.md)");
  cmd->add_option("--trace", a->traces, "a routing trace (concord generate --routing-trace); repeat for more prompts")
      ->type_name("FILE");
  add_real_flag(cmd, "--zipf", a->zipf, non_negative(), "a synthetic router instead: expert popularity 1/rank^SKEW");
  add_integer_flag(cmd, "--experts", a->experts, between(1, 1 << 16), "with --zipf: experts per layer (default 256)");
  add_integer_flag(cmd, "--top-k", a->top_k, between(1, 1 << 16), "with --zipf: experts per token (default 8)");
  add_integer_flag(cmd, "--layers", a->layers, between(1, 4096), "with --zipf: MoE layers (default 8)");
  add_real_flag(cmd, "--burst", a->burst, non_negative(),
                "with --zipf: per-batch noise, each popularity times exp(BURST·z), z ~ N(0,1) (default 0.5)");
  add_integer_flag(cmd, "--tokens", a->tokens, between(1, 1 << 24),
                   "tokens per batch (default 4096 with --zipf, 256 from a trace)");
  add_integer_flag(cmd, "--batches", a->batches, between(1, 1 << 20), "batches simulated (default 200)");
  add_integer_flag(cmd, "--plan-batches", a->plan_batches, between(1, 1 << 20),
                   "other batches whose loads the placements are planned from (default 50)");
  cmd->add_option("--batching", a->batching,
                  "from a trace: random (tokens drawn at random: decode batches of many requests; default), "
                  "contiguous (windows: prefill chunks) or passes (the recorded passes, planned from themselves)");
  add_integer_list_flag(cmd, "--ranks", a->ranks, between(1, 4096), "rank counts to simulate (default 8,64,256)");
  add_integer_flag(cmd, "--slots-per-rank", a->slots_per_rank, between(1, 1 << 16),
                   "expert slots per rank (default: the experts' share E/R rounded up, plus a quarter of it, at least 1)");
  cmd->add_option("--slow-rank", a->slow_rank, "RANK:FACTOR: that rank computes FACTOR times slower");
  cmd->add_option("--policies", a->policies,
                  "comma-separated: contiguous, eplb, speed, search (a local search from EPLB's or the speed-aware "
                  "placement that lowers the planning batches' slowest quarter), optimal, each optionally +balanced "
                  "(default: every one, search only +balanced)");
  cmd->add_option("--cost", a->cost, "a cost model JSON (from --calibrate --cost-out; default: a GPU-like one)");
  cmd->add_option("--exchange", a->exchange,
                  "alltoall (dispatch + combine) or allgather (concord's MPI ranks); default: the cost model's");
  add_integer_flag(cmd, "--search-tries", a->search_tries, between(0, 1 << 24),
                   "policy search: moves tried per layer (default 400)");
  add_seed_flag(cmd, "--seed", a->seed, "the batches' seed (default 1)");
  cmd->add_option("--json", a->json, "write one JSON line per ranks and policy (calibration: the fit and every layer)");
  cmd->add_option("--html", a->html,
                  "write an HTML report: the table and a bar chart of p99 per placement (calibration: the table and "
                  "each run's measured and predicted layer times, pass by pass)");
  cmd->add_flag("--calibrate", a->calibrate, "fit the cost model to --run pairs instead of simulating");
  cmd->add_option("--run", a->runs,
                  "with --calibrate: EP_STATS TRACE of one real run (mpirun ... concord generate --expert-parallel "
                  "--ep-stats EP_STATS --routing-trace TRACE); repeat")
      ->expected(2)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->type_name("FILE FILE");
  add_integer_flag(cmd, "--fit-runs", a->fit_runs, between(1, 1 << 16),
                   "with --calibrate: fit on the first N runs, predict the rest (default 1)");
  cmd->add_option("--cost-out", a->cost_out, "with --calibrate: write the fitted cost model to this JSON file");
  cmd->callback([a]() {
    if (a->calibrate) {
      if (a->runs.empty()) throw InputError("[ep-sim] --calibrate needs --run EP_STATS TRACE (one or more)");
      calibrate(*a);
    } else {
      if (!a->runs.empty() || !a->cost_out.empty()) throw InputError("[ep-sim] --run and --cost-out are for --calibrate");
      simulate(*a);
    }
  });
}

}  // namespace concord::cli
