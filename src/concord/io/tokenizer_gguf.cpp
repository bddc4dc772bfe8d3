// A GGUF file's tokenizer.ggml.* metadata -> Tokenizer (tokenizer.h): the keys read, checked
// and named in every error; the vocabulary itself is checked by Tokenizer::from_vocabulary.
#include <optional>
#include <string>

#include <fmt/format.h>

#include "concord/io/gguf.h"
#include "concord/io/tokenizer.h"
#include "concord/numerics/check.h"

namespace concord::io {
namespace {

[[noreturn]] void fail(const GgufFile& f, const std::string& problem) {
  throw InputError(fmt::format("[tokenizer] {}: {}", f.path(), problem));
}

}  // namespace

// Trailing "[PAD{i}]" tokens of type UNUSED (5), which convert_hf_to_gguf.py adds to fill a
// vocabulary larger than the tokenizer, are dropped.
std::optional<Tokenizer> tokenizer_from_gguf(const GgufFile& f) {
  const GgufValue* model = f.find_value("tokenizer.ggml.model");
  if (model == nullptr) return std::nullopt;
  const std::string& kind = f.get_string("tokenizer.ggml.model");
  if (kind == "none" || kind == "no_vocab") return std::nullopt;
  if (kind != "gpt2")
    fail(f, fmt::format("tokenizer.ggml.model '{}' is not supported (only byte-level BPE, 'gpt2')",
                        kind));
  const GgufValue* tokens = f.find_value("tokenizer.ggml.tokens");
  if (tokens == nullptr || !tokens->is_array() || tokens->array_type != GgufType::string)
    fail(f, "tokenizer.ggml.tokens must be an array of strings");
  const GgufValue* merges = f.find_value("tokenizer.ggml.merges");
  if (merges == nullptr || !merges->is_array() ||
      (merges->size() > 0 && merges->array_type != GgufType::string))
    fail(f, "tokenizer.ggml.merges must be an array of strings (llama.cpp requires it)");
  BpeVocabulary v;
  v.tokens = tokens->strings;
  v.merges = merges->strings;
  if (const GgufValue* types = f.find_value("tokenizer.ggml.token_type")) {
    if (!types->is_array() || types->ints.size() != v.tokens.size())
      fail(f, fmt::format("tokenizer.ggml.token_type must be an integer array of {} entries (one "
                          "per tokenizer.ggml.tokens entry; it has {})",
                          v.tokens.size(), types->size()));
    for (int64_t t : types->ints) v.token_types.push_back(static_cast<int32_t>(t));
  } else {
    v.token_types.assign(v.tokens.size(), 1);
  }
  while (!v.tokens.empty() && v.token_types.back() == 5 &&
         v.tokens.back() == fmt::format("[PAD{}]", v.tokens.size() - 1)) {
    v.tokens.pop_back();
    v.token_types.pop_back();
  }
  v.pre = f.find_value("tokenizer.ggml.pre") ? f.get_string("tokenizer.ggml.pre") : "default";
  // Special ids, checked here where the value may not fit an int32; from_vocabulary checks the
  // range. llama.cpp and transformers both ignore add_space_prefix for a byte-level BPE.
  auto special_id = [&](const char* key, std::optional<int32_t>& out) {
    if (!f.find_value(key)) return;
    const int64_t id = f.get_int(key);
    if (id < 0 || id >= static_cast<int64_t>(v.tokens.size()))
      fail(f, fmt::format("{} is {}, outside the vocabulary (0..{})", key, id,
                          static_cast<int64_t>(v.tokens.size()) - 1));
    out = static_cast<int32_t>(id);
  };
  special_id("tokenizer.ggml.bos_token_id", v.bos_id);
  special_id("tokenizer.ggml.eos_token_id", v.eos_id);
  special_id("tokenizer.ggml.unknown_token_id", v.unk_id);
  special_id("tokenizer.ggml.padding_token_id", v.pad_id);
  auto flag = [&](const char* key, std::optional<bool>& out) {
    const GgufValue* value = f.find_value(key);
    if (value == nullptr) return;
    if (value->is_array() || value->type != GgufType::boolean || value->ints.size() != 1)
      fail(f, fmt::format("{} must be a bool", key));
    out = value->ints[0] != 0;
  };
  flag("tokenizer.ggml.add_bos_token", v.add_bos);
  std::optional<bool> add_eos;
  flag("tokenizer.ggml.add_eos_token", add_eos);
  v.add_eos = add_eos.value_or(false);
  return Tokenizer::from_vocabulary(v, f.path());
}

}  // namespace concord::io
