// Depth recurrence (ConcordRecurrentForCausalLM, docs/recurrence.md): one parameter set at any
// depth; the forward against the independent fp64 reference (tests/model/reference_fp64.cpp,
// which implements the recurrence from its definition); the truncated gradient against central
// differences of the truncated objective; the KV-cache forward at depth r equal to the full
// recompute bit for bit; the fixed-budget cache; adaptive exit; s0's distribution; the config
// and safetensors round trip.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concord/model/files.h"
#include "concord/model/kv_cache.h"
#include "concord/model/model.h"
#include "concord/numerics/check.h"
#include "model_to_reference.h"
#include "reference_fp64.h"
#include "test_inputs.h"

namespace concord::model {
namespace {

using concord_test::reference_config;
using concord_test::reference_weights;
using concord_test::same_bits;
using concord_test::tokens_of;

// P = 1, R = 2, Q = 1.
ModelConfig recurrent(int64_t mean = 3, const char* init = "random") {
  ModelConfig c;
  c.architecture = "ConcordRecurrentForCausalLM";
  c.vocab_size = 48;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 32;
  c.n_layers_in_prelude = 1;
  c.n_layers_in_recurrent_block = 2;
  c.n_layers_in_coda = 1;
  c.mean_recurrence = mean;
  c.max_recurrence = 4 * mean;
  c.state_init = init;
  c.state_init_std = 0.5;
  return c;
}

void randomize(Model& m, uint64_t seed) { concord_test::randomize_weights(m, seed); }

// s0 of B sequences of T tokens (positions 0..T-1), as the reference takes it.
std::vector<double> initial_state(const ModelConfig& c, uint64_t seed, int64_t B, int64_t T) {
  std::vector<double> s;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (float v : recurrent_initial_state(c, seed, t)) s.push_back(v);
  return s;
}

TEST(Recurrent, OneParameterSetRunsAtEveryDepth) {
  const ModelConfig c = recurrent();
  Model m(c);
  randomize(m, 3);
  int64_t count = 0;
  for (const ParamSpec& s : m.params()) count += s.numel();
  EXPECT_EQ(count, c.parameter_count());
  EXPECT_EQ(count, 48 * 32 + 4 * (32 * 32 * 2 + 32 * 16 * 2 + 2 * 32 + 2 * 8 + 3 * 32 * 40) + 2 * 32 * 32 + 32);
  const int64_t T = 5, V = c.vocab_size;
  const auto tokens = tokens_of(T, 1, V);
  std::vector<std::vector<float>> logits;
  for (int64_t r : {1, 2, 5, 12, 40}) {
    m.set_depth(r);
    EXPECT_EQ(m.params().size(), Model(c).params().size());
    std::vector<float> out(static_cast<size_t>(T * V));
    m.forward(tokens, 1, T, out);
    for (float v : out) ASSERT_TRUE(std::isfinite(v)) << "depth " << r;
    for (const auto& earlier : logits) EXPECT_FALSE(same_bits(earlier, out)) << "depth " << r;
    logits.push_back(out);
  }
  EXPECT_THROW(m.set_depth(0), InputError);
  Model dense(ModelConfig{});
  EXPECT_THROW(dense.set_depth(2), InputError);
}

TEST(Recurrent, ForwardAndLossMatchTheFp64Reference) {
  for (const char* init : {"random", "zero"}) {
    const ModelConfig c = recurrent(3, init);
    Model m(c);
    randomize(m, 5);
    m.set_state_seed(99);
    const int64_t B = 2, T = 6, V = c.vocab_size;
    const auto tokens = tokens_of(B * T, 2, V);
    std::vector<float> out(static_cast<size_t>(B * T * V));
    for (int64_t r : {1, 3, 7}) {
      m.set_depth(r);
      m.forward(tokens, B, T, out);
      reference::Config ref = reference_config(c);
      ref.depth = r;
      ref.initial_state = initial_state(c, 99, B, T);
      const auto want = reference::forward_logits(ref, reference_weights(m), tokens, B, T);
      double worst = 0, scale = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        worst = std::max(worst, std::abs(out[i] - want[i]));
        scale = std::max(scale, std::abs(want[i]));
      }
      EXPECT_LT(worst, 2e-5 * scale) << init << " depth " << r;
    }
  }
}

// Truncated backprop through the last k of r iterations is the exact gradient of the truncated
// objective: the state entering iteration r - k held constant at its value, e and every
// parameter free. Central differences of the fp64 reference running that objective check every
// kind of weight; the full gradient (k = 0) is checked against the full objective, and the two
// differ (the truncation is not a no-op).
TEST(Recurrent, TruncatedGradientEqualsFiniteDifferencesOfTheTruncatedObjective) {
  const ModelConfig c = recurrent(4);
  Model m(c);
  randomize(m, 11);
  m.set_state_seed(7);
  const int64_t B = 2, T = 5, r = 4, k = 2;
  const auto tokens = tokens_of(B * T, 4, c.vocab_size);
  const auto targets = reference::next_token_targets(tokens, B, T);
  const reference::Weights w = reference_weights(m);
  reference::Config start = reference_config(c);
  start.initial_state = initial_state(c, 7, B, T);
  start.depth = r - k;
  reference::Config truncated = reference_config(c);
  truncated.depth = k;
  truncated.initial_state = reference::recurrent_state(start, w, tokens, B, T);
  reference::Config full = reference_config(c);
  full.depth = r;
  full.initial_state = start.initial_state;

  m.set_depth(r);
  std::map<std::string, std::vector<float>> grads;
  for (int64_t kk : {k, int64_t{0}}) {
    m.set_backprop_iterations(kk);
    const float loss = m.forward_backward(tokens, targets, B, T);
    const double ref_loss = reference::loss(kk == 0 ? full : truncated, w, tokens, targets, B, T);
    EXPECT_NEAR(loss, ref_loss, 1e-5 * std::abs(ref_loss));
    for (const ParamSpec& s : m.params()) {
      const auto g = m.grad(s.name);
      grads[s.name + (kk == 0 ? "/full" : "/truncated")] = std::vector<float>(g.begin(), g.end());
    }
  }
  std::mt19937_64 rng(5);
  for (const ParamSpec& s : m.params()) {
    for (const bool is_full : {false, true}) {
      const reference::Config& ref = is_full ? full : truncated;
      const auto& g = grads[s.name + (is_full ? "/full" : "/truncated")];
      double scale = 0, worst = 0;
      std::vector<std::pair<double, double>> pairs;
      for (int i = 0; i < 6; ++i) {
        const auto index = static_cast<size_t>(std::uniform_int_distribution<int64_t>(0, s.numel() - 1)(rng));
        const double h = 1e-5;
        auto loss_at = [&](double delta) {
          reference::Weights p = w;
          p[s.name][index] += delta;
          return reference::loss(ref, p, tokens, targets, B, T);
        };
        const double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
        pairs.emplace_back(g[index], fd);
        scale = std::max(scale, std::abs(fd));
      }
      ASSERT_GT(scale, 0.0) << s.name;
      for (const auto& [gv, fd] : pairs) {
        EXPECT_LE(std::abs(gv - fd), 1e-3 * std::abs(fd) + 2e-4 * scale)
            << s.name << (is_full ? " full" : " truncated") << ": " << gv << " vs " << fd;
        worst = std::max(worst, std::abs(gv - fd) / scale);
      }
      std::printf("[ measured ] %-9s %-44s scale %.3g, worst |Δ|/scale %.3g\n", is_full ? "full" : "truncated",
                  s.name.c_str(), scale, worst);
    }
  }
  // The prelude's gradient comes only through e in the truncated case: it differs from the full.
  const std::string prelude_q = hf_param_name(ParamKind::q, 0);
  EXPECT_FALSE(same_bits(grads[prelude_q + "/full"], grads[prelude_q + "/truncated"]));
}

// Depth r through the KV cache equals the full recompute bit for bit: prefill of two sequences
// at once and token-by-token decode, under fp32, bf16 and mxfp8, at depths below, at and above
// the mean, the deepest one the cache holds included.
TEST(Recurrent, CachedForwardAtDepthREqualsTheFullRecomputeBitForBit) {
  for (const char* preset : {"fp32", "bf16", "mxfp8"}) {
    const ModelConfig c = recurrent(3);
    Model m(c, PrecisionPolicy::preset(preset));
    randomize(m, 13);
    m.set_state_seed(5);
    const int64_t T = 7, V = c.vocab_size;
    const auto a = tokens_of(T, 21, V), b = tokens_of(T, 22, V);
    for (int64_t r : {1, 3, 5, 12}) {
      m.set_depth(r);
      std::vector<float> full_a(static_cast<size_t>(T * V)), full_b(full_a.size());
      m.forward(a, 1, T, full_a);
      m.forward(b, 1, T, full_b);
      KvCache cache(c, 3);
      EXPECT_EQ(cache.num_layers(), 1 + 12 * 2 + 1);
      const int sa = cache.allocate(), sb = cache.allocate(), step = cache.allocate();
      const CachedInput both[2] = {{sa, a, LogitRows::all}, {sb, b, LogitRows::all}};
      std::vector<float> prefill(static_cast<size_t>(2 * T * V));
      m.forward_cached(cache, both, prefill);
      EXPECT_TRUE(same_bits(std::span(prefill).subspan(0, full_a.size()), full_a)) << preset << " r=" << r;
      EXPECT_TRUE(same_bits(std::span(prefill).subspan(full_a.size()), full_b)) << preset << " r=" << r;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<float> row(static_cast<size_t>(V));
        const CachedInput one{step, std::span(a).subspan(static_cast<size_t>(t), 1), LogitRows::last};
        m.forward_cached(cache, std::span(&one, 1), row);
        EXPECT_TRUE(same_bits(row, std::span<const float>(full_a).subspan(static_cast<size_t>(t * V), static_cast<size_t>(V))))
            << preset << " r=" << r << " position " << t;
      }
      EXPECT_EQ(m.last_iterations(), std::vector<int32_t>{static_cast<int32_t>(r)});
    }
  }
}

