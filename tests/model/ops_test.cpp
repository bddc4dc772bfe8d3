// Tests of the model ops (src/concord/model/ops.h): every backward against central finite
// differences of the fp64 instantiation, fp32 against fp64, each forward against its formula
// written out here, the KV-cache identity of attention, thread/batch invariance, and bad input.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "concord/model/ops.h"
#include "concord/numerics/convert.h"

namespace concord::model {
namespace {

using Vec = std::vector<double>;
using FVec = std::vector<float>;

Vec random_vec(std::mt19937_64& rng, size_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Values exactly representable in fp32, so the float and double runs see the same inputs.
Vec random_float_exact(std::mt19937_64& rng, size_t n, double lo = -1.0, double hi = 1.0) {
  Vec v = random_vec(rng, n, lo, hi);
  for (auto& x : v) x = static_cast<float>(x);
  return v;
}

FVec to_float(const Vec& v) { return FVec(v.begin(), v.end()); }

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

Vec minus(const Vec& a, const Vec& b) {
  Vec d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// Gradient check: max over i of |analytic_i − numeric_i| / max(|numeric_i|, 1), the numeric
// derivative by central differences (step h) of loss() with respect to x[i]. In fp64 with
// h = 1e-6 the truncation error is ~1e-12 and the cancellation error ~1e-10 for |loss| ~ 10, so
// the tolerance 1e-6 has four orders of margin; a wrong gradient is off by O(1) (see the control
// test FiniteDifferenceCheckerRejectsAWrongGradient).
constexpr double kGradTolerance = 1e-6;

double gradient_error(Vec& x, const Vec& analytic, const std::function<double()>& loss,
                      double h = 1e-6) {
  EXPECT_EQ(x.size(), analytic.size());
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    x[i] = saved - h;
    const double down = loss();
    x[i] = saved;
    const double numeric = (up - down) / (2.0 * h);
    worst = std::max(worst, std::abs(analytic[i] - numeric) / std::max(std::abs(numeric), 1.0));
  }
  return worst;
}

// Max of |f − d| / max(|d|, 1): fp32 results against the fp64 instantiation.
double float_error(const FVec& f, const Vec& d) {
  EXPECT_EQ(f.size(), d.size());
  double worst = 0.0;
  for (size_t i = 0; i < d.size(); ++i) {
    worst =
        std::max(worst, std::abs(static_cast<double>(f[i]) - d[i]) / std::max(std::abs(d[i]), 1.0));
  }
  return worst;
}
// fp32 tolerance: float eps is 6e-8; each op rounds a few times and sums at most a few hundred
// terms here (accumulations in F add ~sqrt(n) ulps), so 2e-5 leaves a margin of >10.
constexpr double kFloatTolerance = 2e-5;

bool same_bits(const FVec& a, const FVec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

template <class Fn>
void expect_input_error(Fn fn, const std::string& op) {
  try {
    fn();
    ADD_FAILURE() << op << ": expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Attention inputs shared by several tests.
struct AttentionCase {
  int64_t B, S, Hq, Hkv, D;
  Vec q, k, v;
  AttentionCase(std::mt19937_64& rng, int64_t b, int64_t s, int64_t hq, int64_t hkv, int64_t d)
      : B(b), S(s), Hq(hq), Hkv(hkv), D(d) {
    // Scores of a few units, so the softmax is far from uniform and from one-hot.
    q = random_float_exact(rng, static_cast<size_t>(B * S * Hq * D), -1.5, 1.5);
    k = random_float_exact(rng, static_cast<size_t>(B * S * Hkv * D), -1.5, 1.5);
    v = random_float_exact(rng, static_cast<size_t>(B * S * Hkv * D));
  }
  size_t q_size() const { return static_cast<size_t>(B * S * Hq * D); }
  size_t kv_size() const { return static_cast<size_t>(B * S * Hkv * D); }
  size_t probs_size() const { return static_cast<size_t>(B * Hq * S * S); }
};

// ---------------------------------------------------------------------------------------------
// Finite differences (fp64)

TEST(OpsGradient, FiniteDifferenceCheckerRejectsAWrongGradient) {
  std::mt19937_64 rng(1);
  Vec x = random_vec(rng, 5);
  auto loss = [&] { return x[0] * x[1] + std::sin(x[2]) + x[3] * x[3] * x[4]; };
  Vec right = {x[1], x[0], std::cos(x[2]), 2 * x[3] * x[4], x[3] * x[3]};
  EXPECT_LE(gradient_error(x, right, loss), kGradTolerance);
  Vec wrong = right;
  wrong[3] *= 1.0 + 1e-4;
  EXPECT_GT(gradient_error(x, wrong, loss), kGradTolerance);
}

TEST(OpsGradient, Embedding) {
  std::mt19937_64 rng(11);
  const int64_t T = 9, V = 7, C = 5;
  const std::vector<int32_t> tokens = {3, 0, 6, 3, 3, 1, 6, 2, 0};
  Vec table = random_vec(rng, V * C), r = random_vec(rng, T * C);
  Vec out(T * C);
  auto loss = [&] {
    embedding_forward<double>(out.data(), tokens.data(), table.data(), T, V, C);
    return dot(r, out);
  };
  const Vec initial = random_vec(rng, V * C);  // dtable is accumulated into
  Vec dtable = initial;
  embedding_backward<double>(dtable.data(), r.data(), tokens.data(), T, V, C);
  EXPECT_LE(gradient_error(table, minus(dtable, initial), loss), kGradTolerance);
  // Row 4 (token 4 is never used) keeps its initial value exactly.
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dtable[4 * C + c], initial[4 * C + c]);
}

TEST(OpsGradient, RmsNorm) {
  std::mt19937_64 rng(12);
  const int64_t T = 4, C = 6;
  const double eps = 1e-2;  // large enough that a dropped eps would show in the gradient
  Vec x = random_vec(rng, T * C), w = random_vec(rng, C, 0.5, 1.5), r = random_vec(rng, T * C);
  Vec y(T * C), rstd(T);
  auto loss = [&] {
    rmsnorm_forward<double>(y.data(), rstd.data(), x.data(), w.data(), T, C, eps);
    return dot(r, y);
  };
  loss();
  Vec dx(T * C, 123.0);  // overwritten
  const Vec initial_dw = random_vec(rng, C);
  Vec dw = initial_dw;
  rmsnorm_backward<double>(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), T, C);
  EXPECT_LE(gradient_error(x, dx, loss), kGradTolerance);
  EXPECT_LE(gradient_error(w, minus(dw, initial_dw), loss), kGradTolerance);
}

TEST(OpsGradient, Rope) {
  std::mt19937_64 rng(13);
  const int64_t T = 3, H = 2, D = 8;
  const std::vector<int32_t> positions = {0, 5, 17};
  const RopeTable table = RopeTable::build(32, D, 10000.0);
  Vec x = random_vec(rng, T * H * D), r = random_vec(rng, T * H * D);
  auto loss = [&] {
    Vec y = x;
    rope_forward<double>(y.data(), positions.data(), T, H, D, table);
    return dot(r, y);
  };
  Vec dx = r;
  rope_backward<double>(dx.data(), positions.data(), T, H, D, table);
  EXPECT_LE(gradient_error(x, dx, loss), kGradTolerance);
}

TEST(OpsGradient, Attention) {
  std::mt19937_64 rng(14);
  AttentionCase a(rng, 2, 5, 4, 2, 8);
  Vec r = random_vec(rng, a.q_size());
  Vec out(a.q_size()), probs(a.probs_size());
  auto loss = [&] {
    attention_forward<double>(out.data(), probs.data(), a.q.data(), a.k.data(), a.v.data(), a.B,
                              a.S, a.Hq, a.Hkv, a.D);
    return dot(r, out);
  };
  loss();
  Vec dq(a.q_size(), 7.0), dk(a.kv_size(), 7.0), dv(a.kv_size(), 7.0);  // overwritten
  attention_backward<double>(dq.data(), dk.data(), dv.data(), r.data(), probs.data(), a.q.data(),
                             a.k.data(), a.v.data(), a.B, a.S, a.Hq, a.Hkv, a.D);
  EXPECT_LE(gradient_error(a.q, dq, loss), kGradTolerance);
  EXPECT_LE(gradient_error(a.k, dk, loss), kGradTolerance);
  EXPECT_LE(gradient_error(a.v, dv, loss), kGradTolerance);
}

TEST(OpsGradient, SwiGlu) {
  std::mt19937_64 rng(15);
  const int64_t T = 3, Fdim = 7;
  Vec gate = random_vec(rng, T * Fdim, -5.0, 5.0), up = random_vec(rng, T * Fdim);
  Vec r = random_vec(rng, T * Fdim), out(T * Fdim);
  auto loss = [&] {
    swiglu_forward<double>(out.data(), gate.data(), up.data(), T, Fdim);
    return dot(r, out);
  };
  Vec dgate(T * Fdim, 9.0), dup(T * Fdim, 9.0);
  swiglu_backward<double>(dgate.data(), dup.data(), r.data(), gate.data(), up.data(), T, Fdim);
  EXPECT_LE(gradient_error(gate, dgate, loss), kGradTolerance);
  EXPECT_LE(gradient_error(up, dup, loss), kGradTolerance);
}

TEST(OpsGradient, CrossEntropyWithIgnoredTargets) {
  std::mt19937_64 rng(16);
  const int64_t T = 5, V = 11;
  const std::vector<int32_t> targets = {3, -100, 0, 10, -1};
  const double scale = 0.37;
  Vec logits = random_vec(rng, T * V, -3.0, 3.0);
  Vec losses(T);
  auto loss = [&] {
    return scale * cross_entropy_forward<double>(nullptr, logits.data(), targets.data(), T, V);
  };
  Vec dlogits(T * V, 5.0);
  cross_entropy_backward<double>(dlogits.data(), logits.data(), targets.data(), T, V, scale);
  EXPECT_LE(gradient_error(logits, dlogits, loss), kGradTolerance);
  for (int64_t v = 0; v < V; ++v) {
    EXPECT_EQ(dlogits[1 * V + v], 0.0);
    EXPECT_EQ(dlogits[4 * V + v], 0.0);
  }
  // Per-row losses: 0 for ignored rows, summing to the total.
  const double total =
      cross_entropy_forward<double>(losses.data(), logits.data(), targets.data(), T, V);
  EXPECT_EQ(losses[1], 0.0);
  EXPECT_EQ(losses[4], 0.0);
  EXPECT_GT(losses[0], 0.0);
  EXPECT_NEAR(losses[0] + losses[2] + losses[3], total, 1e-12);
}

TEST(OpsGradient, LogSoftmax) {
  std::mt19937_64 rng(17);
  const int64_t T = 3, V = 9;
  Vec logits = random_vec(rng, T * V, -3.0, 3.0), r = random_vec(rng, T * V), out(T * V);
  auto loss = [&] {
    log_softmax_forward<double>(out.data(), logits.data(), T, V);
    return dot(r, out);
  };
  loss();
  Vec dlogits(T * V);
  log_softmax_backward<double>(dlogits.data(), r.data(), out.data(), T, V);
  EXPECT_LE(gradient_error(logits, dlogits, loss), kGradTolerance);
}

// ---------------------------------------------------------------------------------------------
// Forwards against their formulas, written out independently here.

TEST(OpsFormula, RmsNormMatchesFormula) {
  std::mt19937_64 rng(21);
  const int64_t T = 5, C = 37;
  const double eps = 1e-6;
  Vec x = random_vec(rng, T * C, -3.0, 3.0), w = random_vec(rng, C);
  Vec y(T * C), rstd(T);
  rmsnorm_forward<double>(y.data(), rstd.data(), x.data(), w.data(), T, C, eps);
  for (int64_t t = 0; t < T; ++t) {
    double mean_sq = 0.0;
    for (int64_t c = 0; c < C; ++c) mean_sq += x[t * C + c] * x[t * C + c] / C;
    const double inv_rms = 1.0 / std::sqrt(mean_sq + eps);
    EXPECT_NEAR(rstd[t], inv_rms, 1e-14 * inv_rms);
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_NEAR(y[t * C + c], w[c] * x[t * C + c] * inv_rms, 1e-14);
    }
  }
}

TEST(OpsFormula, RopeMatchesExplicitRotation) {
  std::mt19937_64 rng(22);
  const int64_t T = 4, H = 3, D = 16;
  const double theta = 1e6;  // Qwen3's rope_theta
  const std::vector<int32_t> positions = {0, 1, 777, 4095};
  const RopeTable table = RopeTable::build(4096, D, theta);
  const Vec x = random_vec(rng, T * H * D);
  Vec y = x;
  rope_forward<double>(y.data(), positions.data(), T, H, D, table);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const double* in = x.data() + (t * H + h) * D;
      const double* got = y.data() + (t * H + h) * D;
      for (int64_t i = 0; i < D / 2; ++i) {
        const double angle = positions[t] / std::pow(theta, 2.0 * i / D);
        // HF: x·cos + rotate_half(x)·sin, rotate_half(x) = (−x2, x1).
        EXPECT_NEAR(got[i], in[i] * std::cos(angle) - in[i + D / 2] * std::sin(angle), 1e-12);
        EXPECT_NEAR(got[i + D / 2], in[i + D / 2] * std::cos(angle) + in[i] * std::sin(angle),
                    1e-12);
      }
    }
  }
  // The backward undoes the forward (a rotation's transpose is its inverse).
  rope_backward<double>(y.data(), positions.data(), T, H, D, table);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-14);
}

