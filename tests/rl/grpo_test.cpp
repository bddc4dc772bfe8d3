// The GRPO / PPO-clip loss (rl/grpo.h) against fp64 references written here, and the model's
// policy-gradient pass (Model::forward_backward_policy) against forward_backward and an fp64
// log-softmax of the forward logits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concord/model/model.h"
#include "concord/model/ops.h"
#include "concord/numerics/check.h"
#include "concord/rl/grpo.h"
#include "concord/serve/logprob.h"

namespace concord::rl {
namespace {

// ---- fp64 references, sharing nothing with src/ ---------------------------------------------

std::vector<double> ref_advantages(const std::vector<double>& r, size_t g, bool normalize,
                                   double eps) {
  std::vector<double> a(r.size());
  for (size_t s = 0; s < r.size(); s += g) {
    long double mean = 0;
    for (size_t i = s; i < s + g; ++i) mean += r[i];
    mean /= g;
    long double var = 0;
    for (size_t i = s; i < s + g; ++i) var += (r[i] - mean) * (r[i] - mean);
    const long double sd = std::sqrt(var / g);
    for (size_t i = s; i < s + g; ++i)
      a[i] = static_cast<double>(normalize ? (r[i] - mean) / (sd + eps) : r[i] - mean);
  }
  return a;
}

// One sequence as the reference sees it: learner, old, sampler, reference log-probs.
struct Seq {
  std::vector<double> l, o, s, q;
  double a = 0;
};

double ref_is_weight(const Seq& seq, size_t t, const PolicyLossConfig& c) {
  double log_seq = 0;
  for (size_t u = 0; u < seq.o.size(); ++u) log_seq += seq.o[u] - seq.s[u];
  const double tok = std::exp(seq.o[t] - seq.s[t]), sq = std::exp(log_seq);
  switch (c.is) {
    case IsMode::none: return 1;
    case IsMode::token_tis: return tok < c.is_cap ? tok : c.is_cap;
    case IsMode::seq_tis: return sq < c.is_cap ? sq : c.is_cap;
    case IsMode::token_mask: return (c.mask_lo <= tok && tok <= c.mask_hi) ? 1 : 0;
    case IsMode::seq_mask: return (c.mask_lo <= sq && sq <= c.mask_hi) ? 1 : 0;
  }
  return -1;
}

// L = −(1/N) Σ w·min(ρA, clip(ρ)A) + β (1/N) Σ (e^{q−l} − (q−l) − 1).
double ref_loss(const std::vector<Seq>& seqs, const PolicyLossConfig& c) {
  double sum = 0;
  size_t n = 0;
  for (const Seq& seq : seqs) {
    for (size_t t = 0; t < seq.l.size(); ++t, ++n) {
      const double rho = std::exp(seq.l[t] - seq.o[t]);
      const double clipped = std::max(1 - c.clip_low, std::min(1 + c.clip_high, rho));
      sum -= ref_is_weight(seq, t, c) * std::min(rho * seq.a, clipped * seq.a);
      if (!seq.q.empty()) {
        const double d = seq.q[t] - seq.l[t];
        sum += c.kl_coef * (std::exp(d) - d - 1);
      }
    }
  }
  return sum / static_cast<double>(n);
}

// Runs policy_loss on the reference's sequences.
struct LossRun {
  PolicyLossStats stats;
  std::vector<std::vector<double>> coef;
};
LossRun run_loss(const std::vector<Seq>& seqs, const PolicyLossConfig& c,
             const std::vector<std::vector<double>>& entropy = {}) {
  std::vector<SequenceLogprobs> in;
  std::vector<std::vector<double>> learner;
  for (const Seq& s : seqs) {
    in.push_back({s.o, s.s, s.q, s.a});
    learner.push_back(s.l);
  }
  LossRun r;
  r.coef.resize(seqs.size());
  r.stats = policy_loss(in, learner, entropy, c, r.coef);
  return r;
}

Seq token(double l, double o, double s, double a) { return Seq{{l}, {o}, {s}, {}, a}; }

// ---- advantages -----------------------------------------------------------------------------

TEST(GroupAdvantages, HandCases) {
  const std::vector<double> r{1, 0, 3, 3, 0, 0, 0, 2};
  const auto a = group_advantages(r, 2);
  const double unit = 0.5 / (0.5 + 1e-6);  // mean 0.5, population std 0.5
  EXPECT_DOUBLE_EQ(a[0], unit);
  EXPECT_DOUBLE_EQ(a[1], -unit);
  EXPECT_EQ(a[2], 0.0);  // equal rewards: no signal
  EXPECT_EQ(a[3], 0.0);
  EXPECT_EQ(a[4], 0.0);
  EXPECT_EQ(a[5], 0.0);
  EXPECT_DOUBLE_EQ(a[6], -1 / (1 + 1e-6));
  EXPECT_DOUBLE_EQ(a[7], 1 / (1 + 1e-6));
  const auto dr = group_advantages(r, 4, /*normalize_std=*/false);  // Dr. GRPO: centred only
  EXPECT_DOUBLE_EQ(dr[0], 1 - 1.75);
  EXPECT_DOUBLE_EQ(dr[2], 3 - 1.75);
  EXPECT_DOUBLE_EQ(dr[7], 2 - 0.5);
  const auto single = group_advantages(r, 1);
  for (double x : single) EXPECT_EQ(x, 0.0);
}

TEST(GroupAdvantages, MatchesReference) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> nd(0.3, 2.0);
  std::vector<double> r(48);
  for (double& x : r) x = nd(rng);
  for (size_t g : {2u, 6u, 8u, 48u}) {
    for (bool norm : {true, false}) {
      const auto got = group_advantages(r, static_cast<int64_t>(g), norm, 1e-4);
      const auto want = ref_advantages(r, g, norm, 1e-4);
      for (size_t i = 0; i < r.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-13) << g << " " << i;
    }
  }
}

TEST(GroupAdvantages, Errors) {
  const std::vector<double> r{1, 2, 3};
  EXPECT_THROW(group_advantages(r, 0), InputError);
  EXPECT_THROW(group_advantages(r, 2), InputError);
  const std::vector<double> bad{1, NAN};
  EXPECT_THROW(group_advantages(bad, 2), InputError);
}

// ---- IS mode names ----------------------------------------------------------------------------

TEST(IsMode, NamesRoundTrip) {
  const auto names = is_mode_names();
  ASSERT_EQ(names.size(), 5u);
  for (const std::string& n : names) EXPECT_EQ(is_mode_name(is_mode_from_name(n)), n);
  EXPECT_EQ(is_mode_from_name("token_tis"), IsMode::token_tis);
  try {
    is_mode_from_name("tis");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("seq_mask"), std::string::npos) << e.what();
  }
}

