// The one definition of a token's log-probability, shared by the sampler (serve: sampled tokens,
// logprobs, full rows), the learner (the RL loss, training's entropy) and the sync probe, so that
// every side scores a token the same way, bit for bit:
//
//   logp(token) = log_softmax(logits / T)[token],   T = temperature, or 1 when T == 0 (greedy)
//
// i.e. the distribution after temperature and BEFORE truncation (top-k / top-p / min-p change
// which tokens may be drawn, not their log-probabilities). Arithmetic, all in double:
//   z_i = double(logits_i) / T;  m = max_i z_i;  S = Σ_i exp(z_i − m) in ascending i;
//   logp_i = (z_i − m) − log(S).
// The sum runs in index order on one thread, so the result does not depend on the thread
// count. Single tokens are returned as double; full-vocabulary rows as float (rounded from the
// double values) to halve their memory. serve/logprob.h names these for the serving side.
//
// Errors (InputError "[logprob] ..."): empty logits, a token outside the vocabulary, a negative
// or non-finite temperature, logits that are NaN or +Inf.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace concord::model {

// The temperature the log-probabilities use: T, or 1 for greedy (T == 0).
double logprob_temperature(float temperature);

// Softmax statistics of logits / T: max and log of the max-subtracted sum (see above).
struct SoftmaxStats {
  double temperature = 1.0;  // T (1 for greedy)
  double max = 0.0;          // m = max_i z_i
  double log_sum = 0.0;      // log Σ exp(z_i − m)
  double z(float logit) const { return static_cast<double>(logit) / temperature; }
  double logprob(float logit) const { return (z(logit) - max) - log_sum; }
};
SoftmaxStats softmax_stats(std::span<const float> logits, float temperature);
// The same arithmetic without the checks, for the training backward's rows (T = 1), where a
// non-finite logit must give a non-finite loss (the optimizer then skips the step), not an error.
SoftmaxStats softmax_stats_unchecked(std::span<const float> logits);

// logp(token) under the definition above.
double token_logprob(std::span<const float> logits, int32_t token, float temperature);
// logp of every token, out.size() == logits.size().
void full_logprobs(std::span<const float> logits, float temperature, std::span<float> out);

// KL(p || q) in nats for p = softmax(p_logits), q = softmax(q_logits) at T = 1, from their
// softmax_stats_unchecked: Σ_i p_i (logp_i − logq_i) in ascending i, terms with p_i = 0 skipped
// (distillation's loss, Model::forward_backward_distill). Sizes must match.
double kl_divergence(std::span<const float> p_logits, std::span<const float> q_logits);

}  // namespace concord::model