TEST(OpsFormula, AttentionMatchesNaiveSoftmax) {
  std::mt19937_64 rng(23);
  AttentionCase a(rng, 2, 6, 6, 2, 8);
  const int64_t B = a.B, S = a.S, Hq = a.Hq, Hkv = a.Hkv, D = a.D;
  Vec out(a.q_size()), probs(a.probs_size(), 42.0);
  attention_forward<double>(out.data(), probs.data(), a.q.data(), a.k.data(), a.v.data(), B, S, Hq,
                            Hkv, D);
  // softmax(Q Kᵀ/√D + mask) V per (b, h), the kv head of h being h / (Hq/Hkv).
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t g = h / (Hq / Hkv);
      for (int64_t s = 0; s < S; ++s) {
        Vec logit(S);
        for (int64_t j = 0; j < S; ++j) {
          double qk = 0.0;
          for (int64_t d = 0; d < D; ++d) {
            qk += a.q[((b * S + s) * Hq + h) * D + d] * a.k[((b * S + j) * Hkv + g) * D + d];
          }
          logit[j] = j <= s ? qk / std::sqrt(static_cast<double>(D))
                            : -std::numeric_limits<double>::infinity();
        }
        const double m = *std::max_element(logit.begin(), logit.end());
        double z = 0.0;
        for (int64_t j = 0; j < S; ++j) z += std::exp(logit[j] - m);
        for (int64_t j = 0; j < S; ++j) {
          const double p = std::exp(logit[j] - m) / z;
          const double got = probs[((b * Hq + h) * S + s) * S + j];
          if (j > s) {
            EXPECT_EQ(got, 0.0);
          } else {
            EXPECT_NEAR(got, p, 1e-14);
          }
        }
        for (int64_t d = 0; d < D; ++d) {
          double o = 0.0;
          for (int64_t j = 0; j < S; ++j) {
            o += std::exp(logit[j] - m) / z * a.v[((b * S + j) * Hkv + g) * D + d];
          }
          EXPECT_NEAR(out[((b * S + s) * Hq + h) * D + d], o, 1e-14);
        }
      }
    }
  }
}

