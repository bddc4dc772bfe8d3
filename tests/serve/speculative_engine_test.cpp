// Speculative decoding in the engine (Engine::set_drafter): greedy output is the non-speculative
// greedy output token for token, with the same log-probabilities, for every drafter and batched;
// sampled output follows the target's distribution (chi-square on the real engine); drafts that
// are rejected leave no trace in the KV cache; stop tokens and max_tokens cut a round.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "concord/model/kv_cache.h"
#include "concord/model/model.h"
#include "concord/numerics/check.h"
#include "concord/serve/drafter.h"
#include "concord/serve/engine.h"
#include "concord/serve/speculative.h"

namespace concord::serve {
namespace {

using model::Model;
using model::ModelConfig;
using model::PrecisionPolicy;

ModelConfig config(int64_t layers, int64_t width, int64_t vocab = 61) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = vocab;
  c.hidden_size = width;
  c.intermediate_size = 2 * width;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = width / 4;
  c.max_position_embeddings = 96;
  return c;
}

std::shared_ptr<Model> make(int64_t layers, int64_t width, uint64_t seed, const std::string& preset = "fp32",
                            float scale = 0.12f) {
  auto m = std::make_shared<Model>(config(layers, width), PrecisionPolicy::preset(preset));
  m->init_random(seed, scale);
  return m;
}

std::vector<Request> requests(int n, float temperature, int64_t max_tokens) {
  std::vector<Request> out;
  std::mt19937_64 rng(11);
  for (int i = 0; i < n; ++i) {
    Request r;
    for (int j = 0; j < 3 + i % 5; ++j) r.prompt.push_back(static_cast<int32_t>(rng() % 61));
    r.sampling.temperature = temperature;
    r.sampling.seed = static_cast<uint64_t>(100 + i);
    r.max_tokens = max_tokens;
    out.push_back(r);
  }
  return out;
}

std::vector<Completion> run(Model& target, std::vector<Request> rs, std::shared_ptr<Drafter> drafter,
                            SpeculationOptions options = {}, EngineStats* stats = nullptr) {
  Engine e(target, {.max_sequences = 4, .prefill_chunk = 16});
  if (drafter) e.set_drafter(std::move(drafter), options);
  std::vector<Completion> out = e.generate(std::move(rs));
  if (stats) *stats = e.stats();
  return out;
}

TEST(SpeculativeEngine, GreedyOutputIsTheGreedyOutputForEveryDrafter) {
  auto target = make(3, 48, 1);
  const std::vector<Completion> plain = run(*target, requests(6, 0.0f, 40), nullptr);
  struct Case {
    std::string name;
    std::shared_ptr<Drafter> drafter;
  };
  const std::vector<Case> cases = {
      {"ngram", std::make_shared<PromptLookupDrafter>()},
      {"other model", std::make_shared<ModelDrafter>(make(1, 32, 2), "small", 4, 96)},
      {"self bf16", std::make_shared<ModelDrafter>(self_draft_model(*target, PrecisionPolicy::preset("bf16")), "self:bf16", 4, 96)},
      {"self layers=1", std::make_shared<ModelDrafter>(self_draft_model(*target, target->policy(), 1), "self:layers=1", 4, 96)},
      {"self fp32", std::make_shared<ModelDrafter>(self_draft_model(*target, target->policy()), "self:fp32", 4, 96)},
  };
  for (const Case& c : cases) {
    for (bool adaptive : {false, true}) {
      EngineStats stats;
      const std::vector<Completion> spec =
          run(*target, requests(6, 0.0f, 40), c.drafter, {.draft_tokens = 5, .adaptive = adaptive}, &stats);
      ASSERT_EQ(spec.size(), plain.size());
      for (size_t i = 0; i < plain.size(); ++i) {
        EXPECT_EQ(spec[i].tokens, plain[i].tokens) << c.name << " request " << i;
        // The verification forward's rows are the decode steps' rows bit for bit (the GEMMs are
        // batch-invariant), so the log-probabilities are the same numbers.
        EXPECT_EQ(spec[i].logprobs, plain[i].logprobs) << c.name << " request " << i;
        EXPECT_EQ(spec[i].finish, plain[i].finish);
      }
      const SpeculationStats& s = stats.speculation;
      EXPECT_GT(s.rounds, 0) << c.name;
      EXPECT_EQ(s.emitted, s.accepted + s.rounds) << c.name;  // no stop tokens: one extra per round
      if (c.name == "self fp32") {
        EXPECT_EQ(s.accepted, s.drafted);  // the target drafting itself
      }
    }
  }
}

// A stop token inside an accepted run of drafts ends the sequence there, as without speculation.
TEST(SpeculativeEngine, StopTokensAndMaxTokensCutARound) {
  auto target = make(2, 32, 3);
  std::vector<Request> rs = requests(4, 0.0f, 30);
  const std::vector<Completion> probe = run(*target, rs, nullptr);
  for (size_t i = 0; i < rs.size(); ++i) rs[i].stop_tokens = {probe[i].tokens[7]};
  const std::vector<Completion> plain = run(*target, rs, nullptr);
  const auto self = std::make_shared<ModelDrafter>(self_draft_model(*target, target->policy()), "self", 4, 96);
  const std::vector<Completion> spec = run(*target, rs, self, {.draft_tokens = 6});
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(spec[i].tokens, plain[i].tokens);
    EXPECT_EQ(spec[i].finish, FinishReason::stop);
  }
  rs = requests(3, 0.0f, 9);
  const std::vector<Completion> a = run(*target, rs, nullptr), b = run(*target, rs, self, {.draft_tokens = 4});
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ(b[i].tokens, a[i].tokens);
    EXPECT_EQ(b[i].tokens.size(), 9u);
  }
}