// Huginn's fixed-budget cache: iterations share core slots (i mod n). With depth <= n it is the
// per-iteration cache; deeper, a token attends to the latest state each slot holds — another
// model, close to the full one, run here to the end without error.
TEST(Recurrent, FixedBudgetCacheSharesCoreSlots) {
  const ModelConfig c = recurrent(3);
  Model m(c);
  randomize(m, 17);
  const int64_t T = 6, V = c.vocab_size;
  const auto tokens = tokens_of(T, 8, V);
  KvCache budget(c, 1, 0, 2);
  EXPECT_EQ(budget.num_layers(), 1 + 2 * 2 + 1);
  EXPECT_EQ(budget.core_slots(), 2);
  std::vector<float> full(static_cast<size_t>(T * V)), cached(full.size());
  m.set_depth(2);
  m.forward(tokens, 1, T, full);
  int slot = budget.allocate();
  const CachedInput all{slot, tokens, LogitRows::all};
  m.forward_cached(budget, std::span(&all, 1), cached);
  EXPECT_TRUE(same_bits(cached, full));
  m.set_depth(6);
  m.forward(tokens, 1, T, full);
  budget.release(slot);
  slot = budget.allocate();
  for (int64_t t = 0; t < T; ++t) {
    const CachedInput one{slot, std::span(tokens).subspan(static_cast<size_t>(t), 1), LogitRows::last};
    m.forward_cached(budget, std::span(&one, 1), std::span(cached).subspan(static_cast<size_t>(t * V), static_cast<size_t>(V)));
  }
  EXPECT_TRUE(same_bits(std::span(cached).subspan(0, static_cast<size_t>(V)), std::span(full).subspan(0, static_cast<size_t>(V))))
      << "the first token attends to itself only";
  double worst = 0;
  for (size_t i = 0; i < full.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(cached[i] - full[i])));
  EXPECT_GT(worst, 0.0) << "a shared slot is a different model";
  std::printf("[ measured ] fixed budget of 2 slots at depth 6: max |logit difference| %.3g\n", worst);
  KvCache wrong(c, 1);  // one slot per iteration up to max_recurrence
  const int s = wrong.allocate();
  const CachedInput one{s, std::span(tokens).subspan(0, 1), LogitRows::last};
  std::vector<float> row(static_cast<size_t>(V));
  EXPECT_NO_THROW(m.forward_cached(wrong, std::span(&one, 1), row));
  EXPECT_THROW(KvCache(ModelConfig{}, 1, 0, 2), InputError);
}

