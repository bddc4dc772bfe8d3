// AdamW against a plain double re-implementation, weight decay, the schedule, thread-count
// independence, and the state round trip a checkpoint relies on.
#include "concord/train/optimizer.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "concord/numerics/check.h"

namespace concord::train {
namespace {

// A parameter set owned by the test: values, gradients, names, decay flags.
struct Params {
  std::vector<std::string> names;
  std::vector<std::vector<float>> values, grads;
  std::vector<bool> decay;

  void add(std::string name, size_t n, bool decays, std::mt19937& gen) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    names.push_back(std::move(name));
    std::vector<float> v(n);
    for (float& x : v) x = normal(gen);
    values.push_back(std::move(v));
    grads.emplace_back(n, 0.0f);
    decay.push_back(decays);
  }
  void randomize_grads(std::mt19937& gen, float scale) {
    std::normal_distribution<float> normal(0.0f, scale);
    for (auto& g : grads) {
      for (float& x : g) x = normal(gen);
    }
  }
  std::vector<ParamView> views() {
    std::vector<ParamView> out;
    for (size_t i = 0; i < names.size(); ++i) out.push_back({names[i], values[i], grads[i], decay[i]});
    return out;
  }
};

// The reference: PyTorch's AdamW written out in double, sharing nothing with src/.
struct ReferenceAdamW {
  AdamWConfig c;
  std::vector<std::vector<double>> p, m, v;
  int t = 0;