// The engine's sampled tokens follow the target: the second generated token (the first a
// speculative round emits) and the pair (first, second), over 6000 seeds, at T = 1 and at
// T = 0.7 with top-p 0.9, with a drafter that disagrees with the target. Chi-square against
// the exact probabilities from the target's own logits; cells with expected count < 5 are
// pooled. Bound: the 1 − 1e-6 quantile (Wilson–Hilferty), so a false failure has probability
// below 1e-6 per test statistic.
double chi2_quantile(double dof, double z) {  // Wilson–Hilferty approximation
  const double a = 2.0 / (9.0 * dof);
  return dof * std::pow(1.0 - a + z * std::sqrt(a), 3);
}

TEST(SpeculativeEngine, SampledTokensFollowTheTargetDistribution) {
  auto target = make(2, 32, 5, "fp32", 0.25f);
  const auto drafter = std::make_shared<ModelDrafter>(make(1, 32, 6, "fp32", 0.25f), "small", 64, 96);
  const std::vector<int32_t> prompt = {3, 14, 15, 9};
  for (const SamplingParams& params : {SamplingParams{.temperature = 1.0f}, SamplingParams{.temperature = 0.7f, .top_p = 0.9f}}) {
    // Exact law of (t0, t1) from the target's logits.
    const int64_t V = target->config().vocab_size;
    auto next = [&](const std::vector<int32_t>& ctx) {
      std::vector<float> logits(static_cast<size_t>(static_cast<int64_t>(ctx.size()) * V));
      target->forward(ctx, 1, static_cast<int64_t>(ctx.size()), logits);
      return processed_distribution(std::span<const float>(logits).last(static_cast<size_t>(V)), params);
    };
    const std::vector<double> p0 = next(prompt);
    std::map<std::pair<int32_t, int32_t>, double> pair_law;
    for (int32_t a = 0; a < V; ++a) {
      if (p0[static_cast<size_t>(a)] == 0) continue;
      std::vector<int32_t> ctx = prompt;
      ctx.push_back(a);
      const std::vector<double> p1 = next(ctx);
      for (int32_t b = 0; b < V; ++b)
        if (p1[static_cast<size_t>(b)] > 0) pair_law[{a, b}] = p0[static_cast<size_t>(a)] * p1[static_cast<size_t>(b)];
    }
    const int kRuns = 6000;
    std::vector<Request> rs;
    for (int i = 0; i < kRuns; ++i) {
      Request r;
      r.prompt = prompt;
      r.sampling = params;
      r.sampling.seed = static_cast<uint64_t>(i);
      r.max_tokens = 3;  // γ = 1: the round after the prompt verifies one draft
      rs.push_back(r);
    }
    Engine e(*target, {.max_sequences = 64, .prefill_chunk = 16});
    e.set_drafter(drafter, {.draft_tokens = 2});
    const std::vector<Completion> out = e.generate(rs);
    const SpeculationStats& st = e.stats().speculation;
    EXPECT_GT(st.rounds, kRuns / 2);
    EXPECT_LT(st.accepted, st.drafted);  // some rejections
    // Acceptance theory: the accepted count is a sum of independent Bernoulli(α_r), α_r from the
    // logits; 5 standard deviations (at most sqrt(n)/2) bound a false failure below 1e-6.
    ASSERT_EQ(st.verified_at.size(), 1u);
    EXPECT_NEAR(static_cast<double>(st.accepted_at[0]), st.alpha_at[0], 5 * std::sqrt(static_cast<double>(st.verified_at[0])) / 2);
    // The contract link α >= 1 − tanh(osc/4), at every verified position of the untruncated run.
    if (params.top_p == 1.0f) {
      EXPECT_EQ(st.contract_checked, st.verified_at[0]);
      EXPECT_EQ(st.contract_violations, 0);
      EXPECT_GE(st.contract_min_slack, -1e-9);
    } else {
      EXPECT_EQ(st.contract_checked, 0);
    }
    std::map<std::pair<int32_t, int32_t>, int> counts;
    for (const Completion& c : out) ++counts[{c.tokens[0], c.tokens[1]}];
    // Pool cells with expected count < 5.
    double chi2 = 0, pooled_e = 0, pooled_o = 0;
    int cells = 0;
    for (const auto& [key, prob] : pair_law) {
      const double e_count = prob * kRuns;
      const double o = counts.contains(key) ? counts.at(key) : 0;
      if (e_count < 5) {
        pooled_e += e_count;
        pooled_o += o;
        continue;
      }
      chi2 += (o - e_count) * (o - e_count) / e_count;
      ++cells;
    }
    for (const auto& [key, n] : counts) EXPECT_TRUE(pair_law.contains(key)) << "a pair the target cannot emit";
    if (pooled_e > 0) {
      chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
      ++cells;
    }
    ASSERT_GT(cells, 5);
    EXPECT_LT(chi2, chi2_quantile(cells - 1, 4.753)) << "temperature " << params.temperature << ", " << cells << " cells";
  }
}

TEST(SpeculativeEngine, ADrafterOfAnotherVocabularyIsRefused) {
  const ModelConfig a = config(1, 32, 61), b = config(1, 32, 62);
  EXPECT_THROW(check_drafter_vocabulary(a, b, "target", "draft"), InputError);
  EXPECT_NO_THROW(check_drafter_vocabulary(a, a, "target", "draft"));
  auto target = make(1, 32, 1);
  Engine e(*target);
  EXPECT_THROW(e.set_drafter(std::make_shared<PromptLookupDrafter>(), {.draft_tokens = 0}), InputError);
  EXPECT_THROW(self_draft_model(*target, target->policy(), 2), InputError);  // 1 layer only
}

}  // namespace
}  // namespace concord::serve
