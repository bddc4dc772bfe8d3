// row_divergence against a long-double reference written here (it shares no code with src/),
// on random and adversarial logits in fp32 and fp64; every guarantee of bounds.h on every row;
// the flip predictor's zero false negatives; the vectorized exp; the bound helpers by hand.
#include "concord/audit/bounds.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "concord/numerics/check.h"
#include "concord/numerics/convert.h"

namespace {

using concord::InputError;
using concord::audit::RowDivergence;
using LD = long double;

constexpr double kU = 0x1p-53;  // unit roundoff of double

// ---- the reference: plain long double (x87: 64-bit significand, exponent range to 1e4932, so
// no exp here underflows for the logits used). Valgrind emulates long double in double
// precision: under it the reference, not the code under test, loses its digits. ----
static_assert(LDBL_MANT_DIG == 64, "the reference needs x87 80-bit long double");

struct Reference {
  LD osc = 0, linf = 0, max_abs_dlogp = 0, tv = 0, kl = 0, kl_reverse = 0, margin = 0;
  int top_ref = 0, top_cand = 0;
  LD dlogp_token = 0, dp_token = 0, logp_ref_token = 0;
};

// ψ(x) = e^x − 1 − x: the Taylor series where expm1l(x) − x would cancel.
LD psi_reference(LD x) {
  if (fabsl(x) >= 0.5L) return expm1l(x) - x;
  LD term = x * x / 2, sum = 0;
  for (int k = 3; k < 60 && term != 0; ++k) {
    sum += term;
    term *= x / k;
  }
  return sum;
}

template <class T>
Reference reference(const std::vector<T>& a, const std::vector<T>& b, int token) {
  const size_t n = a.size();
  Reference out;
  LD max_a = a[0], max_b = b[0];
  for (size_t i = 0; i < n; ++i) {
    if (a[i] > max_a) {
      max_a = a[i];
      out.top_ref = static_cast<int>(i);
    }
    if (b[i] > max_b) {
      max_b = b[i];
      out.top_cand = static_cast<int>(i);
    }
  }
  LD second = -std::numeric_limits<LD>::infinity();
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<int>(i) != out.top_ref) second = std::max(second, static_cast<LD>(a[i]));
  }
  out.margin = n == 1 ? std::numeric_limits<LD>::infinity() : max_a - second;
  LD sum_a = 0, d_max = -1e4000L, d_min = 1e4000L;
  for (size_t i = 0; i < n; ++i) {
    sum_a += expl(a[i] - max_a);
    const LD d = static_cast<LD>(a[i]) - static_cast<LD>(b[i]);
    d_max = std::max(d_max, d);
    d_min = std::min(d_min, d);
  }
  out.osc = d_max - d_min;
  out.linf = std::max(fabsl(d_max), fabsl(d_min));
  // c = log Z_A − log Z_B = m − log E_A[e^−(Δ−m)] for any m. In this form c keeps its digits
  // when it is far below |log Z| (a Δ on one unlikely token), where the difference of the two
  // log-partitions would round it away even in long double; m = the p_A-weighted median of Δ
  // minimizes E_A|Δ − m|, the size of what cancels in the sum.
  const LD log_z_a = max_a + logl(sum_a);
  std::vector<std::pair<LD, LD>> by_delta(n);  // (Δ_i, p_A(i))
  for (size_t i = 0; i < n; ++i) {
    by_delta[i] = {static_cast<LD>(a[i]) - static_cast<LD>(b[i]), expl(a[i] - log_z_a)};
  }
  std::sort(by_delta.begin(), by_delta.end());
  LD mass = 0, m = by_delta.back().first;
  for (const auto& [d, p] : by_delta) {
    mass += p;
    if (mass >= 0.5L) {
      m = d;
      break;
    }
  }
  LD tilt = 0;
  for (size_t i = 0; i < n; ++i) {
    const LD d = static_cast<LD>(a[i]) - static_cast<LD>(b[i]) - m;
    const LD lp_a = a[i] - log_z_a;
    tilt += fabsl(d) < 1 ? expl(lp_a) * expm1l(-d) : expl(lp_a - d) - expl(lp_a);
  }
  const LD c_minus_m = -log1pl(tilt);  // kept apart from m: m + (c − m) would round it
  for (size_t i = 0; i < n; ++i) {
    const LD lp_a = a[i] - log_z_a;
    const LD r =
        (static_cast<LD>(a[i]) - static_cast<LD>(b[i]) - m) - c_minus_m;  // log p_A − log p_B
    const LD p_a = expl(lp_a), p_b = expl(lp_a - r);
    // Σ p_A ψ(−r) = Σ p_A r since Σ p_A (e^−r − 1) = Σ (p_B − p_A) = 0: positive terms. Where
    // |r| ≥ 1 nothing cancels and e^±r may overflow even long double: the terms directly.
    const bool near = fabsl(r) < 1;
    const LD dp = near ? -p_a * expm1l(-r) : p_a - p_b;  // p_A − p_B
    out.tv += fabsl(dp) / 2;
    out.kl += near ? p_a * psi_reference(-r) : p_a * r + (p_b - p_a);
    out.kl_reverse += near ? p_b * psi_reference(r) : -p_b * r + (p_a - p_b);
    out.max_abs_dlogp = std::max(out.max_abs_dlogp, fabsl(r));
    if (static_cast<int>(i) == token) {
      out.dlogp_token = r;
      out.dp_token = dp;
      out.logp_ref_token = lp_a;
    }
  }
  return out;
}