  double step(const Params& params, double lr) {
    if (p.empty()) {
      for (const auto& vals : params.values) {
        p.emplace_back(vals.begin(), vals.end());
        m.emplace_back(vals.size(), 0.0);
        v.emplace_back(vals.size(), 0.0);
      }
    }
    double sq = 0.0;
    for (const auto& g : params.grads) {
      for (const float x : g) sq += static_cast<double>(x) * x;
    }
    const double norm = std::sqrt(sq);
    const double scale = (c.grad_clip > 0 && norm > c.grad_clip) ? c.grad_clip / norm : 1.0;
    ++t;
    const double bc1 = 1.0 - std::pow(c.beta1, t), bc2 = 1.0 - std::pow(c.beta2, t);
    for (size_t k = 0; k < p.size(); ++k) {
      for (size_t i = 0; i < p[k].size(); ++i) {
        const double g = params.grads[k][i] * scale;
        if (params.decay[k]) p[k][i] *= 1.0 - lr * c.weight_decay;
        m[k][i] = c.beta1 * m[k][i] + (1.0 - c.beta1) * g;
        v[k][i] = c.beta2 * v[k][i] + (1.0 - c.beta2) * g * g;
        const double denom = std::sqrt(v[k][i]) / std::sqrt(bc2) + c.eps;
        p[k][i] -= lr / bc1 * m[k][i] / denom;
      }
    }
    return norm;
  }
};

// Runs `steps` steps of AdamW and of the reference on the same gradients; returns the largest
// parameter difference (relative to max(1, |p|)) and whether any step clipped.
void compare_with_reference(AdamWConfig config, int steps, float grad_scale, bool expect_clip) {
  std::mt19937 gen(7);
  Params params;
  params.add("model.layers.0.mlp.up_proj.weight", 300, true, gen);
  params.add("model.layers.0.input_layernorm.weight", 16, false, gen);
  params.add("model.embed_tokens.weight", 70000, true, gen);  // above the parallel threshold
  AdamW adamw(config);
  ReferenceAdamW ref{config, {}, {}, {}, 0};
  bool clipped = false;
  for (int s = 0; s < steps; ++s) {
    params.randomize_grads(gen, grad_scale);
    const double lr = 1e-2 * (s + 1);
    const double ref_norm = ref.step(params, lr);
    const auto views = params.views();
    const double norm = adamw.step(views, lr);
    EXPECT_NEAR(norm, ref_norm, 1e-12 * ref_norm) << "step " << s;
    clipped |= config.grad_clip > 0 && norm > config.grad_clip;
  }
  EXPECT_EQ(clipped, expect_clip);
  EXPECT_EQ(adamw.steps_taken(), steps);
  double worst = 0.0;
  for (size_t k = 0; k < params.values.size(); ++k) {
    for (size_t i = 0; i < params.values[k].size(); ++i) {
      const double want = ref.p[k][i];
      worst = std::max(worst, std::fabs(params.values[k][i] - want) / std::max(1.0, std::fabs(want)));
    }
    const auto m = adamw.exp_avg(params.names[k]);
    const auto v = adamw.exp_avg_sq(params.names[k]);
    for (size_t i = 0; i < m.size(); i += 97) {
      // m sums terms of both signs: its fp32 error is relative to the terms (~1e-2), not to m.
      ASSERT_NEAR(m[i], ref.m[k][i], 1e-6 * std::fabs(ref.m[k][i]) + 1e-8);
      ASSERT_NEAR(v[i], ref.v[k][i], 1e-6 * std::fabs(ref.v[k][i]) + 1e-30);
    }
  }
  // fp32 storage of p, m, v each step: a few fp32 ulps over five steps. A wrong bias correction,
  // clip or decay moves parameters by ~lr = 1e-2.
  EXPECT_LT(worst, 2e-6);
}

TEST(AdamW, MatchesDoubleReferenceWithClipping) {
  AdamWConfig config;
  config.grad_clip = 1.0;  // gradient norms ~ 0.1 * sqrt(70316) ~ 26: every step clips
  compare_with_reference(config, 5, 0.1f, true);
}

TEST(AdamW, MatchesDoubleReferenceWithoutClipping) {
  AdamWConfig config;
  config.grad_clip = 0.0;
  compare_with_reference(config, 5, 0.1f, false);
  config.grad_clip = 1e6;  // enabled but never reached
  compare_with_reference(config, 5, 0.1f, false);
}

TEST(AdamW, ClippingChangesTheUpdate) {
  // Guards the reference comparison: with these gradients the clip must matter. Adam is nearly
  // invariant to one global gradient scale, so the two steps get gradients of different norms:
  // clipped, both count alike; unclipped, the second one (5x larger) dominates.
  std::mt19937 gen(3);
  Params a;
  a.add("w", 1000, true, gen);
  Params b = a;
  AdamW clip({.grad_clip = 1.0}), no_clip({.grad_clip = 0.0});
  for (const float scale : {1.0f, 5.0f}) {
    a.randomize_grads(gen, scale);
    b.grads = a.grads;
    const auto va = a.views(), vb = b.views();
    EXPECT_GT(clip.step(va, 1e-2), 1.0);
    no_clip.step(vb, 1e-2);
  }
  int differing = 0;
  for (size_t i = 0; i < 1000; ++i) differing += a.values[0][i] != b.values[0][i];
  EXPECT_GT(differing, 900);
}

TEST(AdamW, WeightDecaySkippedForNormWeights) {
  std::mt19937 gen(1);
  Params params;
  params.add("matrix", 64, true, gen);
  params.add("norm", 64, false, gen);
  const Params before = params;  // zero gradients: only the decay moves anything
  AdamW adamw({.weight_decay = 0.1});
  const double lr = 0.05;
  const auto views = params.views();
  EXPECT_EQ(adamw.step(views, lr), 0.0);
  for (size_t i = 0; i < 64; ++i) {
    EXPECT_EQ(params.values[1][i], before.values[1][i]);
    EXPECT_EQ(params.values[0][i],
              static_cast<float>(static_cast<double>(before.values[0][i]) * (1.0 - lr * 0.1)));
    EXPECT_NE(params.values[0][i], before.values[0][i]);
  }
}

TEST(AdamW, NonFiniteGradientSkipsTheStep) {
  std::mt19937 gen(2);
  Params params;
  params.add("w", 100, true, gen);
  params.randomize_grads(gen, 1.0f);
  AdamW adamw({});
  auto views = params.views();
  adamw.step(views, 1e-3);
  const Params before = params;
  const std::vector<float> m_before(adamw.exp_avg("w").begin(), adamw.exp_avg("w").end());
  params.grads[0][17] = std::numeric_limits<float>::quiet_NaN();
  views = params.views();
  EXPECT_TRUE(std::isnan(adamw.step(views, 1e-3)));
  EXPECT_EQ(adamw.steps_taken(), 1);
  EXPECT_EQ(params.values, before.values);
  EXPECT_EQ(std::vector<float>(adamw.exp_avg("w").begin(), adamw.exp_avg("w").end()), m_before);
}

TEST(AdamW, RejectsMismatchedSizes) {
  std::vector<float> value(10), grad(9);
  AdamW adamw({});
  const ParamView bad{"w", value, grad, true};
  EXPECT_THROW(adamw.step({&bad, 1}, 1e-3), InputError);
  std::vector<float> grad10(10), state(5);
  adamw.set_state("w", state, state);
  const ParamView good_size{"w", value, grad10, true};
  EXPECT_THROW(adamw.step({&good_size, 1}, 1e-3), InputError);
  EXPECT_THROW(AdamW({.beta1 = 1.0}), InputError);
}

TEST(LrSchedule, WarmupThenCosine) {
  const LrSchedule s{.peak_lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10, .total_steps = 110};
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4);  // peak / warmup
  EXPECT_DOUBLE_EQ(s.at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);                // warmup end: peak
  EXPECT_DOUBLE_EQ(s.at(60), 0.5 * (1e-3 + 1e-4));  // decay midpoint
  EXPECT_NEAR(s.at(35), 1e-4 + 0.9e-3 * 0.5 * (1 + std::cos(std::numbers::pi / 4)), 1e-18);
  EXPECT_DOUBLE_EQ(s.at(110), 1e-4);  // end: min
  EXPECT_DOUBLE_EQ(s.at(5000), 1e-4);
  for (int64_t t = 1; t < 10; ++t) EXPECT_GT(s.at(t), s.at(t - 1));
  for (int64_t t = 11; t <= 110; ++t) EXPECT_LT(s.at(t), s.at(t - 1));
}