TEST(OpsFormula, CrossEntropyOfUniformLogitsIsLogV) {
  for (const int64_t V : {int64_t{2}, int64_t{1000}, int64_t{151936}}) {
    const int64_t T = 3;
    const std::vector<int32_t> targets = {0, static_cast<int32_t>(V - 1), -100};
    Vec logits(static_cast<size_t>(T * V), 3.25);
    Vec losses(T);
    const double total =
        cross_entropy_forward<double>(losses.data(), logits.data(), targets.data(), T, V);
    const double log_v = std::log(static_cast<double>(V));
    EXPECT_NEAR(losses[0], log_v, 1e-12 * log_v) << V;
    EXPECT_NEAR(losses[1], log_v, 1e-12 * log_v) << V;
    EXPECT_EQ(losses[2], 0.0);
    EXPECT_NEAR(total, 2 * log_v, 2e-12 * log_v) << V;
    // fp32: exp(0) = 1 exactly and the sum is in double, so only the final rounding remains.
    FVec flogits(static_cast<size_t>(T * V), 3.25f), flosses(T);
    const double ftotal =
        cross_entropy_forward<float>(flosses.data(), flogits.data(), targets.data(), T, V);
    EXPECT_NEAR(flosses[0], log_v, 1e-7 * log_v) << V;
    EXPECT_NEAR(ftotal, 2 * log_v, 1e-12 * log_v) << V;
  }
}

TEST(OpsFormula, LogSoftmaxRowsNormalize) {
  std::mt19937_64 rng(24);
  const int64_t T = 4, V = 500;
  // Large logits: without the max subtraction exp would overflow.
  Vec logits = random_vec(rng, T * V, 800.0, 900.0), out(T * V);
  log_softmax_forward<double>(out.data(), logits.data(), T, V);
  for (int64_t t = 0; t < T; ++t) {
    double z = 0.0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(out[t * V + v]);
    EXPECT_NEAR(z, 1.0, 1e-12);
    // Differences of log-probs are differences of logits.
    EXPECT_NEAR(out[t * V + 7] - out[t * V + 3], logits[t * V + 7] - logits[t * V + 3], 1e-10);
  }
}

TEST(OpsFormula, SwiGluMatchesFormula) {
  const Vec gate = {-30.0, -2.0, 0.0, 0.5, 3.0, 40.0}, up = {1.0, -2.0, 3.0, 4.0, 0.25, 2.0};
  Vec out(6);
  swiglu_forward<double>(out.data(), gate.data(), up.data(), 1, 6);
  for (size_t i = 0; i < gate.size(); ++i) {
    const double sigmoid = 1.0 / (1.0 + std::exp(-gate[i]));
    EXPECT_NEAR(out[i], gate[i] * sigmoid * up[i], 1e-15 * std::max(1.0, std::abs(out[i])));
  }
  EXPECT_EQ(out[2], 0.0);
}

// ---------------------------------------------------------------------------------------------
// fp32 against fp64 on the same (fp32-representable) inputs.

