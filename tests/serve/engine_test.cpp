// The engine against the training forward: KV-cache decode vs recompute, chunked prefill, batch
// and thread invariance at every precision preset; the KV cache's errors and slot reuse; the
// engine's scheduling (stop tokens, max tokens, context) and determinism.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
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
  r.sampling.top_p = 0.0f;
  EXPECT_THROW(e.submit(r), InputError);
  EXPECT_THROW(e.take(123), InputError);
  EXPECT_THROW(Engine(m, {.max_sequences = 0}), InputError);
  EXPECT_THROW(Engine(m, {.max_sequences = 1, .prefill_chunk = 0}), InputError);
  EXPECT_THROW(Engine(m, {.max_sequences = 1, .prefill_chunk = 4, .max_context = 49}), InputError);
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