TEST(LrSchedule, EdgeCasesAndErrors) {
  const LrSchedule no_warmup{.peak_lr = 2e-3, .min_lr = 0.0, .warmup_steps = 0, .total_steps = 100};
  EXPECT_DOUBLE_EQ(no_warmup.at(0), 2e-3);
  EXPECT_DOUBLE_EQ(no_warmup.at(100), 0.0);
  const LrSchedule warmup_only{.peak_lr = 1.0, .min_lr = 0.1, .warmup_steps = 4, .total_steps = 4};
  EXPECT_DOUBLE_EQ(warmup_only.at(3), 1.0);
  EXPECT_DOUBLE_EQ(warmup_only.at(4), 0.1);
  EXPECT_THROW((LrSchedule{1.0, 0.0, 10, 5}.at(0)), InputError);
  EXPECT_THROW((LrSchedule{-1.0, 0.0, 0, 5}.at(0)), InputError);
  EXPECT_THROW(no_warmup.at(-1), InputError);
}

TEST(GlobalGradNorm, MatchesSequentialDoubleSum) {
  std::mt19937 gen(5);
  Params params;
  params.add("a", 3 * kNormBlock + 17, true, gen);
  params.add("b", 5, false, gen);
  params.add("c", 0, true, gen);
  params.randomize_grads(gen, 0.3f);
  double sq = 0.0;
  for (const auto& g : params.grads) {
    for (const float x : g) sq += static_cast<double>(x) * x;
  }
  const auto views = params.views();
  EXPECT_NEAR(global_grad_norm(views), std::sqrt(sq), 1e-13 * std::sqrt(sq));
  EXPECT_EQ(global_grad_norm({}), 0.0);
}