// ---- the loss on hand-checkable cases ---------------------------------------------------------

TEST(PolicyLoss, FirstUpdateIsMinusMeanAdvantage) {
  // ρ = 1 everywhere: L = −(1/N) Σ A, ∂L/∂l_t = −A/N.
  PolicyLossConfig c;
  const std::vector<Seq> seqs{Seq{{-1, -2}, {-1, -2}, {-1, -2}, {}, 1.5},
                              Seq{{-0.5}, {-0.5}, {-0.5}, {}, -0.75}};
  const LossRun r = run_loss(seqs, c);
  EXPECT_DOUBLE_EQ(r.stats.loss, -(1.5 + 1.5 - 0.75) / 3);
  EXPECT_DOUBLE_EQ(r.stats.pg_loss, r.stats.loss);
  EXPECT_EQ(r.stats.kl, 0.0);
  EXPECT_EQ(r.stats.tokens, 3);
  EXPECT_EQ(r.stats.clip_fraction, 0.0);
  EXPECT_EQ(r.stats.is_weight_mean, 1.0);
  EXPECT_DOUBLE_EQ(r.coef[0][0], -0.5);
  EXPECT_DOUBLE_EQ(r.coef[0][1], -0.5);
  EXPECT_DOUBLE_EQ(r.coef[1][0], 0.25);
}

TEST(PolicyLoss, ClipHandCases) {
  PolicyLossConfig c;  // ε = 0.2 both sides
  const double up = std::log(1.5), down = std::log(0.5);
  // A = 2: ρ = 1.5 → min(3, 2.4) = 2.4 clipped (no gradient); ρ = 0.5 → min(1, 1.6) = 1.
  // A = −1: ρ = 0.5 → min(−0.5, −0.8) = −0.8 clipped; ρ = 1.5 → min(−1.5, −1.2) = −1.5.
  const std::vector<Seq> seqs{token(up, 0, 0, 2), token(down, 0, 0, 2), token(down, 0, 0, -1),
                              token(up, 0, 0, -1)};
  const LossRun r = run_loss(seqs, c);
  EXPECT_NEAR(r.stats.loss, -(2.4 + 1 - 0.8 - 1.5) / 4, 1e-15);
  EXPECT_DOUBLE_EQ(r.stats.clip_fraction, 0.5);
  EXPECT_EQ(r.coef[0][0], 0.0);
  EXPECT_NEAR(r.coef[1][0], -1.0 / 4, 1e-15);  // −ρA/N
  EXPECT_EQ(r.coef[2][0], 0.0);
  EXPECT_NEAR(r.coef[3][0], 1.5 / 4, 1e-15);
}

