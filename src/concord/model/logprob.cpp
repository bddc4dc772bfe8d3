// log_softmax(logits / T) in double with an index-ordered sum: the one log-probability definition.
#include "concord/model/logprob.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::model {

double logprob_temperature(float temperature) {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature))
    throw InputError(fmt::format("[logprob] temperature {} must be finite and >= 0", temperature));
  return temperature == 0.0f ? 1.0 : static_cast<double>(temperature);
}

SoftmaxStats softmax_stats(std::span<const float> logits, float temperature) {
  if (logits.empty()) throw InputError("[logprob] empty logits");
  SoftmaxStats s;
  s.temperature = logprob_temperature(temperature);
  double m = -std::numeric_limits<double>::infinity();
  for (float x : logits) {
    if (std::isnan(x) || x == std::numeric_limits<float>::infinity())
      throw InputError("[logprob] logits contain NaN or +Inf");
    m = std::max(m, s.z(x));
  }
  if (m == -std::numeric_limits<double>::infinity())
    throw InputError("[logprob] every logit is -Inf");
  double sum = 0.0;
  for (float x : logits) sum += std::exp(s.z(x) - m);
  s.max = m;
  s.log_sum = std::log(sum);
  return s;
}

SoftmaxStats softmax_stats_unchecked(std::span<const float> logits) {
  SoftmaxStats s;  // T = 1: z = double(logit), exactly
  double m = -std::numeric_limits<double>::infinity();
  for (float x : logits) m = std::max(m, s.z(x));
  double sum = 0.0;
  for (float x : logits) sum += std::exp(s.z(x) - m);
  s.max = m;
  s.log_sum = std::log(sum);
  return s;
}

double token_logprob(std::span<const float> logits, int32_t token, float temperature) {
  if (token < 0 || static_cast<size_t>(token) >= logits.size())
    throw InputError(fmt::format("[logprob] token {} outside the vocabulary [0, {})", token,
                                 logits.size()));
  return softmax_stats(logits, temperature).logprob(logits[static_cast<size_t>(token)]);
}

void full_logprobs(std::span<const float> logits, float temperature, std::span<float> out) {
  if (out.size() != logits.size())
    throw InputError(fmt::format("[logprob] output holds {} values for {} logits", out.size(),
                                 logits.size()));
  const SoftmaxStats s = softmax_stats(logits, temperature);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<float>(s.logprob(logits[i]));
}

double kl_divergence(std::span<const float> p_logits, std::span<const float> q_logits) {
  if (p_logits.size() != q_logits.size())
    throw InputError(fmt::format("[logprob] KL of {} and {} logits", p_logits.size(), q_logits.size()));
  const SoftmaxStats p = softmax_stats_unchecked(p_logits), q = softmax_stats_unchecked(q_logits);
  double kl = 0.0;
  for (size_t i = 0; i < p_logits.size(); ++i) {
    const double lp = p.logprob(p_logits[i]), pi = std::exp(lp);
    if (pi > 0.0) kl += pi * (lp - q.logprob(q_logits[i]));
  }
  return kl;
}

}  // namespace concord::model