// ---- test rows ----

struct Case {
  std::string name;
  std::vector<double> a, b;  // reference and candidate logits (fp32 runs round them first)
  int token = -1;
};

std::vector<double> normal_row(std::mt19937_64& rng, size_t n, double scale) {
  std::normal_distribution<double> normal(0, scale);
  std::vector<double> row(n);
  for (double& x : row) x = normal(rng);
  return row;
}

std::vector<double> plus_noise(std::mt19937_64& rng, const std::vector<double>& row, double scale) {
  std::vector<double> out = row;
  std::normal_distribution<double> normal(0, scale);
  for (double& x : out) x += normal(rng);
  return out;
}

int random_token(std::mt19937_64& rng, size_t n) {
  return static_cast<int>(std::uniform_int_distribution<size_t>(0, n - 1)(rng));
}

std::vector<Case> adversarial_cases() {
  std::mt19937_64 rng(20261203);
  std::vector<Case> cases;
  const auto add = [&](std::string name, std::vector<double> a, std::vector<double> b) {
    const int token = random_token(rng, a.size());
    cases.push_back({std::move(name), std::move(a), std::move(b), token});
  };
  // Random logits at several scales, candidates at several distances, vocabularies around the
  // 8-lane and 1024-entry block edges.
  for (size_t n : {1, 2, 3, 7, 8, 9, 17, 1000, 1031, 4099}) {
    for (double scale : {0.01, 1.0, 4.0, 30.0}) {
      for (double noise : {1e-7, 1e-4, 1e-2, 0.3, 3.0}) {
        auto a = normal_row(rng, n, scale);
        auto b = plus_noise(rng, a, noise);
        add("random n=" + std::to_string(n) + " scale=" + std::to_string(scale) +
                " noise=" + std::to_string(noise),
            a, b);
      }
    }
  }
  // The Qwen3 vocabulary: one in-contract (Taylor path) and one far (general path) candidate.
  {
    auto a = normal_row(rng, 151936, 3.0);
    add("vocab 151936 noise 1e-3", a, plus_noise(rng, a, 1e-3));
    add("vocab 151936 noise 1", a, plus_noise(rng, a, 1.0));
  }
  // Near-ties in the reference: an exact tie, one ulp (fp32 and fp64), 1e-9.
  for (double gap : {0.0, 1e-9, static_cast<double>(std::nextafter(2.0f, 3.0f) - 2.0f),
                     std::nextafter(2.0, 3.0) - 2.0}) {
    auto a = normal_row(rng, 64, 1.0);
    a[5] = 2.0 + gap;
    a[40] = 2.0;
    add("near tie gap=" + std::to_string(gap), a, plus_noise(rng, a, 1e-9));
    add("near tie gap=" + std::to_string(gap) + " swapped", a, plus_noise(rng, a, 1e-6));
  }
  // Huge spreads: ±1e4 (most probabilities exactly 0), ±80, and single outliers.
  for (double spread : {80.0, 1e4}) {
    std::vector<double> a(3000);
    for (double& x : a) x = (rng() % 2 ? spread : -spread) + std::normal_distribution<>(0, 1)(rng);
    add("spread ±" + std::to_string(spread) + " noise 1e-3", a, plus_noise(rng, a, 1e-3));
    add("spread ±" + std::to_string(spread) + " noise 10", a, plus_noise(rng, a, 10.0));
    auto b = a;
    b[17] = -b[17];
    add("spread ±" + std::to_string(spread) + " one flipped", a, b);
  }
  // Tiny differences, a constant shift plus noise (c far from the spread of Δ).
  {
    auto a = normal_row(rng, 5000, 2.0);
    add("tiny delta 1e-7", a, plus_noise(rng, a, 1e-7));
    std::vector<double> b = plus_noise(rng, a, 1e-6);
    for (double& x : b) x += 5;
    add("shift 5 + noise 1e-6", a, b);
    b = a;
    for (double& x : b) x -= 1e3;
    add("shift -1000 exactly", a, b);
  }
  // Δ concentrated on one token: the reference's top token or a low-probability one.
  for (double delta : {1e-7, 1e-3, 1.0, 50.0, 1e3, -1e3}) {
    auto a = normal_row(rng, 2000, 2.0);
    const auto top = static_cast<size_t>(std::max_element(a.begin(), a.end()) - a.begin());
    const size_t low = static_cast<size_t>(std::min_element(a.begin(), a.end()) - a.begin());
    for (size_t j : {top, low}) {
      auto b = a;
      b[j] -= delta;
      add("one token delta=" + std::to_string(delta) + (j == top ? " top" : " low"), a, b);
    }
  }
  // The candidate's top far above its logit at the reference's top (the log S_A − log S_B path).
  {
    auto a = normal_row(rng, 3000, 1.0);
    auto b = plus_noise(rng, a, 1e-3);
    b[1234] += 900;
    add("candidate top +900", a, b);
    b[1234] -= 300;
    add("candidate top +600", a, b);
  }
  return cases;
}

