// The least-squares study of `concord flow lsq` (flow_study.h).
#include "concord/train/flow_study.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "concord/numerics/check.h"
#include "concord/numerics/format.h"
#include "concord/train/flow.h"

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

}  // namespace concord::train::flow
