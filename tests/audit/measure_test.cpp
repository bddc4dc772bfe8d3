// Producing compared rows (measure.h): teacher-forced rows against Model::forward run on each
// sequence alone (the training forward, another code path than the batched cached forward),
// greedy completion against a plain argmax loop over Model::forward, kernel-vs-kernel against
// kernel-vs-dump and dump-vs-dump, batch invariance, progress and the errors.
#include "concord/audit/measure.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "concord/numerics/check.h"
#include "train/temp_dir.h"

namespace concord::audit {
namespace {

using model::Model;
using model::ModelConfig;

ModelConfig test_config() {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 96;
  return c;
}

// Same seed, same weights: every model made here holds identical parameters.
Model make_model(const std::string& kernel) {
  Model m(test_config());
  m.init_random(7, 0.08f);  // large enough that logits spread over several nats
  apply_kernel(m, kernel_variant(kernel));
  return m;
}

std::vector<EvalSequence> test_sequences(int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<EvalSequence> out;
  for (int i = 0; i < count; ++i) {
    EvalSequence s;
    const auto n = static_cast<size_t>(2 + rng() % 70);  // lengths 2..71
    for (size_t j = 0; j < n; ++j) s.tokens.push_back(static_cast<int32_t>(rng() % 97));
    s.prompt_length = static_cast<int32_t>(1 + rng() % n);
    s.task = i % 2 ? "add" : "";
    s.label = i % 3 ? "" : "user-" + std::to_string(i);
    out.push_back(std::move(s));
  }
  return out;
}

// Model::forward over one sequence alone: (n, V) logits.
std::vector<float> forward_alone(Model& m, const std::vector<int32_t>& tokens) {
  const auto n = static_cast<int64_t>(tokens.size());
  std::vector<float> logits(static_cast<size_t>(n * m.config().vocab_size));
  m.forward(tokens, 1, n, logits);
  return logits;
}

void expect_same_records(const std::vector<RowRecord>& a, const std::vector<RowRecord>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].info, b[i].info) << "row " << i;
    // Bitwise: the same logits give the same statistics.
    EXPECT_EQ(a[i].div.osc, b[i].div.osc) << "row " << i;
    EXPECT_EQ(a[i].div.tv, b[i].div.tv) << "row " << i;
    EXPECT_EQ(a[i].div.kl, b[i].div.kl) << "row " << i;
    EXPECT_EQ(a[i].div.dlogp_token, b[i].div.dlogp_token) << "row " << i;
    EXPECT_EQ(a[i].div.top_ref, b[i].div.top_ref) << "row " << i;
    EXPECT_EQ(a[i].div.top_cand, b[i].div.top_cand) << "row " << i;
    EXPECT_EQ(a[i].div.margin_ref, b[i].div.margin_ref) << "row " << i;
  }
}

TEST(Measure, TeacherForcedRowsMatchForwardAlone) {
  Model m = make_model("fp32");
  const std::vector<EvalSequence> seqs = test_sequences(7, 1);
  const int64_t V = m.config().vocab_size;
  struct Seen {
    RowInfo info;
    std::vector<float> logits;
  };
  std::vector<Seen> seen;
  teacher_forced_logits(m, seqs, 3, [&](const RowInfo& row, std::span<const float> logits) {
    seen.push_back({row, {logits.begin(), logits.end()}});
  });
  size_t k = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const std::vector<float> ref = forward_alone(m, seqs[s].tokens);
    for (size_t p = 0; p + 1 < seqs[s].tokens.size(); ++p, ++k) {
      ASSERT_LT(k, seen.size());
      const RowInfo& got = seen[k].info;
      EXPECT_EQ(got.sequence, static_cast<int64_t>(s));
      EXPECT_EQ(got.position, static_cast<int32_t>(p));
      EXPECT_EQ(got.prompt_length, seqs[s].prompt_length);
      EXPECT_EQ(got.token, seqs[s].tokens[p]);
      EXPECT_EQ(got.next, seqs[s].tokens[p + 1]);
      EXPECT_EQ(got.task, seqs[s].task);
      EXPECT_EQ(got.label, seqs[s].label);
      ASSERT_EQ(seen[k].logits.size(), static_cast<size_t>(V));
      // docs/engine.md: the cached forward reproduces Model::forward bit for bit in fp32.
      EXPECT_EQ(std::memcmp(seen[k].logits.data(), ref.data() + p * static_cast<size_t>(V),
                            static_cast<size_t>(V) * sizeof(float)),
                0)
          << "sequence " << s << " position " << p;
    }
  }
  EXPECT_EQ(k, seen.size());  // no row for a sequence's last position
}