template <class T>
std::vector<T> as(const std::vector<double>& row) {
  return std::vector<T>(row.begin(), row.end());
}

// Tolerances: |got − want| ≤ rel·|want| + abs.
//  - rel = 1e-10: the computed statistics carry a few roundings of double relative to their
//    own size (sums in 8 lanes × blocks of 1024 entries, ≤ ~300 u worst case) and e^x's
//    condition number |x| ≤ |Δ| (2e-12 at |Δ| = 2e4). Measured worst (printed below): 1.4e-12
//    for fp32 rows, 1.8e-11 for fp64 rows, where Δ = fl(z_A − z_B) itself is rounded.
//  - abs: what the reference cannot resolve or the input does not define: the reference's
//    error in r = log p_A − log p_B, ~2^-64 × (1 + |Δ|) from long double (2^-60 below, 16×
//    headroom), plus for fp64 rows the rounding of Δ (u·‖Δ‖∞ per entry); for log-probabilities
//    2^-44 × the logit scale (a double ulp of |log Z| is 2^-52 × it).
struct Tolerance {
  double rel = 1e-10;
  double abs = 0;
};

bool close(double got, LD want, const Tolerance& tol) {
  return fabsl(got - want) <= tol.rel * fabsl(want) + tol.abs;
}

struct ErrorStats {
  double max_rel[6] = {};
  std::string worst[6];
  std::string current;
  // Relative error where the reference resolves the value (1000× above its absolute floor).
  void note(int k, double got, LD want, double floor) {
    if (fabsl(want) > 1000 * floor && fabsl(want) > 1e-290L) {
      const double rel = static_cast<double>(fabsl(got - want) / fabsl(want));
      if (rel > max_rel[k]) {
        max_rel[k] = rel;
        worst[k] = current;
      }
    }
  }
};

