// Model files: load a model from a Hugging Face folder (config.json + model.safetensors or a
// sharded model.safetensors.index.json, tokenizer.json, tokenizer_config.json) or a GGUF file
// (llama, qwen2, qwen3 architectures; F32/F16/BF16/Q8_0/MXFP4 tensors), and export a model to
// either, with its tokenizer, so that llama.cpp and HF-compatible tools run what concord trained.
//
// GGUF ↔ HF names: token_embd ↔ model.embed_tokens, blk.N.attn_norm ↔ input_layernorm,
// blk.N.attn_{q,k,v,output} ↔ self_attn.{q,k,v,o}_proj, blk.N.attn_{q,k}_norm ↔ q_norm/k_norm,
// blk.N.ffn_norm ↔ post_attention_layernorm, blk.N.ffn_{gate,up,down} ↔ mlp.*_proj,
// output_norm ↔ model.norm, output ↔ lm_head. llama.cpp permutes the rows of llama's q/k
// projections for its interleaved RoPE; the loader undoes that and the exporter applies it.
//
// Every file is validated as it is read: shapes against the config, dtypes, missing or unknown
// tensors, shard indexes that name missing files or tensors; errors name the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "concord/io/tokenizer.h"
#include "concord/model/config.h"
#include "concord/model/model.h"
#include "concord/model/policy.h"

namespace concord::model {

// What a model folder or GGUF file says besides its weights.
struct ModelSource {
  std::filesystem::path path;
  std::string format;  // "safetensors" or "gguf"
  ModelConfig config;
  // tokenizer.json of the folder or the GGUF's tokenizer.ggml.*; for a folder without one whose
  // vocabulary is the training byte tokenizer's (259), io::Tokenizer::byte_level(...).
  std::optional<io::Tokenizer> tokenizer;
  std::string chat_template;             // tokenizer_config.json / tokenizer.chat_template; "" if none
  std::vector<int32_t> stop_token_ids;   // eos_token_id(s) of config/generation_config/GGUF
};

// Reads the config, tokenizer and metadata of `path` (a folder or a .gguf file), no weights.
ModelSource inspect_model(const std::filesystem::path& path);

struct LoadedModel {
  ModelSource source;
  Model model;
};
// Loads `path` into a Model running `policy`; weights are quantized once, on first use.
LoadedModel load_model(const std::filesystem::path& path,
                       PrecisionPolicy policy = PrecisionPolicy::preset("fp32"));

enum class ExportFormat { safetensors, gguf };
struct ExportOptions {
  ExportFormat format = ExportFormat::safetensors;
  // safetensors: "f32", "bf16", "f16"; gguf: "f32", "f16", "bf16", "q8_0", "mxfp4" (matrices;
  // 1-D norm weights stay f32 as llama.cpp expects).
  std::string dtype = "f32";
  std::optional<io::Tokenizer> tokenizer;
  std::string chat_template;
  std::vector<int32_t> stop_token_ids;
};
// safetensors: `out` is a folder (config.json, model.safetensors, tokenizer.json,
// tokenizer_config.json, generation_config.json); gguf: `out` is a file. Written atomically.
void export_model(const Model& model, const std::filesystem::path& out, const ExportOptions& options);

}  // namespace concord::model
