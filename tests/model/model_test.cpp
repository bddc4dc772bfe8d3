// The assembled model: operands on their grids for every preset, batch and thread invariance,
// tied embeddings, errors. (Numerical agreement with references: model_vs_reference_test.cpp.)
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "concord/model/model.h"
#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/tensor/gemm.h"
#include "concord/tensor/qgemm.h"

namespace concord::model {
namespace {

ModelConfig small_config(bool qwen3 = true, bool tied = true) {
  ModelConfig c;
  c.architecture = qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
  c.vocab_size = 259;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  return c;
}

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed, int32_t vocab = 259) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

std::vector<int32_t> shifted_targets(const std::vector<int32_t>& tokens, int64_t B, int64_t T) {
  std::vector<int32_t> targets(tokens.size(), -1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < T; ++t) targets[b * T + t] = tokens[b * T + t + 1];
  return targets;
}

bool bitwise_equal(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// The reduction axis of each operand's storage, per role (see policy.h).
int reduction_axis(GemmRole role, bool operand_a) {
  switch (role) {
    case GemmRole::forward: return 1;                    // X (T,K) and W (N,K): along K
    case GemmRole::dgrad: return operand_a ? 1 : 0;      // dY (T,N) along N; W (N,K) down N
    case GemmRole::wgrad: return 0;                      // dY (T,N) and X (T,K): down T
  }
  return -1;
}

class PresetTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PresetTest, EveryGemmOperandLiesOnItsGrid) {
  const PrecisionPolicy policy = PrecisionPolicy::preset(GetParam());
  Model m(small_config(), policy);
  m.init_random(7);
  const int64_t B = 2, T = 32;
  const auto tokens = random_tokens(B * T, 1);
  int records = 0, quantized = 0;
  m.set_gemm_observer([&](const GemmRecord& r) {
    ++records;
    for (int side = 0; side < 2; ++side) {
      const tensor::PreparedOperand& op = side == 0 ? *r.a : *r.b;
      const auto& want = side == 0 ? r.desc_a : r.desc_b;
      ASSERT_EQ(op.desc.has_value(), want.has_value()) << r.weight;
      if (!want) continue;
      ++quantized;
      const numerics::QuantDesc& got = op.quantized.desc;
      EXPECT_EQ(got.element, want->element) << r.weight;
      EXPECT_EQ(got.scale, want->scale) << r.weight;
      EXPECT_EQ(got.rounding, want->rounding) << r.weight;
      EXPECT_EQ(got.block, want->block) << r.weight;
      const bool one_d = got.has_scale && (got.block.rows == 1 || got.block.cols == 1) &&
                         !got.block.per_tensor();
      if (one_d) {
        EXPECT_EQ(got.axis, reduction_axis(r.role, side == 0)) << r.weight;
      }
      // The values the kernel reads are exactly the decoded codes (per-tensor scale factored out).
      numerics::QuantizedTensor q = op.quantized;
      q.tensor_scale = 1.0f;
      std::vector<float> decoded(static_cast<size_t>(q.numel()));
      numerics::dequantize_ref(q, decoded.data());
      ASSERT_EQ(op.rows * op.cols, q.numel());
      EXPECT_TRUE(bitwise_equal(decoded.data(), op.data, decoded.size()))
          << GetParam() << " " << r.weight << " role " << gemm_role_name(r.role) << " side " << side;
      EXPECT_EQ(op.tensor_scale, op.quantized.tensor_scale);
    }
  });
  const float loss = m.forward_backward(tokens, shifted_targets(tokens, B, T), B, T, 3);
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, std::log(259.0), 0.5);  // random init: about uniform
  // 2 layers x 7 weights + lm_head, three roles each.
  EXPECT_EQ(records, 3 * (2 * 7 + 1));
  if (GetParam() != "fp32") {
    EXPECT_GT(quantized, 0);
  }
}

