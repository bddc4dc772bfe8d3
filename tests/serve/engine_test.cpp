// The engine against the training forward: KV-cache decode vs recompute, chunked prefill, batch
// and thread invariance at every precision preset; the KV cache's errors and slot reuse; the
// engine's scheduling (stop tokens, max tokens, context, cancellation) and determinism; top-n
// and prompt log-probabilities against references; the streaming events.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "concord/model/kv_cache.h"
#include "concord/model/model.h"
#include "concord/numerics/check.h"
#include "concord/serve/engine.h"
#include "concord/serve/logprob.h"
#include "concord/serve/sampling.h"

namespace concord::serve {
namespace {

using model::CachedInput;
using model::KvCache;
using model::LogitRows;
using model::Model;
using model::ModelConfig;
using model::PrecisionPolicy;

ModelConfig test_config(bool qwen3 = true) {
  ModelConfig c;
  c.architecture = qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 48;
  return c;
}

Model make_model(const std::string& preset, bool qwen3 = true) {
  Model m(test_config(qwen3), PrecisionPolicy::preset(preset));
  m.init_random(7, 0.08f);  // large enough that logits spread over several nats
  return m;
}

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed, int32_t vocab = 97) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

bool bitwise_equal(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Logits (S, V) of Model::forward over one sequence (B = 1).
std::vector<float> full_forward(Model& m, const std::vector<int32_t>& tokens) {
  const int64_t V = m.config().vocab_size, S = static_cast<int64_t>(tokens.size());
  std::vector<float> logits(static_cast<size_t>(S * V));
  m.forward(tokens, 1, S, logits);
  return logits;
}

// Logits of every token of `tokens`, fed through the cache in chunks of `chunk`.
std::vector<float> chunked_logits(Model& m, const std::vector<int32_t>& tokens, int64_t chunk) {
  const int64_t V = m.config().vocab_size, S = static_cast<int64_t>(tokens.size());
  KvCache cache(m.config(), 1);
  const int slot = cache.allocate();
  std::vector<float> out(static_cast<size_t>(S * V));
  for (int64_t p = 0; p < S; p += chunk) {
    const int64_t n = std::min(chunk, S - p);
    const CachedInput in{slot, std::span<const int32_t>(tokens).subspan(p, n), LogitRows::all};
    m.forward_cached(cache, {&in, 1}, std::span<float>(out).subspan(p * V, n * V));
  }
  EXPECT_EQ(cache.length(slot), S);
  return out;
}

// Normalized mean squared difference Σ(a-b)² / Σ b².
double nmse(const float* a, const float* b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return num / den;
}

bool row_local(const std::string& preset) { return preset != "nvfp4" && preset != "fp8-tensor"; }

class PresetTest : public ::testing::TestWithParam<std::string> {};

// (3) prefill of the whole prompt = the training forward (B = 1), bitwise, every preset.
TEST_P(PresetTest, WholePromptPrefillEqualsTrainingForward) {
  for (bool qwen3 : {true, false}) {
    Model m = make_model(GetParam(), qwen3);
    const auto tokens = random_tokens(20, 11);
    const auto expected = full_forward(m, tokens);
    const auto got = chunked_logits(m, tokens, 20);
    EXPECT_TRUE(bitwise_equal(got.data(), expected.data(), got.size())) << "qwen3=" << qwen3;
  }
}

// (1) + chunked prefill: decoding token by token, or in any chunk size, gives Model::forward's
// logits — bitwise for row-local quantizers; for NVFP4 / per-tensor FP8 the activation scale
// covers different rows (a decode step's one row vs the whole sequence), so the logits differ by
// quantization noise: two independent draws of noise of the preset's size, whose expected
// distance (NMSE) is 2x the preset's own NMSE from fp32 — allowed up to 2.5x (measured 0.5-1.1x).
TEST_P(PresetTest, CachedDecodeAndChunkingMatchRecompute) {
  Model m = make_model(GetParam());
  const auto tokens = random_tokens(23, 12);
  const auto expected = full_forward(m, tokens);
  Model reference = make_model("fp32");
  const auto fp32 = full_forward(reference, tokens);
  const double quant_noise = nmse(expected.data(), fp32.data(), fp32.size());
  for (int64_t chunk : {1, 2, 3, 5, 8, 16}) {
    const auto got = chunked_logits(m, tokens, chunk);
    if (row_local(GetParam())) {
      EXPECT_TRUE(bitwise_equal(got.data(), expected.data(), got.size())) << "chunk " << chunk;
    } else {
      EXPECT_LT(nmse(got.data(), expected.data(), got.size()), 2.5 * quant_noise) << "chunk " << chunk;
    }
  }
}

// (2) a sequence's logits do not depend on the other sequences of the batch — bitwise, every
// preset (quantizers with a tensor-wide scale run per sequence).
TEST_P(PresetTest, BatchInvariance) {
  Model m = make_model(GetParam());
  const int64_t V = m.config().vocab_size;
  const auto a = random_tokens(13, 21), b = random_tokens(9, 22), c = random_tokens(17, 23);
  // a alone: prefill 10, then decode 3 tokens one at a time.
  auto run = [&](bool with_others) {
    KvCache cache(m.config(), 4);
    const int sb = with_others ? cache.allocate() : -1;  // a lands in a different slot
    const int sa = cache.allocate();
    const int sc = with_others ? cache.allocate() : -1;
    std::vector<float> out;
    std::vector<float> logits;
    for (int step = 0; step < 4; ++step) {
      std::vector<CachedInput> in;
      const int64_t a_from = step == 0 ? 0 : 9 + step, a_n = step == 0 ? 10 : 1;
      // With others: b prefills in chunks of 3 (all logits) before a, c decodes one token at a
      // time after a 12-token prefill, after a.
      if (with_others && step < 3) {
        in.push_back({sb, std::span<const int32_t>(b).subspan(3 * step, 3), LogitRows::all});
      }
      in.push_back({sa, std::span<const int32_t>(a).subspan(a_from, a_n), LogitRows::last});
      if (with_others) {
        in.push_back({sc, std::span<const int32_t>(c).subspan(step == 0 ? 0 : 11 + step, step == 0 ? 12 : 1),
                      LogitRows::last});
      }
      logits.assign(static_cast<size_t>(model::logit_rows(in) * V), 0.0f);
      m.forward_cached(cache, in, logits);
      const int64_t row = with_others && step < 3 ? 3 : 0;  // b's rows come first
      out.insert(out.end(), logits.begin() + row * V, logits.begin() + (row + 1) * V);
    }
    return out;
  };
  const auto alone = run(false);
  const auto batched = run(true);
  ASSERT_EQ(alone.size(), batched.size());
  EXPECT_TRUE(bitwise_equal(alone.data(), batched.data(), alone.size()));
}

// The engine's greedy tokens, logits and log-probs: the same alone, batched, and with 1 or 2
// threads; chunk size changes nothing for row-local presets.
TEST_P(PresetTest, EngineDeterministicAcrossBatchesAndThreads) {
  Model m = make_model(GetParam());
  std::vector<Request> requests;
  for (int i = 0; i < 3; ++i) {
    Request r;
    r.prompt = random_tokens(5 + 4 * i, 30 + i);
    r.max_tokens = 6;
    r.sampling.temperature = i == 0 ? 0.0f : 0.9f;
    r.sampling.top_k = i == 2 ? 20 : 0;
    r.sampling.seed = 100 + i;
    requests.push_back(r);
  }
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<Completion> alone;
  for (const Request& r : requests) {
    Engine e(m, {.max_sequences = 1, .prefill_chunk = 4});
    alone.push_back(e.generate({r})[0]);
  }
  omp_set_num_threads(2);
  Engine batched(m, {.max_sequences = 3, .prefill_chunk = 4});
  const auto together = batched.generate(requests);
  omp_set_num_threads(threads);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(alone[i].tokens, together[i].tokens) << i;
    EXPECT_EQ(alone[i].logprobs, together[i].logprobs) << i;
  }
  if (row_local(GetParam())) {
    Engine one_chunk(m, {.max_sequences = 2, .prefill_chunk = 64});
    const auto whole = one_chunk.generate(requests);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(alone[i].tokens, whole[i].tokens) << i;
      EXPECT_EQ(alone[i].logprobs, whole[i].logprobs) << i;
    }
  }
}

