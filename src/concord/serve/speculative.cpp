// Speculative decoding: the verification rule, its randomness and prompt-lookup drafting
// (speculative.h).
#include "concord/serve/speculative.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "concord/numerics/check.h"
#include "concord/numerics/philox.h"

namespace concord::serve {

std::vector<double> processed_distribution(std::span<const float> logits, const SamplingParams& params) {
  const Candidates c = sampling_candidates(logits, params);
  double total = 0.0;
  for (double x : c.probs) total += x;
  std::vector<double> p(logits.size(), 0.0);
  for (size_t i = 0; i < c.tokens.size(); ++i) p[static_cast<size_t>(c.tokens[i])] = c.probs[i] / total;
  return p;
}

std::vector<double> one_hot(int64_t vocab, int32_t token) {
  if (token < 0 || token >= vocab)
    throw InputError(fmt::format("[speculative] token {} outside the vocabulary of {}", token, vocab));
  std::vector<double> q(static_cast<size_t>(vocab), 0.0);
  q[static_cast<size_t>(token)] = 1.0;
  return q;
}

double acceptance_probability(std::span<const double> p, std::span<const double> q) {
  if (p.size() != q.size())
    throw InputError(fmt::format("[speculative] distributions over {} and {} tokens", p.size(), q.size()));
  double alpha = 0.0;
  for (size_t i = 0; i < p.size(); ++i) alpha += std::min(p[i], q[i]);
  return alpha;
}

double expected_tokens_per_round(double alpha, int gamma) {
  if (alpha >= 1.0) return gamma + 1.0;
  return (1.0 - std::pow(alpha, gamma + 1)) / (1.0 - alpha);
}

double expected_speedup(double alpha, int gamma, double cost_ratio) {
  return expected_tokens_per_round(alpha, gamma) / (gamma * cost_ratio + 1.0);
}

namespace {

double unit(uint32_t hi, uint32_t lo) {  // 53 bits in [0, 1)
  return static_cast<double>(((static_cast<uint64_t>(hi) << 32) | lo) >> 11) * 0x1.0p-53;
}

}  // namespace

bool PhiloxChoices::bernoulli(double prob, uint64_t t) {
  const numerics::PhiloxBlock w = numerics::RandomStream{seed_, stream_}.block(t);
  return unit(w[0], w[1]) < prob;
}

size_t PhiloxChoices::categorical(std::span<const double> weights, uint64_t t) {
  double total = 0.0;
  for (double x : weights) total += x;
  CONCORD_CHECK(total > 0.0, "categorical over weights that sum to 0");
  const numerics::PhiloxBlock w = numerics::RandomStream{seed_, stream_}.block(t);
  const double target = unit(w[2], w[3]) * total;
  double running = 0.0;
  size_t last = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] <= 0.0) continue;
    running += weights[i];
    last = i;
    if (running > target) return i;
  }
  return last;  // u · Σw rounded up to the full sum
}

Verdict verify_draft(std::span<const int32_t> draft, std::span<const std::vector<double>> q,
                     std::span<const std::vector<double>> p, Choices& choices, uint64_t t0) {
  const size_t gamma = draft.size();
  if (q.size() != gamma || p.size() != gamma + 1)
    throw InputError(fmt::format("[speculative] {} draft tokens need {} drafter rows and {} target rows (got {} and {})",
                                 gamma, gamma, gamma + 1, q.size(), p.size()));
  const size_t V = p[0].size();
  for (const std::vector<double>& row : p)
    if (row.size() != V) throw InputError("[speculative] target rows of different vocabulary sizes");
  for (const std::vector<double>& row : q)
    if (row.size() != V)
      throw InputError(fmt::format("[speculative] a drafter row over {} tokens, the target's over {}", row.size(), V));
  Verdict v;
  std::vector<double> residual(V);
  for (size_t i = 0; i < gamma; ++i) {
    const int32_t d = draft[i];
    if (d < 0 || static_cast<size_t>(d) >= V)
      throw InputError(fmt::format("[speculative] draft token {} outside the vocabulary of {}", d, V));
    const double qd = q[i][static_cast<size_t>(d)], pd = p[i][static_cast<size_t>(d)];
    if (!(qd > 0.0))
      throw InputError(fmt::format("[speculative] draft token {} has probability 0 under its own drafter", d));
    if (choices.bernoulli(pd >= qd ? 1.0 : pd / qd, t0 + i)) {
      v.tokens.push_back(d);
      ++v.accepted;
      continue;
    }
    // Rejected: the replacement from norm(max(0, p − q)); where p <= q everywhere (p == q up to
    // rounding, when a rejection has probability ~0), from p itself.
    double mass = 0.0;
    for (size_t j = 0; j < V; ++j) mass += residual[j] = std::max(0.0, p[i][j] - q[i][j]);
    const std::span<const double> from = mass > 0.0 ? std::span<const double>(residual) : std::span<const double>(p[i]);
    v.tokens.push_back(static_cast<int32_t>(choices.categorical(from, t0 + i)));
    return v;
  }
  v.tokens.push_back(static_cast<int32_t>(choices.categorical(p[gamma], t0 + gamma)));
  return v;
}

std::vector<int32_t> prompt_lookup_draft(std::span<const int32_t> context, int gamma, int max_ngram, int min_ngram) {
  if (min_ngram < 1 || max_ngram < min_ngram)
    throw InputError(fmt::format("[speculative] n-gram sizes {}..{} must satisfy 1 <= min <= max", min_ngram, max_ngram));
  const auto L = static_cast<int64_t>(context.size());
  for (int64_t n = std::min<int64_t>(max_ngram, L - 1); n >= min_ngram; --n) {
    const std::span<const int32_t> suffix = context.subspan(static_cast<size_t>(L - n));
    for (int64_t j = L - n - 1; j >= 0; --j) {
      if (!std::equal(suffix.begin(), suffix.end(), context.begin() + j)) continue;
      const int64_t from = j + n, to = std::min<int64_t>(L, from + std::max(gamma, 0));
      return {context.begin() + from, context.begin() + to};
    }
  }
  return {};
}

}  // namespace concord::serve
