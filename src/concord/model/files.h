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
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
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
// How load_model holds a GGUF's quantized matrices.
enum class WeightStorage : uint8_t {
  fp32,    // dequantize every tensor to fp32 values (training, weight sync, precision presets)
  native,  // keep Q4_0 / Q4_1 / Q8_0 matrices in their blocks, served by tensor/quant_gemm.h's
           // W4A8 / W8A8 kernels with no fp32 copy; tensors of other types are dequantized
};
// Loads `path` into a Model running `policy`; weights are quantized once, on first use (or by
// Model::prepare_weights). An HF folder has no quantized tensors: `storage` changes nothing.
LoadedModel load_model(const std::filesystem::path& path,
                       PrecisionPolicy policy = PrecisionPolicy::preset("fp32"),
                       WeightStorage storage = WeightStorage::fp32);
// The policy names the CLI takes: "native" (the file's own precision: WeightStorage::native,
// every other operand fp32; the policy is named "native"), or a preset / policy JSON file
// (WeightStorage::fp32 under PrecisionPolicy::from_name_or_file).
LoadedModel load_model(const std::filesystem::path& path, std::string_view policy_name_or_file);

// Experts under a memory cap (model/expert_pager.h; docs/serve.md): a GGUF Qwen3-MoE whose experts
// are Q4_0 / Q4_1 / Q8_0 blocks, loaded as load_model(path, "native") loads it except that its
// experts stay in the file (read with pread when a layer routes to them), and at most the cap of
// their packed bytes is held. Outputs are the uncapped model's bit for bit.
struct ExpertPaging {
  int64_t cap_bytes = 0;  // > 0: the cap in bytes
  double cap_share = 0;   // else: this share (0, 1] of every expert's packed bytes
  bool prefetch = true;   // read the layer's missing and the next layer's predicted experts ahead
  // The pinned hot set: tokens per expert of MoE applications (application -> counts, as
  // `concord generate --router-stats` writes them); the experts with the most tokens, across
  // layers, pinned while they fit in pin_share of the cap. Empty: nothing pinned.
  std::map<int64_t, std::vector<double>> pin_loads;
  double pin_share = 0.5;
};
LoadedModel load_model_paged(const std::filesystem::path& path, const ExpertPaging& paging);

enum class ExportFormat { safetensors, gguf };
struct ExportOptions {
  ExportFormat format = ExportFormat::safetensors;
  // safetensors: "f32", "bf16", "f16"; gguf: "f32", "f16", "bf16", "q4_0", "q4_1", "q8_0", "mxfp4" (matrices;
  // 1-D norm weights stay f32 as llama.cpp expects), "tq2_0" (a binary-weight model: its +-alpha
  // weights as TQ2_0, loaded back natively as packed signs; its other matrices f32).
  std::string dtype = "f32";
  std::optional<io::Tokenizer> tokenizer;
  std::string chat_template;
  std::vector<int32_t> stop_token_ids;
  // safetensors: entries added to the file's __metadata__ beside {"format": "pt"} (e.g. the
  // trainer's step and export rule).
  std::map<std::string, std::string> metadata;
};
// safetensors: `out` is a folder (config.json, model.safetensors, tokenizer.json,
// tokenizer_config.json, generation_config.json); gguf: `out` is a file. Written atomically.
void export_model(const Model& model, const std::filesystem::path& out, const ExportOptions& options);

// --- Building blocks, public for tests and tools ------------------------------------------

// Tensors an HF checkpoint may carry that concord ignores by design, as they hold nothing the
// config does not imply: "model.layers.{i}.self_attn.rotary_emb.inv_freq" (older checkpoints
// store RoPE's inverse frequencies). Besides these, a tied model's "lm_head.weight" is accepted
// when it equals "model.embed_tokens.weight" bit for bit; every other unknown tensor is an error.
bool is_ignored_hf_tensor(std::string_view name);

// The GGUF name of an HF parameter name ("model.layers.3.mlp.up_proj.weight" ->
// "blk.3.ffn_up.weight"), and back; nullopt for names outside the map.
std::optional<std::string> gguf_tensor_name(std::string_view hf_name);
std::optional<std::string> hf_tensor_name(std::string_view gguf_name);
// The GGUF architecture of a config ("llama", "qwen2", "qwen3") and back.
std::string gguf_architecture(const ModelConfig& config);

// llama.cpp's row order for llama's q/k projections (convert_hf_to_gguf.py, LlamaModel.permute:
// w.reshape(heads, 2, D/2, cols).swapaxes(1, 2)): within each head, HF row j*D/2 + i becomes
// row 2i + j, turning HF's rotate_half RoPE pairs (i, i + D/2) into llama.cpp's adjacent pairs.
// `w` is (heads*D, cols) row-major (cols = 1 for a bias); unpermute is the inverse.
std::vector<float> llama_permute_rows(std::span<const float> w, int64_t heads, int64_t cols);
std::vector<float> llama_unpermute_rows(std::span<const float> w, int64_t heads, int64_t cols);

}  // namespace concord::model