// Checks one row's statistics against the reference and every guarantee of bounds.h.
template <class T>
void check_row(const Case& c, ErrorStats& stats) {
  const std::vector<T> a = as<T>(c.a), b = as<T>(c.b);
  const RowDivergence got = concord::audit::row_divergence(a, b, c.token);
  const Reference want = reference(a, b, c.token);
  SCOPED_TRACE(c.name + (sizeof(T) == 4 ? " fp32" : " fp64"));
  stats.current = c.name;

  // Exact statistics.
  EXPECT_EQ(got.top_ref, want.top_ref);
  EXPECT_EQ(got.top_cand, want.top_cand);
  EXPECT_EQ(got.flip, want.top_ref != want.top_cand);
  if (std::isinf(static_cast<double>(want.margin))) {
    EXPECT_TRUE(std::isinf(got.margin_ref));
  } else {
    EXPECT_TRUE(close(got.margin_ref, want.margin, {4 * kU, 0})) << got.margin_ref;
  }
  // osc: one rounding of max − min, plus (fp64 rows) the exact subtraction errors it adds.
  const double scale = static_cast<double>(want.linf) + static_cast<double>(want.osc);
  EXPECT_TRUE(close(got.osc, want.osc, {4 * kU, 4 * kU * scale})) << got.osc;
  EXPECT_GE(got.osc, static_cast<double>(want.osc) * (1 - 4 * kU));  // never below the truth
  EXPECT_TRUE(close(got.linf, want.linf, {2 * kU, 0}));
  // fp64 rows: Δ = fl(z_A − z_B) is rounded (≤ u·|Δ| per entry), which moves r by as much.
  const double delta_rounding = sizeof(T) == 8 ? kU * static_cast<double>(want.linf) : 0.0;
  const double ref_r = 0x1p-60 * (1 + scale) + 2 * delta_rounding;
  const Tolerance logp{1e-12, 0x1p-44 * (1 + scale)};
  const Tolerance tv_tol{1e-10, ref_r};
  const auto kl_tol = [&](LD kl) {
    return Tolerance{1e-10, ref_r * (2 * std::sqrt(static_cast<double>(kl)) + ref_r)};
  };
  EXPECT_TRUE(close(got.max_abs_dlogp, want.max_abs_dlogp, logp)) << got.max_abs_dlogp;
  EXPECT_TRUE(close(got.tv, want.tv, tv_tol)) << got.tv << " vs " << static_cast<double>(want.tv);
  EXPECT_TRUE(close(got.kl, want.kl, kl_tol(want.kl)))
      << got.kl << " vs " << static_cast<double>(want.kl);
  EXPECT_TRUE(close(got.kl_reverse, want.kl_reverse, kl_tol(want.kl_reverse)))
      << got.kl_reverse << " vs " << static_cast<double>(want.kl_reverse);
  stats.note(0, got.osc, want.osc, 4 * kU * scale);
  stats.note(1, got.max_abs_dlogp, want.max_abs_dlogp, logp.abs);
  stats.note(2, got.tv, want.tv, tv_tol.abs);
  stats.note(3, got.kl, want.kl, kl_tol(want.kl).abs);
  stats.note(4, got.kl_reverse, want.kl_reverse, kl_tol(want.kl_reverse).abs);
  if (c.token >= 0) {
    EXPECT_EQ(got.token, c.token);
    EXPECT_TRUE(close(got.dlogp_token, want.dlogp_token, logp)) << got.dlogp_token;
    EXPECT_TRUE(close(got.logp_ref_token, want.logp_ref_token, logp)) << got.logp_ref_token;
    EXPECT_TRUE(close(got.dp_token, want.dp_token, tv_tol))
        << got.dp_token << " vs " << static_cast<double>(want.dp_token);
    stats.note(5, got.dp_token, want.dp_token, tv_tol.abs);
  }

  // The guarantees, on the computed values (slack 1e-12 relative: the two-point case attains
  // the TV bound exactly) and on the reference's (slack 1e-15 relative + its absolute error).
  const double eps = got.osc, slack = 1 + 1e-12;
  EXPECT_LE(got.max_abs_dlogp, concord::audit::logp_bound(eps) * slack);
  EXPECT_LE(got.tv, concord::audit::tv_bound(eps) * slack);
  EXPECT_LE(got.kl, concord::audit::kl_bound(eps) * slack);
  EXPECT_LE(got.kl_reverse, concord::audit::kl_bound(eps) * slack);
  EXPECT_LE(got.kl + got.kl_reverse, eps * got.tv * slack + 1e-300);  // Jeffreys ≤ osc·TV
  const LD eps_ref = want.osc,
           kl_max = std::min(eps_ref * eps_ref / 8, eps_ref * tanhl(eps_ref / 4));
  EXPECT_LE(want.max_abs_dlogp, eps_ref * (1 + 1e-15L) + ref_r);
  EXPECT_LE(want.tv, tanhl(eps_ref / 4) * (1 + 1e-15L) + ref_r);
  EXPECT_LE(want.kl, kl_max * (1 + 1e-15L) + kl_tol(want.kl).abs);
  EXPECT_LE(want.kl_reverse, kl_max * (1 + 1e-15L) + kl_tol(want.kl_reverse).abs);
  if (c.token >= 0) {
    const auto [lo, hi] = concord::audit::ratio_bounds(eps);
    const double ratio = std::exp(got.dlogp_token);
    EXPECT_GE(ratio, lo * (1 - 1e-12));
    EXPECT_LE(ratio, hi * (1 + 1e-12));
    EXPECT_LE(fabsl(want.dlogp_token), eps_ref * (1 + 1e-15L) + ref_r);
  }
  // The greedy theorem: margin > osc (reference values) ⇒ no flip; and the predictor.
  if (want.margin > want.osc) {
    EXPECT_EQ(want.top_ref, want.top_cand);
  }
  if (got.flip) {
    EXPECT_TRUE(got.flip_possible);
  }
  EXPECT_EQ(got.flip_possible, !concord::audit::greedy_stable(got.margin_ref, got.osc));
}