TEST(OpsFloat, MatchesDouble) {
  std::mt19937_64 rng(31);
  {  // embedding
    const int64_t T = 50, V = 13, C = 24;
    std::vector<int32_t> tokens(T);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);
    const Vec table = random_float_exact(rng, V * C), dout = random_float_exact(rng, T * C);
    Vec out(T * C), dtable(V * C, 0.0);
    FVec fout(T * C), fdtable(V * C, 0.0f);
    embedding_forward<double>(out.data(), tokens.data(), table.data(), T, V, C);
    embedding_forward<float>(fout.data(), tokens.data(), to_float(table).data(), T, V, C);
    EXPECT_EQ(float_error(fout, out), 0.0);
    embedding_backward<double>(dtable.data(), dout.data(), tokens.data(), T, V, C);
    embedding_backward<float>(fdtable.data(), to_float(dout).data(), tokens.data(), T, V, C);
    EXPECT_LE(float_error(fdtable, dtable), kFloatTolerance);
  }
  {  // rmsnorm
    const int64_t T = 20, C = 300;
    const Vec x = random_float_exact(rng, T * C, -4, 4), w = random_float_exact(rng, C, 0.5, 2);
    const Vec dy = random_float_exact(rng, T * C);
    Vec y(T * C), rstd(T), dx(T * C), dw(C, 0.0);
    FVec fy(T * C), frstd(T), fdx(T * C), fdw(C, 0.0f);
    rmsnorm_forward<double>(y.data(), rstd.data(), x.data(), w.data(), T, C, 1e-6);
    rmsnorm_forward<float>(fy.data(), frstd.data(), to_float(x).data(), to_float(w).data(), T, C,
                           1e-6);
    EXPECT_LE(float_error(fy, y), kFloatTolerance);
    EXPECT_LE(float_error(frstd, rstd), kFloatTolerance);
    rmsnorm_backward<double>(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), T,
                             C);
    rmsnorm_backward<float>(fdx.data(), fdw.data(), to_float(dy).data(), to_float(x).data(),
                            to_float(w).data(), frstd.data(), T, C);
    EXPECT_LE(float_error(fdx, dx), kFloatTolerance);
    EXPECT_LE(float_error(fdw, dw), kFloatTolerance);
  }
  {  // rope
    const int64_t T = 6, H = 4, D = 64;
    const std::vector<int32_t> positions = {0, 3, 100, 2047, 5, 9};
    const RopeTable table = RopeTable::build(2048, D, 1e6);
    Vec x = random_float_exact(rng, T * H * D);
    FVec fx = to_float(x);
    rope_forward<double>(x.data(), positions.data(), T, H, D, table);
    rope_forward<float>(fx.data(), positions.data(), T, H, D, table);
    EXPECT_LE(float_error(fx, x), kFloatTolerance);
    rope_backward<double>(x.data(), positions.data(), T, H, D, table);
    rope_backward<float>(fx.data(), positions.data(), T, H, D, table);
    EXPECT_LE(float_error(fx, x), kFloatTolerance);
  }
  {  // attention
    AttentionCase a(rng, 2, 40, 8, 2, 64);
    const Vec dout = random_float_exact(rng, a.q_size());
    Vec out(a.q_size()), probs(a.probs_size()), dq(a.q_size()), dk(a.kv_size()), dv(a.kv_size());
    FVec fout(a.q_size()), fprobs(a.probs_size()), fdq(a.q_size()), fdk(a.kv_size()),
        fdv(a.kv_size());
    const FVec fq = to_float(a.q), fk = to_float(a.k), fv = to_float(a.v);
    attention_forward<double>(out.data(), probs.data(), a.q.data(), a.k.data(), a.v.data(), a.B,
                              a.S, a.Hq, a.Hkv, a.D);
    attention_forward<float>(fout.data(), fprobs.data(), fq.data(), fk.data(), fv.data(), a.B, a.S,
                             a.Hq, a.Hkv, a.D);
    EXPECT_LE(float_error(fout, out), kFloatTolerance);
    EXPECT_LE(float_error(fprobs, probs), kFloatTolerance);
    attention_backward<double>(dq.data(), dk.data(), dv.data(), dout.data(), probs.data(),
                               a.q.data(), a.k.data(), a.v.data(), a.B, a.S, a.Hq, a.Hkv, a.D);
    attention_backward<float>(fdq.data(), fdk.data(), fdv.data(), to_float(dout).data(),
                              fprobs.data(), fq.data(), fk.data(), fv.data(), a.B, a.S, a.Hq,
                              a.Hkv, a.D);
    EXPECT_LE(float_error(fdq, dq), kFloatTolerance);
    EXPECT_LE(float_error(fdk, dk), kFloatTolerance);
    EXPECT_LE(float_error(fdv, dv), kFloatTolerance);
  }
  {  // swiglu
    const int64_t T = 7, Fdim = 100;
    const Vec gate = random_float_exact(rng, T * Fdim, -8, 8),
              up = random_float_exact(rng, T * Fdim);
    const Vec dout = random_float_exact(rng, T * Fdim);
    Vec out(T * Fdim), dgate(T * Fdim), dup(T * Fdim);
    FVec fout(T * Fdim), fdgate(T * Fdim), fdup(T * Fdim);
    swiglu_forward<double>(out.data(), gate.data(), up.data(), T, Fdim);
    swiglu_forward<float>(fout.data(), to_float(gate).data(), to_float(up).data(), T, Fdim);
    EXPECT_LE(float_error(fout, out), kFloatTolerance);
    swiglu_backward<double>(dgate.data(), dup.data(), dout.data(), gate.data(), up.data(), T, Fdim);
    swiglu_backward<float>(fdgate.data(), fdup.data(), to_float(dout).data(),
                           to_float(gate).data(), to_float(up).data(), T, Fdim);
    EXPECT_LE(float_error(fdgate, dgate), kFloatTolerance);
    EXPECT_LE(float_error(fdup, dup), kFloatTolerance);
  }
  {  // log-softmax and cross-entropy
    const int64_t T = 6, V = 5000;
    const Vec logits = random_float_exact(rng, T * V, -10, 10),
              dout = random_float_exact(rng, T * V);
    const std::vector<int32_t> targets = {4999, 0, -100, 17, 2500, 3};
    const FVec flogits = to_float(logits);
    Vec out(T * V), dlogits(T * V), losses(T);
    FVec fout(T * V), fdlogits(T * V), flosses(T);
    log_softmax_forward<double>(out.data(), logits.data(), T, V);
    log_softmax_forward<float>(fout.data(), flogits.data(), T, V);
    EXPECT_LE(float_error(fout, out), kFloatTolerance);
    log_softmax_backward<double>(dlogits.data(), dout.data(), out.data(), T, V);
    log_softmax_backward<float>(fdlogits.data(), to_float(dout).data(), fout.data(), T, V);
    EXPECT_LE(float_error(fdlogits, dlogits), kFloatTolerance);
    const double total = cross_entropy_forward<double>(losses.data(), logits.data(),
                                                       targets.data(), T, V);
    const double ftotal = cross_entropy_forward<float>(flosses.data(), flogits.data(),
                                                       targets.data(), T, V);
    EXPECT_LE(float_error(flosses, losses), kFloatTolerance);
    EXPECT_NEAR(ftotal, total, kFloatTolerance * total);
    cross_entropy_backward<double>(dlogits.data(), logits.data(), targets.data(), T, V, 0.5);
    cross_entropy_backward<float>(fdlogits.data(), flogits.data(), targets.data(), T, V, 0.5);
    EXPECT_LE(float_error(fdlogits, dlogits), kFloatTolerance);
  }
}

