// Sampling and log-probabilities against plain references written here: greedy tie-break, the
// kept set of top-k / top-p / min-p, empirical frequencies (chi-square), seeding, and
// log-probabilities against a long-double reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "concord/numerics/check.h"
#include "concord/serve/logprob.h"
#include "concord/serve/sampling.h"

namespace concord::serve {
namespace {

std::vector<float> random_logits(size_t V, uint64_t seed, float spread = 3.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, spread);
  std::vector<float> l(V);
  for (float& x : l) x = normal(rng);
  return l;
}

// The reference: log_softmax in long double, by a different route (log Σ exp over the sorted
// values, no max subtraction needed at these magnitudes).
long double reference_logprob(const std::vector<float>& logits, int32_t token, double T) {
  std::vector<long double> z;
  for (float x : logits) z.push_back(static_cast<long double>(x) / T);
  std::vector<long double> sorted = z;
  std::sort(sorted.begin(), sorted.end());
  long double sum = 0;
  for (long double v : sorted) sum += std::exp(v);
  return z[static_cast<size_t>(token)] - std::log(sum);
}

// The reference kept set: a full sort by (p descending, index ascending), then the three cuts
// exactly as sampling.h states them.
std::vector<int32_t> reference_kept(const std::vector<float>& logits, const SamplingParams& p) {
  const SoftmaxStats s = softmax_stats(logits, p.temperature);
  std::vector<double> prob(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) prob[i] = std::exp(s.logprob(logits[i]));
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return prob[a] != prob[b] ? prob[a] > prob[b] : a < b;
  });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size()) order.resize(p.top_k);
  if (p.top_p < 1.0f) {
    std::vector<int32_t> asc = order;
    std::sort(asc.begin(), asc.end());
    double total = 0;
    for (int32_t i : asc) total += prob[i];
    double running = 0;
    size_t n = 0;
    while (n < order.size()) {
      running += prob[order[n++]];
      if (running >= p.top_p * total) break;
    }
    order.resize(n);
  }
  if (p.min_p > 0.0f) {
    const double top = prob[order[0]];
    std::vector<int32_t> kept;
    for (int32_t i : order) {
      if (prob[i] >= p.min_p * top) kept.push_back(i);
    }
    order = kept;
  }
  std::sort(order.begin(), order.end());
  return order;
}

TEST(Sampling, GreedyIsArgmaxWithLowestIndexTieBreak) {
  EXPECT_EQ(greedy_token(std::vector<float>{1, 3, 3, 2}), 1);
  EXPECT_EQ(greedy_token(std::vector<float>{-INFINITY, -5, -5}), 1);
  EXPECT_EQ(greedy_token(std::vector<float>{7}), 0);
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_k = 1;
  const std::vector<float> ties{0.5f, 2.0f, 2.0f, 2.0f};
  for (uint64_t t = 0; t < 20; ++t) EXPECT_EQ(sample_token(ties, p, t), 1);
  EXPECT_THROW(greedy_token(std::vector<float>{1, NAN}), InputError);
  EXPECT_THROW(greedy_token(std::vector<float>{}), InputError);
}

