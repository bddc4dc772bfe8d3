// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json (GPT-2 / Qwen2 / Qwen3 /
// Llama-3 style), encoding and decoding exactly as HF `tokenizers` does: added and special
// tokens matched first, then the normalizer (NFC or none), the split regex, the byte-level
// mapping, and BPE merges by rank; decoding maps the byte-level characters back to bytes.
//
// The same vocabulary comes in three forms: tokenizer.json (HF), GGUF metadata
// (tokenizer.ggml.*, see BpeVocabulary) and, for from-scratch models, the byte tokenizer of
// training (ids 0..255 = bytes, then special tokens), expressible as a merge-free byte-level BPE
// so that every tool can load it.
//
// What load/from_json rejects (InputError "[tokenizer] <path>: <problem>"): invalid JSON, a model
// other than BPE, a normalizer, pre-tokenizer or decoder concord does not implement exactly (named
// in the message), a split regex that is not one of the known byte-level patterns, vocabulary ids
// that are duplicated, negative or leave holes, merges naming unknown tokens. from_vocabulary
// rejects the same for GGUF metadata, naming the tokenizer.ggml.* key: token types of another
// length or of a type other than normal/control/user-defined, duplicated, empty or non-UTF-8
// tokens, merges naming tokens outside the vocabulary, special ids outside it, and pre-tokenizer
// names it does not implement.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace concord::io {

class GgufFile;  // gguf.h

// A vocabulary in GGUF's terms (tokenizer.ggml.model = "gpt2"). `pre` is one of the names of
// llama.cpp's llama-vocab.cpp that concord implements (docs/tokenizer.md lists them): the Qwen2
// split (qwen2, deepseek-r1-qwen), Llama 3's (llama-bpe, llama3, llama-v3, falcon3, falcon-h1,
// pixtral; dbrx, smaug-bpe without ignore_merges), GPT-2's (gpt-2, phi-2, mpt, olmo, jais; and
// gpt2, which concord wrote before), each digit alone then GPT-2's (smollm, starcoder, refact,
// command-r, codeshell, exaone, minerva-7b), and default (no split; only without merges).
struct BpeVocabulary {
  std::vector<std::string> tokens;   // by id, in byte-level characters (as in tokenizer.json)
  std::vector<int32_t> token_types;  // by id: 1 normal, 3 control (special), 4 user-defined
  std::vector<std::string> merges;   // "left right", by rank
  std::string pre = "qwen2";         // tokenizer.ggml.pre
  std::optional<bool> nfc;           // NFC normalizer; unset: the pre-tokenizer family's (Qwen2)
  // tokenizer.ggml.{bos,eos,unknown,padding}_token_id and add_bos_token / add_eos_token.
  std::optional<int32_t> bos_id, eos_id, unk_id, pad_id;
  std::optional<bool> add_bos;  // unset: llama.cpp's default for `pre` (true for Llama 3's)
  bool add_eos = false;
};

class Tokenizer {
 public:
  static Tokenizer load(const std::filesystem::path& tokenizer_json);
  static Tokenizer from_json(std::string_view json_text, std::string label);
  static Tokenizer from_vocabulary(const BpeVocabulary& vocab, std::string label);
  // The training byte tokenizer as a byte-level BPE: ids 0..255 are the bytes, then
  // `special_tokens` in order (ByteTokenizer: "<|bos|>", "<|eos|>", "<|pad|>").
  static Tokenizer byte_level(const std::vector<std::string>& special_tokens);

  Tokenizer(const Tokenizer&);
  Tokenizer& operator=(const Tokenizer&);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // HF tokenizers' encode(text, add_special_tokens=False): special and added tokens written in
  // the text are recognised when `parse_special` (HF's default).
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // What a model is given for `text`, as llama.cpp's tokenize(text, add_special=true,
  // parse_special=true): encode(text), then the BOS id first when the vocabulary's add_bos is
  // set and the text does not already begin with it (a chat template that writes the BOS
  // itself, as Llama 3's, gives one, not two), and the EOS id last when add_eos is set.
  std::vector<int32_t> encode_for_model(std::string_view text) const;
  // HF's decode(ids, skip_special_tokens=skip_special); InputError for ids outside the vocabulary.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The raw bytes one token decodes to (streaming output; may be part of a UTF-8 character).
  std::string token_bytes(int32_t id) const;

  int32_t vocab_size() const;  // largest id + 1 (base vocabulary and added tokens)
  std::optional<int32_t> token_id(std::string_view token) const;  // by its tokenizer.json string
  bool is_special(int32_t id) const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;

  // A tokenizer.json that HF tokenizers loads and that encodes as this one does.
  std::string to_json() const;
  BpeVocabulary vocabulary() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The tokenizer of a GGUF file's tokenizer.ggml.* metadata (tokenizer_gguf.cpp): nullopt when
// tokenizer.ggml.model is absent, "none" or "no_vocab"; InputError "[tokenizer] <file>: <key>
// ..." for a model other than "gpt2", keys of the wrong type or length, special ids outside
// the vocabulary, and whatever from_vocabulary rejects.
std::optional<Tokenizer> tokenizer_from_gguf(const GgufFile& file);

}  // namespace concord::io
