// The binary-weight optimizers (binary.h): packing, bits per weight from the allocations, ED with
// an unbounded residual equal to latent-weight SGD flip for flip, ED's residual range and its
// rounding, Bop against larq's formula written out here, thread-count invariance, the checkpoint
// round trip. `concord train` with each optimizer: tests/train/trainer_test.cpp.
#include "concord/train/binary.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "concord/numerics/check.h"

namespace concord::train {
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(PackedInts, RoundTripsEveryWidthAndTakesNoMoreWordsThanItsBits) {
  std::mt19937_64 rng(3);
  for (int bits = 1; bits <= 32; ++bits) {
    for (const int64_t n : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64}, int64_t{65}, int64_t{1000}}) {
      PackedInts p(n, bits);
      EXPECT_EQ(static_cast<int64_t>(p.words().size()), (n * bits + 63) / 64) << bits << " " << n;
      std::vector<uint32_t> want(static_cast<size_t>(n));
      const uint64_t mask = bits == 32 ? 0xffffffffULL : (1ULL << bits) - 1;
      for (auto& v : want) v = static_cast<uint32_t>(rng() & mask);
      for (int64_t i = 0; i < n; ++i) p.set(i, want[static_cast<size_t>(i)]);
      // Rewrite every other element: its neighbours (which may share its words) keep their bits.
      for (int64_t i = 0; i < n; i += 2) {
        want[static_cast<size_t>(i)] = static_cast<uint32_t>(rng() & mask);
        p.set(i, want[static_cast<size_t>(i)]);
      }
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(p.get(i), want[static_cast<size_t>(i)]) << bits << " " << i;
    }
  }
  EXPECT_THROW(PackedInts(4, 0), InputError);
  EXPECT_THROW(PackedInts(4, 33), InputError);
}

// One binary parameter (rows x cols) owned by the test.
struct Matrix {
  std::string name = "model.layers.0.mlp.up_proj.weight";
  int64_t rows, cols;
  std::vector<float> value, grad;
  Matrix(int64_t r, int64_t c) : rows(r), cols(c), value(static_cast<size_t>(r * c)), grad(static_cast<size_t>(r * c)) {}
  std::vector<ParamView> views() { return {ParamView{name, value, grad, true, rows}}; }
};

OptimizerConfig named(std::string name, AdamWConfig adamw = {}) {
  return {.name = std::move(name), .adamw = adamw, .binary = {}};
}

AdamWConfig no_clip() {
  AdamWConfig c;
  c.grad_clip = 0.0;
  c.weight_decay = 0.0;
  return c;
}

std::vector<float> sign_of(const std::vector<float>& w) {
  std::vector<float> s(w.size());
  for (size_t i = 0; i < w.size(); ++i) s[i] = w[i] < 0 ? -1.0f : 1.0f;
  return s;
}

TEST(BinaryOptimizer, FirstStepBinarizesWithTheMeanAbsoluteScale) {
  Matrix w(3, 5);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (float& v : w.value) v = normal(rng);
  const std::vector<float> init = w.value;
  for (const char* name : {"latent-adamw", "bop", "ed"}) {
    w.value = init;
    auto opt = make_optimizer(named(name));
    opt->initialize(w.views());
    auto& b = dynamic_cast<BinaryOptimizer&>(*opt);
    for (int64_t r = 0; r < 3; ++r) {
      double mean = 0;
      for (int64_t k = 0; k < 5; ++k) mean += std::fabs(init[static_cast<size_t>(r * 5 + k)]);
      mean /= 5;
      EXPECT_EQ(b.alpha(w.name)[static_cast<size_t>(r)], static_cast<float>(mean)) << name;
      for (int64_t k = 0; k < 5; ++k) {
        const size_t i = static_cast<size_t>(r * 5 + k);
        EXPECT_EQ(w.value[i], (init[i] < 0 ? -1.0f : 1.0f) * static_cast<float>(mean)) << name;
      }
    }
    EXPECT_TRUE(same_bits(b.signs(w.name), sign_of(init))) << name;
  }
}