// The planned activation arena (the memory scheduler's plan of each step, run node by node
// through one reused arena) and Model::forward_cached's bump arena give the same completions bit
// for bit — tokens, log-probs, top entries, full distributions, prompt log-probs — on a workload
// that mixes prompt chunks with decode rows; a plan is made per step shape (decode steps share
// one until the context outgrows its scores), and the arena is the largest plan's.
TEST_P(PresetTest, PlannedActivationArenaEqualsTheBumpArena) {
  Model m = make_model(GetParam());
  std::vector<Request> requests;
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.prompt = random_tokens(3 + 5 * i, 60 + i);
    r.max_tokens = 8 + 2 * i;
    r.sampling.temperature = i == 0 ? 0.0f : 0.8f;
    r.sampling.seed = 200 + i;
    r.top_logprobs = i == 1 ? 3 : 0;
    r.full_logprobs = i == 2;
    r.prompt_logprobs = i == 3;
    requests.push_back(r);
  }
  Engine bump(m, {.max_sequences = 3, .prefill_chunk = 4, .activation_arena = ActivationArena::bump});
  Engine planned(m, {.max_sequences = 3, .prefill_chunk = 4, .activation_arena = ActivationArena::planned});
  const auto a = bump.generate(requests);
  const auto b = planned.generate(requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << i;
    EXPECT_EQ(a[i].logprobs, b[i].logprobs) << i;
    EXPECT_EQ(a[i].top_logprobs, b[i].top_logprobs) << i;
    EXPECT_EQ(a[i].full_logprobs, b[i].full_logprobs) << i;
    EXPECT_EQ(a[i].prompt_logprobs, b[i].prompt_logprobs) << i;
  }
  EXPECT_EQ(bump.stats().activation_plans, 0);
  EXPECT_GT(bump.stats().activation_arena_bytes, 0);
  EXPECT_GT(planned.stats().activation_plans, 0);
  EXPECT_LT(planned.stats().activation_plans, planned.stats().steps);  // decode steps share plans
  EXPECT_GT(planned.stats().activation_arena_bytes, 0);
}

