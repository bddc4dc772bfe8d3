// The disaggregation cost model (serve/split_model.h): the engine's chunking, the predictions
// against a token-by-token recount of the same rules, the least-squares fits recovering known
// costs, and the measurement on a small model (its shape: one prefill figure per chunk, positive
// rates, the hand-over's KV bytes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "concord/model/model.h"
#include "concord/numerics/check.h"
#include "concord/serve/split_model.h"

namespace concord::serve::splitmodel {
namespace {

TEST(SplitModel, ChunksAreCutAtMultiplesOfTheChunkFromThePromptsStart) {
  const std::vector<Chunk> c = chunks_of(2001, 512);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].start, 0);
  EXPECT_EQ(c[3].start, 1536);
  EXPECT_EQ(c[3].tokens, 465);
  EXPECT_EQ(chunks_of(512, 512).size(), 1u);
  EXPECT_EQ(chunks_of(513, 512).back().tokens, 1);
}

Rates sample_rates() {
  Rates r;
  r.token_s = 2e-3;
  r.pair_s = 1e-7;
  r.step_s = 10e-3;
  r.row_s = 1e-3;
  r.bytes_per_token = 46080;
  r.export_s = 1e-10;
  r.import_s = 2e-10;
  r.resume_s = 3e-10;
  r.prefill_slowdown = 1.4;
  r.decode_slowdown = 1.2;
  return r;
}

// The same rules recounted token by token (no closed forms): a token at position q costs token_s
// plus pair_s per row before it.
double recount_prefill(const Rates& r, int64_t from, int64_t to) {
  double s = 0;
  for (int64_t q = from; q < to; ++q) s += r.token_s + r.pair_s * static_cast<double>(q);
  return s;
}

TEST(SplitModel, PredictionsFollowTheEnginesStepsAndTheHandOver) {
  const Rates r = sample_rates();
  const Workload w{2001, 3, 512};
  const Verdict v = predict(r, w);
  // Without the worker: four chunk steps, each with the three streams' rows.
  double ttft = 0, gap = 0;
  for (int64_t s = 0; s < 2001; s += 512) {
    const double step = recount_prefill(r, s, std::min<int64_t>(s + 512, 2001)) + 3 * r.row_s;
    ttft += step;
    gap = std::max(gap, step);
  }
  EXPECT_NEAR(v.engine.ttft_s, ttft, 1e-12);
  EXPECT_NEAR(v.engine.max_gap_s, gap, 1e-12);
  EXPECT_EQ(v.engine.stream_tokens, 4);
  EXPECT_NEAR(v.engine.stream_delay_s, ttft - 4 * (r.step_s + 3 * r.row_s), 1e-12);
  // With it: the worker's prefill slowed by sharing, the export, the import, then one step of four
  // rows in which the rows are copied into the prompt's slot and its last token attends to the
  // 2000 before it.
  const double bytes = 46080.0 * 2001;
  const double window = 1.4 * recount_prefill(r, 0, 2001) + 1e-10 * bytes;
  const double first = r.step_s + 4 * r.row_s + r.pair_s * 2000 + 3e-10 * bytes;
  EXPECT_NEAR(v.split.handover_bytes, bytes, 1e-6);
  EXPECT_NEAR(v.split.ttft_s, window + 2e-10 * bytes + first, 1e-12);
  const double shared_step = 1.2 * (r.step_s + 3 * r.row_s);
  EXPECT_NEAR(v.split.stream_tokens, window / shared_step + 1, 1e-9);
  EXPECT_NEAR(v.split.max_gap_s, std::max(shared_step, 2e-10 * bytes + first), 1e-12);
  const double split_delay = v.split.ttft_s - (window / shared_step + 1) * (r.step_s + 3 * r.row_s);
  EXPECT_NEAR(v.split.stream_delay_s, split_delay, 1e-9);
  EXPECT_NEAR(v.saved_request_s, 3 * (v.engine.stream_delay_s - split_delay) - (v.split.ttft_s - ttft), 1e-9);
  EXPECT_TRUE(v.pays);  // the streams' ~4 s of stalls outweigh the prompt's ~2 s of extra wait
}

