#include "concord/rl/mismatch.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/numerics/check.h"

namespace concord::rl {

namespace {
constexpr double kSafetyBound = 20.0;  // verl's clamp of log-ratios before exp
double clamped(double r) { return std::clamp(r, -kSafetyBound, kSafetyBound); }
}  // namespace

nlohmann::json MismatchMetrics::to_json() const {
  return {{"rollout_corr/kl", kl},
          {"rollout_corr/k3_kl", k3_kl},
          {"rollout_corr/training_ppl", training_ppl},
          {"rollout_corr/rollout_ppl", rollout_ppl},
          {"rollout_corr/log_ppl_diff", log_ppl_diff},
          {"rollout_corr/log_ppl_abs_diff", log_ppl_abs_diff},
          {"rollout_corr/log_ppl_diff_max", log_ppl_diff_max},
          {"rollout_corr/log_ppl_diff_min", log_ppl_diff_min},
          {"rollout_corr/ppl_ratio", ppl_ratio},
          {"rollout_corr/chi2_token", chi2_token},
          {"rollout_corr/chi2_seq", chi2_seq},
          {"rollout_corr/rollout_is_mean", is_mean},
          {"rollout_corr/rollout_is_min", is_min},
          {"rollout_corr/rollout_is_max", is_max},
          {"rollout_corr/rollout_is_eff_sample_size", is_ess},
          {"token_mult_prob_error", token_mult_prob_error},
          {"prob_diff_max", prob_diff_max},
          {"prob_diff_mean", prob_diff_mean},
          {"sequences", sequences},
          {"tokens", tokens}};
}

MismatchMetrics mismatch_metrics(std::span<const std::vector<double>> sampler,
                                 std::span<const std::vector<double>> learner) {
  if (sampler.size() != learner.size())
    throw InputError(fmt::format("[rl] mismatch metrics: {} sampler sequences but {} learner ones",
                                 sampler.size(), learner.size()));
  MismatchMetrics m;
  m.is_min = std::numeric_limits<double>::infinity();
  m.is_max = -std::numeric_limits<double>::infinity();
  m.log_ppl_diff_max = -std::numeric_limits<double>::infinity();
  m.log_ppl_diff_min = std::numeric_limits<double>::infinity();
  double sum_kl = 0, sum_k3 = 0, sum_rho2 = 0, sum_w = 0, sum_mult = 0, sum_dp = 0;
  double sum_train_ppl = 0, sum_roll_ppl = 0, sum_lpd = 0, sum_lpd_abs = 0, sum_ppl_ratio = 0;
  double sum_chi2_seq = 0;
  std::vector<double> weights;
  for (size_t i = 0; i < sampler.size(); ++i) {
    const std::vector<double>& s = sampler[i];
    const std::vector<double>& l = learner[i];
    if (s.size() != l.size())
      throw InputError(fmt::format("[rl] mismatch metrics: sequence {} has {} sampler log-probs but "
                                   "{} learner ones", i, s.size(), l.size()));
    if (s.empty()) continue;
    double seq_s = 0, seq_l = 0, seq_r = 0;
    for (size_t t = 0; t < s.size(); ++t) {
      if (!(s[t] <= 0) || !(l[t] <= 0))
        throw InputError(fmt::format("[rl] mismatch metrics: sequence {} token {}: log-probs must be "
                                     "<= 0 and not NaN (sampler {}, learner {})", i, t, s[t], l[t]));
      const double r = l[t] - s[t];
      const double w = std::exp(clamped(r));
      sum_kl += s[t] - l[t];
      sum_k3 += std::exp(clamped(r)) - clamped(r) - 1;
      sum_rho2 += w * w;
      sum_mult += std::exp(std::abs(r));
      const double dp = std::abs(std::exp(l[t]) - std::exp(s[t]));
      sum_dp += dp;
      m.prob_diff_max = std::max(m.prob_diff_max, dp);
      m.is_min = std::min(m.is_min, w);
      m.is_max = std::max(m.is_max, w);
      weights.push_back(w);
      seq_s += s[t];
      seq_l += l[t];
      seq_r += r;
    }
    const auto n = static_cast<double>(s.size());
    const double mean_s = seq_s / n, mean_l = seq_l / n;
    sum_train_ppl += std::exp(-mean_l);
    sum_roll_ppl += std::exp(-mean_s);
    const double lpd = mean_s - mean_l;
    sum_lpd += lpd;
    sum_lpd_abs += std::abs(lpd);
    sum_ppl_ratio += std::exp(lpd);
    m.log_ppl_diff_max = std::max(m.log_ppl_diff_max, lpd);
    m.log_ppl_diff_min = std::min(m.log_ppl_diff_min, lpd);
    sum_chi2_seq += std::exp(2 * clamped(seq_r));
    ++m.sequences;
    m.tokens += static_cast<int64_t>(s.size());
  }
  if (m.tokens == 0) throw InputError("[rl] mismatch metrics: no tokens");
  const auto N = static_cast<double>(m.tokens), S = static_cast<double>(m.sequences);
  m.kl = sum_kl / N;
  m.k3_kl = sum_k3 / N;
  m.chi2_token = sum_rho2 / N - 1;
  m.chi2_seq = sum_chi2_seq / S - 1;
  m.token_mult_prob_error = sum_mult / N;
  m.prob_diff_mean = sum_dp / N;
  m.training_ppl = sum_train_ppl / S;
  m.rollout_ppl = sum_roll_ppl / S;
  m.log_ppl_diff = sum_lpd / S;
  m.log_ppl_abs_diff = sum_lpd_abs / S;
  m.ppl_ratio = sum_ppl_ratio / S;
  for (double w : weights) sum_w += w;
  m.is_mean = sum_w / N;
  double sum_norm2 = 0;
  for (double w : weights) sum_norm2 += (w / m.is_mean) * (w / m.is_mean);
  m.is_ess = 1.0 / (sum_norm2 / N);
  return m;
}

}  // namespace concord::rl