TEST(PolicyLoss, AsymmetricClip) {
  // ρ = 1.25, A = 1: inside [0.8, 1.28] (clip-higher, DAPO) but clipped at the symmetric 1.2.
  const std::vector<Seq> seqs{token(std::log(1.25), 0, 0, 1)};
  PolicyLossConfig c;
  c.clip_high = 0.28;
  LossRun r = run_loss(seqs, c);
  EXPECT_NEAR(r.coef[0][0], -1.25, 1e-15);
  EXPECT_NEAR(r.stats.loss, -1.25, 1e-15);
  EXPECT_EQ(r.stats.clip_fraction, 0.0);
  c.clip_high = 0.2;
  r = run_loss(seqs, c);
  EXPECT_EQ(r.coef[0][0], 0.0);
  EXPECT_NEAR(r.stats.loss, -1.2, 1e-15);
  EXPECT_EQ(r.stats.clip_fraction, 1.0);
  // ρ = 0.75, A = −1: clipped at the symmetric 0.8, not with clip_low = 0.3.
  const std::vector<Seq> low{token(std::log(0.75), 0, 0, -1)};
  c.clip_low = 0.3;
  r = run_loss(low, c);
  EXPECT_NEAR(r.coef[0][0], 0.75, 1e-15);
  c.clip_low = 0.2;
  r = run_loss(low, c);
  EXPECT_EQ(r.coef[0][0], 0.0);
}

TEST(PolicyLoss, ImportanceWeightsHandCases) {
  // l = o (ρ = 1), A = 1, so J_t = w_t and L = −mean w. Token ratios exp(o − s): 3 and 0.6;
  // the sequence ratio 1.8.
  const Seq seq{{-1, -2}, {-1, -2}, {-1 - std::log(3.0), -2 - std::log(0.6)}, {}, 1};
  struct Case {
    IsMode mode;
    double w0, w1;
  };
  const Case cases[] = {{IsMode::none, 1, 1},        {IsMode::token_tis, 2, 0.6},
                        {IsMode::seq_tis, 1.8, 1.8}, {IsMode::token_mask, 0, 1},
                        {IsMode::seq_mask, 1, 1}};
  for (const Case& k : cases) {
    PolicyLossConfig c;
    c.is = k.mode;  // C = 2, [lo, hi] = [0.5, 2]
    const LossRun r = run_loss({seq}, c);
    const std::string m(is_mode_name(k.mode));
    EXPECT_NEAR(r.stats.loss, -(k.w0 + k.w1) / 2, 1e-14) << m;
    EXPECT_NEAR(r.stats.is_weight_mean, (k.w0 + k.w1) / 2, 1e-14) << m;
    EXPECT_NEAR(r.coef[0][0], -k.w0 / 2, 1e-14) << m;
    EXPECT_NEAR(r.coef[0][1], -k.w1 / 2, 1e-14) << m;
    EXPECT_DOUBLE_EQ(r.stats.masked_fraction, k.mode == IsMode::token_mask ? 0.5 : 0.0) << m;
  }
  // seq_mask drops the whole sequence once its ratio leaves [lo, hi]; seq_tis caps it at C.
  const Seq far{{-1, -2}, {-1, -2}, {-1 - std::log(3.0), -2 - std::log(0.9)}, {}, 1};  // 2.7
  PolicyLossConfig c;
  c.is = IsMode::seq_mask;
  LossRun r = run_loss({far}, c);
  EXPECT_EQ(r.coef[0][0], 0.0);
  EXPECT_EQ(r.coef[0][1], 0.0);
  EXPECT_EQ(r.stats.masked_fraction, 1.0);
  EXPECT_EQ(r.stats.loss, 0.0);
  c.is = IsMode::seq_tis;
  r = run_loss({far}, c);
  EXPECT_NEAR(r.stats.is_weight_mean, 2.0, 1e-15);
}