TEST(RowDivergence, MatchesLongDoubleReferenceAndEveryBoundHolds) {
  ErrorStats stats32, stats64;
  const std::vector<Case> cases = adversarial_cases();
  for (const Case& c : cases) {
    check_row<float>(c, stats32);
    check_row<double>(c, stats64);
  }
  // The measured headroom (informational): relative errors of osc, max|dlogp|, TV, KL, KL_rev, dp.
  for (int k = 0; k < 6; ++k) {
    std::printf("max rel err [%d]: fp32 %.3g (%s)  fp64 %.3g (%s)\n", k, stats32.max_rel[k],
                stats32.worst[k].c_str(), stats64.max_rel[k], stats64.worst[k].c_str());
  }
  EXPECT_GT(cases.size(), 200u);
}

// TV ≤ tanh(osc/4) is attained: two tokens with z_A = (ε/4, −ε/4), z_B = (−ε/4, ε/4).
TEST(RowDivergence, TwoPointExtremalAttainsTheTvBound) {
  for (double eps : {0x1p-20, 0x1p-8, 0.5, 1.0, 4.0, 16.0, 64.0}) {
    const float q = static_cast<float>(eps / 4);  // exact in fp32
    const std::vector<float> a = {q, -q}, b = {-q, q};
    const RowDivergence d = concord::audit::row_divergence(a, b);
    EXPECT_EQ(d.osc, eps);
    const double bound = concord::audit::tv_bound(d.osc);
    EXPECT_NEAR(d.tv, bound, 1e-12 * bound) << eps;
    // KL → ε²/8 as ε → 0 (the Hoeffding bound is tight to second order here).
    if (eps <= 0x1p-8) {
      EXPECT_NEAR(d.kl / (eps * eps / 8), 1.0, eps * eps) << eps;
    }
    EXPECT_NEAR(d.max_abs_dlogp, eps / 2, 1e-12 * eps);  // |Δ − c| = ε/2 at both tokens
  }
  // The same extremal over the Qwen3 vocabulary: one token carries p_A = σ(ε/2).
  for (double eps : {0.01, 1.0, 8.0}) {
    const size_t n = 151936;
    std::vector<double> a(n, 0.0), b(n, 0.0);
    a[777] = eps / 2 + std::log(static_cast<double>(n - 1));
    b[777] = a[777] - eps;
    const RowDivergence d = concord::audit::row_divergence(a, b);
    EXPECT_NEAR(d.tv, std::tanh(eps / 4), 1e-12 * std::tanh(eps / 4)) << eps;
  }
}

