// Internals of the byte-level BPE tokenizer (tokenizer.h), shared by its source files:
// Unicode helpers (tokenizer_unicode.cpp), the split-regex matchers (tokenizer_split.cpp),
// tokenizer.json / GGUF-vocabulary conversion (tokenizer_json.cpp) and encode/decode
// (tokenizer.cpp). Not a public header.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "concord/io/tokenizer.h"
#include "concord/io/utf8.h"

namespace concord::io::tokenizer_detail {

// --- Unicode (tokenizer_unicode.cpp) ---------------------------------------------------------

using io::invalid_utf8_offset;  // io/utf8.h
using io::utf8_lossy;
// The code point at text[pos], advancing pos; text must be valid UTF-8.
char32_t next_code_point(std::string_view text, size_t& pos);
void append_utf8(std::string& out, char32_t cp);

// Character classes the split patterns need, as bit flags.
enum CharFlag : uint8_t {
  kLetter = 1,      // \p{L}: Lu Ll Lt Lm Lo
  kNumber = 2,      // \p{N}: Nd Nl No
  kWhitespace = 4,  // \s: the Unicode White_Space property
  kNewline = 8,     // \r or \n
};
uint8_t char_flags(char32_t cp);
// Rust regex's Unicode \w (HF's single_word test): Alphabetic, marks, Nd, Pc, Join_Control.
bool is_word_char(char32_t cp);
// Rust's char::is_whitespace (White_Space), for lstrip/rstrip.
inline bool is_white_space(char32_t cp) { return (char_flags(cp) & kWhitespace) != 0; }

// NFC (utf8proc); text must be valid UTF-8.
std::string nfc(std::string_view text);

// GPT-2's bytes_to_unicode: byte b <-> one code point, as UTF-8 text.
const std::array<std::string, 256>& byte_to_char();
// The byte a byte-level code point stands for, or -1.
int char_to_byte(char32_t cp);
// `bytes` written in byte-level characters.
std::string to_byte_level(std::string_view bytes);

// --- split patterns (tokenizer_split.cpp) ----------------------------------------------------

enum class SplitPattern : uint8_t {
  kNone,    // no split (ByteLevel with use_regex false alone)
  kGpt2,    // GPT-2 / ByteLevel use_regex
  kQwen2,   // Qwen2 / Qwen3
  kLlama3,  // Llama 3: Qwen2's with \p{N}{1,3}
  kDigitsGpt2,  // SmolLM / StarCoder: each \p{N} alone (HF Digits individual_digits), then GPT-2
};
std::string_view split_pattern_regex(SplitPattern pattern);  // exact tokenizer.json string
bool split_pattern_from_regex(std::string_view regex, SplitPattern& pattern);
// tokenizer.ggml.pre names (llama.cpp's llama-vocab.cpp): the split and what goes with it.
struct GgufPreTokenizer {
  std::string_view name;
  SplitPattern split;
  bool nfc;            // the family's tokenizer.json normalizes to NFC (Qwen2)
  bool ignore_merges;  // llama.cpp's and the family's tokenizer.json ignore_merges (Llama 3)
  bool add_bos;        // llama.cpp's add_bos when tokenizer.ggml.add_bos_token is absent
};
std::span<const GgufPreTokenizer> gguf_pre_tokenizers();
const GgufPreTokenizer* gguf_pre_tokenizer(std::string_view name);  // nullptr: not supported
std::string_view split_pattern_gguf_name(SplitPattern pattern);     // the name concord writes

// Appends the pieces of `text` (byte ranges [begin, end), covering it in order) as HF's
// Split(pattern, Isolated) produces them. Reuses `scratch` across calls.
struct SplitScratch {
  std::vector<char32_t> cps;
  std::vector<uint8_t> flags;
  std::vector<uint32_t> offsets;  // byte offset of each code point, plus the end
};
void split_text(SplitPattern pattern, std::string_view text, SplitScratch& scratch,
                std::vector<std::pair<uint32_t, uint32_t>>& pieces);

// --- the tokenizer's state ------------------------------------------------------------------

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// A flat open-addressing map from a token pair to its merge (rank, merged id).
class MergeMap {
 public:
  struct Merge {
    uint32_t rank;
    int32_t id;
  };
  void reserve(size_t n);
  void insert_or_assign(int32_t left, int32_t right, Merge merge);
  const Merge* find(int32_t left, int32_t right) const;

 private:
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  struct Slot {
    uint64_t key = ~uint64_t{0};
    Merge merge{0, -1};
  };
  std::vector<Slot> slots_;
  size_t used_ = 0;
};

}  // namespace concord::io::tokenizer_detail

namespace concord::io {

struct Tokenizer::Impl {
  std::string label;  // for error messages

  // Pipeline.
  bool nfc = false;
  tokenizer_detail::SplitPattern split = tokenizer_detail::SplitPattern::kNone;
  bool ignore_merges = false;

  // Vocabulary: ids [0, model_vocab_size) are the BPE model's; added tokens may sit among them
  // (also in the model vocabulary, as GPT-2's <|endoftext|>) or follow them.
  std::vector<std::string> tokens;  // by id: tokenizer.json string (content for added tokens)
  int32_t model_vocab_size = 0;
  std::unordered_map<std::string, int32_t> model_ids;  // model vocabulary: string -> id
  std::vector<tokenizer_detail::AddedToken> added;      // sorted by id
  std::vector<int32_t> added_index;                     // by id: index in `added`, or -1
  std::unordered_map<std::string, int32_t> added_ids;   // content -> id

  // BPE.
  std::vector<std::pair<std::string, std::string>> merges;  // by rank, as in the file
  tokenizer_detail::MergeMap merge_map;
  std::array<int32_t, 256> byte_ids{};  // model id of each byte's byte-level character

  // GGUF's special ids and flags (BpeVocabulary); tokenizer.json carries none of them.
  std::optional<int32_t> bos_id, eos_id, unk_id, pad_id;
  bool add_bos = false, add_eos = false;

  // Decoding: the bytes HF's ByteLevel decoder makes of each token.
  std::vector<std::string> decoded;

  // Derived tables; call after filling the fields above. Throws InputError.
  void finish();

  // Matching of added tokens (HF's AddedVocabulary): by first byte, longest first.
  std::array<std::vector<int32_t>, 256> added_by_first_byte_raw;   // non-normalized tokens
  std::array<std::vector<int32_t>, 256> added_by_first_byte_norm;  // normalized tokens
  std::vector<std::string> added_match_norm;  // by index in `added`: the normalized content
};

}  // namespace concord::io