// Prompt log-probs are those of the training forward's logits (row i - 1 scores prompt[i]) under
// logprob.h's definition with the request's temperature: bitwise where chunking is bitwise
// (row-local presets, any chunk; the others with the whole prompt in one chunk), independent of
// prefill_chunk there. Asking for them changes no generated token or log-prob at any preset.
TEST_P(PresetTest, PromptLogprobsMatchRecompute) {
  Model m = make_model(GetParam());
  const int64_t V = m.config().vocab_size;
  Request plain;
  plain.prompt = random_tokens(19, 70);
  plain.max_tokens = 5;
  plain.sampling.temperature = 0.7f;
  plain.sampling.seed = 9;
  Request scored = plain;
  scored.prompt_logprobs = true;
  scored.top_logprobs = 3;
  const auto logits = full_forward(m, plain.prompt);
  std::vector<double> expected;
  for (size_t i = 1; i < plain.prompt.size(); ++i)
    expected.push_back(token_logprob(std::span<const float>(logits).subspan((i - 1) * V, V),
                                     plain.prompt[i], 0.7f));
  const std::vector<int64_t> chunks = row_local(GetParam()) ? std::vector<int64_t>{1, 4, 7, 64}
                                                             : std::vector<int64_t>{64};
  for (int64_t chunk : chunks) {
    Engine e(m, {.max_sequences = 2, .prefill_chunk = chunk});
    const auto out = e.generate({plain, scored});
    EXPECT_TRUE(out[0].prompt_logprobs.empty());
    EXPECT_EQ(out[1].prompt_logprobs, expected) << "chunk " << chunk;
    EXPECT_EQ(out[1].tokens, out[0].tokens) << "chunk " << chunk;
    EXPECT_EQ(out[1].logprobs, out[0].logprobs) << "chunk " << chunk;
    ASSERT_EQ(out[1].prompt_top_logprobs.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      const auto& top = out[1].prompt_top_logprobs[i];
      ASSERT_EQ(top.size(), 3u);
      EXPECT_GE(top[0].logprob, expected[i]);
      for (const TopLogprob& t : top) {
        if (t.token == plain.prompt[i + 1]) {
          EXPECT_EQ(t.logprob, expected[i]);
        }
      }
    }
  }
  // For every preset, different chunkings give each their own plain = scored tokens.
  Engine small_chunks(m, {.max_sequences = 2, .prefill_chunk = 3});
  const auto out = small_chunks.generate({plain, scored});
  EXPECT_EQ(out[1].tokens, out[0].tokens);
  EXPECT_EQ(out[1].logprobs, out[0].logprobs);
  EXPECT_EQ(out[1].prompt_logprobs.size(), expected.size());
}

INSTANTIATE_TEST_SUITE_P(Presets, PresetTest,
                         ::testing::Values("fp32", "bf16", "mxfp8", "mxfp4", "nvfp4", "fp8-tensor"),
                         [](const auto& p) {
                           std::string name = p.param;
                           for (char& ch : name) {
                             if (ch == '-') ch = '_';
                           }
                           return name;
                         });

// Greedy generation equals argmax of recomputed logits, and the log-probs are those of the
// training forward's logits under logprob.h's definition.
TEST(Engine, GreedyMatchesRecompute) {
  Model m = make_model("fp32");
  Request r;
  r.prompt = random_tokens(7, 40);
  r.max_tokens = 8;
  r.sampling.temperature = 0.0f;
  r.full_logprobs = true;
  Engine e(m);
  const Completion c = e.generate({r})[0];
  ASSERT_EQ(c.tokens.size(), 8u);
  ASSERT_EQ(c.full_logprobs.size(), 8u);
  std::vector<int32_t> seq = r.prompt;
  const int64_t V = m.config().vocab_size;
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    const auto logits = full_forward(m, seq);
    const std::span<const float> last(logits.data() + (seq.size() - 1) * V, V);
    EXPECT_EQ(c.tokens[i], greedy_token(last));
    EXPECT_EQ(c.logprobs[i], token_logprob(last, c.tokens[i], 0.0f));
    EXPECT_EQ(c.full_logprobs[i][c.tokens[i]], static_cast<float>(c.logprobs[i]));
    seq.push_back(c.tokens[i]);
  }
  EXPECT_EQ(c.finish, FinishReason::length);
  EXPECT_EQ(e.stats().prefill_tokens, 7);
  EXPECT_EQ(e.stats().generated_tokens, 8);
  EXPECT_EQ(e.stats().decode_tokens, 7);
}