TEST(Measure, SameKernelHasZeroOscillation) {
  Model a = make_model("fp32"), b = make_model("fp32");
  const std::vector<RowRecord> rows = compare_models(a, b, test_sequences(5, 2), 2);
  ASSERT_FALSE(rows.empty());
  for (const RowRecord& r : rows) {
    EXPECT_EQ(r.div.osc, 0.0);
    EXPECT_EQ(r.div.tv, 0.0);
    EXPECT_FALSE(r.div.flip);
  }
}

TEST(Measure, Bf16AgainstFp32MatchesPerSequenceForwards) {
  Model ref = make_model("fp32"), cand = make_model("bf16");
  const std::vector<EvalSequence> seqs = test_sequences(5, 3);
  const std::vector<RowRecord> rows = compare_models(ref, cand, seqs, 4);
  const auto V = static_cast<size_t>(ref.config().vocab_size);
  size_t k = 0;
  double max_osc = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const std::vector<float> za = forward_alone(ref, seqs[s].tokens);
    const std::vector<float> zb = forward_alone(cand, seqs[s].tokens);
    for (size_t p = 0; p + 1 < seqs[s].tokens.size(); ++p, ++k) {
      ASSERT_LT(k, rows.size());
      const RowDivergence expect =
          row_divergence(std::span<const float>(za).subspan(p * V, V),
                         std::span<const float>(zb).subspan(p * V, V), seqs[s].tokens[p + 1]);
      EXPECT_EQ(rows[k].div.osc, expect.osc);
      EXPECT_EQ(rows[k].div.kl, expect.kl);
      EXPECT_EQ(rows[k].div.token, seqs[s].tokens[p + 1]);
      EXPECT_EQ(rows[k].div.dlogp_token, expect.dlogp_token);
      max_osc = std::max(max_osc, rows[k].div.osc);
    }
  }
  EXPECT_EQ(k, rows.size());
  EXPECT_GT(max_osc, 0.0);
}

// A depth-recurrent model: rows carry the depth both models ran at, each depth has its slice
// ("depth:R", ascending), and the rows of a depth are the per-sequence forwards at that depth.
TEST(Measure, RecurrentRowsCarryTheirDepthSlice) {
  ModelConfig c = test_config();
  c.architecture = "ConcordRecurrentForCausalLM";
  c.num_hidden_layers = 3;
  c.n_layers_in_prelude = 1;
  c.n_layers_in_recurrent_block = 1;
  c.n_layers_in_coda = 1;
  c.mean_recurrence = 2;
  c.max_recurrence = 16;
  c.state_init_std = 0.1;
  auto make = [&](const std::string& kernel) {
    Model m(c);
    m.init_random(7, 0.08f);
    apply_kernel(m, kernel_variant(kernel));
    return m;
  };
  Model ref = make("fp32"), cand = make("mxfp8");
  const std::vector<EvalSequence> seqs = test_sequences(3, 5);
  std::vector<RowRecord> rows;
  for (int r : {12, 1}) {
    ref.set_depth(r);
    cand.set_depth(r);
    const std::vector<RowRecord> at = compare_models(ref, cand, seqs, 2);
    for (const RowRecord& row : at) EXPECT_EQ(row.info.depth, r);
    const auto V = static_cast<size_t>(c.vocab_size);
    const std::vector<float> za = forward_alone(ref, seqs[0].tokens), zb = forward_alone(cand, seqs[0].tokens);
    EXPECT_EQ(at[0].div.osc, row_divergence(std::span<const float>(za).subspan(0, V),
                                            std::span<const float>(zb).subspan(0, V), seqs[0].tokens[1]).osc);
    rows.insert(rows.end(), at.begin(), at.end());
  }
  const Measurement m = measure(rows, SliceOptions{}, "fp32", "mxfp8", c.vocab_size);
  std::vector<std::string> depth_slices;
  for (const SliceStats& s : m.slices)
    if (s.slice.starts_with("depth:")) depth_slices.push_back(s.slice);
  EXPECT_EQ(depth_slices, (std::vector<std::string>{"depth:1", "depth:12"}));
  EXPECT_EQ(m.find("depth:1")->rows * 2, m.find("all")->rows);
  cand.set_depth(3);
  EXPECT_THROW(compare_models(ref, cand, seqs, 2), InputError);
  Model dense = make_model("fp32");
  EXPECT_THROW(compare_models(ref, dense, seqs, 2), InputError);
}