TEST(SplitModel, StreamsThatEndDuringThePrefillLeaveTheMachineToIt) {
  const Rates r = sample_rates();
  // Two tokens left: the engine's first two chunk steps carry the stream's row, the others none.
  const Verdict v = predict(r, {2001, 1, 512, 2});
  const double c0 = recount_prefill(r, 0, 512), c1 = recount_prefill(r, 512, 1024);
  EXPECT_NEAR(v.engine.ttft_s, recount_prefill(r, 0, 2001) + 2 * r.row_s, 1e-12);
  EXPECT_EQ(v.engine.stream_tokens, 2);
  EXPECT_NEAR(v.engine.max_gap_s, c1 + r.row_s, 1e-12);
  EXPECT_NEAR(v.engine.stream_delay_s, c0 + c1 + 2 * r.row_s - 2 * (r.step_s + r.row_s), 1e-12);
  // Beside the worker the stream's two steps take 1.2x; the worker's prefill runs 1.4x slower
  // for that long, then at its own speed.
  const double step = 1.2 * (r.step_s + r.row_s), alone = recount_prefill(r, 0, 2001);
  const double bytes = 46080.0 * 2001;
  const double window = 2 * step + (alone - 2 * step / 1.4) + 1e-10 * bytes;
  EXPECT_NEAR(v.split.ttft_s, window + 2e-10 * bytes + r.step_s + r.row_s + r.pair_s * 2000 + 3e-10 * bytes, 1e-12);
  EXPECT_EQ(v.split.stream_tokens, 2);
  EXPECT_NEAR(v.split.max_gap_s, step, 1e-12);
  EXPECT_NEAR(v.split.stream_delay_s, 2 * (step - r.step_s - r.row_s), 1e-12);
  // A stream with more tokens than the prefill takes is the endless one.
  const Verdict endless = predict(r, {2001, 1, 512}), long_one = predict(r, {2001, 1, 512, 100000});
  EXPECT_EQ(endless.split.ttft_s, long_one.split.ttft_s);
  EXPECT_EQ(endless.split.stream_tokens, long_one.split.stream_tokens);
  EXPECT_EQ(endless.engine.ttft_s, long_one.engine.ttft_s);
}

TEST(SplitModel, ItDoesNotPayForAShortPromptOrWithNoStreams) {
  Rates r = sample_rates();
  // Two workers that halve each other: a prompt of one chunk stalls the stream once, briefly,
  // and the split slows the prompt by as much as it spares the stream, plus the hand-over.
  r.prefill_slowdown = r.decode_slowdown = 2;
  EXPECT_FALSE(predict(r, {40, 1, 512}).pays);
  r = sample_rates();
  // Nothing decoding: nothing to save, the hand-over only adds; the worker runs unslowed.
  const Verdict alone = predict(r, {2001, 0, 512});
  EXPECT_FALSE(alone.pays);
  EXPECT_EQ(alone.engine.max_gap_s, 0);
  EXPECT_EQ(alone.split.stream_tokens, 0);
  EXPECT_NEAR(alone.split.ttft_s - alone.engine.ttft_s,
              6e-10 * 46080.0 * 2001 + r.step_s + r.row_s + r.pair_s * 2000, 1e-12);
  // Separate cores (no slowdowns) and a cheap hand-over: the split's only cost left is the
  // hand-over and one step, so it pays from two chunks on.
  r.prefill_slowdown = r.decode_slowdown = 1;
  EXPECT_TRUE(predict(r, {1024, 1, 512}).pays);
  // A serving loop's overhead: every engine step pays it, the worker's prefill does not.
  const Verdict plain = predict(r, {2001, 1, 512}), loaded = predict(r, {2001, 1, 512, 0, 5e-3});
  EXPECT_NEAR(loaded.engine.ttft_s - plain.engine.ttft_s, 4 * 5e-3, 1e-12);
  EXPECT_NEAR(loaded.split.ttft_s - plain.split.ttft_s, 5e-3, 1e-12);
  const double d = r.decode_slowdown * (r.step_s + r.row_s);  // a shared decode step
  EXPECT_NEAR(loaded.split.stream_tokens - 1, (plain.split.stream_tokens - 1) * d / (d + 5e-3), 1e-9);
  EXPECT_THROW(predict(r, {100, 1, 512, 0, -1}), InputError);
  EXPECT_THROW(predict(r, {1, 1, 512}), InputError);
  EXPECT_THROW(predict(r, {100, -1, 512}), InputError);
}