TEST_P(PresetTest, LossAndGradientsDoNotDependOnThreadCount) {
  const int64_t B = 2, T = 32;
  const auto tokens = random_tokens(B * T, 2);
  const auto targets = shifted_targets(tokens, B, T);
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Model m(small_config(), PrecisionPolicy::preset(GetParam()));
    m.init_random(11);
    losses.push_back(m.forward_backward(tokens, targets, B, T, 5));
    std::vector<float> all;
    for (const ParamSpec& p : m.params()) {
      auto g = m.grad(p.name);
      all.insert(all.end(), g.begin(), g.end());
    }
    grads.push_back(std::move(all));
  }
  omp_set_num_threads(2);
  EXPECT_EQ(std::memcmp(&losses[0], &losses[1], sizeof(float)), 0);
  ASSERT_EQ(grads[0].size(), grads[1].size());
  EXPECT_TRUE(bitwise_equal(grads[0].data(), grads[1].data(), grads[0].size()));
}

INSTANTIATE_TEST_SUITE_P(Presets, PresetTest,
                         ::testing::Values("fp32", "bf16", "mxfp8", "fp8-tensor", "nvfp4", "mxfp4"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (char& ch : n) if (ch == '-') ch = '_';
                           return n;
                         });

// Row-local presets: a sequence's logits do not depend on the rest of the batch. (Per-tensor
// activation scales — fp8-tensor, and NVFP4's per-tensor S_enc — read the whole batch's amax,
// so those presets are batch-dependent by construction; see docs/precision.md.)
class BatchInvarianceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvarianceTest, ASequencesLogitsDoNotDependOnTheBatch) {
  Model m(small_config(), PrecisionPolicy::preset(GetParam()));
  m.init_random(3);
  const int64_t T = 24, V = 259;
  const auto batch = random_tokens(5 * T, 9);
  std::vector<float> all(static_cast<size_t>(5 * T * V));
  m.forward(batch, 5, T, all);
  for (int64_t b : {0, 3, 4}) {
    std::vector<int32_t> one(batch.begin() + b * T, batch.begin() + (b + 1) * T);
    std::vector<float> logits(static_cast<size_t>(T * V));
    m.forward(one, 1, T, logits);
    EXPECT_TRUE(bitwise_equal(logits.data(), all.data() + b * T * V, logits.size()))
        << GetParam() << " sequence " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(RowLocalPresets, BatchInvarianceTest,
                         ::testing::Values("fp32", "bf16", "mxfp8", "mxfp4"));

TEST(Model, CausalityEarlierLogitsIgnoreLaterTokens) {
  Model m(small_config(), PrecisionPolicy::preset("fp32"));
  m.init_random(4);
  const int64_t T = 16, V = 259;
  auto tokens = random_tokens(T, 5);
  std::vector<float> a(static_cast<size_t>(T * V)), b(a.size());
  m.forward(tokens, 1, T, a);
  tokens[10] = (tokens[10] + 1) % 259;
  m.forward(tokens, 1, T, b);
  EXPECT_TRUE(bitwise_equal(a.data(), b.data(), static_cast<size_t>(10 * V)));
  EXPECT_FALSE(bitwise_equal(a.data() + 10 * V, b.data() + 10 * V, static_cast<size_t>(V)));
}

TEST(Model, LmHeadInputTimesTheHeadIsTheLogitsBitForBit) {
  // forward_lm_head_input's rows are what the fp32 lm_head multiplies: tensor::gemm of them by the
  // head gives forward()'s logits exactly (the GPU contract's premise, docs/cuda.md).
  for (bool tied : {true, false}) {
    Model m(small_config(true, tied), PrecisionPolicy::preset("fp32"));
    m.init_random(21);
    const int64_t B = 2, T = 9, V = 259, C = 64;
    const auto tokens = random_tokens(B * T, 22);
    std::vector<float> logits(static_cast<size_t>(B * T * V)), hidden(static_cast<size_t>(B * T * C));
    m.forward(tokens, B, T, logits);
    m.forward_lm_head_input(tokens, B, T, hidden);
    const auto head = std::as_const(m).param(tied ? "model.embed_tokens.weight" : "lm_head.weight");
    std::vector<float> z(logits.size());
    tensor::gemm(tensor::Trans::no, tensor::Trans::yes, B * T, V, C, hidden.data(), C, head.data(), C, z.data(), V);
    EXPECT_TRUE(bitwise_equal(z.data(), logits.data(), z.size())) << (tied ? "tied" : "untied");
  }
  Model m(small_config(), PrecisionPolicy::preset("fp32"));
  std::vector<float> wrong(10);
  EXPECT_THROW(m.forward_lm_head_input(random_tokens(4, 1), 1, 4, wrong), InputError);
}

TEST(Model, TiedHeadSharesTheEmbeddingAndItsGradient) {
  const ModelConfig tied = small_config(true, true);
  EXPECT_EQ(parameter_specs(tied).back().name, "model.norm.weight");
  const ModelConfig untied = small_config(true, false);
  EXPECT_EQ(parameter_specs(untied).back().name, "lm_head.weight");
  // An untied model whose head equals the embedding gives the tied model's loss, and the tied
  // gradient is the sum of the untied embedding and head gradients.
  Model t(tied), u(untied);
  t.init_random(8);
  for (const ParamSpec& p : t.params()) {
    auto src = t.param(p.name);
    std::copy(src.begin(), src.end(), u.param(p.name).begin());
  }
  auto emb = t.param("model.embed_tokens.weight");
  std::copy(emb.begin(), emb.end(), u.param("lm_head.weight").begin());
  u.weights_changed();
  const int64_t B = 1, T = 12;
  const auto tokens = random_tokens(T, 6);
  const auto targets = shifted_targets(tokens, B, T);
  const float lt = t.forward_backward(tokens, targets, B, T);
  const float lu = u.forward_backward(tokens, targets, B, T);
  EXPECT_EQ(lt, lu);
  auto gt = t.grad("model.embed_tokens.weight");
  auto ge = u.grad("model.embed_tokens.weight");
  auto gh = u.grad("lm_head.weight");
  double worst = 0;
  for (size_t i = 0; i < gt.size(); ++i)
    worst = std::max(worst, std::abs(double(gt[i]) - (double(ge[i]) + double(gh[i]))));
  EXPECT_LT(worst, 1e-7);
}

TEST(Model, InitIsSeededAndThreadIndependent) {
  omp_set_num_threads(1);
  Model a(small_config());
  a.init_random(42);
  omp_set_num_threads(2);
  Model b(small_config());
  b.init_random(42);
  Model c(small_config());
  c.init_random(43);
  auto wa = a.param("model.layers.0.mlp.up_proj.weight");
  auto wb = b.param("model.layers.0.mlp.up_proj.weight");
  auto wc = c.param("model.layers.0.mlp.up_proj.weight");
  EXPECT_TRUE(bitwise_equal(wa.data(), wb.data(), wa.size()));
  EXPECT_FALSE(bitwise_equal(wa.data(), wc.data(), wa.size()));
  double sum = 0, sum2 = 0;
  for (float x : wa) {
    sum += x;
    sum2 += double(x) * x;
  }
  const double n = static_cast<double>(wa.size());
  EXPECT_NEAR(sum / n, 0.0, 0.002);               // 6144 samples: sd of the mean 0.00026
  EXPECT_NEAR(std::sqrt(sum2 / n), 0.02, 0.001);  // sd of the sd estimate ~0.0002
}

TEST(Model, BadInputsAreErrors) {
  Model m(small_config());
  m.init_random(1);
  std::vector<float> logits(259 * 4);
  EXPECT_THROW(m.forward(std::vector<int32_t>{1, 2, 300, 4}, 1, 4, logits), InputError);
  EXPECT_THROW(m.forward(std::vector<int32_t>{1, 2, 3}, 1, 4, logits), InputError);
  std::vector<int32_t> long_seq(65, 1);
  std::vector<float> big(65 * 259);
  EXPECT_THROW(m.forward(long_seq, 1, 65, big), InputError);
  EXPECT_THROW(m.param("model.layers.9.mlp.up_proj.weight"), InputError);
  EXPECT_THROW(m.forward_backward(std::vector<int32_t>{1, 2}, std::vector<int32_t>{-1, -1}, 1, 2),
               InputError);
}

}  // namespace
}  // namespace concord::model