// "Bits per weight as claimed": the state the optimizer allocated for its binary weights, divided
// by their count, is the sign bit plus each method's per-weight state (ed: plus its one per-tensor
// statistic, or with --ed-update factored one per row and one per column); the per-row scales and
// their moments (96 bits a row, every method) are apart.
TEST(BinaryOptimizer, BitsPerWeightAreTheClaimedOnesForEveryMethodAndWidth) {
  const int64_t rows = 64, cols = 96;  // rows * cols * bits is a whole number of words for every b
  Matrix w(rows, cols);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : w.value) v = normal(rng);
  for (float& g : w.grad) g = normal(rng);
  struct Case {
    std::string name;
    int bits;
    double want;
    std::string update = "rms";
  };
  const double n = static_cast<double>(rows * cols);
  std::vector<Case> cases = {{"latent-adamw", 4, 1 + 96}, {"bop", 4, 1 + 32}};
  for (int b = 2; b <= 8; ++b) cases.push_back({"ed", b, 1 + b + 32 / n});
  cases.push_back({"ed", 4, 1 + 4 + 32 * static_cast<double>(rows + cols) / n, "factored"});
  double latent_bits = 0, ed4_bits = 0;
  for (const Case& c : cases) {
    OptimizerConfig config = named(c.name);
    config.binary.bits = c.bits;
    config.binary.update = c.update;
    auto opt = make_optimizer(config);
    opt->step(w.views(), 1e-3);
    const OptimizerMemory m = opt->memory();
    EXPECT_EQ(m.binary_weights, rows * cols);
    EXPECT_DOUBLE_EQ(m.binary_bits_per_weight(), c.want) << c.name << " " << c.bits << " " << c.update;
    EXPECT_DOUBLE_EQ(m.scale_bits_per_weight(), 96.0 / cols) << c.name;
    EXPECT_EQ(m.other_weights, 0);
    if (c.name == "latent-adamw") latent_bits = m.binary_bits_per_weight();
    if (c.name == "ed" && c.bits == 4 && c.update == "rms") ed4_bits = m.binary_bits_per_weight();
  }
  // ED(4) against the latent baseline, as measured: the "at least 19x less state per weight".
  EXPECT_GE(latent_bits / ed4_bits, 19.0);
}