// The flip predictor over ≥ 1e5 near-tie rows: every observed flip is predicted.
TEST(RowDivergence, FlipPredictorHasNoFalseNegatives) {
  std::mt19937_64 rng(77);
  std::normal_distribution<double> normal(0, 1);
  std::uniform_real_distribution<double> uniform(0, 1);
  int flips = 0, predicted = 0, stable = 0, rows = 0;
  for (int row = 0; row < 100000; ++row) {
    const size_t n = 2 + row % 15;
    std::vector<double> a(n), b(n);
    for (double& x : a) x = normal(rng);
    // Make the top two nearly tied: gaps from exact ties to 1e-3, noise 1e-9 .. 1e-3.
    const auto top = static_cast<size_t>(std::max_element(a.begin(), a.end()) - a.begin());
    const size_t other = (top + 1 + row % (n - 1)) % n;
    const double gap = row % 7 == 0 ? 0.0 : std::pow(10.0, -9 + 6 * uniform(rng));
    a[other] = a[top] - gap;
    const double noise = std::pow(10.0, -9 + 6 * uniform(rng));
    for (size_t i = 0; i < n; ++i) b[i] = a[i] + noise * normal(rng);
    if (row % 3 == 0) {
      for (double& x : b) x += 7.25;  // a shift does not change the distribution
    }
    RowDivergence d;
    if (row % 2 == 0) {
      d = concord::audit::row_divergence(as<float>(a), as<float>(b));
    } else {
      d = concord::audit::row_divergence(a, b);
    }
    ++rows;
    flips += d.flip;
    predicted += d.flip_possible;
    stable += !d.flip_possible;
    if (d.flip && !d.flip_possible) {
      ADD_FAILURE() << "missed flip at row " << row << " margin " << d.margin_ref << " osc "
                    << d.osc;
    }
  }
  std::printf("rows %d: flips %d, predicted possible %d, certified stable %d\n", rows, flips,
              predicted, stable);
  EXPECT_GT(flips, 10000);   // the test exercises flips...
  EXPECT_GT(stable, 10000);  // ...and certifies many rows, so neither side is vacuous
}

// A margin equal to osc may flip (the tie goes to the lowest index): the predictor says so.
TEST(RowDivergence, MarginEqualToOscCountsAsPossibleFlip) {
  const std::vector<float> a = {0, 1}, b = {0, 0};
  const RowDivergence d = concord::audit::row_divergence(a, b);
  EXPECT_EQ(d.margin_ref, 1.0);
  EXPECT_EQ(d.osc, 1.0);
  EXPECT_TRUE(d.flip);
  EXPECT_TRUE(d.flip_possible);
  const RowDivergence same = concord::audit::row_divergence(a, a);
  EXPECT_FALSE(same.flip_possible);
  EXPECT_EQ(same.osc, 0.0);
  EXPECT_EQ(same.tv, 0.0);
  EXPECT_EQ(same.kl, 0.0);
}

TEST(RowDivergence, SingleTokenVocabulary) {
  const std::vector<float> a = {3.5f}, b = {-2.0f};
  const RowDivergence d = concord::audit::row_divergence(a, b, 0);
  EXPECT_EQ(d.osc, 0.0);
  EXPECT_EQ(d.linf, 5.5);
  EXPECT_TRUE(std::isinf(d.margin_ref));
  EXPECT_FALSE(d.flip_possible);
  EXPECT_EQ(d.tv, 0.0);
  EXPECT_EQ(d.kl, 0.0);
  EXPECT_EQ(d.dlogp_token, 0.0);
  EXPECT_EQ(d.logp_ref_token, 0.0);
}

// The generic, AVX2 and AVX-512 builds give bit-identical results (no FMA, fixed lane order).
TEST(RowDivergence, EveryIsaGivesTheSameBits) {
  namespace nm = concord::numerics;
  const nm::Isa saved = nm::active_isa();
  std::vector<Case> cases = adversarial_cases();
  std::vector<std::vector<double>> results;
  std::vector<std::string> isas;
  for (nm::Isa isa : {nm::Isa::generic, nm::Isa::avx2, nm::Isa::avx512}) {
    if (!nm::isa_supported(isa)) continue;
    nm::set_active_isa(isa);
    isas.emplace_back(nm::isa_name(isa));
    std::vector<double> bits;
    for (size_t k = 0; k < cases.size(); k += 3) {
      const Case& c = cases[k];
      for (const RowDivergence& d :
           {concord::audit::row_divergence(as<float>(c.a), as<float>(c.b), c.token),
            concord::audit::row_divergence(c.a, c.b, c.token)}) {
        bits.insert(bits.end(),
                    {d.osc, d.tv, d.kl, d.kl_reverse, d.max_abs_dlogp, d.dlogp_token, d.dp_token});
      }
    }
    results.push_back(bits);
  }
  nm::set_active_isa(saved);
  for (size_t k = 1; k < results.size(); ++k) {
    EXPECT_EQ(std::memcmp(results[k].data(), results[0].data(), results[0].size() * sizeof(double)),
              0)
        << isas[k] << " differs from " << isas[0];
  }
  std::printf("compared ISAs: %zu\n", isas.size());
}

