// The least-squares study of `concord flow lsq` (flow_study.h).
#include "concord/train/flow_study.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "concord/numerics/check.h"
#include "concord/numerics/format.h"
#include "concord/train/flow.h"
#include "concord/train/flow_model.h"

namespace concord::train::flow {

namespace {

using nlohmann::ordered_json;

double dist(std::span<const double> a, std::span<const double> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s);
}

// Round to bf16's 8 significant bits (so that the served copy starts where the master does).
double to_bf16_grid(double v) {
  if (v == 0) return 0;
  const int e = std::ilogb(v);
  return std::ldexp(std::round(std::ldexp(v, 7 - e)), e - 7);
}

// The steps at which to record `points` samples of a run of `steps` steps (0 and steps included).
std::vector<int64_t> sample_steps(int64_t steps, int64_t points) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i <= points; ++i) {
    const int64_t s = steps * i / points;
    if (out.empty() || s != out.back()) out.push_back(s);
  }
  return out;
}

}  // namespace

ordered_json least_squares_study(const LeastSquaresStudyOptions& o,
                                 const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  if (o.d < 1 || o.n < o.d)
    throw InputError(fmt::format("[flow] the population needs at least as many rows as dimensions (n = {}, d = {})", o.n, o.d));
  if (o.gd_steps.empty() || o.sgd_steps.empty() || o.batches.empty())
    throw InputError("[flow] the step-size and batch grids must not be empty");
  for (double m : o.gd_steps)
    if (!(m > 0)) throw InputError(fmt::format("[flow] a step size (η·λ_max) must be > 0, got {}", m));
  for (double m : o.sgd_steps)
    if (!(m > 0 && m < 2)) throw InputError(fmt::format("[flow] an SGD step size (η·λ_max) must be in (0, 2), got {}", m));
  for (int64_t b : o.batches)
    if (b < 1) throw InputError(fmt::format("[flow] a batch size must be ≥ 1, got {}", b));
  if (o.sgd_runs < 2 || o.probe < 1 || o.trajectory_points < 2 || !(o.precision_step > 0 && o.precision_step < 2))
    throw InputError("[flow] sgd runs ≥ 2, probe ≥ 1, trajectory points ≥ 2 and a precision step in (0, 2) are needed");

  const LeastSquares p = LeastSquares::random(o.n, o.d, o.condition, o.noise, o.seed);
  const LeastSquares probe = LeastSquares::random(o.probe, o.d, o.condition, 0.0, o.seed ^ 0x50524F4245ull);
  const LeastSquaresFlow flow(p);
  const double lmin = flow.eigen().values.front(), lmax = flow.eigen().values.back();
  const double t = o.time > 0 ? o.time : 1 / lmin;
  Vec theta0(o.d);
  for (int64_t j = 0; j < o.d; ++j) theta0[j] = to_bf16_grid(philox_normal(o.seed, 9, static_cast<uint64_t>(j)));

  // The RMS over probe rows of x·(a − b): the distance in function space.
  auto function_gap = [&](std::span<const double> a, std::span<const double> b) {
    double s = 0;
    for (int64_t i = 0; i < probe.n; ++i) {
      double v = 0;
      for (int64_t j = 0; j < o.d; ++j) v += probe.x[i * o.d + j] * (a[j] - b[j]);
      s += v * v;
    }
    return std::sqrt(s / static_cast<double>(probe.n));
  };

  ordered_json out;
  const Vec flow_t = flow.at(t, theta0);
  out["problem"] = {{"n", o.n}, {"d", o.d}, {"condition", o.condition}, {"noise", o.noise}, {"seed", o.seed},
                    {"lambda_min", lmin}, {"lambda_max", lmax}, {"time", t}, {"loss_start", p.loss(theta0)},
                    {"loss_flow", p.loss(flow_t)}, {"loss_min", p.loss(flow.minimizer())}};

  // The flow itself: the closed form against the adaptive integrator.
  {
    const OdeRhs rhs = [&](double, std::span<const double> th, std::span<double> dth) {
      p.gradient(th, dth);
      for (double& v : dth) v = -v;
    };
    OdeOptions opt;
    opt.rtol = 1e-10;
    opt.atol = 1e-12;
    OdeStats st;
    const std::vector<double> times = {t};
    const auto numeric = integrate(rhs, 0.0, theta0, times, opt, &st);
    out["flow_check"] = {{"closed_vs_integrated", dist(numeric[0], flow_t)}, {"steps", st.accepted},
                         {"rejected", st.rejected}, {"evaluations", st.evaluations}};
    say(fmt::format("flow: closed form vs Dormand-Prince at t = {:.4g}: {:.2e} ({} steps)", t, dist(numeric[0], flow_t),
                    st.accepted));
  }

  // Gradient descent against the flow at the same time t = ηk.
  {
    ordered_json rows = ordered_json::array();
    std::vector<double> etas, gaps;
    const SymmetricEigen& e = flow.eigen();
    for (double m : o.gd_steps) {
      const double eta = m / lmax;
      const int64_t steps = std::max<int64_t>(1, std::llround(t / eta));
      const double tk = static_cast<double>(steps) * eta;
      const std::vector<int64_t> rec = {steps};
      const Vec gd = gradient_descent(p, theta0, eta, rec)[0];
      const Vec fl = flow.at(tk, theta0);
      // Leading order: (1 − ηλ)^(t/η) − e^(−λt) ≈ −η (λ² t / 2) e^(−λt), per eigen-direction.
      double lead = 0;
      for (int64_t j = 0; j < o.d; ++j) {
        double c = 0;
        for (int64_t i = 0; i < o.d; ++i) c += e.vectors[i * o.d + j] * (theta0[i] - flow.minimizer()[i]);
        const double w = eta * e.values[j] * e.values[j] * tk / 2 * std::exp(-e.values[j] * tk) * c;
        lead += w * w;
      }
      const double gap = dist(gd, fl);
      const bool stable = m < 2;
      rows.push_back({{"eta_lambda_max", m}, {"eta", eta}, {"steps", steps}, {"time", tk}, {"param_gap", gap},
                      {"function_gap", function_gap(gd, fl)}, {"loss_gap", p.loss(gd) - p.loss(fl)},
                      {"predicted_leading", std::sqrt(lead)}, {"stable", stable},
                      {"top_mode_factor", std::pow(std::abs(1 - m), static_cast<double>(steps))}});
      if (m <= 0.5 && gap > 0) {
        etas.push_back(eta);
        gaps.push_back(gap);
      }
    }
    out["gd"] = {{"rows", rows}, {"slope", etas.size() >= 2 ? log_log_slope(etas, gaps) : 0.0}};
    say(fmt::format("gradient descent: {} step sizes, gap order {:.3f} (η·λ_max ≤ 0.5)", rows.size(),
                    out["gd"]["slope"].get<double>()));
  }

  // SGD: the exact spread, its diffusion limit and Monte Carlo runs.
  {
    const std::vector<double> times = {t};
    const Vec c = sgd_diffusion_covariance(p, theta0, times)[0];
    double trc = 0;
    for (int64_t j = 0; j < o.d; ++j) trc += c[j * o.d + j];
    ordered_json rows = ordered_json::array();
    std::vector<double> scales, spreads;
    for (double m : o.sgd_steps)
      for (int64_t b : o.batches) {
        const int64_t steps = std::max<int64_t>(1, std::llround(t * lmax / m));
        const double eta = t / static_cast<double>(steps);
        const std::vector<int64_t> rec = {steps};
        const SgdMoments mo = sgd_moments(p, theta0, eta, b, rec);
        const Vec fl = flow.at(t, theta0);
        double bias2 = 0, tr = 0;
        for (int64_t j = 0; j < o.d; ++j) {
          bias2 += (mo.mean[0][j] - fl[j]) * (mo.mean[0][j] - fl[j]);
          tr += mo.covariance[0][j * o.d + j];
        }
        double sum = 0, sum2 = 0;
        for (int64_t s = 0; s < o.sgd_runs; ++s) {
          const double g = dist(sgd(p, theta0, eta, b, static_cast<uint64_t>(s), rec)[0], fl);
          sum += g * g;
          sum2 += g * g * g * g;
        }
        const double runs = static_cast<double>(o.sgd_runs);
        const double mc = sum / runs;
        const double se = std::sqrt(std::max(0.0, (sum2 / runs - mc * mc) / (runs - 1)));
        const double scale = eta / static_cast<double>(b);
        rows.push_back({{"eta_lambda_max", eta * lmax}, {"eta", eta}, {"batch", b}, {"eta_over_b", scale},
                        {"steps", steps}, {"exact_gap2", bias2 + tr}, {"bias2", bias2}, {"spread", tr},
                        {"diffusion_gap2", bias2 + scale * trc}, {"monte_carlo_gap2", mc},
                        {"monte_carlo_se", se}, {"runs", o.sgd_runs}});
        scales.push_back(scale);
        spreads.push_back(tr);
      }
    // At the smallest η alone the spread's dependence on B is pure (1/B up to O(η) terms).
    std::vector<double> small_scales(scales.end() - static_cast<std::ptrdiff_t>(o.batches.size()), scales.end());
    std::vector<double> small_spreads(spreads.end() - static_cast<std::ptrdiff_t>(o.batches.size()), spreads.end());
    out["sgd"] = {{"diffusion_trace", trc}, {"rows", rows}, {"spread_slope", log_log_slope(scales, spreads)},
                  {"spread_slope_smallest_eta",
                   small_scales.size() >= 2 ? log_log_slope(small_scales, small_spreads) : 0.0}};
    say(fmt::format("SGD: {} (η, B) pairs, spread ∝ (η/B)^{:.3f}", rows.size(), out["sgd"]["spread_slope"].get<double>()));
  }

  // Served precision: fp32 master, the served copy under each export rule.
  {
    const double eta = o.precision_step / lmax;
    const int64_t steps = std::max<int64_t>(1, std::llround(t / eta));
    std::vector<int64_t> every(static_cast<size_t>(steps) + 1);
    for (int64_t s = 0; s <= steps; ++s) every[s] = s;
    Vec g(o.d);
    p.gradient(theta0, g);
    // The rne stall of each coordinate alone: ⌈(spacing toward the motion / 2) / |ηg|⌉; the
    // first coordinate to move is exact (nothing else has moved, so the gradient is constant).
    int64_t predicted_first = -1;
    for (int64_t j = 0; j < o.d; ++j) {
      if (g[j] == 0) continue;
      double ulp = served_ulp(numerics::Format::bf16, theta0[j]);
      const bool toward_zero = (theta0[j] > 0) == (g[j] > 0);
      if (toward_zero && std::abs(theta0[j]) == std::ldexp(1.0, std::ilogb(std::abs(theta0[j])))) ulp /= 2;
      const auto k = static_cast<int64_t>(std::ceil(ulp / 2 / std::abs(eta * g[j])));
      if (predicted_first < 0 || k < predicted_first) predicted_first = k;
    }
    ordered_json rows = ordered_json::array();
    struct Rule {
      const char* name;
      const char* rule;
      numerics::Format format;
    };
    const Rule rules[] = {{"fp32", "rne", numerics::Format::f32},
                          {"bf16-rne", "rne", numerics::Format::bf16},
                          {"bf16-sr", "sr", numerics::Format::bf16},
                          {"bf16-ef", "ef", numerics::Format::bf16}};
    const Vec fl = flow.at(static_cast<double>(steps) * eta, theta0);
    for (const Rule& r : rules) {
      std::vector<int64_t> first;
      const auto run = served_gradient_descent(p, theta0, eta, r.rule, r.format, o.seed, steps, every, &first);
      int64_t held = 0;
      for (int64_t s = 1; s <= steps; ++s)
        for (int64_t j = 0; j < o.d; ++j) held += run[s][j] == run[s - 1][j];
      int64_t earliest = -1;
      for (int64_t f : first)
        if (f >= 0 && (earliest < 0 || f < earliest)) earliest = f;
      ordered_json row = {{"rule", r.name}, {"param_gap", dist(run.back(), fl)}, {"function_gap", function_gap(run.back(), fl)},
                          {"loss_gap", p.loss(run.back()) - p.loss(fl)},
                          {"held_fraction", static_cast<double>(held) / static_cast<double>(steps * o.d)},
                          {"first_move", earliest}};
      if (r.format == numerics::Format::bf16 && std::string(r.rule) == "rne") {
        // Every stall of every coordinate: the steps between two changes of its served value,
        // against spacing/|ηg| (spacing/2 for the first: the master starts on a grid point and
        // must reach the midpoint; later it starts just past one and must reach the next),
        // g the gradient at the served copy when the stall began.
        std::vector<double> ratio;
        Vec gs(o.d);
        for (int64_t j = 0; j < o.d; ++j) {
          int64_t begin = 0;
          for (int64_t s = 1; s <= steps; ++s) {
            if (run[s][j] == run[s - 1][j]) continue;
            p.gradient(run[begin], gs);
            const double v = run[begin][j];
            double spacing = served_ulp(numerics::Format::bf16, v);
            if (v != 0 && (v > 0) == (gs[j] > 0) && std::abs(v) == std::ldexp(1.0, std::ilogb(std::abs(v)))) spacing /= 2;
            const double predicted = (begin == 0 ? spacing / 2 : spacing) / std::abs(eta * gs[j]);
            if (gs[j] != 0 && predicted >= 2) ratio.push_back(static_cast<double>(s - begin) / predicted);
            begin = s;
          }
        }
        std::sort(ratio.begin(), ratio.end());
        auto quantile = [&](double q) {
          return ratio.empty() ? 0.0 : ratio[static_cast<size_t>(q * static_cast<double>(ratio.size() - 1))];
        };
        row["stalls"] = {{"count", ratio.size()}, {"ratio_p10", quantile(0.1)}, {"ratio_median", quantile(0.5)},
                         {"ratio_p90", quantile(0.9)}};
      }
      rows.push_back(std::move(row));
    }
    out["precision"] = {{"eta_lambda_max", o.precision_step}, {"eta", eta}, {"steps", steps},
                        {"predicted_first_move_rne", predicted_first}, {"rows", rows}};
    say(fmt::format("served precision: η·λ_max = {}, {} steps; bf16-rne's stalls over ulp/|ηg|: median {:.3f}",
                    o.precision_step, steps, rows[1]["stalls"]["ratio_median"].get<double>()));
  }

  // Distance to the flow over time, for the plots.
  {
    ordered_json tr = ordered_json::array();
    auto add = [&](const std::string& name, double eta, const std::vector<int64_t>& rec, const std::vector<Vec>& thetas) {
      ordered_json x = ordered_json::array(), y = ordered_json::array(), loss = ordered_json::array();
      for (size_t i = 0; i < rec.size(); ++i) {
        const double ti = static_cast<double>(rec[i]) * eta;
        x.push_back(ti);
        y.push_back(dist(thetas[i], flow.at(ti, theta0)));
        loss.push_back(p.loss(thetas[i]));
      }
      tr.push_back({{"name", name}, {"time", x}, {"param_gap", y}, {"loss", loss}});
    };
    for (double m : {0.5, 0.125}) {
      const double eta = m / lmax;
      const std::vector<int64_t> rec = sample_steps(std::llround(t / eta), o.trajectory_points);
      add(fmt::format("GD η·λmax={}", m), eta, rec, gradient_descent(p, theta0, eta, rec));
      add(fmt::format("SGD η·λmax={} B=4", m), eta, rec, sgd(p, theta0, eta, 4, 0, rec));
    }
    const double eta = o.precision_step / lmax;
    const int64_t steps = std::llround(t / eta);
    const std::vector<int64_t> rec = sample_steps(steps, o.trajectory_points);
    for (const char* rule : {"rne", "sr", "ef"})
      add(fmt::format("bf16-{} η·λmax={}", rule, o.precision_step), eta, rec,
          served_gradient_descent(p, theta0, eta, rule, numerics::Format::bf16, o.seed, steps, rec));
    out["trajectories"] = tr;
  }
  return out;
}