TEST(Measure, BatchInvariantKernelsDoNotDependOnBatch) {
  const std::vector<EvalSequence> seqs = test_sequences(6, 4);
  Model ref = make_model("fp32"), cand = make_model("fp32-reversed");
  const std::vector<RowRecord> one = compare_models(ref, cand, seqs, 1);
  expect_same_records(one, compare_models(ref, cand, seqs, 4));
  expect_same_records(one, compare_models(ref, cand, seqs, 6));
  double max_osc = 0;
  for (const RowRecord& r : one) max_osc = std::max(max_osc, r.div.osc);
  EXPECT_GT(max_osc, 0.0);  // another reduction order does change the logits
}

TEST(Measure, BatchDependentKernelSeesRealBatches) {
  // fp32-batch-split's reduction depends on the GEMM's row count, so running 6 sequences in one
  // pass must change some logits compared with one sequence per pass.
  const std::vector<EvalSequence> seqs = test_sequences(6, 5);
  Model ref = make_model("fp32"), cand = make_model("fp32-batch-split");
  const std::vector<RowRecord> one = compare_models(ref, cand, seqs, 1);
  const std::vector<RowRecord> six = compare_models(ref, cand, seqs, 6);
  ASSERT_EQ(one.size(), six.size());
  int differ = 0;
  for (size_t i = 0; i < one.size(); ++i) differ += one[i].div.osc != six[i].div.osc;
  EXPECT_GT(differ, 0);
}

TEST(Measure, ProgressCountsSequencesPerBatch) {
  Model a = make_model("fp32"), b = make_model("fp32");
  std::vector<std::pair<int64_t, int64_t>> calls;
  compare_models(a, b, test_sequences(5, 6), 2,
                 [&](int64_t done, int64_t total) { calls.emplace_back(done, total); });
  EXPECT_EQ(calls, (std::vector<std::pair<int64_t, int64_t>>{{2, 5}, {4, 5}, {5, 5}}));
}

TEST(Measure, DumpsGiveTheSameRowsAsKernels) {
  concord::train::TempDir dir;
  const std::vector<EvalSequence> seqs = test_sequences(5, 7);
  Model ref = make_model("fp32"), cand = make_model("bf16");
  const std::vector<RowRecord> direct = compare_models(ref, cand, seqs, 3);
  const int64_t V = ref.config().vocab_size;
  for (const char* ext : {".safetensors", ".npy"}) {
    LogitDumpWriter ref_writer(V), cand_writer(V);
    teacher_forced_logits(ref, seqs, 3, [&](const RowInfo& info, std::span<const float> z) {
      ref_writer.add(info, z);
    });
    teacher_forced_logits(cand, seqs, 3, [&](const RowInfo& info, std::span<const float> z) {
      cand_writer.add(info, z);
    });
    const std::string ref_path = (dir.path / (std::string("ref") + ext)).string();
    const std::string cand_path = (dir.path / (std::string("cand") + ext)).string();
    ref_writer.write(ref_path);
    cand_writer.write(cand_path);
    const LogitDump ref_dump = LogitDump::open(ref_path), cand_dump = LogitDump::open(cand_path);
    expect_same_records(direct, compare_dumps(ref_dump, cand_dump));
    // A kernel against a dump, on either side, with another batch size (fp32/bf16 are
    // batch-invariant).
    expect_same_records(direct, compare_model_dump(cand, ref_dump, false, 2));
    expect_same_records(direct, compare_model_dump(ref, cand_dump, true, 5));
  }
}

TEST(Measure, CompleteIsGreedyByDefault) {
  Model m = make_model("fp32");
  std::vector<EvalSequence> prompts(3);
  prompts[0].tokens = {1, 2, 3};
  prompts[1].tokens = {50};
  prompts[2].tokens = {9, 8, 7, 6, 5, 4};
  prompts[2].task = "add";
  CompletionOptions options;
  options.max_new_tokens = 6;
  options.batch = 2;
  const std::vector<EvalSequence> done = complete(m, prompts, options);
  ASSERT_EQ(done.size(), 3u);
  const auto V = static_cast<size_t>(m.config().vocab_size);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(done[i].prompt_length, static_cast<int32_t>(prompts[i].tokens.size()));
    EXPECT_EQ(done[i].task, prompts[i].task);
    // The reference: argmax of the last row of Model::forward, one token at a time.
    std::vector<int32_t> expect = prompts[i].tokens;
    for (int t = 0; t < 6; ++t) {
      const std::vector<float> z = forward_alone(m, expect);
      const auto last = z.begin() + static_cast<std::ptrdiff_t>((expect.size() - 1) * V);
      expect.push_back(static_cast<int32_t>(
          std::max_element(last, last + static_cast<std::ptrdiff_t>(V)) - last));
    }
    EXPECT_EQ(done[i].tokens, expect) << "prompt " << i;
  }
  // A stop token ends the completion and is kept.
  options.stop_tokens = {done[0].tokens[3]};
  const std::vector<EvalSequence> stopped = complete(m, {prompts[0]}, options);
  EXPECT_EQ(stopped[0].tokens,
            std::vector<int32_t>(done[0].tokens.begin(), done[0].tokens.begin() + 4));
}