// Adaptive exit: a threshold of 0 never exits early (the fixed depth, bit for bit); an infinite
// one exits at the second iterate (the first that has a predecessor), which is the depth-2 model
// with the same cache rule, bit for bit; a threshold between uses fewer iterations on some tokens.
TEST(Recurrent, AdaptiveExitStopsWhenSuccessiveIteratesAgree) {
  const ModelConfig c = recurrent(3);
  Model m(c);
  randomize(m, 19);
  const int64_t T = 8, V = c.vocab_size;
  const auto tokens = tokens_of(T, 31, V);
  auto decode = [&](int64_t depth, std::optional<Model::AdaptiveExit> exit, std::vector<int32_t>* used) {
    m.set_depth(depth);
    m.set_adaptive_exit(exit);
    KvCache cache(c, 1);
    const int slot = cache.allocate();
    std::vector<float> out(static_cast<size_t>(T * V));
    for (int64_t t = 0; t < T; ++t) {
      const CachedInput one{slot, std::span(tokens).subspan(static_cast<size_t>(t), 1), LogitRows::last};
      m.forward_cached(cache, std::span(&one, 1), std::span(out).subspan(static_cast<size_t>(t * V), static_cast<size_t>(V)));
      if (used) used->push_back(m.last_iterations().at(0));
    }
    m.set_adaptive_exit(std::nullopt);
    return out;
  };
  std::vector<int32_t> used;
  EXPECT_TRUE(same_bits(decode(6, Model::AdaptiveExit{0.0, 0}, &used), decode(6, std::nullopt, nullptr)));
  EXPECT_EQ(used, std::vector<int32_t>(T, 6));
  used.clear();
  EXPECT_TRUE(same_bits(decode(6, Model::AdaptiveExit{INFINITY, 0}, &used), decode(2, std::nullopt, nullptr)));
  EXPECT_EQ(used, std::vector<int32_t>(T, 2));
  used.clear();
  decode(3, Model::AdaptiveExit{0.0, 9}, &used);  // max_iterations overrides the depth
  EXPECT_EQ(used, std::vector<int32_t>(T, 9));
  // A prefill of several tokens is refused in adaptive mode.
  m.set_adaptive_exit(Model::AdaptiveExit{});
  KvCache cache(c, 1);
  const int slot = cache.allocate();
  const CachedInput many{slot, tokens, LogitRows::last};
  std::vector<float> row(static_cast<size_t>(V));
  EXPECT_THROW(m.forward_cached(cache, std::span(&many, 1), row), InputError);
}

