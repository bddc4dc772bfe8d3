// Sampling: the truncation rules and the seeded draw of sampling.h.
#include "concord/serve/sampling.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "concord/numerics/check.h"
#include "concord/numerics/philox.h"
#include "concord/serve/logprob.h"

namespace concord::serve {

void SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f)
    throw InputError(fmt::format("[sampling] temperature {} must be finite and >= 0 (0: greedy)",
                                 temperature));
  if (top_k < 0) throw InputError(fmt::format("[sampling] top_k {} must be >= 0 (0: off)", top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    throw InputError(fmt::format("[sampling] top_p {} must lie in (0, 1] (1: off)", top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    throw InputError(fmt::format("[sampling] min_p {} must lie in [0, 1] (0: off)", min_p));
}

double sampling_uniform(uint64_t seed, uint64_t t) {
  const numerics::PhiloxBlock w = numerics::RandomStream{seed, kSamplingStream}.block(t);
  const uint64_t bits = ((static_cast<uint64_t>(w[0]) << 32) | w[1]) >> 11;
  return static_cast<double>(bits) * 0x1.0p-53;
}

int32_t greedy_token(std::span<const float> logits) {
  if (logits.empty()) throw InputError("[sampling] empty logits");
  size_t best = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) throw InputError("[sampling] logits contain NaN");
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

Candidates sampling_candidates(std::span<const float> logits, const SamplingParams& params) {
  params.validate();
  if (params.greedy()) return {{greedy_token(logits)}, {1.0}};
  const SoftmaxStats stats = softmax_stats(logits, params.temperature);
  const auto V = static_cast<int64_t>(logits.size());
  std::vector<double> p(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) p[i] = std::exp(stats.logprob(logits[i]));
  // (p descending, index ascending): a strict total order, so every sort gives one result.
  auto before = [&](int32_t a, int32_t b) { return p[a] != p[b] ? p[a] > p[b] : a < b; };

  std::vector<int32_t> order(logits.size());
  for (int32_t i = 0; i < V; ++i) order[i] = i;
  int64_t kept = V;
  if (params.top_k > 0 && params.top_k < V) {
    std::nth_element(order.begin(), order.begin() + params.top_k, order.end(), before);
    kept = params.top_k;
    order.resize(static_cast<size_t>(kept));
  }
  if (params.top_p < 1.0f) {
    std::vector<int32_t> ascending(order.begin(), order.begin() + kept);
    std::sort(ascending.begin(), ascending.end());
    double total = 0.0;
    for (int32_t i : ascending) total += p[i];
    const double target = static_cast<double>(params.top_p) * total;
    // Sort only as much of the order as the prefix needs: the head grows 4x at a time.
    int64_t sorted = 0, cut = kept;
    double running = 0.0;
    for (int64_t head = std::min<int64_t>(kept, 256);; head = std::min(kept, head * 4)) {
      std::partial_sort(order.begin() + sorted, order.begin() + head, order.begin() + kept, before);
      for (; sorted < head; ++sorted) {
        running += p[order[sorted]];
        if (running >= target) break;
      }
      if (sorted < head) {
        cut = sorted + 1;
        break;
      }
      if (head == kept) break;
    }
    kept = cut;
    order.resize(static_cast<size_t>(kept));
  }
  if (params.min_p > 0.0f) {
    const int32_t top = *std::min_element(order.begin(), order.end(), before);
    const double threshold = static_cast<double>(params.min_p) * p[top];
    std::erase_if(order, [&](int32_t i) { return p[i] < threshold && i != top; });
  }
  std::sort(order.begin(), order.end());
  Candidates c;
  c.tokens = std::move(order);
  c.probs.reserve(c.tokens.size());
  for (int32_t i : c.tokens) c.probs.push_back(p[i]);
  return c;
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& params, uint64_t t) {
  params.validate();
  if (params.greedy()) return greedy_token(logits);
  const Candidates c = sampling_candidates(logits, params);
  double total = 0.0;
  for (double q : c.probs) total += q;
  const double target = sampling_uniform(params.seed, t) * total;
  double running = 0.0;
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    running += c.probs[i];
    if (running > target) return c.tokens[i];
  }
  return c.tokens.back();  // u · P rounded up to the full sum
}

}  // namespace concord::serve