TEST(Engine, StopTokenAndContextLimit) {
  Model m = make_model("fp32");
  Request r;
  r.prompt = random_tokens(5, 41);
  r.max_tokens = 20;
  r.sampling.temperature = 0.0f;
  Engine probe(m);
  const Completion free_run = probe.generate({r})[0];
  ASSERT_EQ(free_run.tokens.size(), 20u);
  // Stop at the third generated token: kept as the last token.
  r.stop_tokens = {free_run.tokens[2]};
  Engine e(m);
  const Completion stopped = e.generate({r})[0];
  EXPECT_EQ(stopped.finish, FinishReason::stop);
  const auto first = std::find(free_run.tokens.begin(), free_run.tokens.end(), free_run.tokens[2]);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(free_run.tokens.begin(), first + 1));
  // A context of 10 tokens: 5 prompt + 5 generated (the last one is never fed back).
  r.stop_tokens.clear();
  Engine small(m, {.max_sequences = 1, .prefill_chunk = 8, .max_context = 10});
  const Completion cut = small.generate({r})[0];
  EXPECT_EQ(cut.finish, FinishReason::context);
  EXPECT_EQ(cut.tokens, std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + 6));
  r.max_tokens = 0;
  EXPECT_TRUE(small.generate({r})[0].tokens.empty());
}

TEST(Engine, QueuesMoreRequestsThanSlots) {
  Model m = make_model("bf16");
  std::vector<Request> requests;
  for (int i = 0; i < 5; ++i) {
    Request r;
    r.prompt = random_tokens(3 + i, 50 + i);
    r.max_tokens = 3 + i;
    r.sampling.seed = static_cast<uint64_t>(i);
    requests.push_back(r);
  }
  Engine two(m, {.max_sequences = 2, .prefill_chunk = 2});
  const auto queued = two.generate(requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    Engine alone(m, {.max_sequences = 1});
    const Completion c = alone.generate({requests[i]})[0];
    EXPECT_EQ(queued[i].tokens, c.tokens) << i;
    EXPECT_EQ(queued[i].tokens.size(), static_cast<size_t>(3 + i));
  }
  EXPECT_EQ(two.cache().sequences_in_use(), 0);
}

TEST(Engine, RejectsBadRequests) {
  Model m = make_model("fp32");
  Engine e(m, {.max_sequences = 1, .prefill_chunk = 4, .max_context = 16});
  Request r;
  EXPECT_THROW(e.submit(r), InputError);  // empty prompt
  r.prompt = {1, 2, 97};
  EXPECT_THROW(e.submit(r), InputError);  // outside the vocabulary
  r.prompt = random_tokens(17, 1);
  EXPECT_THROW(e.submit(r), InputError);  // longer than the context
  r.prompt = {1};
  r.top_logprobs = kMaxTopLogprobs + 1;
  EXPECT_THROW(e.submit(r), InputError);
  r.top_logprobs = -1;
  EXPECT_THROW(e.submit(r), InputError);
  r.top_logprobs = kMaxTopLogprobs;
  EXPECT_NO_THROW(e.submit(r));
  r.sampling.top_p = 0.0f;
  EXPECT_THROW(e.submit(r), InputError);
  EXPECT_THROW(e.take(123), InputError);
  EXPECT_THROW(Engine(m, {.max_sequences = 0}), InputError);
  EXPECT_THROW(Engine(m, {.max_sequences = 1, .prefill_chunk = 0}), InputError);
  EXPECT_THROW(Engine(m, {.max_sequences = 1, .prefill_chunk = 4, .max_context = 49}), InputError);
}

// The top-n reference: log_softmax(logits / T) in long double, sorted (logp desc, id asc).
std::vector<std::pair<long double, int32_t>> reference_top(std::span<const float> logits, float T,
                                                           size_t n) {
  const long double t = T == 0.0f ? 1.0L : static_cast<long double>(T);
  long double m = -INFINITY;
  for (float x : logits) m = std::max(m, static_cast<long double>(x) / t);
  long double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<long double>(x) / t - m);
  std::vector<std::pair<long double, int32_t>> all;
  for (size_t i = 0; i < logits.size(); ++i)
    all.push_back({static_cast<long double>(logits[i]) / t - m - std::log(sum), static_cast<int32_t>(i)});
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  all.resize(std::min(n, all.size()));
  return all;
}

// Each generated token's top-n list is the long-double reference's on the recomputed logits (the
// same tokens in the same order, values within 1e-12), its values are token_logprob's exactly,
// and the sampled token's log-prob is its entry whenever it is listed.
TEST(Engine, TopLogprobsMatchReference) {
  Model m = make_model("fp32");
  const int64_t V = m.config().vocab_size;
  for (const auto& [temperature, n] : {std::pair{0.0f, 5}, std::pair{0.8f, 20}, std::pair{1.3f, 1}}) {
    Request r;
    r.prompt = random_tokens(6, 80);
    r.max_tokens = 7;
    r.sampling.temperature = temperature;
    r.sampling.seed = 4;
    r.top_logprobs = n;
    Engine e(m);
    const Completion c = e.generate({r})[0];
    ASSERT_EQ(c.top_logprobs.size(), c.tokens.size());
    std::vector<int32_t> seq = r.prompt;
    int listed = 0;
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const auto logits = full_forward(m, seq);
      const std::span<const float> last(logits.data() + (seq.size() - 1) * V, V);
      const auto expected = reference_top(last, temperature, static_cast<size_t>(n));
      const auto& got = c.top_logprobs[i];
      ASSERT_EQ(got.size(), expected.size());
      for (size_t k = 0; k < got.size(); ++k) {
        EXPECT_EQ(got[k].token, expected[k].second) << "token " << i << " entry " << k;
        EXPECT_NEAR(got[k].logprob, static_cast<double>(expected[k].first), 1e-12);
        EXPECT_EQ(got[k].logprob, token_logprob(last, got[k].token, temperature));
        if (got[k].token == c.tokens[i]) {
          EXPECT_EQ(got[k].logprob, c.logprobs[i]);
          ++listed;
        }
      }
      if (temperature == 0.0f) {
        EXPECT_EQ(got[0].token, c.tokens[i]);  // greedy: the argmax
      }
      seq.push_back(c.tokens[i]);
    }
    EXPECT_GT(listed, 0) << "T " << temperature;
  }
}