// The core slots of iterations a token did not run hold its last iterate's keys and values, so a
// later token iterating deeper attends to the earlier token's latest state (Huginn's rule).
TEST(Recurrent, SkippedIterationSlotsHoldTheLatestState) {
  const ModelConfig c = recurrent(3);
  Model m(c);
  randomize(m, 29);
  const int64_t T = 4, V = c.vocab_size, P = 1, R = 2;
  const auto tokens = tokens_of(T, 9, V);
  KvCache cache(c, 1);
  const int slot = cache.allocate();
  m.set_depth(2);
  std::vector<float> out(static_cast<size_t>(V));
  const CachedInput all{slot, tokens, LogitRows::last};
  m.forward_cached(cache, std::span(&all, 1), out);
  const auto W = static_cast<size_t>(cache.row_width() * T);
  for (int64_t j = 0; j < R; ++j) {
    const std::span<const float> last_k(cache.keys(slot, P + 1 * R + j), W), last_v(cache.values(slot, P + 1 * R + j), W);
    EXPECT_FALSE(same_bits(last_k, std::span<const float>(cache.keys(slot, P + j), W)));
    for (int64_t it = 2; it < cache.core_slots(); ++it) {
      EXPECT_TRUE(same_bits(std::span<const float>(cache.keys(slot, P + it * R + j), W), last_k)) << it << " " << j;
      EXPECT_TRUE(same_bits(std::span<const float>(cache.values(slot, P + it * R + j), W), last_v)) << it << " " << j;
    }
  }
  // A deeper next token runs (reading those rows) without error.
  m.set_depth(7);
  const CachedInput next{slot, std::span(tokens).subspan(0, 1), LogitRows::last};
  m.forward_cached(cache, std::span(&next, 1), out);
  for (float v : out) EXPECT_TRUE(std::isfinite(v));
}