// With an unbounded fp32 residual (bits = 0) and plain SGD, ED is latent-weight SGD: on the same
// gradient stream the signs flip at the same steps. The stream is dyadic (gradients multiples of
// 2^-6, alpha and lr powers of two times small integers) so that every sum is exact in both and
// the comparison is bit for bit; alpha stays fixed because each row's gradient pairs cancel in
// dL/dalpha.
TEST(BinaryOptimizer, UnboundedEdWithSgdFlipsExactlyWhenLatentSgdDoes) {
  const int64_t rows = 4, cols = 8;
  Matrix w(rows, cols);
  const float magnitude[] = {1.0f, 0.5f, 0.25f, 0.75f};
  for (int64_t i = 0; i < rows * cols; ++i)
    w.value[static_cast<size_t>(i)] = ((i * 7) % 3 == 0 ? -1.0f : 1.0f) * magnitude[i % 4] * 0.125f;
  OptimizerConfig config = named("ed", no_clip());
  config.binary.bits = 0;
  config.binary.update = "sgd";
  auto opt = make_optimizer(config);
  auto& ed = dynamic_cast<BinaryOptimizer&>(*opt);
  opt->initialize(w.views());
  // The reference: latent x = w / max|w| of each row, x -= lr * g * alpha, sign(x).
  std::vector<double> latent(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < latent.size(); ++i) latent[i] = static_cast<double>(w.value[i] < 0 ? -1 : 1) * magnitude[i % 4];
  // (the first step binarized w; recompute x from the initial magnitudes, max 0.125 -> 1)
  const std::vector<float> alpha0(ed.alpha(w.name).begin(), ed.alpha(w.name).end());
  for (float a : alpha0) ASSERT_EQ(a, 0.125f * 2.5f / 4.0f);
  const double lr = 0.25;
  std::mt19937 rng(9);
  int64_t flips = 0;
  for (int step = 0; step < 400; ++step) {
    const std::vector<float> s = ed.signs(w.name);
    for (int64_t i = 0; i < rows * cols; i += 2) {
      const auto ii = static_cast<size_t>(i);
      // g multiple of 2^-6 in [-1, 1], biased per element so that some weights drift across zero.
      const int q = static_cast<int>(rng() % 129) - 64 + static_cast<int>((i % 5) - 2) * 3;
      w.grad[ii] = static_cast<float>(q) / 64.0f;
      w.grad[ii + 1] = -w.grad[ii] * s[ii] * s[ii + 1];  // dL/dalpha of the pair is 0
    }
    opt->step(w.views(), lr);
    for (size_t i = 0; i < latent.size(); ++i) latent[i] -= lr * static_cast<double>(w.grad[i]) * alpha0[i / cols];
    const std::vector<float> now = ed.signs(w.name);
    for (size_t i = 0; i < latent.size(); ++i) {
      ASSERT_EQ(now[i], latent[i] < 0 ? -1.0f : 1.0f) << "step " << step << " element " << i;
      flips += now[i] != s[i];
    }
    for (float a : ed.alpha(w.name)) ASSERT_EQ(a, alpha0[0]);
  }
  EXPECT_GT(flips, 20);  // the stream does flip weights
}

// ED's residual stays a b-bit integer and the grid index stays on the grid under any gradient
// (huge ones saturate at the ends, as a clipped latent does); the sign is the grid index's top bit.
TEST(BinaryOptimizer, EdResidualNeverLeavesItsRange) {
  for (int bits = 2; bits <= 8; ++bits) {
    for (const char* rounding : {"stochastic", "diffused"}) {
      Matrix w(8, 24);
      std::mt19937 rng(static_cast<unsigned>(bits));
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (float& v : w.value) v = normal(rng);
      OptimizerConfig config = named("ed");
      config.binary.bits = bits;
      config.binary.rounding = rounding;
      auto opt = make_optimizer(config);
      auto& ed = dynamic_cast<BinaryOptimizer&>(*opt);
      const uint32_t top = 1u << (bits + 1);
      bool saw_bottom = false, saw_top = false;
      for (int step = 0; step < 60; ++step) {
        const float scale = step % 10 == 9 ? 1e6f : 1.0f;  // now and then a huge gradient
        for (float& g : w.grad) g = normal(rng) * scale;
        opt->step(w.views(), 0.05);
        const std::vector<float> s = ed.signs(w.name);
        for (int64_t i = 0; i < 8 * 24; ++i) {
          const uint32_t z = ed.ed_grid_index(w.name, i);
          ASSERT_LT(z, top);
          ASSERT_EQ(s[static_cast<size_t>(i)], z >= (1u << bits) ? 1.0f : -1.0f);
          saw_bottom |= z == 0;
          saw_top |= z == top - 1;
        }
        // The checkpoint view of the residual holds integers below 2^bits.
        std::vector<TensorView> params = {{w.name, {8, 24}, w.value}};
        for (const TensorView& v : opt->state_views(params)) {
          if (!v.name.ends_with(".residual")) continue;
          for (float r : v.values) ASSERT_TRUE(r >= 0 && r < std::ldexp(1.0f, bits) && r == std::floor(r));
        }
      }
      EXPECT_TRUE(saw_bottom && saw_top) << bits << " " << rounding;  // the huge steps saturated
    }
  }
}