TEST(AdamW, BitIdenticalAcrossThreadCounts) {
  const int saved = omp_get_max_threads();
  struct Result {
    std::vector<std::vector<float>> values;
    std::vector<float> m, v;
    double norm;
  };
  auto run = [](int threads) {
    omp_set_num_threads(threads);
    std::mt19937 gen(11);
    Params params;
    params.add("big", 200'000, true, gen);
    params.add("norm", 300, false, gen);
    params.add("mid", 5 * kNormBlock + 3, true, gen);
    AdamW adamw({});
    Result r{};
    for (int s = 0; s < 3; ++s) {
      params.randomize_grads(gen, 0.05f);
      const auto views = params.views();
      r.norm = adamw.step(views, 3e-3);
    }
    r.values = params.values;
    r.m.assign(adamw.exp_avg("big").begin(), adamw.exp_avg("big").end());
    r.v.assign(adamw.exp_avg_sq("big").begin(), adamw.exp_avg_sq("big").end());
    return r;
  };
  const Result one = run(1);
  for (const int threads : {2, 3, 4}) {
    const Result many = run(threads);
    EXPECT_EQ(std::memcmp(&one.norm, &many.norm, sizeof(double)), 0) << threads;
    ASSERT_EQ(one.values.size(), many.values.size());
    for (size_t k = 0; k < one.values.size(); ++k) {
      EXPECT_EQ(0, std::memcmp(one.values[k].data(), many.values[k].data(),
                               one.values[k].size() * sizeof(float)))
          << "param " << k << " threads " << threads;
    }
    EXPECT_EQ(0, std::memcmp(one.m.data(), many.m.data(), one.m.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(one.v.data(), many.v.data(), one.v.size() * sizeof(float)));
  }
  omp_set_num_threads(saved);
}

TEST(AdamW, StateRoundTripResumesBitExactly) {
  std::mt19937 gen(9);
  Params params;
  params.add("w", 5000, true, gen);
  params.add("n", 40, false, gen);
  std::vector<std::vector<std::vector<float>>> grads;
  for (int s = 0; s < 6; ++s) {
    params.randomize_grads(gen, 0.2f);
    grads.push_back(params.grads);
  }
  const Params start = params;

  // Straight through: six steps.
  AdamW straight({});
  for (int s = 0; s < 6; ++s) {
    params.grads = grads[s];
    const auto views = params.views();
    straight.step(views, 1e-3 * (s + 1));
  }
  const auto straight_values = params.values;

  // Three steps, state copied out through the accessors into a fresh optimizer, three more.
  params = start;
  AdamW first({});
  for (int s = 0; s < 3; ++s) {
    params.grads = grads[s];
    const auto views = params.views();
    first.step(views, 1e-3 * (s + 1));
  }
  AdamW resumed({});
  for (const std::string& name : first.state_names()) {
    const std::vector<float> m(first.exp_avg(name).begin(), first.exp_avg(name).end());
    const std::vector<float> v(first.exp_avg_sq(name).begin(), first.exp_avg_sq(name).end());
    resumed.set_state(name, m, v);
  }
  resumed.set_steps_taken(first.steps_taken());
  EXPECT_EQ(resumed.state_names(), (std::vector<std::string>{"n", "w"}));
  for (int s = 3; s < 6; ++s) {
    params.grads = grads[s];
    const auto views = params.views();
    resumed.step(views, 1e-3 * (s + 1));
  }
  for (size_t k = 0; k < params.values.size(); ++k) {
    EXPECT_EQ(0, std::memcmp(params.values[k].data(), straight_values[k].data(),
                             params.values[k].size() * sizeof(float)));
  }
  EXPECT_EQ(resumed.steps_taken(), 6);
  EXPECT_THROW(resumed.exp_avg("missing"), InputError);
}

}  // namespace
}  // namespace concord::train
