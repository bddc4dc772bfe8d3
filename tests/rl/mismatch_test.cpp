// Mismatch metrics against values worked out by hand and a long-double re-computation of the
// verl formulas written here.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "concord/numerics/check.h"
#include "concord/rl/mismatch.h"

namespace concord::rl {
namespace {

TEST(Mismatch, IdenticalLogprobsShowNoMismatch) {
  std::vector<std::vector<double>> s{{-0.1, -2.0, -0.5}, {-1.0}};
  const MismatchMetrics m = mismatch_metrics(s, s);
  EXPECT_EQ(m.sequences, 2);
  EXPECT_EQ(m.tokens, 4);
  EXPECT_EQ(m.kl, 0.0);
  EXPECT_EQ(m.k3_kl, 0.0);
  EXPECT_EQ(m.chi2_token, 0.0);
  EXPECT_EQ(m.chi2_seq, 0.0);
  EXPECT_EQ(m.is_mean, 1.0);
  EXPECT_EQ(m.is_min, 1.0);
  EXPECT_EQ(m.is_max, 1.0);
  EXPECT_EQ(m.is_ess, 1.0);
  EXPECT_EQ(m.token_mult_prob_error, 1.0);
  EXPECT_EQ(m.prob_diff_max, 0.0);
  EXPECT_EQ(m.log_ppl_abs_diff, 0.0);
  EXPECT_DOUBLE_EQ(m.training_ppl, m.rollout_ppl);
  EXPECT_DOUBLE_EQ(m.ppl_ratio, 1.0);
}

TEST(Mismatch, OneTokenByHand) {
  // sampler p = 0.5, learner p = 0.25: r = ln 0.5.
  std::vector<std::vector<double>> s{{std::log(0.5)}}, l{{std::log(0.25)}};
  const MismatchMetrics m = mismatch_metrics(s, l);
  const double r = std::log(0.5);
  EXPECT_DOUBLE_EQ(m.kl, -r);
  EXPECT_DOUBLE_EQ(m.k3_kl, 0.5 - r - 1);
  EXPECT_DOUBLE_EQ(m.is_mean, 0.5);
  EXPECT_DOUBLE_EQ(m.chi2_token, 0.25 - 1);
  EXPECT_DOUBLE_EQ(m.token_mult_prob_error, 2.0);
  EXPECT_DOUBLE_EQ(m.prob_diff_max, 0.25);
  EXPECT_DOUBLE_EQ(m.training_ppl, 4.0);
  EXPECT_DOUBLE_EQ(m.rollout_ppl, 2.0);
  EXPECT_DOUBLE_EQ(m.log_ppl_diff, -r);
  EXPECT_DOUBLE_EQ(m.ppl_ratio, 2.0);
  EXPECT_DOUBLE_EQ(m.is_ess, 1.0);
  const nlohmann::json j = m.to_json();
  EXPECT_DOUBLE_EQ(j["rollout_corr/k3_kl"].get<double>(), m.k3_kl);
  EXPECT_TRUE(j.contains("rollout_corr/log_ppl_abs_diff"));
  EXPECT_TRUE(j.contains("token_mult_prob_error"));
}

TEST(Mismatch, RandomBatchesAgainstLongDouble) {
  std::mt19937_64 gen(5);
  std::uniform_real_distribution<double> logp(-6.0, -1e-3), noise(-0.3, 0.3);
  std::uniform_int_distribution<int> len(0, 40);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::vector<double>> s(8), l(8);
    for (size_t i = 0; i < s.size(); ++i) {
      const int n = len(gen) + (i == 0 ? 1 : 0);
      for (int t = 0; t < n; ++t) {
        s[i].push_back(logp(gen));
        l[i].push_back(std::min(0.0, s[i].back() + noise(gen)));
      }
    }
    long double kl = 0, k3 = 0, w_sum = 0, w2_sum = 0, mult = 0, lpd_abs = 0, chi2_seq = 0;
    long double n_tok = 0, n_seq = 0;
    std::vector<long double> ws;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i].empty()) continue;
      long double ms = 0, ml = 0, rs = 0;
      for (size_t t = 0; t < s[i].size(); ++t) {
        const long double r = static_cast<long double>(l[i][t]) - s[i][t];
        kl += -r;
        k3 += std::exp(r) - r - 1;
        ws.push_back(std::exp(r));
        mult += std::exp(std::fabs(r));
        ms += s[i][t];
        ml += l[i][t];
        rs += r;
        n_tok += 1;
      }
      const auto n = static_cast<long double>(s[i].size());
      lpd_abs += std::fabs(ms / n - ml / n);
      chi2_seq += std::exp(2 * rs);
      n_seq += 1;
    }
    for (long double w : ws) w_sum += w;
    const long double w_mean = w_sum / n_tok;
    for (long double w : ws) w2_sum += (w / w_mean) * (w / w_mean);
    const MismatchMetrics m = mismatch_metrics(s, l);
    EXPECT_NEAR(m.kl, static_cast<double>(kl / n_tok), 1e-12);
    EXPECT_NEAR(m.k3_kl, static_cast<double>(k3 / n_tok), 1e-12);
    EXPECT_NEAR(m.is_mean, static_cast<double>(w_mean), 1e-12);
    EXPECT_NEAR(m.is_ess, static_cast<double>(n_tok / w2_sum), 1e-12);
    EXPECT_NEAR(m.token_mult_prob_error, static_cast<double>(mult / n_tok), 1e-12);
    EXPECT_NEAR(m.log_ppl_abs_diff, static_cast<double>(lpd_abs / n_seq), 1e-12);
    EXPECT_NEAR(m.chi2_seq, static_cast<double>(chi2_seq / n_seq - 1), 1e-9);
    EXPECT_GE(m.k3_kl, 0.0);
    EXPECT_LE(m.is_ess, 1.0 + 1e-12);
  }
}

TEST(Mismatch, BadInput) {
  std::vector<std::vector<double>> a{{-1.0}}, b{{-1.0}, {-2.0}}, c{{-1.0, -2.0}}, e{{}};
  EXPECT_THROW(mismatch_metrics(a, b), InputError);
  EXPECT_THROW(mismatch_metrics(a, c), InputError);
  EXPECT_THROW(mismatch_metrics(e, e), InputError);
  std::vector<std::vector<double>> pos{{0.5}}, nan{{std::nan("")}};
  EXPECT_THROW(mismatch_metrics(pos, a), InputError);
  EXPECT_THROW(mismatch_metrics(a, nan), InputError);
}

}  // namespace
}  // namespace concord::rl