// Stochastic rounding moves the grid index by u / delta on average (unbiased); diffusion moves a
// row of equal updates by the rounded row total, the error carried element to element.
TEST(BinaryOptimizer, EdRoundingIsUnbiasedAndDiffusionCarriesTheError) {
  const int bits = 4;
  const double delta = 1.0 / 16;
  // u = -lr * g * alpha with sgd: alpha = mean|w| = 1 (w = +-1), g = -1, lr = 0.3 delta.
  for (const char* rounding : {"stochastic", "diffused"}) {
    Matrix w(2, 256);
    for (size_t i = 0; i < w.value.size(); ++i) w.value[i] = -1.0f;  // a binary row: x = -1/2, z = 8 of 0..31
    OptimizerConfig config = named("ed", no_clip());
    config.binary.bits = bits;
    config.binary.rounding = rounding;
    config.binary.update = "sgd";
    auto opt = make_optimizer(config);
    auto& ed = dynamic_cast<BinaryOptimizer&>(*opt);
    for (float& g : w.grad) g = -1.0f;
    // dL/dalpha = sum g * s = 256 per row: alpha grows; one step is measured.
    opt->initialize(w.views());
    for (int64_t i = 0; i < 512; ++i) ASSERT_EQ(ed.ed_grid_index(w.name, i), 8u);
    opt->step(w.views(), 0.3 * delta);
    int64_t moved = 0;
    for (int64_t i = 0; i < 512; ++i) moved += ed.ed_grid_index(w.name, i) - 8;
    if (std::string(rounding) == "diffused") {
      // Each row: 256 updates of 0.3 steps = 76.8 steps; diffusion realizes 76 or 77 of them.
      int64_t row0 = 0;
      for (int64_t i = 0; i < 256; ++i) row0 += ed.ed_grid_index(w.name, i) - 8;
      EXPECT_TRUE(row0 == 76 || row0 == 77) << row0;
      EXPECT_EQ(moved, 2 * row0);
    } else {
      // 512 Bernoulli(0.3) moves: mean 153.6, sd 10.4; six sigma either side.
      EXPECT_NEAR(static_cast<double>(moved), 153.6, 62.0);
    }
  }
}

// Bop against larq's Bop written out here: m <- m + gamma (g - m) with g = dL/ds = dL/dW * alpha;
// the weight flips when w * m > threshold.
TEST(BinaryOptimizer, BopMatchesLarqsFormula) {
  Matrix w(6, 32);
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : w.value) v = normal(rng);
  OptimizerConfig config = named("bop", no_clip());
  config.binary.bop_gamma = 0.05;
  config.binary.bop_threshold = 1e-3;
  auto opt = make_optimizer(config);
  auto& bop = dynamic_cast<BinaryOptimizer&>(*opt);
  opt->initialize(w.views());
  std::vector<float> ref_sign = sign_of(w.value), ref_m(w.value.size(), 0.0f);
  int64_t flips = 0;
  for (int step = 0; step < 200; ++step) {
    const std::vector<float> alpha(bop.alpha(w.name).begin(), bop.alpha(w.name).end());
    for (size_t i = 0; i < w.grad.size(); ++i) w.grad[i] = normal(rng) * 0.01f + (i % 3 == 0 ? 0.004f : -0.002f);
    opt->step(w.views(), 1e-3);
    for (size_t i = 0; i < w.grad.size(); ++i) {
      const double g = static_cast<double>(w.grad[i]) * alpha[i / 32];
      ref_m[i] = static_cast<float>(ref_m[i] + 0.05 * (g - ref_m[i]));
      if (static_cast<double>(ref_sign[i]) * ref_m[i] > 1e-3) {
        ref_sign[i] = -ref_sign[i];
        ++flips;
      }
    }
    ASSERT_TRUE(same_bits(bop.signs(w.name), ref_sign)) << "step " << step;
  }
  EXPECT_GT(flips, 10);
}

