// Model files, internal: what files.cpp (dispatch, shared rules), files_hf.cpp (HF folders) and
// files_gguf.cpp (GGUF files) share. Not installed; include only from those files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "concord/io/gguf.h"
#include "concord/model/files.h"
#include "concord/numerics/check.h"

namespace concord::model::files_detail {

// "[model] <path>: <problem>", one line.
[[noreturn]] inline void fail(const std::filesystem::path& path, std::string_view problem) {
  throw InputError(fmt::format("[model] {}: {}", path.string(), problem));
}

// The special tokens of the training byte tokenizer (ids 256, 257, 258).
inline const std::vector<std::string>& byte_special_tokens() {
  static const std::vector<std::string> tokens = {"<|bos|>", "<|eos|>", "<|pad|>"};
  return tokens;
}
inline constexpr int64_t kByteVocabulary = 259;

// Appends the ids of `ids` not yet in `out`, in order.
void append_unique(std::vector<int32_t>& out, const std::vector<int64_t>& ids,
                   const std::filesystem::path& source, std::string_view what);

// Checks that a source's tokenizer and stop ids fit the config's vocabulary.
void check_source(const ModelSource& source);

// HF folder (files_hf.cpp).
ModelSource inspect_hf_folder(const std::filesystem::path& dir);
void read_hf_weights(const std::filesystem::path& dir, Model& model);
void write_hf_folder(const Model& model, const std::filesystem::path& out,
                     const ExportOptions& options);

// GGUF (files_gguf.cpp).
ModelSource inspect_gguf(const io::GgufFile& file);
// The file's Q4_0 / Q4_1 / Q8_0 matrices in their blocks (llama's q/k rows un-permuted), by HF
// name, for WeightStorage::native.
// paged_experts: the experts as tensor::QuantWeight::unloaded placeholders (their type and shape;
// an expert of another type is an error), for an ExpertPager to read (load_model_paged).
StoredWeights gguf_stored_weights(const io::GgufFile& file, const ModelConfig& config, bool paged_experts = false);
// Reads every parameter that is not stored in `model` (stored ones are checked, not read).
void read_gguf_weights(const io::GgufFile& file, Model& model);
void write_gguf_file(const Model& model, const std::filesystem::path& out,
                     const ExportOptions& options);

}  // namespace concord::model::files_detail
