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
#include "concord/model/files.h"
#include "concord/numerics/check.h"
#include "concord/train/data.h"
#include "concord/train/flow_model.h"
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

std::string gap_cell(const ordered_json& row) {
  return row.contains("param_gap") ? g4(row["param_gap"]) : std::string("diverged");
}

std::string model_tables(const ordered_json& r, const std::string& model) {
  const auto& m = r["model"];
  std::string s = fmt::format(
      "{}: {} parameters, population {} sequences; sharpness λ_max = {} at the start (2/λ_max = {}), {} at t\n"
      "flow to t = {}: {} Dormand-Prince steps ({} rejected, {} gradient evaluations, rtol {}); loss {} -> {}\n\n",
      model, m["parameters"].get<int64_t>(), m["sequences"].get<int64_t>(), g4(m["lambda_max"]),
      g4(m["edge_of_stability_lr"]), g4(m["lambda_max_at_t"]), g4(m["time"]), m["flow_steps"].get<int64_t>(),
      m["flow_rejected"].get<int64_t>(), m["flow_evaluations"].get<int64_t>(), g4(m["rtol"]), g4(m["loss_start"]),
      g4(m["loss_flow"]));
  const auto& li = r["linearized"];
  s += fmt::format("linearized model (first-order Taylor at the start; J·v by central differences of the forward, Jᵀ by "
                   "the backward): its flow at t is {} from the flow, which moved {} (logits RMS {}); population loss "
                   "of the true model there {}, of the linear model {}\n\n",
                   g4(li["param_gap"]), g4(li["flow_displacement"]), g4(li["function_gap"]), g4(li["loss"]),
                   g4(li["linear_model_loss"]));
  auto groups = [](const ordered_json& row) {
    std::string g;
    if (!row.contains("groups")) return g;
    for (const auto& [k, v] : row["groups"].items()) g += fmt::format(" {} {}", k, g4(v));
    return g;
  };
  s += "gradient descent vs the flow at t (‖Δθ‖ by parameter group in the last column)\n";
  s += fmt::format("  {:>9} {:>9} {:>6} {:>10} {:>11} {:>11}  {}\n", "η·λ_max", "at t", "steps", "‖Δθ‖", "Δlogits rms",
                   "ΔL", "groups");
  for (const auto& row : r["gd"]["rows"])
    s += fmt::format("  {:>9} {:>9} {:>6} {:>10} {:>11} {:>11} {}\n", g4(row["eta_lambda_max"]),
                     g4(row["eta_lambda_max_at_t"]), row["steps"].get<int64_t>(),
                     gap_cell(row), row.contains("function_gap") ? g4(row["function_gap"]) : "-",
                     row.contains("loss_gap") ? g4(row["loss_gap"]) : "-", groups(row));
  s += fmt::format("  order of the gap in η (η·λ_max ≤ 0.5): {:.3f} (theory 1 as η → 0); \"at t\": η times the "
                   "sharpness of the flow at t (past 2: beyond the edge of stability there)\n\n",
                   r["gd"]["slope"].get<double>());
  s += "SGD vs the flow at t\n";
  s += fmt::format("  {:>5} {:>9} {:>10} {:>14}\n", "B", "η·λ_max", "η/B", "E‖Δθ‖² (runs)");
  for (const auto& row : r["sgd"]["rows"])
    s += fmt::format("  {:>5} {:>9} {:>10} {:>14}\n", row["batch"].get<int64_t>(), g4(row["eta_lambda_max"]),
                     g4(row["eta_over_b"]), fmt::format("{} ({})", g4(row["mean_gap2"]), row["runs"].get<int64_t>()));
  s += "\nAdamW (no decay, no clipping; the SGD runs' step count) vs the flow at t\n";
  s += fmt::format("  {:>9} {:>6} {:>10} {:>11} {:>11}\n", "lr", "steps", "‖Δθ‖", "Δlogits rms", "ΔL");
  for (const auto& row : r["adamw"]["rows"])
    s += fmt::format("  {:>9} {:>6} {:>10} {:>11} {:>11}\n", g4(row["lr"]), row["steps"].get<int64_t>(),
                     g4(row["param_gap"]), g4(row["function_gap"]), g4(row["loss_gap"]));
  s += fmt::format("\nserved weights (GD at η·λ_max = {}, {} steps; held: matrix elements whose served value did not change, "
                   "per step)\n", g4(r["precision"]["eta_lambda_max"]), r["precision"]["steps"].get<int64_t>());
  s += fmt::format("  {:>9} {:>10} {:>11} {:>11} {:>7}\n", "rule", "‖Δθ‖", "Δlogits rms", "ΔL", "held");
  for (const auto& row : r["precision"]["rows"])
    s += fmt::format("  {:>9} {:>10} {:>11} {:>11} {:>6.1f}%\n", row["rule"].get<std::string>(), g4(row["param_gap"]),
                     g4(row["function_gap"]), g4(row["loss_gap"]), 100 * row["held_fraction"].get<double>());
  for (const auto& row : r["precision"]["rows"])
    if (row.contains("predicted_held_fraction"))
      s += fmt::format("  bf16-rne held predicted from the ulp-to-update ratio (min(bf16 cells the fp32 run "
                       "crossed, steps) changes per element): {:.1f}%\n", 100 * row["predicted_held_fraction"].get<double>());
  return s;
}

