// Activation recomputation (Model::set_recompute, docs/sched.md): the training passes drop the
// attention probabilities or a whole block's activations and recompute them in the backward.
// Losses and every gradient are bit for bit those of keeping everything — dense (Qwen3, Qwen2
// without QK-norm and with biases), Qwen3-MoE with and without the load-balancing loss, a repeated
// block in the schedule; under fp32, bf16, mxfp8 and nvfp4 (stochastic rounding in the backward) —
// and the activation arena's high-water mark falls: block < attention < keep.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "concord/model/model.h"
#include "concord/numerics/check.h"

namespace concord::model {
namespace {

using R = Model::Recompute;

ModelConfig config_of(const std::string& kind) {
  ModelConfig c;
  c.architecture = kind == "qwen2" ? "Qwen2ForCausalLM" : kind == "moe" || kind == "moe-aux" ? "Qwen3MoeForCausalLM"
                                                                                               : "Qwen3ForCausalLM";
  c.vocab_size = 50;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  if (kind == "moe" || kind == "moe-aux") {
    c.num_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 12;
    c.mlp_only_layers = {0};
    c.output_router_logits = kind == "moe-aux";
  }
  if (kind == "repeat") c.schedule = {0, 1, 1, 2};
  return c;
}

struct Step {
  float loss = 0;
  std::vector<std::vector<float>> grads;
  Model::ActivationMemory memory;
};

Step step(Model& m, const std::vector<R>& modes, int64_t B, int64_t S) {
  m.set_recompute(modes);
  std::vector<int32_t> tokens(static_cast<size_t>(B * S)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 7 + 3) % 50);
    targets[i] = static_cast<int32_t>((i * 11 + 5) % 50);
  }
  Step s;
  s.loss = m.forward_backward(tokens, targets, B, S, /*step=*/3);
  s.memory = m.activation_memory();
  for (const ParamSpec& p : m.params()) {
    const auto g = m.grad(p.name);
    s.grads.emplace_back(g.begin(), g.end());
  }
  return s;
}

bool same(const Step& a, const Step& b) {
  if (std::memcmp(&a.loss, &b.loss, sizeof(float)) != 0 || a.grads.size() != b.grads.size()) return false;
  for (size_t i = 0; i < a.grads.size(); ++i)
    if (a.grads[i].size() != b.grads[i].size() ||
        std::memcmp(a.grads[i].data(), b.grads[i].data(), sizeof(float) * a.grads[i].size()) != 0)
      return false;
  return true;
}

TEST(Recompute, GradientsAreBitForBitKeepingEverythingsAndTheArenaShrinks) {
  const int64_t B = 2, S = 32;
  for (const std::string kind : {"qwen3", "qwen2", "moe", "moe-aux", "repeat"}) {
    for (const char* policy : {"fp32", "bf16", "mxfp8", "nvfp4"}) {
      Model m(config_of(kind), PrecisionPolicy::preset(policy));
      m.init_random(7, 0.1f);
      const auto A = static_cast<size_t>(m.config().applications());
      const std::string what = kind + " " + policy;
      const Step keep = step(m, {}, B, S);
      const Step attention = step(m, std::vector<R>(A, R::attention), B, S);
      EXPECT_TRUE(same(keep, attention)) << what;
      EXPECT_LT(attention.memory.high_water, keep.memory.high_water) << what;
      std::vector<R> mixed(A, R::keep);
      mixed[1] = R::attention;
      mixed[A - 1] = kind == "moe-aux" ? R::attention : R::block;
      EXPECT_TRUE(same(keep, step(m, mixed, B, S))) << what;
      if (kind == "moe-aux") {  // the MoE applications' routing is read after the forward
        EXPECT_THROW(m.set_recompute(std::vector<R>(A, R::block)), InputError);
        continue;
      }
      const Step block = step(m, std::vector<R>(A, R::block), B, S);
      EXPECT_TRUE(same(keep, block)) << what;
      EXPECT_LT(block.memory.high_water, attention.memory.high_water) << what;
      m.set_recompute({});
      EXPECT_TRUE(same(keep, step(m, {}, B, S))) << what;  // back to keeping everything
    }
  }
}

TEST(Recompute, BadPlansAreRefused) {
  Model m(config_of("qwen3"));
  EXPECT_THROW(m.set_recompute({R::keep}), InputError);  // 3 applications
  EXPECT_NO_THROW(m.set_recompute({R::keep, R::block, R::attention}));
  EXPECT_EQ(m.recompute().size(), 3u);
}

}  // namespace
}  // namespace concord::model