namespace {

// The group a parameter's distance is reported under.
std::string param_group(const std::string& name) {
  if (name.find("self_attn") != std::string::npos) return "attention";
  if (name.find("mlp") != std::string::npos) return "mlp";
  if (name.find("norm") != std::string::npos) return "norm";
  return "embedding";  // the embedding table and an untied head
}

// The position of x's bf16 rounding (rne) on the ordered bf16 grid: consecutive values differ by 1.
int64_t bf16_ordinal(double x) {
  const auto f = static_cast<float>(std::abs(x));
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  return x < 0 ? -static_cast<int64_t>(rounded) : static_cast<int64_t>(rounded);
}

double rms_diff(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return a.empty() ? 0.0 : std::sqrt(s / static_cast<double>(a.size()));
}

}  // namespace

ordered_json model_study(ModelLoss& L, const Batch& probe, const ModelStudyOptions& o,
                         const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  if (o.gd_steps.empty() || o.batches.empty() || o.points < 1 || o.sgd_runs < 1)
    throw InputError("[flow] the step-size and batch grids must not be empty; points and runs ≥ 1");
  for (double m : o.gd_steps)
    if (!(m > 0)) throw InputError(fmt::format("[flow] a step size (η·λ_max) must be > 0, got {}", m));
  if (!(o.sgd_step > 0) || !(o.precision_step > 0)) throw InputError("[flow] the SGD and precision step sizes must be > 0");
  for (double lr : o.adam_lrs)
    if (!(lr > 0)) throw InputError(fmt::format("[flow] an AdamW learning rate must be > 0, got {}", lr));
  for (int64_t b : o.batches)
    if (b < 1) throw InputError(fmt::format("[flow] a batch size must be ≥ 1, got {}", b));

  const Vec theta0 = L.values();
  const PowerResult sharp = model_sharpness(L, theta0, o.seed, 100, 1e-4);
  const double lmax = sharp.value;
  if (!(lmax > 0))
    throw InputError(fmt::format("[flow] the Hessian's largest eigenvalue at the start is {} (not positive): no "
                                 "edge of stability to scale the step sizes by", lmax));
  const double t = o.time > 0 ? o.time : 20 / lmax;
  const int64_t P = o.points;
  std::vector<double> times;
  for (int64_t i = 0; i <= P; ++i) times.push_back(t * static_cast<double>(i) / static_cast<double>(P));
  say(fmt::format("sharpness at the start λ_max = {:.4g} ({} power iterations); t = {:.4g}", lmax, sharp.iterations, t));

  OdeOptions opt;
  opt.rtol = o.rtol;
  opt.atol = o.rtol * 1e-3;
  OdeStats st;
  const int64_t before = L.evaluations();
  const std::vector<Vec> flow = model_flow(L, theta0, times, opt, &st);
  const int64_t flow_evals = L.evaluations() - before;
  std::vector<double> flow_loss;
  for (const Vec& th : flow) flow_loss.push_back(L.loss(th));
  const std::vector<float> flow_logits = L.logits(flow.back(), probe);
  const PowerResult sharp_end = model_sharpness(L, flow.back(), o.seed, 100, 1e-4);
  say(fmt::format("flow: {} Dormand-Prince steps ({} rejected, {} gradient evaluations); loss {:.4f} -> {:.4f}; "
                  "sharpness at t {:.4g}", st.accepted, st.rejected, flow_evals, flow_loss.front(), flow_loss.back(),
                  sharp_end.value));

  ordered_json out;
  out["model"] = {{"parameters", L.size()}, {"sequences", L.sequences()}, {"lambda_max", lmax},
                  {"edge_of_stability_lr", 2 / lmax}, {"time", t}, {"loss_start", flow_loss.front()},
                  {"loss_flow", flow_loss.back()}, {"lambda_max_at_t", sharp_end.value},
                  {"flow_steps", st.accepted}, {"flow_rejected", st.rejected}, {"flow_evaluations", flow_evals},
                  {"rtol", o.rtol}};
  ordered_json flow_tr = {{"name", "flow"}, {"time", times}, {"param_gap", Vec(times.size(), 0.0)}, {"loss", flow_loss}};

  // The linearized model's flow (first-order Taylor around θ0): how far the nonlinear flow
  // leaves the kernel regime by t.
  LinearizedLoss lin(L, theta0);
  OdeStats lst;
  const int64_t lin_before = L.evaluations();
  const std::vector<Vec> lin_flow = linearized_flow(lin, theta0, times, opt, &lst);
  ordered_json lin_gap = ordered_json::array(), lin_loss = ordered_json::array(), lin_model_loss = ordered_json::array();
  for (size_t i = 0; i < times.size(); ++i) {
    lin_gap.push_back(dist(lin_flow[i], flow[i]));
    lin_loss.push_back(L.loss(lin_flow[i]));
    lin_model_loss.push_back(lin.loss(lin_flow[i]));
  }
  out["linearized"] = {{"steps", lst.accepted}, {"evaluations", L.evaluations() - lin_before},
                       {"param_gap", lin_gap.back()}, {"flow_displacement", dist(flow.back(), theta0)},
                       {"loss", lin_loss.back()}, {"linear_model_loss", lin_model_loss.back()},
                       {"function_gap", rms_diff(L.logits(lin_flow.back(), probe), flow_logits)}};
  say(fmt::format("linearized flow: {} steps; at t {:.4g} from the flow (which moved {:.4g}); loss of the true model "
                  "there {:.4f}, of the linear model {:.4f}", lst.accepted, lin_gap.back().get<double>(),
                  dist(flow.back(), theta0), lin_loss.back().get<double>(), lin_model_loss.back().get<double>()));

  // The end of a run against the flow at t: parameters (whole and by group), function, loss.
  const std::vector<model::ParamSpec>& specs = L.params();
  auto compare = [&](const Vec& th) {
    ordered_json groups = ordered_json::object();
    std::map<std::string, double> sq;
    for (size_t p = 0; p < specs.size(); ++p) {
      double s2 = 0;
      for (int64_t i = L.offsets()[p]; i < L.offsets()[p] + specs[p].numel(); ++i)
        s2 += (th[i] - flow.back()[i]) * (th[i] - flow.back()[i]);
      sq[param_group(specs[p].name)] += s2;
    }
    for (const auto& [g, v] : sq) groups[g] = std::sqrt(v);
    return ordered_json{{"param_gap", dist(th, flow.back())}, {"function_gap", rms_diff(L.logits(th, probe), flow_logits)},
                        {"loss_gap", L.loss(th) - flow_loss.back()}, {"groups", groups}};
  };
  // k = t/η steps. From P steps up, k is rounded up to a multiple of P so that every (k/P)-th
  // step lands on a flow sample (η·λ_max then differs from the one asked for by < P/k; the
  // tables give the one used); a shorter run is compared at t alone.
  auto steps_for = [&](double m) {
    const int64_t k = std::max<int64_t>(1, std::llround(t * lmax / m));
    return k < P ? k : (k + P - 1) / P * P;
  };
  auto record_for = [&](int64_t k) {
    std::vector<int64_t> rec;
    if (k % P != 0) return std::vector<int64_t>{0, k};
    for (int64_t i = 0; i <= P; ++i) rec.push_back(k * i / P);
    return rec;
  };
  ordered_json trajectories = ordered_json::array({flow_tr});
  trajectories.push_back({{"name", "linearized flow"}, {"time", times}, {"param_gap", lin_gap}, {"loss", lin_loss}});
  auto trajectory = [&](const std::string& name, const ModelRun& run) {
    if (run.served.size() != flow.size()) return;  // compared at t alone
    ordered_json gap = ordered_json::array();
    for (size_t i = 0; i < run.served.size(); ++i) gap.push_back(dist(run.served[i], flow[i]));
    trajectories.push_back({{"name", name}, {"time", times}, {"param_gap", gap}, {"loss", run.loss}});
  };

  // Gradient descent by step size.
  {
    ordered_json rows = ordered_json::array();
    std::vector<double> etas, gaps;
    for (double m : o.gd_steps) {
      const int64_t k = steps_for(m);
      ModelRunOptions ro;
      ro.lr = t / static_cast<double>(k);
      ordered_json row = {{"eta_lambda_max", ro.lr * lmax}, {"eta_lambda_max_at_t", ro.lr * sharp_end.value},
                          {"eta", ro.lr}, {"steps", k}};
      try {
        const ModelRun run = run_model(L, theta0, ro, k, record_for(k));
        row.update(compare(run.served.back()));
        trajectory(fmt::format("GD η·λmax={:.3g}", ro.lr * lmax), run);
        if (ro.lr * lmax <= 0.5) {
          etas.push_back(ro.lr);
          gaps.push_back(row["param_gap"].get<double>());
        }
      } catch (const InputError& e) {  // a non-finite gradient: the run diverged
        row["diverged"] = e.what();
      }
      say(fmt::format("GD η·λ_max = {:.3g}: {} steps, ‖Δθ‖ = {}", ro.lr * lmax, k,
                      row.contains("param_gap") ? fmt::format("{:.4g}", row["param_gap"].get<double>()) : "diverged"));
      rows.push_back(std::move(row));
    }
    out["gd"] = {{"rows", rows}, {"slope", etas.size() >= 2 ? log_log_slope(etas, gaps) : 0.0}};
  }

  // SGD by batch size at one step size.
  {
    const int64_t k = steps_for(o.sgd_step);
    const double eta = t / static_cast<double>(k);
    ordered_json rows = ordered_json::array();
    for (int64_t b : o.batches) {
      double sum2 = 0;
      ordered_json end;
      for (int64_t r = 0; r < o.sgd_runs; ++r) {
        ModelRunOptions ro;
        ro.optimizer = "sgd";
        ro.lr = eta;
        ro.batch = b;
        ro.seed = o.seed + static_cast<uint64_t>(r);
        const ModelRun run = run_model(L, theta0, ro, k, record_for(k));
        const double g = dist(run.served.back(), flow.back());
        sum2 += g * g;
        if (r == 0) {
          end = compare(run.served.back());
          trajectory(fmt::format("SGD B={}", b), run);
        }
      }
      ordered_json row = {{"batch", b}, {"eta_lambda_max", eta * lmax}, {"steps", k}, {"eta_over_b", eta / static_cast<double>(b)},
                          {"mean_gap2", sum2 / static_cast<double>(o.sgd_runs)}, {"runs", o.sgd_runs}, {"first_run", end}};
      say(fmt::format("SGD B = {}: E‖Δθ‖² = {:.4g} over {} runs", b, row["mean_gap2"].get<double>(), o.sgd_runs));
      rows.push_back(std::move(row));
    }
    out["sgd"] = {{"rows", rows}};
  }

  // AdamW: same number of steps as GD at the SGD step size, its own learning rates.
  {
    const int64_t k = steps_for(o.sgd_step);
    ordered_json rows = ordered_json::array();
    for (double lr : o.adam_lrs) {
      ModelRunOptions ro;
      ro.optimizer = "adamw";
      ro.lr = lr;
      const ModelRun run = run_model(L, theta0, ro, k, record_for(k));
      ordered_json row = {{"lr", lr}, {"steps", k}};
      row.update(compare(run.served.back()));
      trajectory(fmt::format("AdamW lr={:g}", lr), run);
      say(fmt::format("AdamW lr = {:g}: {} steps, ‖Δθ‖ = {:.4g}, loss {:.4f}", lr, k, row["param_gap"].get<double>(),
                      run.loss.back()));
      rows.push_back(std::move(row));
    }
    out["adamw"] = {{"rows", rows}};
  }

  // Served precision: GD with the served copy in fp32 or bf16 under each rule.
  {
    const int64_t k = steps_for(o.precision_step);
    const double eta = t / static_cast<double>(k);
    int64_t bf16_elements = 0;
    for (const model::ParamSpec& sp : specs)
      if (!sp.served_in_f32()) bf16_elements += sp.numel();
    ordered_json rows = ordered_json::array();
    struct Rule {
      const char* name;
      const char* rule;
      numerics::Format format;
    };
    const Rule rules[] = {{"fp32", "rne", numerics::Format::f32},
                          {"bf16-rne", "rne", numerics::Format::bf16},
                          {"bf16-sr", "sr", numerics::Format::bf16},
                          {"bf16-ef", "ef", numerics::Format::bf16}};
    Vec fp32_end;
    for (const Rule& r : rules) {
      ModelRunOptions ro;
      ro.lr = eta;
      ro.served = r.format;
      ro.rule = r.rule;
      ro.seed = o.seed;
      const ModelRun run = run_model(L, theta0, ro, k, record_for(k));
      int64_t changes = 0;
      for (size_t p = 0; p < specs.size(); ++p)
        if (!specs[p].served_in_f32())
          for (int64_t i = L.offsets()[p]; i < L.offsets()[p] + specs[p].numel(); ++i) changes += run.changes[i];
      ordered_json row = {{"rule", r.name}, {"eta_lambda_max", eta * lmax}, {"steps", k},
                          {"held_fraction", 1 - static_cast<double>(changes) / static_cast<double>(k * bf16_elements)}};
      row.update(compare(run.served.back()));
      if (r.format == numerics::Format::f32) fp32_end = run.served.back();
      if (r.format == numerics::Format::bf16 && std::string(r.rule) == "rne" && !fp32_end.empty()) {
        // rne's served value changes once per bf16 grid cell the master crosses, at most once a
        // step: from the fp32 run's start and end of each element, min(cells between, k) changes
        // in k steps — the held fraction the ulp-to-update ratio predicts (a path that turns back
        // is undercounted; near zero the cells are small, so it is counted in cells, not in the
        // start's ulp).
        double predicted_changes = 0;
        for (size_t p = 0; p < specs.size(); ++p)
          if (!specs[p].served_in_f32())
            for (int64_t i = L.offsets()[p]; i < L.offsets()[p] + specs[p].numel(); ++i)
              predicted_changes += static_cast<double>(
                  std::min<int64_t>(k, std::abs(bf16_ordinal(fp32_end[i]) - bf16_ordinal(theta0[i]))));
        row["predicted_held_fraction"] = 1 - predicted_changes / static_cast<double>(k * bf16_elements);
      }
      trajectory(r.name, run);
      say(fmt::format("served {}: ‖Δθ‖ = {:.4g}, matrices held still {:.1f}% of steps", r.name,
                      row["param_gap"].get<double>(), 100 * row["held_fraction"].get<double>()));
      rows.push_back(std::move(row));
    }
    out["precision"] = {{"eta_lambda_max", eta * lmax}, {"steps", k}, {"rows", rows}};
  }
  out["trajectories"] = trajectories;
  return out;
}

}  // namespace concord::train::flow