// s0 ("random"): a normal truncated to ±3σ times state_init_std, the same for a position in every
// call, different across positions and seeds. Its sample mean and standard deviation over 40,000
// values lie within 5 standard errors of the truncated normal's (0 and 0.98658σ): a false failure
// has probability below 1e-6.
TEST(Recurrent, InitialStateIsASeededTruncatedNormal) {
  ModelConfig c = recurrent();
  c.hidden_size = 400;
  const double sigma = c.state_init_std;
  double sum = 0, sum2 = 0, most = 0;
  int64_t n = 0;
  for (int64_t p = 0; p < 100; ++p) {
    const auto s = recurrent_initial_state(c, 42, p);
    EXPECT_EQ(s, recurrent_initial_state(c, 42, p));
    EXPECT_NE(s, recurrent_initial_state(c, 43, p));
    for (float v : s) {
      sum += v;
      sum2 += static_cast<double>(v) * v;
      most = std::max(most, std::abs(static_cast<double>(v)));
      ++n;
    }
  }
  const double mean = sum / static_cast<double>(n), sd = std::sqrt(sum2 / static_cast<double>(n) - mean * mean);
  const double want_sd = 0.98658 * sigma;
  EXPECT_LE(most, 3 * sigma + 1e-6);
  EXPECT_LT(std::abs(mean), 5 * want_sd / std::sqrt(static_cast<double>(n)));
  // sd of the sample sd ≈ σ_t · sqrt((κ − 1) / (4n)), κ = 2.71 the kurtosis truncated at ±3.
  EXPECT_LT(std::abs(sd - want_sd), 5 * want_sd * std::sqrt(1.71 / (4.0 * static_cast<double>(n))));
  c.state_init = "zero";
  EXPECT_EQ(recurrent_initial_state(c, 42, 3), std::vector<float>(400, 0.0f));
}

TEST(Recurrent, ConfigJsonAndSafetensorsRoundTrip) {
  const ModelConfig c = recurrent(3);
  const nlohmann::json j = c.to_json();
  EXPECT_EQ(j.at("model_type"), "concord_recurrent");
  const ModelConfig back = ModelConfig::from_json(j, "t");
  EXPECT_EQ(back.to_json(), j);
  auto message = [&](nlohmann::json bad) {
    try {
      ModelConfig::from_json(bad, "cfg.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  nlohmann::json bad = j;
  bad["n_layers_in_coda"] = 2;
  EXPECT_NE(message(bad).find("must equal n_layers_in_prelude"), std::string::npos) << message(bad);
  bad = j;
  bad["injection_type"] = "add";
  EXPECT_NE(message(bad).find("injection_type 'add' is not supported"), std::string::npos) << message(bad);
  bad = j;
  bad["state_init"] = "like-init";
  EXPECT_NE(message(bad).find("state_init 'like-init'"), std::string::npos) << message(bad);
  bad = ModelConfig{}.to_json();
  bad["mean_recurrence"] = 4;
  EXPECT_NE(message(bad).find("a ConcordRecurrentForCausalLM field"), std::string::npos) << message(bad);
  bad = j;
  bad.erase("max_recurrence");
  bad.erase("state_init_std");
  const ModelConfig defaults = ModelConfig::from_json(bad, "t");
  EXPECT_EQ(defaults.max_recurrence, 12);
  EXPECT_DOUBLE_EQ(defaults.state_init_std, std::sqrt(2.0 / (5.0 * 32)));

  Model m(c);
  randomize(m, 23);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("concord_recurrent_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ExportOptions gguf;
  gguf.format = ExportFormat::gguf;
  EXPECT_THROW(export_model(m, dir / "m.gguf", gguf), InputError);
  export_model(m, dir / "hf", ExportOptions{});
  LoadedModel loaded = load_model(dir / "hf");
  EXPECT_TRUE(loaded.model.config().recurrent());
  const int64_t T = 5, V = c.vocab_size;
  const auto tokens = tokens_of(T, 3, V);
  std::vector<float> want(static_cast<size_t>(T * V)), got(want.size());
  m.set_depth(5);
  loaded.model.set_depth(5);
  m.forward(tokens, 1, T, want);
  loaded.model.forward(tokens, 1, T, got);
  EXPECT_TRUE(same_bits(got, want));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace concord::model