TEST(RowDivergence, RejectsBadRows) {
  const std::vector<float> a = {1, 2, 3}, b = {1, 2};
  const auto message = [](auto&& call) {
    try {
      call();
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { concord::audit::row_divergence(a, b); }).find("3 logits"),
            std::string::npos);
  const std::vector<float> empty;
  EXPECT_NE(message([&] { concord::audit::row_divergence(empty, empty); }).find("empty"),
            std::string::npos);
  std::vector<float> bad = a;
  bad[2] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(message([&] {
              concord::audit::row_divergence(a, bad);
            }).find("candidate row holds nan at logit 2"),
            std::string::npos);
  std::vector<double> inf = {1, -std::numeric_limits<double>::infinity(), 0};
  const std::vector<double> ok = {1, 2, 3};
  EXPECT_NE(message([&] {
              concord::audit::row_divergence(inf, ok);
            }).find("reference row holds -inf at logit 1"),
            std::string::npos);
  EXPECT_NE(message([&] { concord::audit::row_divergence(a, a, 3); }).find("token 3 is outside"),
            std::string::npos);
  EXPECT_THROW(concord::audit::row_divergence(a, a, -2), InputError);
  const std::vector<double> huge = {1.7e308, 0}, neg = {-1.7e308, 0};
  EXPECT_NE(message([&] { concord::audit::row_divergence(huge, neg); }).find("overflow"),
            std::string::npos);
  EXPECT_THROW(concord::audit::tv_bound(-1), InputError);
  EXPECT_THROW(concord::audit::kl_bound(std::nan("")), InputError);
  EXPECT_THROW(concord::audit::reward_drift_bound(1, 0, 0.5), InputError);
  EXPECT_THROW(concord::audit::reward_drift_bound(0, 1, 1.5), InputError);
  EXPECT_THROW(concord::audit::policy_gradient_bias_bound(-1, 0.5), InputError);
  const std::vector<double> eps_bad = {0.1, -0.1};
  EXPECT_THROW(concord::audit::sequence_tv_bound(eps_bad), InputError);
  std::vector<double> out(2);
  EXPECT_THROW(concord::audit::vector_exp(ok, out), InputError);
}

// ---- the bound helpers, by hand (values from Python's math module) ----

TEST(Bounds, HandValues) {
  using namespace concord::audit;
  EXPECT_EQ(tv_bound(0), 0.0);
  EXPECT_DOUBLE_EQ(tv_bound(4), 0.7615941559557649);  // tanh(1)
  EXPECT_DOUBLE_EQ(tv_bound(1e-3), 0.0002499999947916668);
  EXPECT_EQ(tv_bound(std::numeric_limits<double>::infinity()), 1.0);
  EXPECT_DOUBLE_EQ(kl_bound(1), 0.125);                // 1²/8 < 1·tanh(1/4) = 0.2449
  EXPECT_DOUBLE_EQ(kl_bound(16), 15.989268795825073);  // 16·tanh(4) < 16²/8 = 32
  EXPECT_EQ(logp_bound(0.5), 0.5);
  EXPECT_DOUBLE_EQ(ratio_bounds(0.5).first, 0.6065306597126334);
  EXPECT_DOUBLE_EQ(ratio_bounds(0.5).second, 1.6487212707001282);
  EXPECT_DOUBLE_EQ(tis_safe_truncation(0.5), 1.6487212707001282);
  const std::vector<double> two = {4, 4}, three = {1, 2, 0};
  EXPECT_DOUBLE_EQ(sequence_tv_bound(two), 0.9431626535255558);    // 1 − (1 − tanh 1)²
  EXPECT_DOUBLE_EQ(sequence_tv_bound(three), 0.5938547036337929);  // ≤ Σ tanh = 0.707
  EXPECT_EQ(sequence_tv_bound({}), 0.0);
  const std::vector<double> many(1000, 1e-9);
  // 1 − (1 − tanh(2.5e-10))^1000 = 2.4999996878125261e-07 (50-digit decimal): no cancellation.
  EXPECT_NEAR(sequence_tv_bound(many), 2.4999996878125261e-07, 2.5e-19);  // 1000 log1p's: ~1e-13
  const std::vector<double> saturated = {1e3, 1e3};
  EXPECT_EQ(sequence_tv_bound(saturated), 1.0);
  EXPECT_DOUBLE_EQ(reward_drift_bound(-1, 1, 0.25), 0.5);
  EXPECT_DOUBLE_EQ(policy_gradient_bias_bound(3, 0.1), 0.6000000000000001);
}