// Every method, every ED rounding: the same values whatever the thread count, and a restore from
// state_views continues bit for bit.
TEST(BinaryOptimizer, ThreadCountInvariantAndStateRoundTripsBitExactly) {
  struct Case {
    std::string name, rounding;
    int bits;
    std::string update = "rms";
  };
  for (const Case& c : {Case{"latent-adamw", "stochastic", 4}, Case{"bop", "stochastic", 4},
                        Case{"ed", "stochastic", 3}, Case{"ed", "diffused", 6}, Case{"ed", "stochastic", 0},
                        Case{"ed", "stochastic", 4, "factored"}}) {
    OptimizerConfig config = named(c.name);
    config.binary.bits = c.bits;
    config.binary.rounding = c.rounding;
    config.binary.update = c.update;
    config.binary.bop_threshold = 1e-5;
    // Two binary matrices (one with 33 columns: rows share packed words) and a plain vector.
    auto run = [&](int threads, int steps_before, std::vector<NamedTensor>* save, const std::vector<NamedTensor>* load) {
      omp_set_num_threads(threads);
      std::mt19937 rng(11);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<std::vector<float>> values = {std::vector<float>(70 * 33), std::vector<float>(128 * 64),
                                                std::vector<float>(50)};
      std::vector<std::vector<float>> grads = values;
      for (auto& v : values)
        for (float& x : v) x = normal(rng) * 0.05f;
      const std::vector<std::string> names = {"a.weight", "b.weight", "norm.weight"};
      auto views = [&] {
        return std::vector<ParamView>{{names[0], values[0], grads[0], true, 70},
                                      {names[1], values[1], grads[1], true, 128},
                                      {names[2], values[2], grads[2], false, 0}};
      };
      const std::vector<TensorView> tviews = {{names[0], {70, 33}, values[0]},
                                              {names[1], {128, 64}, values[1]},
                                              {names[2], {50}, values[2]}};
      auto opt = make_optimizer(config);
      opt->initialize(views());
      for (int step = 0; step < 12; ++step) {
        for (auto& g : grads)
          for (float& x : g) x = normal(rng) * 0.1f + 0.02f;
        if (step == steps_before && load != nullptr) {
          auto fresh = make_optimizer(config);
          fresh->restore_state(*load, tviews, steps_before);
          opt = std::move(fresh);
        }
        opt->step(views(), 3e-3);
        if (step + 1 == steps_before && save != nullptr)
          for (const TensorView& v : opt->state_views(tviews))
            save->push_back({v.name, v.shape, std::vector<float>(v.values.begin(), v.values.end())});
      }
      std::vector<float> all;
      for (auto& v : values) all.insert(all.end(), v.begin(), v.end());
      return all;
    };
    const std::vector<float> one = run(1, -1, nullptr, nullptr);
    const std::vector<float> two = run(2, -1, nullptr, nullptr);
    EXPECT_TRUE(same_bits(one, two)) << c.name << " " << c.rounding << " " << c.bits << " " << c.update;
    std::vector<NamedTensor> saved;
    run(2, 5, &saved, nullptr);
    EXPECT_FALSE(saved.empty());
    const std::vector<float> resumed = run(2, 5, nullptr, &saved);
    EXPECT_TRUE(same_bits(one, resumed)) << c.name << " " << c.rounding << " " << c.bits << " " << c.update;
  }
  omp_set_num_threads(2);
}

