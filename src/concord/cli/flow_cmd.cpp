// `concord flow`: real training trajectories against the population gradient flow (issue 20,
// docs/flow.md). `flow lsq` runs the least-squares study (train/flow_study.h): tables on stdout,
// the figures as JSON, an offline HTML report with the plots.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/audit/svg.h"
#include "concord/cli/commands.h"
#include "concord/cli/flags.h"
#include "concord/io/atomic_file.h"
#include "concord/train/flow_study.h"

namespace concord::cli {
namespace {

using nlohmann::ordered_json;

std::string g4(double v) { return fmt::format("{:.4g}", v); }

std::vector<double> numbers(const ordered_json& a) {
  std::vector<double> v;
  for (const auto& x : a) v.push_back(x.is_number() ? x.get<double>() : std::nan(""));
  return v;
}

// The tables of `concord flow lsq` (stdout and the report share them).
std::string text_tables(const ordered_json& r) {
  const auto& pr = r["problem"];
  std::string s = fmt::format(
      "least squares: n = {}, d = {}, λ = [{}, {}], seed {}; compared at t = {} (1/λ_min by default)\n"
      "loss: start {}, flow(t) {}, minimum {}\n"
      "flow: closed form vs Dormand-Prince 5(4): {:.2e} apart ({} steps, {} rejected)\n\n",
      pr["n"].get<int64_t>(), pr["d"].get<int64_t>(), g4(pr["lambda_min"]), g4(pr["lambda_max"]), pr["seed"].get<uint64_t>(),
      g4(pr["time"]), g4(pr["loss_start"]), g4(pr["loss_flow"]), g4(pr["loss_min"]),
      r["flow_check"]["closed_vs_integrated"].get<double>(), r["flow_check"]["steps"].get<int64_t>(),
      r["flow_check"]["rejected"].get<int64_t>());
  s += "gradient descent vs the flow at t = ηk (leading order: η·‖Σ λ²t/2 e^(−λt) c v‖)\n";
  s += fmt::format("  {:>9} {:>7} {:>11} {:>11} {:>11} {:>11}  {}\n", "η·λ_max", "steps", "‖Δθ‖", "leading", "Δf (probe)",
                   "ΔL", "");
  for (const auto& row : r["gd"]["rows"])
    s += fmt::format("  {:>9} {:>7} {:>11} {:>11} {:>11} {:>11}  {}\n", g4(row["eta_lambda_max"]),
                     row["steps"].get<int64_t>(), g4(row["param_gap"]), g4(row["predicted_leading"]),
                     g4(row["function_gap"]), g4(row["loss_gap"]),
                     row["stable"].get<bool>() ? "" : fmt::format("past 2/λ_max: top mode ×{}", g4(row["top_mode_factor"])));
  s += fmt::format("  order of the gap in η (η·λ_max ≤ 0.5): {:.3f} (theory 1)\n\n", r["gd"]["slope"].get<double>());
  s += fmt::format("SGD vs the flow: E‖θ − θ_flow(t)‖² exact (moment recursion), the diffusion limit bias² + (η/B)·tr C(t)"
                   " (tr C = {}), and {} runs\n", g4(r["sgd"]["diffusion_trace"]), r["sgd"]["rows"][0]["runs"].get<int64_t>());
  s += fmt::format("  {:>9} {:>5} {:>10} {:>11} {:>11} {:>11} {:>18}\n", "η·λ_max", "B", "η/B", "bias²", "exact",
                   "diffusion", "Monte Carlo ± se");
  for (const auto& row : r["sgd"]["rows"])
    s += fmt::format("  {:>9} {:>5} {:>10} {:>11} {:>11} {:>11} {:>18}\n", g4(row["eta_lambda_max"]),
                     row["batch"].get<int64_t>(), g4(row["eta_over_b"]), g4(row["bias2"]), g4(row["exact_gap2"]),
                     g4(row["diffusion_gap2"]),
                     fmt::format("{} ± {}", g4(row["monte_carlo_gap2"]), g4(row["monte_carlo_se"])));
  s += fmt::format("  spread (exact − bias²) ∝ (η/B)^{:.3f} over all rows, ^{:.3f} at the smallest η (theory 1 as η → 0)\n\n",
                   r["sgd"]["spread_slope"].get<double>(), r["sgd"]["spread_slope_smallest_eta"].get<double>());
  const auto& pc = r["precision"];
  s += fmt::format("served weights: fp32 master, served copy by each export rule, gradient at the served copy "
                   "(η·λ_max = {}, {} steps)\n", g4(pc["eta_lambda_max"]), pc["steps"].get<int64_t>());
  s += fmt::format("  {:>9} {:>11} {:>11} {:>11} {:>8} {:>11}\n", "rule", "‖Δθ‖", "Δf (probe)", "ΔL", "held",
                   "first move");
  for (const auto& row : pc["rows"])
    s += fmt::format("  {:>9} {:>11} {:>11} {:>11} {:>7.1f}% {:>11}\n", row["rule"].get<std::string>(),
                     g4(row["param_gap"]), g4(row["function_gap"]), g4(row["loss_gap"]),
                     100 * row["held_fraction"].get<double>(), row["first_move"].get<int64_t>());
  s += fmt::format("  bf16-rne's first move predicted from ulp/(2|ηg|): step {}\n",
                   pc["predicted_first_move_rne"].get<int64_t>());
  const auto& st = pc["rows"][1]["stalls"];
  s += fmt::format("  bf16-rne's stalls ({} of ≥ 2 predicted steps): measured / predicted (spacing/|ηg|, half for the "
                   "first) p10 {:.3f}, median {:.3f}, p90 {:.3f}\n",
                   st["count"].get<int64_t>(), st["ratio_p10"].get<double>(), st["ratio_median"].get<double>(),
                   st["ratio_p90"].get<double>());
  return s;
}

std::string html_report(const ordered_json& r, const std::string& tables) {
  using audit::Series;
  std::string h = fmt::format("<!doctype html><html><head><meta charset=\"utf-8\"><title>concord flow lsq</title>"
                              "<style>{}</style></head><body><h1>Gradient flow against real trajectories: least squares</h1>",
                              audit::report_style());
  h += "<pre>" + audit::html_escape(tables) + "</pre>";
  // GD gap against η, with the leading-order prediction.
  std::vector<double> eta, gap, lead;
  for (const auto& row : r["gd"]["rows"]) {
    if (!row["stable"].get<bool>()) continue;
    eta.push_back(row["eta"]);
    gap.push_back(row["param_gap"]);
    lead.push_back(row["predicted_leading"]);
  }
  std::vector<Series> s1 = {{"GD ‖θ_k − θ_flow(ηk)‖", eta, gap}, {"leading order (slope 1)", eta, lead}};
  h += "<h2>Step size</h2>" +
       audit::svg_line_plot(s1, {"gradient descent vs the flow at t", "η", "parameter gap", true, true, 640, 360});
  std::vector<double> scale, exact, diffusion, mc;
  for (const auto& row : r["sgd"]["rows"]) {
    scale.push_back(row["eta_over_b"]);
    exact.push_back(row["exact_gap2"].get<double>() - row["bias2"].get<double>());
    diffusion.push_back(row["diffusion_gap2"].get<double>() - row["bias2"].get<double>());
    mc.push_back(row["monte_carlo_gap2"].get<double>() - row["bias2"].get<double>());
  }
  std::vector<Series> s2 = {{"exact spread", scale, exact}, {"diffusion (η/B)·tr C", scale, diffusion},
                            {"Monte Carlo − bias²", scale, mc}};
  h += "<h2>Batch noise</h2>" +
       audit::svg_line_plot(s2, {"SGD's spread about the flow at t", "η/B", "E‖θ − θ_flow‖² − bias²", true, true, 640, 360});
  std::vector<Series> s3, s4;
  for (const auto& tr : r["trajectories"]) {
    s3.push_back({tr["name"].get<std::string>(), numbers(tr["time"]), numbers(tr["param_gap"])});
    s4.push_back({tr["name"].get<std::string>(), numbers(tr["time"]), numbers(tr["loss"])});
  }
  h += "<h2>Over time</h2>" +
       audit::svg_line_plot(s3, {"distance to the flow", "t = ηk", "‖θ − θ_flow(t)‖", false, true, 640, 360}) +
       audit::svg_line_plot(s4, {"loss", "t = ηk", "L(θ)", false, true, 640, 360});
  h += "</body></html>\n";
  return h;
}

}  // namespace

void add_flow_command(CLI::App& app) {
  CLI::App* flow = app.add_subcommand(
      "flow", "Real training trajectories against the population gradient flow θ̇ = −∇L(θ): where the flow "
              "predicts them and by how much step size, batch noise and low-precision weights move them (docs/flow.md)");
  flow->require_subcommand(1);
  struct Args {
    int64_t n = 256, d = 16, sgd_runs = 64;
    double condition = 30, noise = 0.5, time = 0, precision_step = 0.01;
    uint64_t seed = 1;
    std::vector<double> gd_steps, sgd_steps;
    std::vector<int32_t> batches;
    std::string json, report;
  };
  auto a = std::make_shared<Args>();
  CLI::App* lsq = flow->add_subcommand(
      "lsq", "The least-squares study, where every quantity is exact: the flow in closed form (checked against "
             "Dormand-Prince), gradient descent's O(η) gap up to and past 2/λ_max, SGD's exact spread against its "
             "η/B diffusion limit and Monte Carlo runs, and bf16 served weights (rne's stall predicted from "
             "ulp/(2|ηg|), sr, ef) against fp32. Tables on stdout; --json and --report write the figures and plots.");
  add_integer_flag(lsq, "--n", a->n, between(1, 1 << 20), "population rows (default 256)");
  add_integer_flag(lsq, "--d", a->d, between(1, 256), "dimensions (default 16)");
  add_real_flag(lsq, "--condition", a->condition, real_at_least(1), "about λ_max/λ_min of the Hessian (default 30)");
  add_real_flag(lsq, "--noise", a->noise, non_negative(), "label noise (default 0.5)");
  add_seed_flag(lsq, "--seed", a->seed, "seed of the problem, the start and the SGD runs (default 1)");
  add_real_flag(lsq, "--time", a->time, positive(), "the comparison time t (default 1/λ_min)");
  add_real_list_flag(lsq, "--gd-steps", a->gd_steps, positive(),
                     "gradient-descent step sizes as η·λ_max (default 2.1,1.9,1,0.5,0.25,0.125,0.0625,0.03125)");
  add_real_list_flag(lsq, "--sgd-steps", a->sgd_steps, real_in(0, 2, true, true),
                     "SGD step sizes as η·λ_max (default 0.25,0.0625)");
  add_integer_list_flag(lsq, "--batches", a->batches, between(1, 1 << 20), "SGD batch sizes (default 1,4,16,64)");
  add_integer_flag(lsq, "--sgd-runs", a->sgd_runs, between(2, 100000), "Monte Carlo runs per (η, B) (default 64)");
  add_real_flag(lsq, "--precision-step", a->precision_step, real_in(0, 2, true, true),
                "η·λ_max of the served-precision runs (default 0.01)");
  lsq->add_option("--json", a->json, "write the figures to this JSON file");
  lsq->add_option("--report", a->report, "write an offline HTML report with the plots to this file");
  lsq->callback([a]() {
    train::flow::LeastSquaresStudyOptions o;
    o.n = a->n;
    o.d = a->d;
    o.condition = a->condition;
    o.noise = a->noise;
    o.seed = a->seed;
    o.time = a->time;
    o.sgd_runs = a->sgd_runs;
    o.precision_step = a->precision_step;
    if (!a->gd_steps.empty()) o.gd_steps = a->gd_steps;
    if (!a->sgd_steps.empty()) o.sgd_steps = a->sgd_steps;
    if (!a->batches.empty()) o.batches.assign(a->batches.begin(), a->batches.end());
    const ordered_json r = train::flow::least_squares_study(o, [](const std::string& line) {
      std::fprintf(stderr, "[flow] %s\n", line.c_str());
    });
    const std::string tables = text_tables(r);
    std::fputs(tables.c_str(), stdout);
    if (!a->json.empty()) io::write_file_atomic(a->json, r.dump(1) + "\n");
    if (!a->report.empty()) io::write_file_atomic(a->report, html_report(r, tables));
  });
}

}  // namespace concord::cli
