// The training depth sampler (train/depth.h): its draws' mean and variance against the formulas,
// the Poisson inversion against the pmf, and determinism per (seed, step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <string>

#include "concord/numerics/check.h"
#include "concord/model/model.h"
#include "concord/train/data.h"
#include "concord/train/depth.h"
#include "concord/train/depth_eval.h"

namespace concord::train {
namespace {

// Poisson(λ) by inversion: the frequencies of u on a fine grid are the pmf.
TEST(DepthSampler, PoissonInversionFollowsThePmf) {
  for (double lambda : {0.0, 0.7, 4.0, 31.5}) {
    const int n = 200000;
    std::map<int64_t, int> counts;
    for (int i = 0; i < n; ++i) ++counts[poisson_inverse(lambda, (i + 0.5) / n)];
    double pmf = std::exp(-lambda);
    for (int64_t k = 0; k < 60; ++k) {
      if (k > 0) pmf *= lambda / static_cast<double>(k);
      EXPECT_NEAR(counts[k] / static_cast<double>(n), pmf, 2.0 / n) << "λ " << lambda << " k " << k;
    }
  }
}

// Over 40,000 steps, the sample mean and variance lie within 5 standard errors of E[r] = 1 + r̄
// and Var[r] = r̄ + r̄²(e^{σ²} − 1). The standard errors are estimated from the sample (the
// variance's from the fourth central moment); with 40,000 draws the CLT applies and a false
// failure has probability about 6e-7 per check. The seed is fixed, so the test is deterministic.
TEST(DepthSampler, MeanAndVarianceMatchTheirFormulas) {
  for (const auto& [mean, sigma] : {std::pair{4.0, 0.5}, std::pair{8.0, 0.5}, std::pair{2.0, 0.0}, std::pair{16.0, 1.0}}) {
    DepthSampler d;
    d.mean = mean;
    d.sigma = sigma;
    const int64_t n = 40000;
    double s1 = 0, s2 = 0;
    std::vector<double> r(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      r[static_cast<size_t>(i)] = static_cast<double>(d.at(12345, i));
      ASSERT_GE(r[static_cast<size_t>(i)], 1.0);
      s1 += r[static_cast<size_t>(i)];
    }
    const double m = s1 / static_cast<double>(n);
    double m4 = 0;
    for (double v : r) {
      s2 += (v - m) * (v - m);
      m4 += std::pow(v - m, 4);
    }
    const double var = s2 / static_cast<double>(n - 1);
    m4 /= static_cast<double>(n);
    const double se_mean = std::sqrt(var / static_cast<double>(n));
    const double se_var = std::sqrt((m4 - var * var) / static_cast<double>(n));
    EXPECT_NEAR(m, d.expected_depth(), 5 * se_mean) << mean << " " << sigma;
    EXPECT_NEAR(var, d.depth_variance(), 5 * se_var) << mean << " " << sigma;
    std::printf("[ measured ] r̄ %.0f σ %.1f: mean %.4f (formula %.4f), variance %.3f (formula %.3f)\n", mean, sigma, m,
                d.expected_depth(), var, d.depth_variance());
  }
}

TEST(DepthSampler, DrawsDependOnSeedAndStepOnly) {
  DepthSampler d;
  int differ = 0;
  for (int64_t s = 0; s < 100; ++s) {
    EXPECT_EQ(d.at(7, s), d.at(7, s));
    differ += d.at(7, s) != d.at(8, s);
  }
  EXPECT_GT(differ, 50);
  d.kind = "fixed";
  EXPECT_EQ(d.at(7, 3), 5);  // round(1 + r̄)
  d.fixed = 9;
  EXPECT_EQ(d.at(7, 3), 9);
  d.kind = "poisson";
  EXPECT_THROW(d.validate("cfg.json"), InputError);
}

// The addition corpus: "a+b=c" lines with the right sums, operands of the asked digit counts,
// every count present, the same text for the same seed.
TEST(AdditionCorpus, LinesAreCorrectSumsOfTheAskedDigitCounts) {
  const std::string text = addition_problems(3000, 2, 5, 9);
  EXPECT_EQ(text, addition_problems(3000, 2, 5, 9));
  EXPECT_NE(text, addition_problems(3000, 2, 5, 10));
  std::istringstream lines(text);
  std::string line;
  std::map<size_t, int> digit_counts;
  int n = 0;
  while (std::getline(lines, line)) {
    ++n;
    const size_t plus = line.find('+'), eq = line.find('=');
    ASSERT_NE(plus, std::string::npos);
    ASSERT_NE(eq, std::string::npos);
    const std::string a = line.substr(0, plus), b = line.substr(plus + 1, eq - plus - 1), c = line.substr(eq + 1);
    for (const std::string& x : {a, b}) {
      ASSERT_GE(x.size(), 2u);
      ASSERT_LE(x.size(), 5u);
      EXPECT_NE(x[0], '0') << line;
      ++digit_counts[x.size()];
    }
    EXPECT_EQ(std::stoull(a) + std::stoull(b), std::stoull(c)) << line;
  }
  EXPECT_EQ(n, 3000);
  EXPECT_EQ(digit_counts.size(), 4u);
  EXPECT_EQ(load_corpus("addition:3").substr(0, 50), addition_problems(400000, 1, 3, 1).substr(0, 50));
  EXPECT_THROW(load_corpus("addition:0"), InputError);
  EXPECT_THROW(load_corpus("addition-reversed:19"), InputError);
  EXPECT_FALSE(addition_corpus("kjv").has_value());
  EXPECT_EQ(addition_corpus("addition-reversed:4")->max_digits, 4);
  EXPECT_EQ(addition_corpus("addition-reversed:4")->order, SumOrder::lsb_first);
  EXPECT_EQ(addition_corpus("addition:4")->order, SumOrder::msb_first);
  EXPECT_THROW(load_corpus("addition:x"), InputError);
  EXPECT_THROW(addition_problems(1, 3, 19, 1), InputError);
}

// The reversed corpus holds the same problems, each sum written least significant digit first.
TEST(AdditionCorpus, ReversedSumsAreTheSameSumsDigitsReversed) {
  std::istringstream msb(addition_problems(2000, 1, 6, 3)), lsb(addition_problems(2000, 1, 6, 3, SumOrder::lsb_first));
  std::string a, b;
  int n = 0, differ = 0;
  while (std::getline(msb, a)) {
    ASSERT_TRUE(std::getline(lsb, b));
    const size_t eq = a.find('=');
    ASSERT_EQ(a.substr(0, eq + 1), b.substr(0, eq + 1));
    std::string sum = b.substr(eq + 1);
    differ += sum != a.substr(eq + 1);
    std::reverse(sum.begin(), sum.end());
    EXPECT_EQ(sum, a.substr(eq + 1)) << b;
    ++n;
  }
  EXPECT_FALSE(std::getline(lsb, b));
  EXPECT_EQ(n, 2000);
  EXPECT_GT(differ, 1000);  // most sums are not palindromes
  EXPECT_EQ(load_corpus("addition-reversed:3").substr(0, 60),
            addition_problems(400000, 1, 3, 1, SumOrder::lsb_first).substr(0, 60));
}

// Decoding token by token through the KV cache scores exactly what the full forward scores (its
// logits are the same bits); adaptive exit with threshold 0 runs every iteration.
TEST(DepthEval, DecodingScoresWhatTheFullForwardScores) {
  model::ModelConfig c;
  c.architecture = "ConcordRecurrentForCausalLM";
  c.vocab_size = 259;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  c.max_position_embeddings = 64;
  c.n_layers_in_prelude = 1;
  c.n_layers_in_recurrent_block = 1;
  c.n_layers_in_coda = 1;
  c.mean_recurrence = 3;
  c.max_recurrence = 8;
  c.state_init_std = 0.2;
  model::Model m(c);
  m.init_random(3, 0.1f);
  const ByteTokenizer tokenizer;
  const std::vector<Batch> batches =
      validation_batches(tokenizer.encode(addition_problems(200, 1, 3, 4)), 2, 24, 2);
  const double full = mean_loss(m, batches);
  const DecodeEval fixed = decode_eval(m, batches, 4, std::nullopt);
  EXPECT_EQ(fixed.tokens, 4 * 24);
  EXPECT_NEAR(fixed.loss, full, 1e-12 * full);
  EXPECT_DOUBLE_EQ(fixed.iterations_per_token, 3.0);
  const DecodeEval exhaustive = decode_eval(m, batches, 4, model::Model::AdaptiveExit{0.0, 3});
  EXPECT_NEAR(exhaustive.loss, full, 1e-12 * full);
  EXPECT_DOUBLE_EQ(exhaustive.iterations_per_token, 3.0);
  const DecodeEval eager = decode_eval(m, batches, 4, model::Model::AdaptiveExit{INFINITY, 6});
  EXPECT_DOUBLE_EQ(eager.iterations_per_token, 2.0);
  const double acc = addition_accuracy(m, 2, 10, 5);
  EXPECT_GE(acc, 0.0);
  EXPECT_LE(acc, 1.0);
}

}  // namespace
}  // namespace concord::train
