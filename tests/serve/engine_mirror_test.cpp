// The engine mirror (serve/engine_mirror.h): its messages round-trip and malformed ones are
// refused; a follower fed a leader's record runs the leader's steps — the same steps, tokens and
// prefill/decode split — and stops with an error when the ids diverge.
#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <vector>

#include "concord/model/model.h"
#include "concord/numerics/check.h"
#include "concord/serve/engine_mirror.h"

namespace concord::serve {
namespace {

Request sample_request(int64_t n, uint64_t seed) {
  Request r;
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < n; ++i) r.prompt.push_back(static_cast<int32_t>(rng() % 97));
  r.sampling.temperature = 0.7f;
  r.sampling.top_k = 5;
  r.sampling.top_p = 0.9f;
  r.sampling.min_p = 0.01f;
  r.sampling.seed = seed;
  r.max_tokens = 6 + static_cast<int64_t>(seed % 5);
  r.stop_tokens = {3};
  r.top_logprobs = 2;
  r.prompt_logprobs = seed % 2 == 0;
  return r;
}

TEST(EngineMirror, MessagesRoundTripAndMalformedOnesAreRefused) {
  MirrorMessage m;
  m.ops.push_back({EngineOp::Type::submit, 7, sample_request(5, 4)});
  m.ops.push_back({EngineOp::Type::cancel, 3, {}});
  const std::vector<uint8_t> bytes = encode_mirror(m);
  const MirrorMessage back = decode_mirror(bytes);
  ASSERT_EQ(back.ops.size(), 2u);
  EXPECT_FALSE(back.stop);
  const Request& a = m.ops[0].request;
  const Request& b = back.ops[0].request;
  EXPECT_EQ(back.ops[0].id, 7);
  EXPECT_EQ(b.prompt, a.prompt);
  EXPECT_EQ(b.sampling.temperature, a.sampling.temperature);
  EXPECT_EQ(b.sampling.top_k, a.sampling.top_k);
  EXPECT_EQ(b.sampling.top_p, a.sampling.top_p);
  EXPECT_EQ(b.sampling.min_p, a.sampling.min_p);
  EXPECT_EQ(b.sampling.seed, a.sampling.seed);
  EXPECT_EQ(b.max_tokens, a.max_tokens);
  EXPECT_EQ(b.stop_tokens, a.stop_tokens);
  EXPECT_EQ(b.top_logprobs, a.top_logprobs);
  EXPECT_EQ(b.prompt_logprobs, a.prompt_logprobs);
  EXPECT_EQ(back.ops[1].type, EngineOp::Type::cancel);
  EXPECT_EQ(back.ops[1].id, 3);
  MirrorMessage stop;
  stop.stop = true;
  EXPECT_TRUE(decode_mirror(encode_mirror(stop)).stop);
  // Every cut of the message, a wrong magic, trailing bytes.
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THROW(decode_mirror(std::span(bytes).first(n)), InputError) << n;
  std::vector<uint8_t> bad = bytes;
  bad[0] = 'X';
  EXPECT_THROW(decode_mirror(bad), InputError);
  bad = bytes;
  bad.push_back(0);
  EXPECT_THROW(decode_mirror(bad), InputError);
}

model::Model tiny_model() {
  model::ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 97;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  model::Model m(c, model::PrecisionPolicy::preset("fp32"));
  m.init_random(5, 0.2f);
  return m;
}

TEST(EngineMirror, AFollowerRunsTheLeadersSteps) {
  model::Model m = tiny_model();
  EngineOptions o;
  o.max_sequences = 3;
  o.prefill_chunk = 4;
  Engine leader(m, o);
  EngineLog log;
  std::deque<std::vector<uint8_t>> sent;
  // Requests arriving between steps, one cancelled mid-way, as a server's scheduler does it.
  std::vector<int64_t> ids;
  for (int step = 0; step < 40; ++step) {
    if (step % 3 == 0 && step < 18) {
      const Request r = sample_request(3 + step / 3, static_cast<uint64_t>(step));
      ids.push_back(leader.submit(r));
      log.submitted(ids.back(), r);
    }
    if (step == 7) {
      leader.cancel(ids[1]);
      log.cancelled(ids[1]);
    }
    if (leader.waiting() + leader.running() == 0) continue;
    sent.push_back(log.take(false));
    leader.step();
  }
  sent.push_back(log.take(true));
  const int64_t leader_steps = leader.stats().steps;
  Engine follower(m, o);
  const int64_t steps = follow_engine(follower, [&] {
    std::vector<uint8_t> b = std::move(sent.front());
    sent.pop_front();
    return b;
  });
  EXPECT_EQ(steps, leader_steps);
  EXPECT_EQ(follower.stats().steps, leader.stats().steps);
  EXPECT_EQ(follower.stats().generated_tokens, leader.stats().generated_tokens);
  EXPECT_EQ(follower.stats().prefill_tokens, leader.stats().prefill_tokens);
  EXPECT_EQ(follower.stats().decode_tokens, leader.stats().decode_tokens);
  EXPECT_GT(leader.stats().generated_tokens, 20);

  // An id the follower's engine would not give: the engines diverged.
  Engine other(m, o);
  MirrorMessage wrong;
  wrong.ops.push_back({EngineOp::Type::submit, 41, sample_request(4, 1)});
  std::vector<uint8_t> msg = encode_mirror(wrong);
  EXPECT_THROW(follow_engine(other, [&] { return msg; }), InputError);
  // A step with nothing to run: diverged too.
  Engine idle(m, o);
  EXPECT_THROW(follow_engine(idle, [] { return encode_mirror(MirrorMessage{}); }), InputError);
}

}  // namespace
}  // namespace concord::serve