// Ties go to the lower token id; -Inf logits rank last; n is capped at the vocabulary.
TEST(Engine, TopLogprobsTiesAndCap) {
  const std::vector<float> logits{1.0f, 3.0f, 3.0f, -INFINITY, 2.0f, 3.0f};
  const SoftmaxStats stats = softmax_stats(logits, 1.0f);
  std::vector<TopLogprob> top;
  top_logprobs(logits, stats, 4, top);
  ASSERT_EQ(top.size(), 4u);
  const std::vector<int32_t> order{1, 2, 5, 4};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(top[k].token, order[k]);
    EXPECT_EQ(top[k].logprob, token_logprob(logits, order[k], 1.0f));
  }
  top_logprobs(logits, stats, 20, top);
  ASSERT_EQ(top.size(), logits.size());
  EXPECT_EQ(top.back().token, 3);
  EXPECT_EQ(top.back().logprob, -INFINITY);
  top_logprobs(logits, stats, 0, top);
  EXPECT_TRUE(top.empty());
  // Through the engine, on a model with fewer tokens than asked for.
  ModelConfig small = test_config();
  small.vocab_size = 11;
  Model m(small);
  m.init_random(3, 0.08f);
  Request r;
  r.prompt = random_tokens(4, 81, 11);
  r.max_tokens = 3;
  r.top_logprobs = kMaxTopLogprobs;
  r.prompt_logprobs = true;
  Engine e(m);
  const Completion c = e.generate({r})[0];
  ASSERT_EQ(c.top_logprobs.size(), 3u);
  for (const auto& list : c.top_logprobs) EXPECT_EQ(list.size(), 11u);
  ASSERT_EQ(c.prompt_top_logprobs.size(), 3u);
  for (const auto& list : c.prompt_top_logprobs) EXPECT_EQ(list.size(), 11u);
}

// Scoring a prompt without generating (max_tokens = 0): the prompt runs, no token is drawn, no
// event is sent; a one-token prompt has nothing to score and finishes at submit.
TEST(Engine, PromptLogprobsWithoutGeneration) {
  Model m = make_model("fp32");
  Request r;
  r.prompt = random_tokens(9, 82);
  r.max_tokens = 0;
  r.prompt_logprobs = true;
  Engine e(m, {.max_sequences = 1, .prefill_chunk = 4});
  int events = 0;
  e.set_token_callback([&](const TokenEvent&) { ++events; });
  const int64_t id = e.submit(r);
  EXPECT_FALSE(e.finished(id));
  e.run();
  const Completion c = e.take(id);
  EXPECT_TRUE(c.tokens.empty());
  EXPECT_EQ(c.finish, FinishReason::length);
  Request with_tokens = r;
  with_tokens.max_tokens = 2;
  EXPECT_EQ(c.prompt_logprobs, e.generate({with_tokens})[0].prompt_logprobs);
  EXPECT_EQ(c.prompt_logprobs.size(), 8u);
  r.prompt = {5};
  const int64_t one = e.submit(r);
  EXPECT_TRUE(e.finished(one));
  EXPECT_TRUE(e.take(one).prompt_logprobs.empty());
  r.prompt_logprobs = false;
  r.prompt = random_tokens(3, 83);
  EXPECT_TRUE(e.finished(e.submit(r)));  // nothing to compute
  EXPECT_EQ(events, 2);                  // only with_tokens' two tokens
  EXPECT_EQ(e.cache().sequences_in_use(), 0);
}