TEST(Bounds, GreedyStableSlack) {
  using concord::audit::greedy_stable;
  EXPECT_FALSE(greedy_stable(1, 1));
  EXPECT_FALSE(greedy_stable(1 + 0x1p-45, 1));  // within the 2^-40 slack: may flip
  EXPECT_TRUE(greedy_stable(1 + 0x1p-39, 1));
  EXPECT_FALSE(greedy_stable(0, 0));
  EXPECT_FALSE(greedy_stable(DBL_MIN / 2, 0));  // below the absolute slack
  EXPECT_TRUE(greedy_stable(3 * DBL_MIN, 0));
  EXPECT_TRUE(greedy_stable(std::numeric_limits<double>::infinity(), 5));
  EXPECT_FALSE(greedy_stable(std::nan(""), 1));
  EXPECT_FALSE(greedy_stable(100, std::numeric_limits<double>::infinity()));
}

// ---- the vectorized elementary functions ----

uint64_t ulp_distance(double x, double y) {  // both ≥ 0
  uint64_t bx, by;
  std::memcpy(&bx, &x, 8);
  std::memcpy(&by, &y, 8);
  return bx > by ? bx - by : by - bx;
}

TEST(VectorExp, WithinTwoUlpOverTheSoftmaxRange) {
  std::mt19937_64 rng(5);
  std::vector<double> x;
  std::uniform_real_distribution<double> wide(-746, 0), narrow(-1, 0), high(0, 709);
  for (int i = 0; i < 400000; ++i) x.push_back(wide(rng));
  for (int i = 0; i < 100000; ++i) x.push_back(narrow(rng));
  for (int i = 0; i < 50000; ++i) x.push_back(high(rng));
  for (double v :
       {0.0, -0.0, -1e-300, -DBL_MIN, -0x1p-60, -0.34657359027997264, -708.39, -708.4, -709.0,
        -744.4, -745.0, -745.13, -745.14, -745.2, -746.0, -800.0, -1e4, -1e300, 709.0})
    x.push_back(v);
  for (int k = -1080; k <= 1022; ++k) x.push_back(k * 0.6931471805599453);  // binade edges
  std::vector<double> got(x.size());
  concord::audit::vector_exp(x, got);
  uint64_t worst_std = 0, worst_ld = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want_ld = static_cast<double>(expl(static_cast<LD>(x[i])));
    worst_std = std::max(worst_std, ulp_distance(got[i], std::exp(x[i])));
    worst_ld = std::max(worst_ld, ulp_distance(got[i], want_ld));
    if (ulp_distance(got[i], want_ld) > 2) {
      ADD_FAILURE() << "exp(" << x[i] << ") = " << got[i] << ", want " << want_ld;
      break;
    }
  }
  std::printf("vector_exp: max ulp vs std::exp %llu, vs expl %llu\n",
              static_cast<unsigned long long>(worst_std),
              static_cast<unsigned long long>(worst_ld));
  EXPECT_LE(worst_std, 2u);
  const std::vector<double> special = {0.0, -0.0, -746.0, -1e300};
  std::vector<double> special_out(special.size());
  concord::audit::vector_exp(special, special_out);
  EXPECT_EQ(special_out, (std::vector<double>{1.0, 1.0, 0.0, 0.0}));
}

TEST(VectorExp, PsiIsAccurateRelativeToItsValue) {
  std::vector<double> t;
  for (int i = -20000; i <= 20000; ++i) t.push_back(0.34657359027997264 * i / 20000);
  for (double v : {1e-300, -1e-300, 1e-9, -1e-9, 1e-18}) t.push_back(v);
  std::vector<double> pos(t.size()), neg(t.size());
  concord::audit::vector_exp_psi(t, pos, neg);
  double worst = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    for (const auto& [got, x] :
         {std::pair{pos[i], static_cast<LD>(t[i])}, std::pair{neg[i], -static_cast<LD>(t[i])}}) {
      const LD want = psi_reference(x);
      if (fabsl(want) < DBL_MIN) {  // ψ(±1e-300) = 5e-601 rounds to 0 in double
        EXPECT_EQ(got, static_cast<double>(want));
        continue;
      }
      worst = std::max(worst, static_cast<double>(fabsl(got - want) / want));
    }
  }
  std::printf("psi: max relative error %.3g (%.2f ulp)\n", worst, worst / 0x1p-52);
  EXPECT_LE(worst, 4 * 0x1p-52);
}

}  // namespace
