// The gradient flow of a concord transformer (train/flow_model.h): the population gradient and
// its Hessian-vector products against finite differences of the loss (independent of the
// backward pass), gradient descent converging to the integrated flow at O(η), the bf16-rne stall
// against ulp/(2|ηg|), Adam's sign-like first step, and seeded SGD.
#include "concord/train/flow_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "concord/numerics/check.h"

namespace concord::train::flow {
namespace {

model::ModelConfig tiny() {
  model::ModelConfig c;
  c.vocab_size = 259;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = true;
  return c;
}

Batch population(int64_t sequences, int64_t T) {
  const ByteTokenizer tok;
  const std::string text =
      "In the beginning God created the heaven and the earth. And the earth was without form, and void; and "
      "darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters.";
  return validation_batches(tok.encode(text), sequences, T, 1).at(0);
}

double dot(std::span<const double> a, std::span<const double> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
double dist(std::span<const double> a, std::span<const double> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s);
}
Vec direction(int64_t n, uint64_t seed) {
  Vec v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = philox_normal(seed, 3, static_cast<uint64_t>(i));
  const double nv = std::sqrt(dot(v, v));
  for (double& x : v) x /= nv;
  return v;
}

struct Fixture {
  model::Model m{tiny()};
  Fixture() { m.init_random(5, 0.2f); }
};

TEST(FlowModel, GradientAndCurvatureAgainstDifferencesOfTheLoss) {
  Fixture f;
  ModelLoss L(f.m, population(4, 16));
  const Vec theta = L.values(), v = direction(L.size(), 1);
  Vec g(L.size());
  const double l0 = L.gradient(theta, g);
  EXPECT_NEAR(l0, L.loss(theta), 1e-5 * l0);
  // Directional derivative: central difference of the loss (forward passes only).
  const double eps = 1e-2;
  Vec plus = theta, minus = theta;
  for (int64_t i = 0; i < L.size(); ++i) {
    plus[i] += eps * v[i];
    minus[i] -= eps * v[i];
  }
  const double lp = L.loss(plus), lm = L.loss(minus);
  EXPECT_NEAR((lp - lm) / (2 * eps), dot(g, v), 2e-3 * std::abs(dot(g, v)) + 1e-5);
  // vᵀHv: from the gradient's central difference (hvp) and from the loss's second difference.
  Vec hv(L.size());
  const GradientFn grad = [&](std::span<const double> th, std::span<double> out) { L.gradient(th, out); };
  hvp_central(grad, theta, v, 1e-3, hv);
  const double h = 5e-2;
  Vec p2 = theta, m2 = theta;
  for (int64_t i = 0; i < L.size(); ++i) {
    p2[i] += h * v[i];
    m2[i] -= h * v[i];
  }
  const double second = (L.loss(p2) - 2 * L.loss(theta) + L.loss(m2)) / (h * h);
  EXPECT_NEAR(dot(v, hv), second, 0.03 * std::abs(second) + 1e-3);
}

TEST(FlowModel, GradientDescentConvergesToTheFlowAtOrderEta) {
  Fixture f;
  ModelLoss L(f.m, population(4, 16));
  const Vec theta0 = L.values();
  const double t = 2.0;
  OdeOptions opt;
  opt.rtol = 1e-7;
  opt.atol = 1e-9;
  OdeStats st;
  const std::vector<double> times = {t};
  const Vec flow_t = model_flow(L, theta0, times, opt, &st)[0];
  EXPECT_GT(st.accepted, 2);
  std::vector<double> etas, gaps;
  for (int64_t k : {8, 16, 32, 64}) {
    ModelRunOptions o;
    o.lr = t / static_cast<double>(k);
    const std::vector<int64_t> rec = {k};
    const ModelRun run = run_model(L, theta0, o, k, rec);
    etas.push_back(o.lr);
    gaps.push_back(dist(run.served[0], flow_t));
  }
  EXPECT_NEAR(log_log_slope(etas, gaps), 1.0, 0.1);
  EXPECT_LT(gaps.back(), 0.2 * dist(theta0, flow_t));  // the flow moved much further than the gap
  // The flow lowers the loss.
  EXPECT_LT(L.loss(flow_t), L.loss(theta0));
}

TEST(FlowModel, Bf16RneStallMatchesTheUlpToUpdateRatio) {
  Fixture f;
  ModelLoss L(f.m, population(4, 16));
  Vec theta0 = L.values();
  for (double& x : theta0)
    if (x != 0) x = std::ldexp(std::round(std::ldexp(x, 7 - std::ilogb(x))), std::ilogb(x) - 7);  // bf16 values
  Vec g(L.size());
  L.gradient(theta0, g);
  // Among the elements served in bf16 (matrices; norms are served in fp32 and move every step),
  // the first to move: predicted ⌈(spacing toward the motion / 2) / |ηg|⌉ from the gradient at
  // the start, which changes only through the fp32 norms until then. η is chosen so that the
  // earliest predicted stall is 20 steps.
  std::vector<bool> bf16(static_cast<size_t>(L.size()), false);
  Vec half_spacing_over_g(static_cast<size_t>(L.size()), INFINITY);
  double smallest = INFINITY;
  for (size_t p = 0; p < L.params().size(); ++p) {
    if (L.params()[p].served_in_f32()) continue;
    for (int64_t i = L.offsets()[p]; i < L.offsets()[p] + L.params()[p].numel(); ++i) {
      bf16[i] = true;
      if (g[i] == 0 || theta0[i] == 0) continue;
      double spacing = served_ulp(numerics::Format::bf16, theta0[i]);
      if ((theta0[i] > 0) == (g[i] > 0) && std::abs(theta0[i]) == std::ldexp(1.0, std::ilogb(std::abs(theta0[i]))))
        spacing /= 2;
      half_spacing_over_g[i] = spacing / 2 / std::abs(g[i]);
      smallest = std::min(smallest, half_spacing_over_g[i]);
    }
  }
  const double eta = smallest / 19.5;
  int64_t predicted = -1;
  for (double r : half_spacing_over_g)
    if (std::isfinite(r)) {
      const auto k = static_cast<int64_t>(std::ceil(r / eta));
      if (predicted < 0 || k < predicted) predicted = k;
    }
  ASSERT_GT(predicted, 3);
  ModelRunOptions o;
  o.lr = eta;
  o.served = numerics::Format::bf16;
  const std::vector<int64_t> rec = {0};
  const ModelRun run = run_model(L, theta0, o, 4 * predicted, rec);
  int64_t measured = -1;
  for (int64_t i = 0; i < L.size(); ++i)
    if (bf16[i] && run.first_move[i] >= 0 && (measured < 0 || run.first_move[i] < measured)) measured = run.first_move[i];
  ASSERT_GT(measured, 0);
  EXPECT_NEAR(static_cast<double>(measured) / static_cast<double>(predicted), 1.0, 0.25)
      << "measured " << measured << ", predicted " << predicted;
  // The fp32 served copy moves at once at an ordinary step (at this tiny η most fp32 master
  // updates are below half an fp32 ulp and are lost too).
  o.served = numerics::Format::f32;
  o.lr = 1e-3;
  const ModelRun f32 = run_model(L, theta0, o, 1, rec);
  int64_t moved = 0;
  for (int64_t i = 0; i < L.size(); ++i) moved += f32.first_move[i] == 1;
  EXPECT_GT(moved, L.size() / 2);
}

TEST(FlowModel, AdamFirstStepIsSignLikeAndSgdIsSeeded) {
  Fixture f;
  ModelLoss L(f.m, population(4, 16));
  const Vec theta0 = L.values();
  Vec g(L.size());
  L.gradient(theta0, g);
  ModelRunOptions o;
  o.optimizer = "adamw";
  o.lr = 1e-3;
  const std::vector<int64_t> rec = {1};
  const ModelRun adam = run_model(L, theta0, o, 1, rec);
  int64_t checked = 0;
  for (int64_t i = 0; i < L.size(); ++i) {
    if (std::abs(g[i]) < 1e-4) continue;
    // m̂ = g, v̂ = g²: the step is lr·g/(|g| + eps), every coordinate moving by ≈ lr.
    EXPECT_NEAR(theta0[i] - adam.served[0][i], o.lr * (g[i] > 0 ? 1 : -1), 2e-4 * o.lr + 1e-7 * std::abs(theta0[i]));
    ++checked;
  }
  EXPECT_GT(checked, L.size() / 4);
  ModelRunOptions s;
  s.optimizer = "sgd";
  s.lr = 0.1;
  s.batch = 2;
  const std::vector<int64_t> rec5 = {5};
  const Vec a = run_model(L, theta0, s, 5, rec5).served[0];
  const Vec b = run_model(L, theta0, s, 5, rec5).served[0];
  s.seed = 2;
  const Vec c = run_model(L, theta0, s, 5, rec5).served[0];
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  ModelRunOptions bad;
  bad.optimizer = "lion";
  EXPECT_THROW(run_model(L, theta0, bad, 1, rec), InputError);
  bad.optimizer = "gd";
  bad.lr = 0;
  EXPECT_THROW(run_model(L, theta0, bad, 1, rec), InputError);
}

TEST(FlowModel, SharpnessAgainstTheStepSize) {
  Fixture f;
  ModelLoss L(f.m, population(4, 16));
  const Vec theta0 = L.values();
  const PowerResult r = model_sharpness(L, theta0, 1, 200, 1e-6);
  ASSERT_GT(r.value, 0);
  // The Rayleigh quotient of the returned vector is the eigenvalue; a random direction's is below.
  const Vec v = direction(L.size(), 9);
  Vec hv(L.size());
  const GradientFn grad = [&](std::span<const double> th, std::span<double> out) { L.gradient(th, out); };
  hvp_central(grad, theta0, v, 1e-3, hv);
  EXPECT_LT(dot(v, hv), r.value);
  EXPECT_LT(r.residual, 0.1 * r.value);
}

TEST(FlowModel, LinearizedModelJvpAndVjpAreAdjoint) {
  // ⟨u, J v⟩ (central differences of the forward) = ⟨Jᵀu, v⟩ (the backward pass), for
  // u = (q_b − q_a)/rows, q_a and q_b two softmaxes: the dot-product test of two independent
  // computations.
  Fixture f;
  ModelLoss L(f.m, population(4, 16));
  const Vec theta0 = L.values();
  LinearizedLoss lin(L, theta0, 1e-2);
  const int64_t V = 259, rows = 4 * 16;
  std::vector<float> a(static_cast<size_t>(rows * V)), b(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(philox_normal(21, 0, i));
    b[i] = static_cast<float>(philox_normal(21, 1, i));
  }
  const Vec v = direction(L.size(), 4);
  const std::vector<double> jv = lin.jvp(v);
  const Vec jtu = lin.vjp(a, b);
  double lhs = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double ma = -INFINITY, mb = -INFINITY, sa = 0, sb = 0;
    for (int64_t k = 0; k < V; ++k) {
      ma = std::max(ma, static_cast<double>(a[r * V + k]));
      mb = std::max(mb, static_cast<double>(b[r * V + k]));
    }
    for (int64_t k = 0; k < V; ++k) {
      sa += std::exp(a[r * V + k] - ma);
      sb += std::exp(b[r * V + k] - mb);
    }
    for (int64_t k = 0; k < V; ++k) {
      const double qa = std::exp(a[r * V + k] - ma) / sa, qb = std::exp(b[r * V + k] - mb) / sb;
      lhs += (qb - qa) / rows * jv[r * V + k];
    }
  }
  // Tolerance: the forward's fp32 rounding over a step of 1e-2 (≈ 1e-5·|z| per logit).
  EXPECT_NEAR(lhs, dot(jtu, v), 3e-3 * std::abs(lhs) + 1e-8);
  // At θ0 the linear model is the model: its loss and gradient are the model's.
  Vec g(L.size()), g0(L.size());
  EXPECT_NEAR(lin.gradient(theta0, g), L.gradient(theta0, g0), 1e-6);
  for (int64_t i = 0; i < L.size(); i += 97) EXPECT_NEAR(g[i], g0[i], 1e-6 + 1e-4 * std::abs(g0[i]));
  // Away from θ0 it is first-order accurate: the loss gap shrinks as ‖δ‖² (a quarter per halving).
  std::vector<double> steps, gaps;
  for (double h : {0.4, 0.2, 0.1}) {
    Vec th = theta0;
    for (int64_t i = 0; i < L.size(); ++i) th[i] += h * v[i];
    steps.push_back(h);
    gaps.push_back(std::abs(lin.loss(th) - L.loss(th)));
  }
  EXPECT_NEAR(log_log_slope(steps, gaps), 2.0, 0.3);
}

TEST(FlowModel, LinearizedFlowAgreesWithTheFlowAtShortTimes) {
  Fixture f;
  ModelLoss L(f.m, population(4, 16));
  const Vec theta0 = L.values();
  LinearizedLoss lin(L, theta0, 1e-2);
  OdeOptions opt;
  opt.rtol = 1e-7;
  opt.atol = 1e-9;
  // Short: t·λ_max ≪ 1 (λ_max ≈ 10 here).
  const std::vector<double> times = {0.01, 0.02, 1.0};
  const auto a = model_flow(L, theta0, times, opt);
  const auto b = linearized_flow(lin, theta0, times, opt);
  // The two flows agree to second order in t (their Hessians differ: the linear model's is the
  // Gauss–Newton part), and part ways later.
  const double g1 = dist(a[0], b[0]), g2 = dist(a[1], b[1]);
  EXPECT_LT(g1, 0.05 * dist(a[0], theta0));
  EXPECT_NEAR(std::log2(g2 / g1), 2.0, 0.6);
  EXPECT_GT(dist(a[2], b[2]) / dist(a[2], theta0), g1 / dist(a[0], theta0));
}

}  // namespace
}  // namespace concord::train::flow
