// Issue 35: `concord train` killed and resumed ends on the bits recorded before the training
// state was restructured (tests/golden/train_state_fingerprints.json; tests/train_state_fixture.h).
// Two runs: bf16 served weights with sr (random bits keyed by step and parameter) and nvfp4 with
// ef (a carried error that must come back from the checkpoint), each killed after step 6 with a
// checkpoint at 4, resumed, and fingerprinted at its final checkpoint (step 12) and final/.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <utility>

#include "concord/model/files.h"
#include "concord/train/checkpoint.h"
#include "concord/train/trainer.h"
#include "temp_dir.h"
#include "train_state_fixture.h"

namespace concord::train {
namespace {

namespace fs = std::filesystem;

TrainConfig fixture_config(const fs::path& dir) {
  std::ostringstream text;
  std::mt19937 rng(11);
  const char* words[] = {"and", "the", "lord", "said", "unto", "moses", "in", "land", "of", "egypt"};
  for (int i = 0; i < 4000; ++i) text << words[rng() % 10] << (i % 13 == 12 ? ".\n" : " ");
  const fs::path corpus = dir / "corpus.txt";
  std::ofstream(corpus) << text.str();
  TrainConfig c;
  c.name = "fixture";
  c.model.hidden_size = 32;
  c.model.intermediate_size = 64;
  c.model.num_hidden_layers = 2;
  c.model.num_attention_heads = 4;
  c.model.num_key_value_heads = 2;
  c.model.head_dim = 8;
  c.model.max_position_embeddings = 32;
  c.corpus = corpus.string();
  c.validation_fraction = 0.1;
  c.split_chunk = 256;
  c.batch_size = 2;
  c.seq_len = 24;
  c.steps = 12;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.warmup_steps = 3;
  c.eval_every = 6;
  c.eval_batches = 1;
  c.checkpoint_every = 4;
  c.checkpoint_keep = 2;
  return c;
}

// The served weights final/ holds (its file's metadata names the run folder, so not its bytes).
uint64_t served_fingerprint(const fs::path& final_dir) {
  model::LoadedModel loaded = model::load_model(final_dir);
  test::Fnv1a h;
  for (const model::ParamSpec& p : loaded.model.params()) {
    h.add(p.name);
    const auto v = std::as_const(loaded.model).param(p.name);
    h.add(v.data(), v.size() * sizeof(float));
  }
  return h.value();
}

TEST(TrainStateFixture, KilledAndResumedTrainRunsEndOnTheRecordedBits) {
  const TempDir tmp;
  for (const auto& [policy, rule] : {std::pair{"bf16", "sr"}, std::pair{"nvfp4", "ef"}}) {
    const std::string name = fmt::format("train_{}_{}", policy, rule);
    const fs::path dir = tmp.path / name;
    fs::create_directories(dir);
    TrainConfig c = fixture_config(dir);
    c.policy = model::PrecisionPolicy::preset(policy);
    c.export_rule = rule;
    TrainOptions o;
    o.progress = false;
    o.out = dir / "run";
    o.stop_after = 6;
    ASSERT_EQ(train(c, o).steps_done, 6);
    o.stop_after.reset();
    const TrainResult resumed = train(c, o);
    ASSERT_EQ(resumed.start_step, 4) << name;
    const LoadedCheckpoint last = load_checkpoint(*latest_checkpoint(dir / "run"));
    ASSERT_EQ(last.step, 12);
    const std::string print = fmt::format("{}/{:016x}", test::fingerprint(last),
                                          served_fingerprint(dir / "run" / "final"));
    test::expect_fingerprint(name, print);
  }
}

}  // namespace
}  // namespace concord::train