TEST(PolicyLoss, KlHandCase) {
  // q − l = ln 2: K = 2 − ln 2 − 1; ∂K/∂l = 1 − e^{q−l} = −1. A = 0 leaves only the KL.
  const double l = -1.0;
  Seq seq{{l}, {l}, {l}, {l + std::log(2.0)}, 0};
  PolicyLossConfig c;
  c.kl_coef = 0.1;
  const LossRun r = run_loss({seq}, c);
  EXPECT_NEAR(r.stats.kl, 1 - std::log(2.0), 1e-15);
  EXPECT_NEAR(r.stats.loss, 0.1 * (1 - std::log(2.0)), 1e-15);
  EXPECT_EQ(r.stats.pg_loss, 0.0);
  EXPECT_NEAR(r.coef[0][0], -0.1, 1e-15);
  // KL is reported with kl_coef = 0 too (when reference log-probs are given), but not in the loss.
  c.kl_coef = 0;
  const LossRun r0 = run_loss({seq}, c);
  EXPECT_NEAR(r0.stats.kl, 1 - std::log(2.0), 1e-15);
  EXPECT_EQ(r0.stats.loss, 0.0);
  EXPECT_EQ(r0.coef[0][0], 0.0);
}

TEST(PolicyLoss, StatsAndJson) {
  const std::vector<Seq> seqs{Seq{{-1, -2}, {-1, -2}, {-1, -2}, {}, 1}, Seq{{-3}, {-3}, {-3}, {}, 1}};
  const LossRun r = run_loss(seqs, PolicyLossConfig{}, {{0.5, 1.5}, {4.0}});
  EXPECT_DOUBLE_EQ(r.stats.entropy, 2.0);
  const nlohmann::json j = r.stats.to_json();
  EXPECT_DOUBLE_EQ(j.at("actor/entropy").get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j.at("actor/pg_loss").get<double>(), -1.0);
  EXPECT_EQ(j.at("actor/tokens").get<int64_t>(), 3);
  for (const char* key : {"actor/loss", "actor/kl_loss", "actor/pg_clipfrac",
                          "actor/is_weight_mean", "actor/is_masked_fraction"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
}

// ---- the loss and its gradient against the fp64 reference -------------------------------------

std::vector<Seq> random_batch(uint64_t seed, bool with_ref) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> base(-4.0, -0.05), jitter(-0.35, 0.35), adv(-1.5, 1.5);
  std::vector<Seq> seqs;
  for (size_t len : {5u, 0u, 7u, 3u, 6u}) {
    Seq s;
    s.a = adv(rng);
    for (size_t t = 0; t < len; ++t) {
      const double o = base(rng);
      s.o.push_back(o);
      s.l.push_back(o + jitter(rng));
      s.s.push_back(o + jitter(rng));
      if (with_ref) s.q.push_back(o + jitter(rng));
    }
    seqs.push_back(s);
  }
  return seqs;
}

class LossModes : public ::testing::TestWithParam<IsMode> {};

TEST_P(LossModes, LossMatchesReferenceAndCoefficientsMatchFiniteDifferences) {
  PolicyLossConfig c;
  c.is = GetParam();
  c.clip_low = 0.2;
  c.clip_high = 0.28;
  c.kl_coef = 0.07;
  c.is_cap = 1.3;
  c.mask_lo = 0.8;
  c.mask_hi = 1.25;
  int checked = 0;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    std::vector<Seq> seqs = random_batch(seed, true);
    const LossRun r = run_loss(seqs, c);
    EXPECT_NEAR(r.stats.loss, ref_loss(seqs, c), 1e-14);
    for (size_t i = 0; i < seqs.size(); ++i) {
      for (size_t t = 0; t < seqs[i].l.size(); ++t) {
        // Skip the kinks of min/clip, where the derivative is one-sided.
        const double rho = std::exp(seqs[i].l[t] - seqs[i].o[t]);
        if (std::abs(rho - (1 - c.clip_low)) < 1e-4 || std::abs(rho - (1 + c.clip_high)) < 1e-4)
          continue;
        const double h = 1e-6, keep = seqs[i].l[t];
        seqs[i].l[t] = keep + h;
        const double plus = ref_loss(seqs, c);
        seqs[i].l[t] = keep - h;
        const double minus = ref_loss(seqs, c);
        seqs[i].l[t] = keep;
        EXPECT_NEAR(r.coef[i][t], (plus - minus) / (2 * h), 1e-9) << "seed " << seed << " seq "
                                                                  << i << " token " << t;
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 70);
}

INSTANTIATE_TEST_SUITE_P(Grpo, LossModes,
                         ::testing::Values(IsMode::none, IsMode::token_tis, IsMode::seq_tis,
                                           IsMode::token_mask, IsMode::seq_mask),
                         [](const ::testing::TestParamInfo<IsMode>& p) {
                           return std::string(is_mode_name(p.param));
                         });

TEST(PolicyLoss, ClipRegionHasZeroGradient) {
  // Sweep ρ over [0.5, 1.6] for A = ±1: the gradient is exactly 0 where the clip is active
  // (A > 0 and ρ > 1 + ε_high, A < 0 and ρ < 1 − ε_low) and −ρA/N elsewhere — including the
  // "wrong side" (A > 0, ρ < 1 − ε_low), where PPO's min keeps the unclipped term.
  PolicyLossConfig c;
  c.clip_low = 0.2;
  c.clip_high = 0.28;
  int zero = 0, live = 0;
  for (double a : {1.0, -1.0}) {
    for (int k = 0; k <= 110; ++k) {
      const double rho = 0.5 + 0.01 * k + 0.001;  // never exactly on a boundary
      const std::vector<Seq> seqs{token(std::log(rho), 0, -0.1, a)};
      const LossRun r = run_loss(seqs, c);
      const bool active = a > 0 ? rho > 1.28 : rho < 0.8;
      if (active) {
        EXPECT_EQ(r.coef[0][0], 0.0) << a << " " << rho;
        ++zero;
      } else {
        EXPECT_NEAR(r.coef[0][0], -rho * a, 1e-12) << a << " " << rho;
        ++live;
      }
      EXPECT_EQ(r.stats.clip_fraction, active ? 1.0 : 0.0);
    }
  }
  EXPECT_GT(zero, 40);
  EXPECT_GT(live, 150);
}

TEST(PolicyLoss, MaskedTokensCountInTheMeanButGetNoGradient) {
  // token_mask over [0.8, 1.25]: the second token (ratio e^{0.5}) is dropped; N stays 3.
  PolicyLossConfig c;
  c.is = IsMode::token_mask;
  c.mask_lo = 0.8;
  c.mask_hi = 1.25;
  const std::vector<Seq> seqs{Seq{{-1, -1}, {-1, -1}, {-1, -1.5}, {}, 1}, token(-2, -2, -2, -3)};
  const LossRun r = run_loss(seqs, c);
  EXPECT_DOUBLE_EQ(r.coef[0][0], -1.0 / 3);
  EXPECT_EQ(r.coef[0][1], 0.0);
  EXPECT_DOUBLE_EQ(r.coef[1][0], 1.0);
  EXPECT_DOUBLE_EQ(r.stats.masked_fraction, 1.0 / 3);
  EXPECT_DOUBLE_EQ(r.stats.loss, -(1.0 - 3.0) / 3);
}

TEST(PolicyLoss, EmptyBatchIsZero) {
  const std::vector<Seq> seqs{Seq{}, Seq{}};
  const LossRun r = run_loss(seqs, PolicyLossConfig{});
  EXPECT_EQ(r.stats.tokens, 0);
  EXPECT_EQ(r.stats.loss, 0.0);
  EXPECT_TRUE(r.coef[0].empty() && r.coef[1].empty());
}

TEST(PolicyLoss, Errors) {
  const PolicyLossConfig ok;
  const std::vector<Seq> good{Seq{{-1, -2}, {-1, -2}, {-1, -2}, {}, 1}};
  EXPECT_NO_THROW(run_loss(good, ok));
  std::vector<Seq> bad = good;
  bad[0].s.pop_back();  // sampler shorter than learner
  EXPECT_THROW(run_loss(bad, ok), InputError);
  bad = good;
  bad[0].l[1] = NAN;
  EXPECT_THROW(run_loss(bad, ok), InputError);
  bad = good;
  bad[0].o[0] = -INFINITY;
  EXPECT_THROW(run_loss(bad, ok), InputError);
  bad = good;
  bad[0].a = NAN;
  EXPECT_THROW(run_loss(bad, ok), InputError);
  PolicyLossConfig kl;
  kl.kl_coef = 0.1;  // without reference log-probs
  EXPECT_THROW(run_loss(good, kl), InputError);
  EXPECT_THROW(run_loss(good, ok, {{0.1}}), InputError);  // entropy row of the wrong length
  for (auto broken : {+[](PolicyLossConfig& c) { c.clip_low = 1; },
                      +[](PolicyLossConfig& c) { c.clip_high = -0.1; },
                      +[](PolicyLossConfig& c) { c.kl_coef = -1; },
                      +[](PolicyLossConfig& c) { c.is_cap = 0; },
                      +[](PolicyLossConfig& c) { c.mask_lo = 3; }}) {
    PolicyLossConfig c;
    broken(c);
    EXPECT_THROW(run_loss(good, c), InputError);
  }
  // Wrong number of coefficient rows.
  std::vector<SequenceLogprobs> in{{good[0].o, good[0].s, {}, 1}};
  std::vector<std::vector<double>> learner{good[0].l}, coef;
  EXPECT_THROW(policy_loss(in, learner, {}, ok, coef), InputError);
}

// ---- the per-row-scale cross-entropy backward -------------------------------------------------

TEST(CrossEntropyBackwardRows, MatchesReferenceAndUniformScaleIsBitwiseCrossEntropy) {
  const int64_t T = 5, V = 37;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(T * V);
  for (float& x : logits) x = nd(rng);
  const std::vector<int32_t> targets{3, -1, 36, 0, 17};
  const std::vector<double> scale{0.5, 9.0, -1.25, 0.0, 3.0};
  std::vector<float> d(T * V, 7.0f);
  model::cross_entropy_backward_rows(d.data(), logits.data(), targets.data(), T, V, scale.data());
  for (int64_t t = 0; t < T; ++t) {
    long double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<long double>(logits[t * V + v]));
    for (int64_t v = 0; v < V; ++v) {
      const long double p = std::exp(static_cast<long double>(logits[t * V + v])) / sum;
      const double want =
          targets[t] < 0 ? 0.0 : static_cast<double>(scale[t] * (p - (v == targets[t] ? 1 : 0)));
      EXPECT_NEAR(d[t * V + v], want, 1e-6 * std::abs(scale[t]) + 1e-30) << t << " " << v;
    }
  }
  const std::vector<double> uniform(T, 0.125);
  std::vector<float> rows(T * V), ce(T * V);
  model::cross_entropy_backward_rows(rows.data(), logits.data(), targets.data(), T, V,
                                     uniform.data());
  model::cross_entropy_backward(ce.data(), logits.data(), targets.data(), T, V, 0.125);
  EXPECT_EQ(std::memcmp(rows.data(), ce.data(), rows.size() * sizeof(float)), 0);
  const std::vector<int32_t> outside{0, 0, 37, 0, 0};
  EXPECT_THROW(model::cross_entropy_backward_rows(rows.data(), logits.data(), outside.data(), T, V,
                                                  uniform.data()),
               InputError);
}

// ---- Model::forward_backward_policy -----------------------------------------------------------

model::ModelConfig small_config(bool tied) {
  model::ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 259;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  return c;
}

constexpr int64_t kB = 2, kT = 12;

struct Batch {
  std::vector<int32_t> tokens, targets;
};
// Next-token targets; the first `prompt` positions of every row and the last are ignored (< 0),
// as in an RL batch where only completion tokens are scored.
Batch make_batch(uint64_t seed, int64_t prompt = 3) {
  std::mt19937_64 rng(seed);
  Batch b;
  b.tokens.resize(kB * kT);
  for (int32_t& t : b.tokens) t = static_cast<int32_t>(rng() % 259);
  b.targets.assign(kB * kT, -1);
  for (int64_t r = 0; r < kB; ++r)
    for (int64_t t = prompt; t + 1 < kT; ++t) b.targets[r * kT + t] = b.tokens[r * kT + t + 1];
  return b;
}

// Every parameter's gradient, concatenated in params() order (tied heads appear once).
std::vector<float> all_grads(model::Model& m) {
  std::vector<float> g;
  for (const model::ParamSpec& p : m.params()) {
    const auto s = m.grad(p.name);
    g.insert(g.end(), s.begin(), s.end());
  }
  return g;
}

class PolicyPass : public ::testing::TestWithParam<std::string> {};

TEST_P(PolicyPass, MinusOneOverNEqualsMeanCrossEntropyBitwise) {
  // coef = −1/N on every valid token makes Σ coef·logp the mean cross-entropy, and the per-row
  // dlogits −coef·(softmax − onehot) the same floats as cross_entropy_backward's (1/N)·(…): the
  // negation of −1/N is exact and the row arithmetic is shared, and the backward below dlogits
  // is the same code with the same step seeds. So the gradients agree bit for bit at every
  // preset, stochastic rounding included.
  for (bool tied : {true, false}) {
    model::Model m(small_config(tied), model::PrecisionPolicy::preset(GetParam()));
    m.init_random(5);
    const Batch b = make_batch(21);
    const float ce = m.forward_backward(b.tokens, b.targets, kB, kT, /*step=*/3);
    const std::vector<float> want = all_grads(m);
    int64_t n = 0;
    for (int32_t t : b.targets) n += t >= 0;
    const double surrogate = m.forward_backward_policy(
        b.tokens, b.targets, kB, kT,
        [&](std::span<const double>, std::span<const double>, std::span<double> coef) {
          for (size_t t = 0; t < coef.size(); ++t)
            coef[t] = b.targets[t] >= 0 ? -1.0 / static_cast<double>(n) : 0.0;
        },
        /*step=*/3);
    const std::vector<float> got = all_grads(m);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << GetParam() << (tied ? " tied" : " untied");
    EXPECT_NEAR(surrogate, ce, 1e-6 * ce);  // ce was rounded to float
  }
}

INSTANTIATE_TEST_SUITE_P(Grpo, PolicyPass, ::testing::Values("fp32", "bf16", "mxfp8", "nvfp4"),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string s = p.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

TEST(PolicyPassLogprobs, EqualFp64LogSoftmaxOfTheForwardLogits) {
  model::Model m(small_config(true), model::PrecisionPolicy::preset("bf16"));
  m.init_random(9, 0.2f);  // a peaked distribution, so entropy is far from log V
  const Batch b = make_batch(4);
  const int64_t V = 259;
  std::vector<float> logits(kB * kT * V);
  m.forward(b.tokens, kB, kT, logits);
  std::vector<double> seen_logp, seen_entropy;
  m.forward_backward_policy(b.tokens, b.targets, kB, kT,
                            [&](std::span<const double> lp, std::span<const double> h,
                                std::span<double>) {
                              seen_logp.assign(lp.begin(), lp.end());
                              seen_entropy.assign(h.begin(), h.end());
                            });
  ASSERT_EQ(seen_logp.size(), static_cast<size_t>(kB * kT));
  double min_h = 1e9, max_h = 0;
  for (int64_t t = 0; t < kB * kT; ++t) {
    if (b.targets[t] < 0) {
      EXPECT_EQ(seen_logp[t], 0.0);
      EXPECT_EQ(seen_entropy[t], 0.0);
      continue;
    }
    const float* x = logits.data() + t * V;
    long double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<long double>(x[v]));
    const long double lse = std::log(sum);
    long double h = 0;
    for (int64_t v = 0; v < V; ++v) {
      const long double lp = x[v] - lse;
      h -= std::exp(lp) * lp;
    }
    EXPECT_NEAR(seen_logp[t], static_cast<double>(x[b.targets[t]] - lse), 1e-12) << t;
    EXPECT_NEAR(seen_entropy[t], static_cast<double>(h), 1e-12) << t;
    // The sampler's definition (model/logprob.h) at temperature 1, bit for bit.
    EXPECT_EQ(seen_logp[t],
              serve::token_logprob(std::span<const float>(x, V), b.targets[t], 1.0f)) << t;
    min_h = std::min(min_h, seen_entropy[t]);
    max_h = std::max(max_h, seen_entropy[t]);
  }
  EXPECT_LT(min_h, std::log(259.0) - 0.05);  // not a uniform distribution
  EXPECT_GT(max_h, 0.0);
}

TEST(PolicyPassLogprobs, IgnoredRowsContributeNothing) {
  // A run where rows are ignored (target −1) and a run where those rows have real targets but
  // coefficient 0 give the same gradients, bit for bit; and an ignored row given a coefficient
  // is an error.
  model::Model m(small_config(false), model::PrecisionPolicy::preset("fp32"));
  m.init_random(2);
  const Batch ignored = make_batch(8, /*prompt=*/4);
  const Batch all = make_batch(8, /*prompt=*/0);
  std::mt19937_64 rng(1);
  std::vector<double> c(kB * kT);
  for (double& x : c) x = std::uniform_real_distribution<double>(-0.1, 0.1)(rng);
  auto fill = [&](const Batch& b) {
    return [&c, &b](std::span<const double>, std::span<const double>, std::span<double> coef) {
      for (size_t t = 0; t < coef.size(); ++t) coef[t] = b.targets[t] >= 0 ? c[t] : 0.0;
    };
  };
  auto zero_where_ignored = [&](std::span<const double>, std::span<const double>,
                                std::span<double> coef) {
    for (size_t t = 0; t < coef.size(); ++t) coef[t] = ignored.targets[t] >= 0 ? c[t] : 0.0;
  };
  const double s1 = m.forward_backward_policy(ignored.tokens, ignored.targets, kB, kT, fill(ignored));
  const std::vector<float> g1 = all_grads(m);
  const double s2 = m.forward_backward_policy(all.tokens, all.targets, kB, kT, zero_where_ignored);
  const std::vector<float> g2 = all_grads(m);
  EXPECT_EQ(s1, s2);
  // Equal as numbers (a coefficient 0 gives dlogits of −0.0 where an ignored row gives +0.0).
  ASSERT_EQ(g1.size(), g2.size());
  size_t differ = 0;
  for (size_t i = 0; i < g1.size(); ++i) differ += g1[i] != g2[i];
  EXPECT_EQ(differ, 0u);
  double norm = 0;
  for (float g : g1) norm += static_cast<double>(g) * g;
  EXPECT_GT(norm, 0.0);
  EXPECT_THROW(m.forward_backward_policy(
                   ignored.tokens, ignored.targets, kB, kT,
                   [](std::span<const double>, std::span<const double>, std::span<double> coef) {
                     for (double& x : coef) x = 0.01;
                   }),
               InputError);
  EXPECT_THROW(m.forward_backward_policy(
                   all.tokens, all.targets, kB, kT,
                   [](std::span<const double>, std::span<const double>, std::span<double> coef) {
                     coef[0] = NAN;
                   }),
               InputError);
  std::vector<int32_t> short_targets(all.targets.begin(), all.targets.end() - 1);
  EXPECT_THROW(m.forward_backward_policy(all.tokens, short_targets, kB, kT, zero_where_ignored),
               InputError);
}

// Σ_t c_t logp_t(θ) from a forward pass, in double.
double surrogate_from_forward(model::Model& m, const Batch& b, const std::vector<double>& c) {
  const int64_t V = 259;
  std::vector<float> logits(kB * kT * V);
  m.forward(b.tokens, kB, kT, logits);
  double s = 0;
  for (int64_t t = 0; t < kB * kT; ++t) {
    if (b.targets[t] < 0) continue;
    s += c[t] * serve::token_logprob(std::span<const float>(logits.data() + t * V, V),
                                     b.targets[t], 1.0f);
  }
  return s;
}

TEST(PolicyPassLogprobs, GradientIsTheDirectionalDerivativeOfTheSurrogate) {
  // With random coefficients of both signs: moving θ by ±h along the unit gradient direction
  // changes Σ c·logp by ±h·‖g‖ to first order. Measured: 1e-4 relative at h = 3e-3 (fp32
  // forward noise ~1e-6 on Σ c·logp over 2h, plus the O(h²) curvature term), so a 0.3% tolerance
  // has margin and still catches a gradient scaled by 1.01.
  model::Model m(small_config(false), model::PrecisionPolicy::preset("fp32"));
  m.init_random(6, 0.1f);
  const Batch b = make_batch(17);
  std::mt19937_64 rng(5);
  std::vector<double> c(kB * kT, 0.0);
  for (size_t t = 0; t < c.size(); ++t)
    if (b.targets[t] >= 0) c[t] = std::uniform_real_distribution<double>(-0.2, 0.2)(rng);
  m.forward_backward_policy(b.tokens, b.targets, kB, kT,
                            [&](std::span<const double>, std::span<const double>,
                                std::span<double> coef) {
                              std::copy(c.begin(), c.end(), coef.begin());
                            });
  std::vector<std::vector<float>> base, dir;
  double norm2 = 0;
  for (const model::ParamSpec& p : m.params()) {
    const auto g = m.grad(p.name);
    dir.emplace_back(g.begin(), g.end());
    const auto w = m.param(p.name);
    base.emplace_back(w.begin(), w.end());
    for (float x : g) norm2 += static_cast<double>(x) * x;
  }
  const double norm = std::sqrt(norm2), h = 3e-3;
  ASSERT_GT(norm, 1e-3);
  auto shift = [&](double step) {
    for (size_t i = 0; i < m.params().size(); ++i) {
      const auto w = m.param(m.params()[i].name);
      for (size_t k = 0; k < w.size(); ++k)
        w[k] = static_cast<float>(base[i][k] + step * dir[i][k] / norm);
    }
    m.weights_changed();
  };
  shift(h);
  const double plus = surrogate_from_forward(m, b, c);
  shift(-h);
  const double minus = surrogate_from_forward(m, b, c);
  shift(0);
  EXPECT_NEAR((plus - minus) / (2 * h), norm, 0.003 * norm);
}

}  // namespace
}  // namespace concord::rl