// ---------------------------------------------------------------------------------------------
// KV cache: the decode step reproduces the batched forward bit for bit (fp32).

TEST(OpsAttention, QueryRowOverGrowingCacheReproducesForwardBitwise) {
  std::mt19937_64 rng(41);
  // D = 20 exercises the dot product's tail (20 = 2·8 + 4).
  for (const int64_t D : {int64_t{16}, int64_t{20}}) {
    AttentionCase a(rng, 2, 33, 6, 2, D);
    const int64_t B = a.B, S = a.S, Hq = a.Hq, Hkv = a.Hkv;
    const FVec q = to_float(a.q), k = to_float(a.k), v = to_float(a.v);
    FVec out(a.q_size()), probs(a.probs_size());
    attention_forward<float>(out.data(), probs.data(), q.data(), k.data(), v.data(), B, S, Hq, Hkv,
                             D);
    // The engine's cache has its own row stride (padded here), filled one position per step.
    const int64_t stride = Hkv * D + 3;
    for (int64_t b = 0; b < B; ++b) {
      FVec cache_k(static_cast<size_t>(S * stride), NAN),
          cache_v(static_cast<size_t>(S * stride), NAN);
      for (int64_t s = 0; s < S; ++s) {
        std::copy_n(k.data() + (b * S + s) * Hkv * D, Hkv * D, cache_k.data() + s * stride);
        std::copy_n(v.data() + (b * S + s) * Hkv * D, Hkv * D, cache_v.data() + s * stride);
        FVec row_out(static_cast<size_t>(Hq * D)), row_probs(static_cast<size_t>(Hq * (s + 1)));
        attention_query_row(row_out.data(), row_probs.data(), q.data() + (b * S + s) * Hq * D,
                            cache_k.data(), cache_v.data(), s + 1, stride, Hq, Hkv, D);
        ASSERT_EQ(std::memcmp(row_out.data(), out.data() + (b * S + s) * Hq * D,
                              row_out.size() * sizeof(float)),
                  0)
            << "b=" << b << " s=" << s << " D=" << D;
        for (int64_t h = 0; h < Hq; ++h) {
          ASSERT_EQ(std::memcmp(row_probs.data() + h * (s + 1),
                                probs.data() + ((b * Hq + h) * S + s) * S,
                                static_cast<size_t>(s + 1) * sizeof(float)),
                    0)
              << "b=" << b << " s=" << s << " h=" << h;
        }
        // probs is optional.
        FVec row_out2(static_cast<size_t>(Hq * D));
        attention_query_row(row_out2.data(), nullptr, q.data() + (b * S + s) * Hq * D,
                            cache_k.data(), cache_v.data(), s + 1, stride, Hq, Hkv, D);
        ASSERT_TRUE(same_bits(row_out2, row_out));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The float attention kernel's copies (baseline SSE2, AVX2; ops_attention_kernel.h) against the
// reference operation order written out here: bitwise, for every instruction set the CPU has.

// The reference arithmetic of one query (docs/engine.md): 8-lane dot products combined pairwise,
// times the scale; exp in float, sum and division in double; out = 0 + Σ_j p_j v_j, j ascending.
void reference_attend_one_query(float* out, float* probs, const float* q, const float* k,
                                const float* v, int64_t n_ctx, int64_t kv_stride, int64_t Hq,
                                int64_t Hkv, int64_t D) {
  const int64_t group = Hq / Hkv;
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  for (int64_t h = 0; h < Hq; ++h) {
    const float* qh = q + h * D;
    FVec p(static_cast<size_t>(n_ctx));
    for (int64_t j = 0; j < n_ctx; ++j) {
      const float* kj = k + j * kv_stride + (h / group) * D;
      float lane[8] = {};
      for (int64_t i = 0; i < D; ++i) lane[i % 8] = lane[i % 8] + qh[i] * kj[i];
      const float dot = ((lane[0] + lane[4]) + (lane[1] + lane[5])) +
                        ((lane[2] + lane[6]) + (lane[3] + lane[7]));
      p[j] = dot * scale;
    }
    float max_score = -std::numeric_limits<float>::infinity();
    for (const float s : p) max_score = std::max(max_score, s);
    double sum = 0.0;
    for (float& s : p) {
      s = std::exp(s - max_score);
      sum += static_cast<double>(s);
    }
    const double inv_sum = 1.0 / sum;
    for (float& s : p) s = static_cast<float>(static_cast<double>(s) * inv_sum);
    std::copy(p.begin(), p.end(), probs + h * n_ctx);
    for (int64_t d = 0; d < D; ++d) {
      float o = 0.0f;
      for (int64_t j = 0; j < n_ctx; ++j) o = o + p[j] * v[j * kv_stride + (h / group) * D + d];
      out[h * D + d] = o;
    }
  }
}

// The instruction sets this CPU can run the attention kernel with; restores the active one.
class IsaSweep {
 public:
  IsaSweep() : saved_(numerics::active_isa()) {}
  ~IsaSweep() { numerics::set_active_isa(saved_); }
  IsaSweep(const IsaSweep&) = delete;
  IsaSweep& operator=(const IsaSweep&) = delete;
  static std::vector<numerics::Isa> available() {
    std::vector<numerics::Isa> isas;
    for (const auto isa : {numerics::Isa::generic, numerics::Isa::avx2, numerics::Isa::avx512}) {
      if (numerics::isa_supported(isa)) isas.push_back(isa);
    }
    return isas;
  }

 private:
  numerics::Isa saved_;
};

TEST(OpsAttentionIsa, EveryKernelCopyMatchesTheReferenceOrderBitwise) {
  IsaSweep restore;
  const auto isas = IsaSweep::available();
  std::mt19937_64 rng(77);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  struct Shape { int64_t Hq, Hkv, D; };
  // SmolLM2 (9/3/64), Qwen3 (16/8/128), D = 32, and scalar-path shapes (D % 8 != 0, D = 8).
  const Shape shapes[] = {{9, 3, 64}, {16, 8, 128}, {4, 4, 32}, {6, 2, 20}, {2, 1, 8}};
  int64_t checked = 0;
  for (const Shape& sh : shapes) {
    for (const int64_t n_ctx : {1, 2, 3, 4, 5, 7, 8, 9, 33, 130}) {
      const int64_t stride = sh.Hkv * sh.D + 3;  // unaligned rows, as a padded cache could be
      FVec q(static_cast<size_t>(sh.Hq * sh.D)), k(static_cast<size_t>(n_ctx * stride)),
          v(static_cast<size_t>(n_ctx * stride));
      // Scores spread over tens of units (exp sees large and tiny arguments), some exact zeros
      // and negative zeros (signed-zero additions must round the same way).
      for (auto& x : q) x = 2.0f * normal(rng);
      for (auto& x : k) x = normal(rng);
      for (auto& x : v) x = normal(rng);
      for (size_t i = 0; i < v.size(); i += 11) v[i] = (i % 2 == 0) ? 0.0f : -0.0f;
      for (size_t i = 0; i < q.size(); i += 13) q[i] = -0.0f;
      FVec want_out(q.size()), want_probs(static_cast<size_t>(sh.Hq * n_ctx));
      reference_attend_one_query(want_out.data(), want_probs.data(), q.data(), k.data(), v.data(),
                                 n_ctx, stride, sh.Hq, sh.Hkv, sh.D);
      for (const auto isa : isas) {
        numerics::set_active_isa(isa);
        FVec out(q.size(), NAN), probs(want_probs.size(), NAN);
        attention_query_row(out.data(), probs.data(), q.data(), k.data(), v.data(), n_ctx, stride,
                            sh.Hq, sh.Hkv, sh.D);
        const std::string where = std::string(numerics::isa_name(isa)) +
                                  " Hq=" + std::to_string(sh.Hq) + " Hkv=" +
                                  std::to_string(sh.Hkv) + " D=" + std::to_string(sh.D) +
                                  " n_ctx=" + std::to_string(n_ctx);
        ASSERT_TRUE(same_bits(out, want_out)) << "out, " << where;
        ASSERT_TRUE(same_bits(probs, want_probs)) << "probs, " << where;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, static_cast<int64_t>(std::size(shapes) * 10 * isas.size()));
}

TEST(OpsAttentionIsa, ForwardIsTheSameOnEveryInstructionSet) {
  IsaSweep restore;
  std::mt19937_64 rng(78);
  for (const int64_t D : {int64_t{64}, int64_t{128}, int64_t{20}}) {
    AttentionCase a(rng, 2, 37, 6, 3, D);
    const FVec q = to_float(a.q), k = to_float(a.k), v = to_float(a.v);
    numerics::set_active_isa(numerics::Isa::generic);
    FVec want_out(a.q_size()), want_probs(a.probs_size());
    attention_forward<float>(want_out.data(), want_probs.data(), q.data(), k.data(), v.data(), a.B,
                             a.S, a.Hq, a.Hkv, D);
    for (const auto isa : IsaSweep::available()) {
      numerics::set_active_isa(isa);
      FVec out(a.q_size()), probs(a.probs_size());
      attention_forward<float>(out.data(), probs.data(), q.data(), k.data(), v.data(), a.B, a.S,
                               a.Hq, a.Hkv, D);
      EXPECT_TRUE(same_bits(out, want_out)) << numerics::isa_name(isa) << " D=" << D;
      EXPECT_TRUE(same_bits(probs, want_probs)) << numerics::isa_name(isa) << " D=" << D;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Thread and batch invariance (fp32, bitwise).

// Runs `run` (which returns all of an op's outputs) with 1, 2 and 3 OpenMP threads and expects
// the same bits. The thread count is restored afterwards.
template <class Fn>
void expect_thread_invariant(const char* what, Fn run) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const FVec one = run();
  for (int threads : {2, 3}) {
    omp_set_num_threads(threads);
    EXPECT_TRUE(same_bits(run(), one)) << what << " with " << threads << " threads";
  }
  omp_set_num_threads(saved);
}

void append(FVec& all, const FVec& part) { all.insert(all.end(), part.begin(), part.end()); }

TEST(OpsInvariance, ThreadCountDoesNotChangeBits) {
  std::mt19937_64 rng(51);
  {
    const int64_t T = 700, V = 40, C = 96;
    std::vector<int32_t> tokens(T);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);
    const FVec table = to_float(random_vec(rng, V * C)), dout = to_float(random_vec(rng, T * C));
    expect_thread_invariant("embedding", [&] {
      FVec out(T * C), dtable(V * C, 0.5f);
      embedding_forward<float>(out.data(), tokens.data(), table.data(), T, V, C);
      embedding_backward<float>(dtable.data(), dout.data(), tokens.data(), T, V, C);
      append(out, dtable);
      return out;
    });
  }
  {
    const int64_t T = 257, C = 200;  // C spans four column blocks of dw, the last one partial
    const FVec x = to_float(random_vec(rng, T * C)), w = to_float(random_vec(rng, C));
    const FVec dy = to_float(random_vec(rng, T * C));
    expect_thread_invariant("rmsnorm", [&] {
      FVec y(T * C), rstd(T), dx(T * C), dw(C, 0.25f);
      rmsnorm_forward<float>(y.data(), rstd.data(), x.data(), w.data(), T, C, 1e-6);
      rmsnorm_backward<float>(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), T,
                              C);
      append(y, rstd);
      append(y, dx);
      append(y, dw);
      return y;
    });
  }
  {
    const int64_t T = 31, H = 3, D = 32;
    std::vector<int32_t> positions(T);
    for (int64_t t = 0; t < T; ++t) positions[t] = static_cast<int32_t>(t * 7);
    const RopeTable table = RopeTable::build(256, D, 1e4);
    const FVec x = to_float(random_vec(rng, T * H * D));
    expect_thread_invariant("rope", [&] {
      FVec y = x, dy = x;
      rope_forward<float>(y.data(), positions.data(), T, H, D, table);
      rope_backward<float>(dy.data(), positions.data(), T, H, D, table);
      append(y, dy);
      return y;
    });
  }
  {
    AttentionCase a(rng, 2, 19, 4, 2, 16);
    const FVec q = to_float(a.q), k = to_float(a.k), v = to_float(a.v);
    const FVec dout = to_float(random_vec(rng, a.q_size()));
    expect_thread_invariant("attention", [&] {
      FVec out(a.q_size()), probs(a.probs_size()), dq(a.q_size()), dk(a.kv_size()),
          dv(a.kv_size());
      attention_forward<float>(out.data(), probs.data(), q.data(), k.data(), v.data(), a.B, a.S,
                               a.Hq, a.Hkv, a.D);
      attention_backward<float>(dq.data(), dk.data(), dv.data(), dout.data(), probs.data(),
                                q.data(), k.data(), v.data(), a.B, a.S, a.Hq, a.Hkv, a.D);
      for (const FVec* part : {&probs, &dq, &dk, &dv}) append(out, *part);
      return out;
    });
  }
  {
    const int64_t T = 23, V = 3001;
    const FVec logits = to_float(random_vec(rng, T * V, -5, 5)),
               r = to_float(random_vec(rng, T * V));
    std::vector<int32_t> targets(T);
    for (int64_t t = 0; t < T; ++t)
      targets[t] = t % 5 == 0 ? -100 : static_cast<int32_t>(rng() % V);
    expect_thread_invariant("swiglu, log-softmax, cross-entropy", [&] {
      FVec out(T * V), dgate(T * V), dup(T * V), lsm(T * V), dlsm(T * V), losses(T), dlogits(T * V);
      swiglu_forward<float>(out.data(), logits.data(), r.data(), T, V);
      swiglu_backward<float>(dgate.data(), dup.data(), r.data(), logits.data(), r.data(), T, V);
      log_softmax_forward<float>(lsm.data(), logits.data(), T, V);
      log_softmax_backward<float>(dlsm.data(), r.data(), lsm.data(), T, V);
      const double total =
          cross_entropy_forward<float>(losses.data(), logits.data(), targets.data(), T, V);
      cross_entropy_backward<float>(dlogits.data(), logits.data(), targets.data(), T, V, 0.125);
      for (const FVec* part : {&dgate, &dup, &lsm, &dlsm, &losses, &dlogits}) append(out, *part);
      FVec total_bits(2);  // the double total, bit for bit
      std::memcpy(total_bits.data(), &total, sizeof(total));
      append(out, total_bits);
      return out;
    });
  }
}

// Row `row` of a T-row batch, computed with the whole batch and alone (T = 1), agrees bitwise.
TEST(OpsInvariance, ARowIsTheSameAloneAndInABatch) {
  std::mt19937_64 rng(52);
  const int64_t T = 29, C = 130, row = 17;
  const FVec x = to_float(random_vec(rng, T * C, -4, 4)), w = to_float(random_vec(rng, C));
  const FVec g = to_float(random_vec(rng, T * C)), dy = to_float(random_vec(rng, T * C));
  const FVec row_x(x.begin() + row * C, x.begin() + (row + 1) * C);
  const FVec row_g(g.begin() + row * C, g.begin() + (row + 1) * C);
  const FVec row_dy(dy.begin() + row * C, dy.begin() + (row + 1) * C);
  auto slice = [&](const FVec& all) {
    return FVec(all.begin() + row * C, all.begin() + (row + 1) * C);
  };
  {  // rmsnorm forward and dx
    FVec y(T * C), rstd(T), dx(T * C), dw(C, 0.0f), y1(C), rstd1(1), dx1(C), dw1(C, 0.0f);
    rmsnorm_forward<float>(y.data(), rstd.data(), x.data(), w.data(), T, C, 1e-6);
    rmsnorm_forward<float>(y1.data(), rstd1.data(), row_x.data(), w.data(), 1, C, 1e-6);
    EXPECT_TRUE(same_bits(slice(y), y1));
    EXPECT_EQ(rstd[row], rstd1[0]);
    rmsnorm_backward<float>(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), T, C);
    rmsnorm_backward<float>(dx1.data(), dw1.data(), row_dy.data(), row_x.data(), w.data(),
                            rstd1.data(), 1, C);
    EXPECT_TRUE(same_bits(slice(dx), dx1));
  }
  {  // swiglu
    FVec out(T * C), dgate(T * C), dup(T * C), out1(C), dgate1(C), dup1(C);
    swiglu_forward<float>(out.data(), g.data(), x.data(), T, C);
    swiglu_forward<float>(out1.data(), row_g.data(), row_x.data(), 1, C);
    EXPECT_TRUE(same_bits(slice(out), out1));
    swiglu_backward<float>(dgate.data(), dup.data(), dy.data(), g.data(), x.data(), T, C);
    swiglu_backward<float>(dgate1.data(), dup1.data(), row_dy.data(), row_g.data(), row_x.data(), 1,
                           C);
    EXPECT_TRUE(same_bits(slice(dgate), dgate1));
    EXPECT_TRUE(same_bits(slice(dup), dup1));
  }
  {  // log-softmax and cross-entropy
    FVec out(T * C), dl(T * C), out1(C), dl1(C), losses(T), losses1(1);
    log_softmax_forward<float>(out.data(), x.data(), T, C);
    log_softmax_forward<float>(out1.data(), row_x.data(), 1, C);
    EXPECT_TRUE(same_bits(slice(out), out1));
    log_softmax_backward<float>(dl.data(), dy.data(), out.data(), T, C);
    log_softmax_backward<float>(dl1.data(), row_dy.data(), out1.data(), 1, C);
    EXPECT_TRUE(same_bits(slice(dl), dl1));
    std::vector<int32_t> targets(T);
    for (int64_t t = 0; t < T; ++t) targets[t] = static_cast<int32_t>((t * 37) % C);
    cross_entropy_forward<float>(losses.data(), x.data(), targets.data(), T, C);
    const double alone =
        cross_entropy_forward<float>(losses1.data(), row_x.data(), &targets[row], 1, C);
    EXPECT_EQ(losses[row], losses1[0]);
    EXPECT_EQ(static_cast<float>(alone), losses1[0]);
    cross_entropy_backward<float>(dl.data(), x.data(), targets.data(), T, C, 0.3);
    cross_entropy_backward<float>(dl1.data(), row_x.data(), &targets[row], 1, C, 0.3);
    EXPECT_TRUE(same_bits(slice(dl), dl1));
  }
  {  // rope (a row of C = 130 = 5 heads of D = 26) and embedding
    const int64_t H = 5, D = 26, V = 50;
    std::vector<int32_t> positions(T), tokens(T);
    for (int64_t t = 0; t < T; ++t) {
      positions[t] = static_cast<int32_t>((t * 13) % 100);
      tokens[t] = static_cast<int32_t>((t * 7) % V);
    }
    const RopeTable table = RopeTable::build(100, D, 1e4);
    FVec y = x, y1 = row_x;
    rope_forward<float>(y.data(), positions.data(), T, H, D, table);
    rope_forward<float>(y1.data(), &positions[row], 1, H, D, table);
    EXPECT_TRUE(same_bits(slice(y), y1));
    const FVec table_values = to_float(random_vec(rng, V * C));
    FVec e(T * C), e1(C);
    embedding_forward<float>(e.data(), tokens.data(), table_values.data(), T, V, C);
    embedding_forward<float>(e1.data(), &tokens[row], table_values.data(), 1, V, C);
    EXPECT_TRUE(same_bits(slice(e), e1));
  }
}

TEST(OpsInvariance, AttentionSequenceIsTheSameAloneAndInABatch) {
  std::mt19937_64 rng(53);
  AttentionCase a(rng, 3, 11, 4, 1, 16);  // Hkv = 1: multi-query attention
  const int64_t S = a.S, Hq = a.Hq, Hkv = a.Hkv, D = a.D, b = 1;
  const FVec q = to_float(a.q), k = to_float(a.k), v = to_float(a.v);
  const FVec dout = to_float(random_vec(rng, a.q_size()));
  FVec out(a.q_size()), probs(a.probs_size()), dq(a.q_size()), dk(a.kv_size()), dv(a.kv_size());
  attention_forward<float>(out.data(), probs.data(), q.data(), k.data(), v.data(), a.B, S, Hq, Hkv,
                           D);
  attention_backward<float>(dq.data(), dk.data(), dv.data(), dout.data(), probs.data(), q.data(),
                            k.data(), v.data(), a.B, S, Hq, Hkv, D);
  const int64_t nq = S * Hq * D, nkv = S * Hkv * D, np = Hq * S * S;
  auto part = [](const FVec& all, int64_t n, int64_t i) {
    return FVec(all.begin() + i * n, all.begin() + (i + 1) * n);
  };
  const FVec q1 = part(q, nq, b), k1 = part(k, nkv, b), v1 = part(v, nkv, b),
             dout1 = part(dout, nq, b);
  FVec out1(nq), probs1(np), dq1(nq), dk1(nkv), dv1(nkv);
  attention_forward<float>(out1.data(), probs1.data(), q1.data(), k1.data(), v1.data(), 1, S, Hq,
                           Hkv, D);
  attention_backward<float>(dq1.data(), dk1.data(), dv1.data(), dout1.data(), probs1.data(),
                            q1.data(), k1.data(), v1.data(), 1, S, Hq, Hkv, D);
  EXPECT_TRUE(same_bits(part(out, nq, b), out1));
  EXPECT_TRUE(same_bits(part(probs, np, b), probs1));
  EXPECT_TRUE(same_bits(part(dq, nq, b), dq1));
  EXPECT_TRUE(same_bits(part(dk, nkv, b), dk1));
  EXPECT_TRUE(same_bits(part(dv, nkv, b), dv1));
}

// ---------------------------------------------------------------------------------------------
// Bad input

TEST(OpsErrors, BadArgumentsThrowInputError) {
  const std::vector<int32_t> tokens = {0, 5};
  FVec table(5 * 4, 1.0f), out(2 * 4);
  expect_input_error(
      [&] { embedding_forward<float>(out.data(), tokens.data(), table.data(), 2, 5, 4); },
      "embedding_forward");
  const std::vector<int32_t> negative = {-1};
  expect_input_error(
      [&] { embedding_backward<float>(table.data(), out.data(), negative.data(), 1, 5, 4); },
      "embedding_backward");

  expect_input_error([] { RopeTable::build(16, 7, 1e4); }, "rope");
  expect_input_error([] { RopeTable::build(16, 8, 0.0); }, "rope");
  const RopeTable rope = RopeTable::build(16, 8, 1e4);
  FVec x(2 * 8);
  const std::vector<int32_t> positions = {3, 16};
  expect_input_error([&] { rope_forward<float>(x.data(), positions.data(), 2, 1, 8, rope); },
                     "rope_forward");
  const std::vector<int32_t> ok_positions = {3, 15};
  expect_input_error([&] { rope_backward<float>(x.data(), ok_positions.data(), 2, 1, 7, rope); },
                     "rope_backward");  // odd head_dim
  expect_input_error([&] { rope_forward<float>(x.data(), ok_positions.data(), 1, 1, 16, rope); },
                     "rope_forward");  // head_dim not the table's

  FVec q(3 * 8), kv(2 * 8), probs(3 * 9);
  expect_input_error(
      [&] {
        attention_forward<float>(q.data(), probs.data(), q.data(), kv.data(), kv.data(), 1, 1, 3,
                                 2, 8);
      },
      "attention_forward");
  expect_input_error(
      [&] {
        attention_backward<float>(q.data(), kv.data(), kv.data(), q.data(), probs.data(), q.data(),
                                  kv.data(), kv.data(), 1, 1, 3, 2, 8);
      },
      "attention_backward");
  expect_input_error(
      [&] {
        attention_query_row(q.data(), nullptr, q.data(), kv.data(), kv.data(), 0, 16, 2, 2, 8);
      },
      "attention_query_row");
  expect_input_error(
      [&] {
        attention_query_row(q.data(), nullptr, q.data(), kv.data(), kv.data(), 1, 8, 2, 2, 8);
      },
      "attention_query_row");  // kv_stride shorter than a row

  FVec logits(2 * 4), losses(2);
  const std::vector<int32_t> targets = {1, 4};
  expect_input_error(
      [&] { cross_entropy_forward<float>(losses.data(), logits.data(), targets.data(), 2, 4); },
      "cross_entropy_forward");
  expect_input_error(
      [&] { cross_entropy_backward<float>(logits.data(), logits.data(), targets.data(), 2, 4, 1); },
      "cross_entropy_backward");
}

}  // namespace
}  // namespace concord::model