// Events: one per sampled token, in each sequence's order, carrying the completion's token,
// log-prob and top entries; `finished` on the last event only, with the completion's reason,
// when the completion is already available.
TEST(Engine, TokenEventsInOrderFinishedOnce) {
  Model m = make_model("fp32");
  std::vector<Request> requests;
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.prompt = random_tokens(3 + 2 * i, 90 + i);
    r.max_tokens = 4 + i;
    r.sampling.seed = static_cast<uint64_t>(i);
    r.top_logprobs = i % 2 == 0 ? 2 : 0;
    requests.push_back(r);
  }
  {  // request 3 stops at its second token
    Engine probe(m);
    requests[3].stop_tokens = {probe.generate({requests[3]})[0].tokens[1]};
  }
  struct Seen {
    std::vector<int32_t> tokens;
    std::vector<double> logprobs;
    std::vector<std::vector<TopLogprob>> top;
    int finished = 0;
    bool after_finish = false;
    FinishReason finish = FinishReason::length;
  };
  std::map<int64_t, Seen> seen;
  Engine e(m, {.max_sequences = 2, .prefill_chunk = 3});
  e.set_token_callback([&](const TokenEvent& ev) {
    Seen& s = seen[ev.id];
    if (s.finished) s.after_finish = true;
    s.tokens.push_back(ev.token);
    s.logprobs.push_back(ev.logprob);
    s.top.emplace_back(ev.top.begin(), ev.top.end());
    if (ev.finished) {
      ++s.finished;
      s.finish = ev.finish;
      EXPECT_TRUE(e.finished(ev.id));
      EXPECT_FALSE(e.cancel(ev.id));
    } else {
      EXPECT_FALSE(e.finished(ev.id));
    }
  });
  std::vector<int64_t> ids;
  for (const Request& r : requests) ids.push_back(e.submit(r));
  e.run();
  for (size_t i = 0; i < ids.size(); ++i) {
    const Completion c = e.take(ids[i]);
    const Seen& s = seen[ids[i]];
    EXPECT_EQ(s.tokens, c.tokens) << i;
    EXPECT_EQ(s.logprobs, c.logprobs) << i;
    EXPECT_EQ(s.finished, 1) << i;
    EXPECT_FALSE(s.after_finish) << i;
    EXPECT_EQ(s.finish, c.finish) << i;
    if (requests[i].top_logprobs > 0) {
      EXPECT_EQ(s.top, c.top_logprobs) << i;
    } else {
      for (const auto& t : s.top) EXPECT_TRUE(t.empty()) << i;
    }
  }
  EXPECT_EQ(seen[ids[3]].finish, FinishReason::stop);
  EXPECT_EQ(seen[ids[3]].tokens.size(), 2u);
}

// Cancelling a running request frees its slot at once (the waiting one runs from the next step),
// its completion holds the tokens so far; a waiting request leaves the queue; unknown, finished
// and taken ids are refused. The others' results are those of running alone.
TEST(Engine, CancelRunningAndWaiting) {
  Model m = make_model("fp32");
  std::vector<Request> requests;
  for (int i = 0; i < 3; ++i) {
    Request r;
    r.prompt = random_tokens(4 + i, 100 + i);
    r.max_tokens = 6;
    r.sampling.seed = static_cast<uint64_t>(10 + i);
    requests.push_back(r);
  }
  std::vector<Completion> alone;
  for (const Request& r : requests) {
    Engine one(m, {.max_sequences = 1});
    alone.push_back(one.generate({r})[0]);
  }
  Engine e(m, {.max_sequences = 1});
  std::vector<int64_t> ids;
  for (const Request& r : requests) ids.push_back(e.submit(r));
  EXPECT_EQ(e.waiting(), 3);
  EXPECT_EQ(e.running(), 0);
  EXPECT_TRUE(e.cancel(ids[1]));  // still queued
  EXPECT_EQ(e.waiting(), 2);
  ASSERT_TRUE(e.finished(ids[1]));
  const Completion queued = e.take(ids[1]);
  EXPECT_TRUE(queued.tokens.empty());
  EXPECT_EQ(queued.finish, FinishReason::cancelled);
  EXPECT_FALSE(e.cancel(ids[1]));  // taken
  ASSERT_TRUE(e.step());           // request 0: prefill and its first token
  ASSERT_TRUE(e.step());           // ... its second
  EXPECT_EQ(e.running(), 1);
  EXPECT_EQ(e.waiting(), 1);
  EXPECT_TRUE(e.cancel(ids[0]));
  EXPECT_EQ(e.running(), 0);
  EXPECT_EQ(e.cache().sequences_in_use(), 0);
  const Completion cut = e.take(ids[0]);
  EXPECT_EQ(cut.finish, FinishReason::cancelled);
  EXPECT_EQ(cut.tokens, std::vector<int32_t>(alone[0].tokens.begin(), alone[0].tokens.begin() + 2));
  EXPECT_EQ(cut.logprobs, std::vector<double>(alone[0].logprobs.begin(), alone[0].logprobs.begin() + 2));
  ASSERT_TRUE(e.step());  // request 2 is admitted into the freed slot
  EXPECT_EQ(e.running(), 1);
  EXPECT_EQ(e.waiting(), 0);
  e.run();
  EXPECT_FALSE(e.cancel(ids[2]));  // finished, not taken
  const Completion last = e.take(ids[2]);
  EXPECT_EQ(last.tokens, alone[2].tokens);
  EXPECT_EQ(last.logprobs, alone[2].logprobs);
  EXPECT_FALSE(e.cancel(12345));
  EXPECT_FALSE(e.step());
}