// --ed-update factored divides each element's gradient by the root of Adafactor's factored second
// moment, R[r] C[k] / mean(R): for a gradient of rank one in magnitude (|g[r,k]| = rho[r] kappa[k],
// any signs) that is |g[r,k]| itself, so every weight moves by lr, whatever its row's and column's
// scale — where "rms" (one statistic per tensor) moves them in proportion to |g|, here over a range
// of 10^6. Measured on the unbounded residual (bits = 0), which records the move exactly.
TEST(BinaryOptimizer, EdFactoredMovesEveryWeightAlikeUnderARankOneGradient) {
  const int64_t rows = 6, cols = 40;
  const double lr = 0.01;
  std::mt19937 rng(5);
  Matrix w(rows, cols);
  for (float& v : w.value) v = (rng() & 1) != 0 ? 1.0f : -1.0f;  // alpha = 1 exactly
  std::vector<float> direction(w.grad.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) {
      const double rho = std::pow(10.0, static_cast<double>(r) - 3.0);   // 1e-3 .. 1e2
      const double kappa = std::ldexp(1.0, static_cast<int>(k % 9) - 4);  // 1/16 .. 16
      const auto i = static_cast<size_t>(r * cols + k);
      direction[i] = (rng() & 1) != 0 ? 1.0f : -1.0f;
      w.grad[i] = static_cast<float>(rho * kappa) * direction[i];
    }
  const std::vector<TensorView> tviews = {{w.name, {rows, cols}, w.value}};
  auto residual = [&](const Optimizer& opt) {
    for (const TensorView& v : opt.state_views(tviews))
      if (v.name == w.name + ".residual") return std::vector<float>(v.values.begin(), v.values.end());
    ADD_FAILURE() << "no residual";
    return std::vector<float>{};
  };
  for (const char* update : {"factored", "rms"}) {
    OptimizerConfig config = named("ed", no_clip());
    config.binary.bits = 0;
    config.binary.update = update;
    const std::vector<float> init = w.value;
    auto opt = make_optimizer(config);
    opt->initialize(w.views());
    const std::vector<float> before = residual(*opt);
    opt->step(w.views(), lr);
    const std::vector<float> after = residual(*opt);
    double smallest = 1e300, largest = 0;
    for (size_t i = 0; i < before.size(); ++i) {
      const double moved = static_cast<double>(after[i]) - static_cast<double>(before[i]);
      if (std::string(update) == "factored") {
        EXPECT_NEAR(moved, -lr * direction[i], 1e-3 * lr) << i;
      }
      smallest = std::min(smallest, std::fabs(moved));
      largest = std::max(largest, std::fabs(moved));
    }
    if (std::string(update) == "rms") {
      EXPECT_GT(largest, 1e5 * smallest);
    }
    w.value = init;
  }
}

TEST(BinaryOptimizer, BadSettingsAndStateAreInputErrors) {
  OptimizerConfig config = named("ed");
  config.binary.bits = 1;
  EXPECT_THROW(make_optimizer(config), InputError);
  config.binary.bits = 9;
  EXPECT_THROW(make_optimizer(config), InputError);
  config.binary.bits = 4;
  config.binary.rounding = "nearest";
  EXPECT_THROW(make_optimizer(config), InputError);
  config.binary.rounding = "stochastic";
  config.binary.update = "adam";
  EXPECT_THROW(make_optimizer(config), InputError);
  EXPECT_THROW(make_optimizer(named("sgd")), InputError);
  BinaryConfig b;
  EXPECT_THROW(parse_binary_classes("embedding", b), InputError);
  // A residual that is not a 4-bit integer, a sign that is not +-1.
  auto opt = make_optimizer(named("ed"));
  const std::vector<TensorView> params = {{"w", {2, 2}, std::vector<float>(4)}};
  const std::vector<float> row = {1, 1};
  std::vector<NamedTensor> state = {{"w.sign", {2, 2}, {1, -1, 1, 1}},      {"w.residual", {2, 2}, {0, 3, 16, 1}},
                                    {"w.alpha", {2}, row},                   {"w.alpha_exp_avg", {2}, row},
                                    {"w.alpha_exp_avg_sq", {2}, row},        {"w.grad_sq", {1}, {1}}};
  EXPECT_THROW(opt->restore_state(state, params, 3), InputError);
  state[1].values[2] = 15;
  EXPECT_NO_THROW(opt->restore_state(state, params, 3));
  state[0].values[0] = 0.5f;
  EXPECT_THROW(opt->restore_state(state, params, 3), InputError);
}

}  // namespace
}  // namespace concord::train