TEST(SplitModel, TheFitsRecoverKnownCosts) {
  const Rates truth = sample_rates();
  std::vector<PrefillStep> prefill;
  for (const Chunk& c : chunks_of(2048, 512)) prefill.push_back({c, prefill_seconds(truth, c)});
  std::vector<DecodeStep> decode;
  for (int64_t rows : {1, 2, 4})
    for (int k = 0; k < 3; ++k) decode.push_back({rows, decode_seconds(truth, rows)});
  Rates r;
  fit_prefill(prefill, r);
  fit_decode(decode, r);
  EXPECT_NEAR(r.token_s, truth.token_s, 1e-12);
  EXPECT_NEAR(r.pair_s, truth.pair_s, 1e-15);
  EXPECT_NEAR(r.step_s, truth.step_s, 1e-12);
  EXPECT_NEAR(r.row_s, truth.row_s, 1e-12);
  // Noise that would make a cost negative: it is 0, the other fitted alone.
  std::vector<DecodeStep> flat{{1, 0.012}, {2, 0.011}, {4, 0.010}};
  fit_decode(flat, r);
  EXPECT_EQ(r.row_s, 0);
  EXPECT_NEAR(r.step_s, 0.011, 1e-12);
  // One start position (or one row count) cannot separate the two costs.
  std::vector<PrefillStep> one{{{0, 512}, 1.0}, {{0, 512}, 1.1}};
  EXPECT_THROW(fit_prefill(one, r), InputError);
  std::vector<DecodeStep> same{{2, 0.01}, {2, 0.02}};
  EXPECT_THROW(fit_decode(same, r), InputError);
}

TEST(SplitModel, MeasuresTheEngineOnThisMachine) {
  model::ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 512;
  model::Model m(c, model::PrecisionPolicy::preset("fp32"));
  m.init_random(7, 0.08f);
  EngineOptions o;
  o.prefill_chunk = 64;
  std::vector<std::string> lines;
  const Measured x = measure(m, o, 300, 1, [&](const std::string& s) { lines.push_back(s); });
  EXPECT_EQ(lines.size(), 5u);
  ASSERT_EQ(x.prefill.size(), 5u);  // 4 chunks of 64 and one of 44
  EXPECT_EQ(x.prefill[4].chunk.start, 256);
  EXPECT_EQ(x.prefill[4].chunk.tokens, 44);
  EXPECT_EQ(x.decode.size(), 48u);  // 16 timed steps of 1, 2 and 4 rows
  EXPECT_GT(x.shared_decode_steps, 0);
  const Rates& r = x.rates;
  EXPECT_GT(r.token_s + r.pair_s, 0);
  EXPECT_GT(r.step_s + r.row_s, 0);
  EXPECT_GE(r.prefill_slowdown, 1);
  EXPECT_GE(r.decode_slowdown, 1);
  // The hand-over carries the keys and values of every prompt row but the last (fp32), and the
  // records' headers and tokens.
  const double kv = 2.0 * 2 * 2 * 16 * 4 * 299;
  EXPECT_GT(x.handover_bytes, kv);
  EXPECT_LT(x.handover_bytes, kv * 1.2);
  EXPECT_GT(x.export_seconds, 0);
  EXPECT_GT(x.import_seconds, 0);
  EXPECT_GT(x.resume_step_seconds, 0);
  EXPECT_GE(r.resume_s, 0);
  EXPECT_THROW(measure(m, o, 600, 1), InputError);  // longer than the context
}

}  // namespace
}  // namespace concord::serve::splitmodel
