// The training depth sampler (train/depth.h): its draws' mean and variance against the formulas,
// the Poisson inversion against the pmf, and determinism per (seed, step).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "concord/numerics/check.h"
#include "concord/train/depth.h"

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

}  // namespace
}  // namespace concord::train