// Cancellation from the token callback, of the event's own request (its completion ends with the
// event's token, as a stop string needs) and of another request later in the same step (it gets
// no token in that step); the requests that are not cancelled produce what they produce alone.
TEST(Engine, CancelFromCallbackKeepsOthersInvariant) {
  Model m = make_model("bf16");
  std::vector<Request> requests;
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.prompt = random_tokens(5 + 3 * i, 110 + i);
    r.max_tokens = 8;
    r.sampling.temperature = 0.9f;
    r.sampling.seed = static_cast<uint64_t>(20 + i);
    r.top_logprobs = 2;
    requests.push_back(r);
  }
  std::vector<Completion> alone;
  for (const Request& r : requests) {
    Engine one(m, {.max_sequences = 1, .prefill_chunk = 4});
    alone.push_back(one.generate({r})[0]);
  }
  Engine e(m, {.max_sequences = 4, .prefill_chunk = 4});
  std::vector<int64_t> ids;
  for (const Request& r : requests) ids.push_back(e.submit(r));
  std::map<int64_t, int> events;
  int64_t cancelled_other_at = -1;  // tokens of request 3 when request 0 cancelled it
  e.set_token_callback([&](const TokenEvent& ev) {
    const int n = ++events[ev.id];
    EXPECT_FALSE(ev.finished && ev.finish == FinishReason::cancelled);
    if (ev.id == ids[1] && n == 3) {
      EXPECT_TRUE(e.cancel(ev.id));
    }
    if (ev.id == ids[0] && n == 4) {
      cancelled_other_at = events[ids[3]];
      EXPECT_TRUE(e.cancel(ids[3]));  // slot 3 comes after slot 0 in this step
    }
  });
  e.run();
  const Completion c0 = e.take(ids[0]), c1 = e.take(ids[1]), c2 = e.take(ids[2]), c3 = e.take(ids[3]);
  EXPECT_EQ(c0.tokens, alone[0].tokens);
  EXPECT_EQ(c0.logprobs, alone[0].logprobs);
  EXPECT_EQ(c0.top_logprobs, alone[0].top_logprobs);
  EXPECT_EQ(c2.tokens, alone[2].tokens);
  EXPECT_EQ(c2.logprobs, alone[2].logprobs);
  EXPECT_EQ(c1.finish, FinishReason::cancelled);
  EXPECT_EQ(c1.tokens, std::vector<int32_t>(alone[1].tokens.begin(), alone[1].tokens.begin() + 3));
  EXPECT_EQ(c1.top_logprobs.size(), 3u);
  EXPECT_EQ(events[ids[1]], 3);
  EXPECT_EQ(c3.finish, FinishReason::cancelled);
  ASSERT_GE(cancelled_other_at, 0);
  EXPECT_EQ(static_cast<int64_t>(c3.tokens.size()), cancelled_other_at);
  EXPECT_EQ(events[ids[3]], cancelled_other_at);
  EXPECT_EQ(c3.tokens, std::vector<int32_t>(alone[3].tokens.begin(),
                                            alone[3].tokens.begin() + cancelled_other_at));
  EXPECT_EQ(e.cache().sequences_in_use(), 0);
}

// A depth-recurrent model runs in the planned arena too (a plan per depth), with the same tokens
// and iteration counts as the bump arena; with adaptive exit it runs the bump arena (the
// iterations are decided as each token runs).
TEST(Engine, RecurrentModelPlannedArenaAndAdaptiveExit) {
  ModelConfig c = test_config();
  c.architecture = "ConcordRecurrentForCausalLM";
  c.num_hidden_layers = 4;
  c.n_layers_in_prelude = 1;
  c.n_layers_in_recurrent_block = 2;
  c.n_layers_in_coda = 1;
  c.mean_recurrence = 2;
  c.max_recurrence = 4;
  c.state_init = "random";
  c.state_init_std = 0.5;
  Model m(c, PrecisionPolicy::preset("fp32"));
  m.init_random(3, 0.08f);
  std::vector<Request> requests;
  for (int i = 0; i < 2; ++i) {
    Request r;
    r.prompt = random_tokens(5 + 3 * i, 40 + i);
    r.max_tokens = 6;
    r.sampling.temperature = 0.7f;
    r.sampling.seed = 9 + i;
    requests.push_back(r);
  }
  for (int64_t depth : {2, 3}) {
    m.set_depth(depth);
    Engine bump(m, {.max_sequences = 2, .prefill_chunk = 4, .activation_arena = ActivationArena::bump});
    Engine planned(m, {.max_sequences = 2, .prefill_chunk = 4});
    const auto a = bump.generate(requests), b = planned.generate(requests);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(a[i].tokens, b[i].tokens) << depth;
      EXPECT_EQ(a[i].logprobs, b[i].logprobs) << depth;
    }
    EXPECT_GT(planned.stats().activation_plans, 0);
    EXPECT_EQ(planned.stats().core_iterations, bump.stats().core_iterations);
  }
  m.set_adaptive_exit(Model::AdaptiveExit{1e-3, 3});
  Engine adaptive(m, {.max_sequences = 1, .prefill_chunk = 1});
  EXPECT_EQ(adaptive.generate({requests[0]})[0].tokens.size(), 6u);
  EXPECT_EQ(adaptive.stats().activation_plans, 0);
}