TEST(Sampling, KeptSetMatchesReference) {
  int cases = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    auto logits = random_logits(seed % 2 ? 50 : 700, seed);
    if (seed % 5 == 0) {  // ties at the boundaries
      for (size_t i = 0; i < logits.size(); i += 3) logits[i] = logits[0];
    }
    for (float T : {0.5f, 1.0f, 1.7f}) {
      for (int k : {0, 1, 5, 40}) {
        for (float top_p : {1.0f, 0.9f, 0.5f, 0.05f}) {
          for (float min_p : {0.0f, 0.05f, 0.3f}) {
            SamplingParams p;
            p.temperature = T;
            p.top_k = k;
            p.top_p = top_p;
            p.min_p = min_p;
            const Candidates c = sampling_candidates(logits, p);
            ASSERT_EQ(c.tokens, reference_kept(logits, p))
                << "seed " << seed << " T " << T << " k " << k << " p " << top_p << " min_p " << min_p;
            ASSERT_EQ(c.tokens.size(), c.probs.size());
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 40 * 3 * 4 * 4 * 3);
  // Hand-checked: p ∝ (4, 2, 1, 1) over exp logits.
  const std::vector<float> l{std::log(4.0f), std::log(2.0f), 0.0f, 0.0f};
  SamplingParams p;
  p.top_p = 0.7f;  // 0.5 + 0.25 >= 0.7
  EXPECT_EQ(sampling_candidates(l, p).tokens, (std::vector<int32_t>{0, 1}));
  p.top_p = 1.0f;
  p.top_k = 3;  // ties (2, 3) broken by index
  EXPECT_EQ(sampling_candidates(l, p).tokens, (std::vector<int32_t>{0, 1, 2}));
  p.top_k = 0;
  p.min_p = 0.3f;  // keeps p >= 0.3 · 0.5
  EXPECT_EQ(sampling_candidates(l, p).tokens, (std::vector<int32_t>{0, 1}));
}

// Upper tail of the chi-square distribution: Q(df/2, x/2), the regularized gamma, by its series.
double chi_square_survival(double x, int df) {
  const double a = df / 2.0, h = x / 2.0;
  double term = 1.0 / a, sum = term;
  for (int n = 1; n < 1000; ++n) {
    term *= h / (a + n);
    sum += term;
  }
  return 1.0 - std::exp(-h + a * std::log(h) - std::lgamma(a)) * sum;
}

// Empirical frequencies of the seeded sampler against the truncated, renormalized distribution.
// The seeds are fixed, so the test is deterministic; were the draws truly random, a correct
// sampler would fail the p < 1e-6 threshold with probability 1e-6 per case.
TEST(Sampling, FrequenciesMatchTruncatedDistribution) {
  const std::vector<float> logits{1.0f, 0.2f, 2.0f, -1.0f, 0.5f, 1.5f, -3.0f, 0.9f};
  struct Case {
    float T;
    int k;
    float top_p, min_p;
  };
  for (const Case& cs : {Case{1.0f, 0, 1.0f, 0.0f}, Case{0.7f, 5, 1.0f, 0.0f},
                         Case{1.3f, 0, 0.8f, 0.0f}, Case{1.0f, 6, 0.9f, 0.1f}}) {
    SamplingParams p;
    p.temperature = cs.T;
    p.top_k = cs.k;
    p.top_p = cs.top_p;
    p.min_p = cs.min_p;
    p.seed = 1234;
    const auto kept = reference_kept(logits, p);
    const SoftmaxStats s = softmax_stats(logits, cs.T);
    double total = 0;
    for (int32_t i : kept) total += std::exp(s.logprob(logits[i]));
    constexpr int kDraws = 40000;
    std::vector<int> count(logits.size(), 0);
    for (uint64_t t = 0; t < kDraws; ++t) ++count[sample_token(logits, p, t)];
    double chi2 = 0;
    int outside = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      if (std::find(kept.begin(), kept.end(), static_cast<int32_t>(i)) == kept.end()) {
        outside += count[i];
        continue;
      }
      const double expected = kDraws * std::exp(s.logprob(logits[i])) / total;
      chi2 += (count[i] - expected) * (count[i] - expected) / expected;
    }
    EXPECT_EQ(outside, 0);
    const int df = static_cast<int>(kept.size()) - 1;
    EXPECT_GT(chi_square_survival(chi2, df), 1e-6) << "chi2 " << chi2 << " df " << df;
  }
  EXPECT_NEAR(chi_square_survival(27.631021115928547, 2), 1e-6, 1e-12);  // = exp(-x/2) for df 2
}

TEST(Sampling, SeedAndStepDetermineTheDraw) {
  const auto logits = random_logits(300, 5, 1.0f);
  SamplingParams p;
  p.seed = 99;
  std::vector<int32_t> a, b;
  for (uint64_t t = 0; t < 50; ++t) a.push_back(sample_token(logits, p, t));
  for (uint64_t t = 50; t-- > 0;) b.insert(b.begin(), sample_token(logits, p, t));  // any order
  EXPECT_EQ(a, b);
  p.seed = 100;
  std::vector<int32_t> c;
  for (uint64_t t = 0; t < 50; ++t) c.push_back(sample_token(logits, p, t));
  EXPECT_NE(a, c);
  EXPECT_EQ(sampling_uniform(7, 3), sampling_uniform(7, 3));
  EXPECT_NE(sampling_uniform(7, 3), sampling_uniform(7, 4));
  for (uint64_t t = 0; t < 1000; ++t) {
    const double u = sampling_uniform(1, t);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(Sampling, RejectsBadParameters) {
  const std::vector<float> logits{0, 1};
  SamplingParams p;
  p.temperature = -1;
  EXPECT_THROW(sample_token(logits, p, 0), InputError);
  p = {};
  p.temperature = INFINITY;
  EXPECT_THROW(sample_token(logits, p, 0), InputError);
  p = {};
  p.top_k = -2;
  EXPECT_THROW(sample_token(logits, p, 0), InputError);
  p = {};
  p.top_p = 1.5f;
  EXPECT_THROW(sample_token(logits, p, 0), InputError);
  p = {};
  p.min_p = -0.1f;
  EXPECT_THROW(sample_token(logits, p, 0), InputError);
  p = {};
  EXPECT_THROW(sample_token(std::vector<float>{0, NAN}, p, 0), InputError);
}

// Every threshold of sampling.h at its value, just below and just above, with logits whose
// probabilities compare exactly: tied logits give bit-identical p, a -Inf logit gives p = 0, so
// sums like q + q and products like 0.5 · 2q are exact in double. The expected kept sets are
// read off the documented rule, not the code.
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<int32_t> kept(const std::vector<float>& logits, float top_p, float min_p,
                          int32_t top_k = 0) {
  SamplingParams p;
  p.top_p = top_p;
  p.min_p = min_p;
  p.top_k = top_k;
  return sampling_candidates(logits, p).tokens;
}

TEST(SamplingBoundaries, TopPAtTheExactMass) {
  // Tokens 1 and 3 tie (p = q each), the rest have p = 0: P = 2q, and top_p = 1/2 asks for a
  // mass of exactly q, which the first of the two (index 1, the lower) reaches: "reaches" is >=.
  const std::vector<float> logits{kNegInf, 0.0f, kNegInf, 0.0f};
  EXPECT_EQ(kept(logits, 0.5f, 0.0f), (std::vector<int32_t>{1}));
  EXPECT_EQ(kept(logits, std::nextafter(0.5f, 0.0f), 0.0f), (std::vector<int32_t>{1}));
  EXPECT_EQ(kept(logits, std::nextafter(0.5f, 1.0f), 0.0f), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(kept(logits, 1.0f, 0.0f), (std::vector<int32_t>{0, 1, 2, 3}));  // 1: off
  // Four ties: P = 4q, top_p = 1/4 is exactly one token's mass, 3/4 exactly three.
  const std::vector<float> four{2.0f, 2.0f, 2.0f, 2.0f, kNegInf};
  EXPECT_EQ(kept(four, 0.25f, 0.0f), (std::vector<int32_t>{0}));
  EXPECT_EQ(kept(four, std::nextafter(0.25f, 1.0f), 0.0f), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(kept(four, 0.5f, 0.0f), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(kept(four, std::nextafter(0.5f, 1.0f), 0.0f), (std::vector<int32_t>{0, 1, 2}));
}

TEST(SamplingBoundaries, MinPKeepsTheTokenAtTheThreshold) {
  // min_p = 1: the threshold is p_max itself, and a token tied with the top has p == threshold:
  // kept ("p_i >= min_p · max p"). A token one float step below the top is not.
  const float below = std::nextafter(1.0f, 0.0f);
  const std::vector<float> logits{1.0f, below, 1.0f, 0.0f};
  EXPECT_EQ(kept(logits, 1.0f, 1.0f), (std::vector<int32_t>{0, 2}));
  // min_p one float step below 1 (1 - 2^-24) keeps token 1, whose ratio to the top is
  // exp(-2^-24) = 1 - 2^-24 + 2^-49 (a margin 10x the rounding of the two exps), not token 3.
  EXPECT_EQ(kept(logits, 1.0f, below), (std::vector<int32_t>{0, 1, 2}));
  // Token 3's ratio is exp(-1); the floats on either side of it keep and drop it.
  const auto ratio = static_cast<float>(std::exp(-1.0));
  EXPECT_EQ(kept(logits, 1.0f, std::nextafter(ratio, 0.0f)), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(kept(logits, 1.0f, std::nextafter(ratio, 1.0f)), (std::vector<int32_t>{0, 1, 2}));
  // The top token is always kept, and min_p = 0 is off.
  EXPECT_EQ(kept(std::vector<float>{5.0f}, 1.0f, 1.0f), (std::vector<int32_t>{0}));
  EXPECT_EQ(kept(logits, 1.0f, 0.0f), (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(SamplingBoundaries, TopKAtTheVocabularySize) {
  const std::vector<float> logits{0.5f, 3.0f, 1.0f, 3.0f, -2.0f};  // order: 1, 3, 2, 0, 4
  EXPECT_EQ(kept(logits, 1.0f, 0.0f, 5), (std::vector<int32_t>{0, 1, 2, 3, 4}));  // k = V
  EXPECT_EQ(kept(logits, 1.0f, 0.0f, 6), (std::vector<int32_t>{0, 1, 2, 3, 4}));  // k > V
  EXPECT_EQ(kept(logits, 1.0f, 0.0f, 4), (std::vector<int32_t>{0, 1, 2, 3}));     // k = V - 1
  EXPECT_EQ(kept(logits, 1.0f, 0.0f, 2), (std::vector<int32_t>{1, 3}));          // the tie
  EXPECT_EQ(kept(logits, 1.0f, 0.0f, 1), (std::vector<int32_t>{1}));  // the lower index of it
  EXPECT_EQ(kept(logits, 1.0f, 0.0f, 0), (std::vector<int32_t>{0, 1, 2, 3, 4}));  // 0: off
}

TEST(SamplingBoundaries, ParameterRangesAtTheirEnds) {
  const std::vector<float> logits{0.0f, 1.0f};
  auto valid = [&](float T, int32_t k, float top_p, float min_p) {
    SamplingParams p;
    p.temperature = T;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    try {
      sample_token(logits, p, 0);
      return true;
    } catch (const InputError&) {
      return false;
    }
  };
  EXPECT_TRUE(valid(0.0f, 0, 1.0f, 0.0f));   // T = 0: greedy
  EXPECT_FALSE(valid(-0.0f - std::numeric_limits<float>::denorm_min(), 0, 1.0f, 0.0f));
  EXPECT_TRUE(valid(1.0f, 0, 1.0f, 0.0f));   // k = 0 off
  EXPECT_FALSE(valid(1.0f, -1, 1.0f, 0.0f));
  EXPECT_TRUE(valid(1.0f, 0, 1.0f, 0.0f));   // top_p = 1 is in (0, 1]
  EXPECT_FALSE(valid(1.0f, 0, std::nextafter(1.0f, 2.0f), 0.0f));
  EXPECT_TRUE(valid(1.0f, 0, std::numeric_limits<float>::denorm_min(), 0.0f));
  EXPECT_FALSE(valid(1.0f, 0, 0.0f, 0.0f));  // top_p = 0 is not
  EXPECT_TRUE(valid(1.0f, 0, 1.0f, 1.0f));   // min_p in [0, 1]
  EXPECT_FALSE(valid(1.0f, 0, 1.0f, std::nextafter(1.0f, 2.0f)));
  EXPECT_FALSE(valid(1.0f, 0, 1.0f, -std::numeric_limits<float>::denorm_min()));
}

TEST(Logprob, MatchesLongDoubleReference) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const auto logits = random_logits(seed % 2 ? 1000 : 37, seed, 4.0f);
    for (float T : {0.0f, 0.3f, 1.0f, 2.5f}) {
      std::vector<float> all(logits.size());
      full_logprobs(logits, T, all);
      for (int32_t tok = 0; tok < static_cast<int32_t>(logits.size()); tok += 7) {
        const double got = token_logprob(logits, tok, T);
        const long double want = reference_logprob(logits, tok, T == 0.0f ? 1.0 : T);
        EXPECT_NEAR(got, static_cast<double>(want), 1e-12 * (1 + std::fabs(got))) << seed << " " << T;
        EXPECT_EQ(all[tok], static_cast<float>(got));
      }
    }
  }
  // Greedy scores with T = 1: the same as temperature 1.
  const auto l = random_logits(10, 3);
  EXPECT_EQ(token_logprob(l, 4, 0.0f), token_logprob(l, 4, 1.0f));
  // Large logits do not overflow (max subtraction); -Inf entries get -Inf.
  const std::vector<float> big{1000.0f, 999.0f, -INFINITY};
  EXPECT_NEAR(token_logprob(big, 0, 1.0f), -std::log1p(std::exp(-1.0)), 1e-15);
  EXPECT_EQ(token_logprob(big, 2, 1.0f), -INFINITY);
  EXPECT_THROW(token_logprob(big, 3, 1.0f), InputError);
  EXPECT_THROW(token_logprob(big, 0, -1.0f), InputError);
  EXPECT_THROW(token_logprob(std::vector<float>{1, NAN}, 0, 1.0f), InputError);
  std::vector<float> short_out(2);
  EXPECT_THROW(full_logprobs(big, 1.0f, short_out), InputError);
}

}  // namespace
}  // namespace concord::serve