std::string model_report(const ordered_json& r, const std::string& tables) {
  using audit::Series;
  std::string h = fmt::format("<!doctype html><html><head><meta charset=\"utf-8\"><title>concord flow model</title>"
                              "<style>{}</style></head><body><h1>Gradient flow against real training: a transformer</h1>",
                              audit::report_style());
  h += "<pre>" + audit::html_escape(tables) + "</pre>";
  std::vector<double> eta, gap;
  for (const auto& row : r["gd"]["rows"])
    if (row.contains("param_gap")) {
      eta.push_back(row["eta"]);
      gap.push_back(row["param_gap"]);
    }
  std::vector<Series> s1 = {{"GD ‖θ − θ_flow(t)‖", eta, gap}};
  h += audit::svg_line_plot(s1, {"gradient descent vs the flow at t", "η", "parameter gap", true, true, 640, 360});
  std::vector<Series> s2, s3;
  for (const auto& tr : r["trajectories"]) {
    if (tr["name"] != "flow") s2.push_back({tr["name"].get<std::string>(), numbers(tr["time"]), numbers(tr["param_gap"])});
    s3.push_back({tr["name"].get<std::string>(), numbers(tr["time"]), numbers(tr["loss"])});
  }
  h += audit::svg_line_plot(s2, {"distance to the flow (AdamW: by step, on the SGD runs' time axis)", "t = ηk",
                                 "‖θ − θ_flow(t)‖", false, true, 640, 360}) +
       audit::svg_line_plot(s3, {"population loss", "t = ηk", "L(θ)", false, false, 640, 360});
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

  struct ModelArgs {
    std::string model, corpus = "kjv", json, report;
    int64_t population = 8, seq_len = 64, probe = 4, sgd_runs = 4, points = 20;
    double time = 0, sgd_step = 0.25, precision_step = 0.25, rtol = 1e-6;
    std::vector<double> gd_steps, adam_lrs;
    std::vector<int32_t> batches;
    uint64_t seed = 1;
  };
  auto b = std::make_shared<ModelArgs>();
  CLI::App* mcmd = flow->add_subcommand(
      "model", "A concord transformer (a trained run's final/ or a model folder, fp32 values) against the flow of "
               "its population loss (--population sequences of --corpus, integrated by Dormand-Prince): gradient "
               "descent by step size (as η·λ_max, λ_max the sharpness at the start), SGD by batch size, AdamW, and "
               "bf16 served weights under rne/sr/ef; distances in parameters (whole and by group), logits on a "
               "held-out probe, and loss. Tables on stdout; --json and --report write the figures and plots.");
  mcmd->add_option("--model", b->model, "the model: a folder with config.json and model.safetensors")->required();
  mcmd->add_option("--corpus", b->corpus, "the population's text: kjv (default), a file, or addition:N");
  add_integer_flag(mcmd, "--population", b->population, between(1, 4096), "population sequences (default 8)");
  add_integer_flag(mcmd, "--seq-len", b->seq_len, between(2, 8192), "tokens per sequence (default 64)");
  add_integer_flag(mcmd, "--probe", b->probe, between(1, 4096), "held-out probe sequences (default 4)");
  add_real_flag(mcmd, "--time", b->time, positive(), "the comparison time t (default 20/λ_max)");
  add_real_list_flag(mcmd, "--gd-steps", b->gd_steps, positive(), "GD step sizes as η·λ_max (default 1,0.5,0.25,0.125)");
  add_real_flag(mcmd, "--sgd-step", b->sgd_step, positive(), "the SGD runs' η·λ_max (default 0.25)");
  add_integer_list_flag(mcmd, "--batches", b->batches, between(1, 4096), "SGD sequences per step (default 1,2,4)");
  add_integer_flag(mcmd, "--sgd-runs", b->sgd_runs, between(1, 1000), "seeds per SGD batch size (default 4)");
  add_real_list_flag(mcmd, "--adam-lrs", b->adam_lrs, positive(), "AdamW learning rates (default 0.001,0.00025)");
  add_real_flag(mcmd, "--precision-step", b->precision_step, positive(), "the served-precision runs' η·λ_max (default 0.25)");
  add_integer_flag(mcmd, "--points", b->points, between(1, 1000), "samples along each trajectory (default 20)");
  add_real_flag(mcmd, "--rtol", b->rtol, real_in(0, 1e-2, true, false), "the flow's relative tolerance (default 1e-6)");
  add_seed_flag(mcmd, "--seed", b->seed, "seed of the sharpness start vector, SGD batches and sr (default 1)");
  mcmd->add_option("--json", b->json, "write the figures to this JSON file");
  mcmd->add_option("--report", b->report, "write an offline HTML report with the plots to this file");
  mcmd->callback([b]() {
    model::LoadedModel loaded = model::load_model(b->model, "fp32");
    if (!loaded.source.tokenizer)
      throw InputError(fmt::format("[flow] {} has no tokenizer to read the corpus with", b->model));
    const std::vector<int32_t> tokens = loaded.source.tokenizer->encode(train::load_corpus(b->corpus), false);
    const train::TokenSplit split = train::split_tokens(tokens, 0.1, b->seq_len * 4);
    train::Batch population = train::validation_batches(split.train, b->population, b->seq_len, 1).at(0);
    const train::Batch probe = train::validation_batches(split.validation, b->probe, b->seq_len, 1).at(0);
    train::flow::ModelLoss loss(loaded.model, std::move(population));
    train::flow::ModelStudyOptions o;
    o.time = b->time;
    if (!b->gd_steps.empty()) o.gd_steps = b->gd_steps;
    o.sgd_step = b->sgd_step;
    if (!b->batches.empty()) o.batches.assign(b->batches.begin(), b->batches.end());
    o.sgd_runs = b->sgd_runs;
    if (!b->adam_lrs.empty()) o.adam_lrs = b->adam_lrs;
    o.precision_step = b->precision_step;
    o.points = b->points;
    o.rtol = b->rtol;
    o.seed = b->seed;
    const ordered_json r = train::flow::model_study(loss, probe, o, [](const std::string& line) {
      std::fprintf(stderr, "[flow] %s\n", line.c_str());
    });
    const std::string tables = model_tables(r, b->model);
    std::fputs(tables.c_str(), stdout);
    if (!b->json.empty()) io::write_file_atomic(b->json, r.dump(1) + "\n");
    if (!b->report.empty()) io::write_file_atomic(b->report, model_report(r, tables));
  });
}

}  // namespace concord::cli