// The activation arena by name; an MoE model runs the bump arena whatever is asked (its experts'
// rows are known only after routing).
TEST(Engine, ActivationArenaNamesAndMoeFallback) {
  EXPECT_EQ(activation_arena_from_name("planned"), ActivationArena::planned);
  EXPECT_EQ(activation_arena_from_name("bump"), ActivationArena::bump);
  EXPECT_STREQ(activation_arena_name(ActivationArena::planned), "planned");
  EXPECT_THROW(activation_arena_from_name("arena"), InputError);
  ModelConfig c = test_config();
  c.architecture = "Qwen3MoeForCausalLM";
  c.num_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  Model m(c, PrecisionPolicy::preset("fp32"));
  m.init_random(3, 0.08f);
  Engine e(m, {.max_sequences = 2, .prefill_chunk = 4});
  Request r;
  r.prompt = random_tokens(6, 5);
  r.max_tokens = 4;
  EXPECT_EQ(e.generate({r})[0].tokens.size(), 4u);
  EXPECT_EQ(e.stats().activation_plans, 0);
}

TEST(KvCache, SlotsCapacityAndErrors) {
  Model m = make_model("fp32");
  const ModelConfig& c = m.config();
  EXPECT_THROW(KvCache(c, 0), InputError);
  EXPECT_THROW(KvCache(c, 1, c.max_position_embeddings + 1), InputError);
  KvCache cache(c, 2, 8);
  EXPECT_EQ(cache.capacity(), 8);
  const int s0 = cache.allocate(), s1 = cache.allocate();
  EXPECT_EQ(s0, 0);
  EXPECT_EQ(s1, 1);
  EXPECT_THROW(cache.allocate(), InputError);
  const auto tokens = random_tokens(9, 60);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  const CachedInput too_long{s0, tokens, LogitRows::last};
  EXPECT_THROW(m.forward_cached(cache, {&too_long, 1}, logits), InputError);
  EXPECT_EQ(cache.length(s0), 0);  // nothing written by a rejected call
  const CachedInput twice[2] = {{s0, std::span(tokens).first(2)}, {s0, std::span(tokens).first(2)}};
  std::vector<float> two(static_cast<size_t>(2 * c.vocab_size));
  EXPECT_THROW(m.forward_cached(cache, twice, two), InputError);
  const std::vector<int32_t> outside{97};
  const CachedInput bad_token{s0, outside};
  EXPECT_THROW(m.forward_cached(cache, {&bad_token, 1}, logits), InputError);
  std::vector<float> wrong(3);
  const CachedInput ok{s0, std::span(tokens).first(8)};
  EXPECT_THROW(m.forward_cached(cache, {&ok, 1}, wrong), InputError);
  m.forward_cached(cache, {&ok, 1}, logits);
  EXPECT_EQ(cache.length(s0), 8);
  const CachedInput one_more{s0, std::span(tokens).subspan(8, 1)};
  EXPECT_THROW(m.forward_cached(cache, {&one_more, 1}, logits), InputError);
  // Release and reuse: a fresh sequence in a reused slot computes what a new cache computes.
  cache.release(s0);
  EXPECT_THROW(cache.length(s0), InputError);
  EXPECT_THROW(cache.release(s0), InputError);
  EXPECT_EQ(cache.allocate(), s0);
  const CachedInput again{s0, std::span(tokens).first(5)};
  std::vector<float> reused(static_cast<size_t>(c.vocab_size));
  m.forward_cached(cache, {&again, 1}, reused);
  const auto fresh = chunked_logits(m, std::vector<int32_t>(tokens.begin(), tokens.begin() + 5), 5);
  EXPECT_TRUE(bitwise_equal(reused.data(), fresh.data() + 4 * c.vocab_size, reused.size()));
  // Truncate and re-decode: the same logits as the first time.
  cache.truncate(s0, 3);
  const CachedInput redo{s0, std::span(tokens).subspan(3, 2)};
  m.forward_cached(cache, {&redo, 1}, reused);
  EXPECT_TRUE(bitwise_equal(reused.data(), fresh.data() + 4 * c.vocab_size, reused.size()));
  EXPECT_THROW(cache.truncate(s0, 6), InputError);
  // A cache made for another model shape.
  ModelConfig other = c;
  other.num_hidden_layers = 3;
  KvCache wrong_shape(other, 1);
  wrong_shape.allocate();
  const CachedInput w{0, std::span(tokens).first(1)};
  EXPECT_THROW(m.forward_cached(wrong_shape, {&w, 1}, logits), InputError);
  // Positions beyond max_position_embeddings.
  KvCache full(c, 1);
  full.allocate();
  const auto long_tokens = random_tokens(c.max_position_embeddings + 1, 61);
  std::vector<float> many(static_cast<size_t>(c.vocab_size));
  const CachedInput past{0, long_tokens};
  EXPECT_THROW(m.forward_cached(full, {&past, 1}, many), InputError);
}

}  // namespace
}  // namespace concord::serve
