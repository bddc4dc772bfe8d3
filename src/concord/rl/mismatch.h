// Sampler–learner mismatch metrics of one batch of rollouts, from the two sides' log-probs of the
// sampled tokens (model/logprob.h's definition on both sides). Names follow verl's
// `rollout_corr/*` metrics (verl/trainer/ppo/rollout_corr_helper.py) where verl has one, so
// numbers can be put beside a verl run's; NeMo-RL's `token_mult_prob_error` likewise.
//
// With s_t = sampler (rollout) log-prob and l_t = learner (training) log-prob of token t, and
// r_t = l_t − s_t (log importance ratio learner/sampler), over the batch's N valid tokens:
//   rollout_corr/kl              mean_t (s_t − l_t)            direct estimator of KL(sampler‖learner)
//   rollout_corr/k3_kl           mean_t (e^r − r − 1)          the non-negative k3 estimator
//                                 (r clamped to ±20, as verl does)
//   rollout_corr/training_ppl    mean_seq exp(−mean_t l_t),  rollout_corr/rollout_ppl likewise
//   rollout_corr/log_ppl_diff    mean_seq (mean_t s_t − mean_t l_t); _abs_diff: mean of |·|;
//                                 _max/_min over sequences; ppl_ratio: mean_seq exp(·)
//   rollout_corr/chi2_token      mean_t e^{2r} − 1;   chi2_seq: mean_seq e^{2 Σ_t r} − 1 (±20 clamp)
//   rollout_corr/rollout_is_mean, _min, _max   token ratios e^r
//   rollout_corr/rollout_is_eff_sample_size    1 / mean_t (w_t / mean w)², w = e^r (1 = no
//                                 mismatch, → 1/N when one token dominates); verl first clamps w
//                                 to its IS threshold [1/C, C] — concord reports the unclamped ratio
//   token_mult_prob_error        mean_t e^{|r_t|}  (1 = identical)
//   prob_diff_max, prob_diff_mean     max and mean of |e^{l_t} − e^{s_t}| (|Δp| of sampled tokens)
// Means over tokens are taken over all tokens of the batch (verl's masked_mean), in double, in
// sequence then token order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace concord::rl {

struct MismatchMetrics {
  int64_t sequences = 0, tokens = 0;
  double kl = 0, k3_kl = 0;
  double training_ppl = 0, rollout_ppl = 0;
  double log_ppl_diff = 0, log_ppl_abs_diff = 0, log_ppl_diff_max = 0, log_ppl_diff_min = 0;
  double ppl_ratio = 0;
  double chi2_token = 0, chi2_seq = 0;
  double is_mean = 0, is_min = 0, is_max = 0, is_ess = 0;
  double token_mult_prob_error = 0;
  double prob_diff_max = 0, prob_diff_mean = 0;
  // {"rollout_corr/kl": ..., ..., "token_mult_prob_error": ..., "prob_diff_max": ...}
  nlohmann::json to_json() const;
};

// sampler[i] and learner[i]: the log-probs of sequence i's sampled tokens (same lengths; empty
// sequences are skipped). InputError on mismatched shapes, no tokens at all, or a log-prob that
// is NaN or positive.
MismatchMetrics mismatch_metrics(std::span<const std::vector<double>> sampler,
                                 std::span<const std::vector<double>> learner);

}  // namespace concord::rl