TEST(Measure, Errors) {
  concord::train::TempDir dir;
  Model a = make_model("fp32"), b = make_model("fp32");
  const std::vector<EvalSequence> seqs = test_sequences(2, 8);
  EXPECT_THROW(compare_models(a, b, seqs, 0), InputError);
  std::vector<EvalSequence> empty(1);
  EXPECT_THROW(compare_models(a, b, empty, 1), InputError);
  // The context is 96: a sequence of 97 tokens feeds 96 (its last token is only a `next`) —
  // what the engine returns when a completion fills the context; 98 is too long.
  std::vector<EvalSequence> fits(1);
  fits[0].tokens.assign(97, 1);
  EXPECT_EQ(compare_models(a, b, fits, 1).size(), 96u);
  std::vector<EvalSequence> too_long(1);
  too_long[0].tokens.assign(98, 1);
  EXPECT_THROW(compare_models(a, b, too_long, 1), InputError);
  // A one-token sequence has no rows (and feeds nothing).
  std::vector<EvalSequence> single(1);
  single[0].tokens = {4};
  EXPECT_TRUE(compare_models(a, b, single, 1).empty());
  CompletionOptions options;
  options.batch = 0;
  EXPECT_THROW(complete(a, seqs, options), InputError);

  const int64_t V = a.config().vocab_size;
  auto write_dump = [&](const std::string& name, const std::vector<RowInfo>& infos, int64_t vocab) {
    LogitDumpWriter w(vocab);
    std::vector<float> z(static_cast<size_t>(vocab));
    for (size_t i = 0; i < infos.size(); ++i) {
      for (size_t j = 0; j < z.size(); ++j) z[j] = static_cast<float>((i * 7 + j * 3) % 11);
      w.add(infos[i], z);
    }
    const std::string path = (dir.path / name).string();
    w.write(path);
    return path;
  };
  auto info = [](int64_t seq, int32_t pos, int32_t token) {
    RowInfo r;
    r.sequence = seq;
    r.position = pos;
    r.token = token;
    return r;
  };
  const std::string good = write_dump("good.safetensors", {info(0, 0, 5), info(0, 1, 6)}, V);
  const std::string other_token = write_dump("tok.safetensors", {info(0, 0, 5), info(0, 1, 7)}, V);
  const std::string other_rows = write_dump("rows.safetensors", {info(0, 0, 5)}, V);
  const std::string other_vocab =
      write_dump("vocab.safetensors", {info(0, 0, 5), info(0, 1, 6)}, V + 1);
  const std::string gap = write_dump("gap.safetensors", {info(0, 0, 5), info(0, 2, 6)}, V);
  const std::string repeated = write_dump("rep.safetensors", {info(0, 0, 5), info(0, 0, 6)}, V);
  const std::string no_token = write_dump("notok.safetensors", {info(0, 0, 5), info(0, 1, -1)}, V);
  const LogitDump g = LogitDump::open(good);
  EXPECT_NO_THROW(compare_dumps(g, LogitDump::open(good)));
  for (const std::string& bad : {other_token, other_rows, other_vocab}) {
    try {
      compare_dumps(g, LogitDump::open(bad));
      ADD_FAILURE() << "no error for " << bad;
    } catch (const InputError& e) {
      // One line naming both files.
      const std::string what = e.what();
      EXPECT_NE(what.find(good), std::string::npos) << what;
      EXPECT_NE(what.find(bad), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
  const std::vector<RowRecord> rows = compare_model_dump(a, g, true, 1);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].info.next, 6);  // filled in from the next row's token
  EXPECT_EQ(rows[1].info.next, -1);
  for (const std::string& bad : {other_vocab, gap, repeated, no_token}) {
    try {
      compare_model_dump(a, LogitDump::open(bad), true, 1);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace concord::audit
