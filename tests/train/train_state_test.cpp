// TrainState (issue 35): a save and restore continues on the same bits as a run that never stopped
// (master, optimizer moments and step count, ef's carried error); a checkpoint of another model is
// refused naming the layer, the file and the tensor; the optimizer is named when unknown.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "concord/model/model.h"
#include "concord/model/policy.h"
#include "concord/numerics/check.h"
#include "concord/train/checkpoint.h"
#include "concord/train/train_state.h"
#include "temp_dir.h"

namespace concord::train {
namespace {

namespace fs = std::filesystem;

model::ModelConfig small_config(int hidden) {
  model::ModelConfig c;
  c.vocab_size = 40;
  c.hidden_size = hidden;
  c.intermediate_size = 2 * hidden;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = hidden / 2;
  c.max_position_embeddings = 16;
  return c;
}

OptimizerConfig adamw() { return {.name = "adamw", .adamw = {.lr = 1e-2, .weight_decay = 0.1}, .binary = {}}; }

// Gradients of step `step`, different per parameter and step, written into `m`'s grad buffers.
void fill_grads(model::Model& m, int step) {
  std::mt19937 rng(static_cast<uint32_t>(100 + step));
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (const model::ParamSpec& p : m.params())
    for (float& g : m.grad(p.name)) g = normal(rng);
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(TrainState, SaveAndRestoreContinueOnTheBitsOfAnUninterruptedRun) {
  TempDir tmp;
  const fs::path dir = tmp.path;
  const model::ModelConfig config = small_config(16);
  const auto policy = model::PrecisionPolicy::preset("nvfp4");
  model::Model init(config);
  init.init_random(5);
  model::Model served(config, policy);

  TrainState straight(init, policy, "ef", 9, adamw());
  TrainState first(init, policy, "ef", 9, adamw());
  for (int step = 0; step < 3; ++step) {
    for (TrainState* s : {&straight, &first}) {
      s->export_to(served, step);
      fill_grads(served, step);
      s->step(served, 1e-2);
    }
  }
  const fs::path saved = first.save(dir, 3, nlohmann::json{{"step", 3}}, 2);
  TrainState resumed(init, policy, "ef", 9, adamw());  // starts from the initial weights ...
  resumed.restore(load_checkpoint(saved), "train");  // ... and restores
  EXPECT_EQ(resumed.optimizer().steps_taken(), 3);
  model::Model served_straight(config, policy), served_resumed(config, policy);
  for (int step = 3; step < 6; ++step) {
    straight.export_to(served_straight, step);
    resumed.export_to(served_resumed, step);
    for (model::Model* m : {&served_straight, &served_resumed}) fill_grads(*m, step);
    straight.step(served_straight, 1e-2);
    resumed.step(served_resumed, 1e-2);
  }
  for (size_t p = 0; p < straight.params().size(); ++p) {
    const std::string& name = straight.params()[p].name;
    EXPECT_TRUE(same_bits(straight.master(p), resumed.master(p))) << name;
    EXPECT_TRUE(same_bits(served_straight.param(name), served_resumed.param(name))) << name;
  }
}

TEST(TrainState, ACheckpointOfAnotherModelIsRefusedNamingLayerFileAndTensor) {
  TempDir tmp;
  const fs::path dir = tmp.path;
  const auto policy = model::PrecisionPolicy::preset("bf16");
  model::Model small(small_config(16));
  small.init_random(1);
  const fs::path ckpt = TrainState(small, policy, "rne", 0, adamw()).save(dir, 1, nlohmann::json::object(), 1);
  model::Model wide(small_config(24));
  TrainState other(wide, policy, "rne", 0, adamw());
  try {
    other.restore(load_checkpoint(ckpt), "rl");
    ADD_FAILURE() << "restored a checkpoint of another model";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "[rl] " + (ckpt / "model.safetensors").string() + ": tensor '" +
                                         other.params()[0].name + "' is missing or has the wrong size");
  }
}

TEST(TrainState, InitialWeightsOfTheWrongShapeAndUnknownOptimizersAreNamed) {
  const model::ModelConfig config = small_config(16);
  const auto policy = model::PrecisionPolicy::preset("bf16");
  EXPECT_THROW(TrainState(config, policy, "rne", 0, adamw(), {}), InputError);
  try {
    make_optimizer({.name = "sgd", .adamw = {}, .binary = {}});
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "[optimizer] unknown optimizer 'sgd' (known: adamw, latent-adamw, bop, ed)");
  }
  try {
    model::Model m(config);
    TrainState(m, policy, "stochastic", 0, adamw());
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("stochastic"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace concord::train
