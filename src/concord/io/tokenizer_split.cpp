// The split regexes of byte-level BPE tokenizers, as hand-written matchers over code points.
//
// Each matcher returns the end of the match at position i the way a backtracking engine
// (HF uses Oniguruma) finds it: alternatives tried left to right, quantifiers greedy, giving
// back only where a later part of the same alternative fails. None of the patterns can match
// the empty string, and every code point starts a match of one alternative, so the pieces
// cover the text.
#include "concord/io/tokenizer_impl.h"

namespace concord::io::tokenizer_detail {
namespace {

constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Text {
  const char32_t* cp;
  const uint8_t* flags;
  size_t n;
  bool has(size_t k, uint8_t f) const { return k < n && (flags[k] & f) != 0; }
  // [^\s\p{L}\p{N}]
  bool other(size_t k) const { return k < n && (flags[k] & (kWhitespace | kLetter | kNumber)) == 0; }
  size_t run(size_t k, uint8_t f) const {
    while (k < n && (flags[k] & f) != 0) ++k;
    return k;
  }
  size_t run_other(size_t k) const {
    while (other(k)) ++k;
    return k;
  }
};

// The contractions after an apostrophe at i; `fold` makes them case-insensitive the way
// Oniguruma's (?i) does: simple Unicode case folding, where 's' also matches U+017F (long s).
size_t match_contraction(const Text& t, size_t i, bool fold) {
  if (t.cp[i] != '\'' || i + 1 >= t.n) return 0;
  auto letter = [&](size_t k) -> char32_t {
    if (k >= t.n) return 0;
    const char32_t c = t.cp[k];
    if (!fold) return c;
    if (c >= 'A' && c <= 'Z') return c + ('a' - 'A');
    if (c == 0x17F) return 's';
    return c;
  };
  const char32_t a = letter(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  const char32_t b = letter(i + 2);
  if ((a == 'r' || a == 'v') && b == 'e') return i + 3;
  if (a == 'l' && b == 'l') return i + 3;
  return 0;
}

// \s+(?!\S) then \s+, for a whitespace run [i, e).
size_t match_trailing_space(const Text& t, size_t i, size_t e) {
  if (e == t.n) return e;     // (?!\S) holds at the end of the text
  if (e - i >= 2) return e - 1;  // give one back: the lookahead sees whitespace
  return e;                   // \s+
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const Text& t, size_t i) {
  if (size_t e = match_contraction(t, i, false)) return e;
  const size_t j = t.cp[i] == ' ' ? i + 1 : i;  // optional space
  if (t.has(j, kLetter)) return t.run(j, kLetter);
  if (t.has(j, kNumber)) return t.run(j, kNumber);
  if (t.other(j)) return t.run_other(j);
  // Here t.cp[i] is whitespace (a space followed by whitespace or the end).
  return match_trailing_space(t, i, t.run(i, kWhitespace));
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_qwen2(const Text& t, size_t i, size_t max_digits) {
  if (size_t e = match_contraction(t, i, true)) return e;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (t.has(i, kLetter)) return t.run(i, kLetter);
  if (!t.has(i, kLetter | kNumber | kNewline) && t.has(i + 1, kLetter)) return t.run(i + 1, kLetter);
  if (t.has(i, kNumber)) {
    size_t e = i + 1;
    while (e < i + max_digits && t.has(e, kNumber)) ++e;
    return e;
  }
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  const size_t j = (t.cp[i] == ' ' && t.other(i + 1)) ? i + 1 : i;
  if (t.other(j)) return t.run(t.run_other(j), kNewline);
  // Whitespace from here on. \s*[\r\n]+: the run up to its last \r or \n.
  const size_t e = t.run(i, kWhitespace);
  for (size_t k = e; k > i; --k) {
    if (t.flags[k - 1] & kNewline) return k;
  }
  return match_trailing_space(t, i, e);
}

// One row per tokenizer.ggml.pre name concord reads: the split llama.cpp's llama-vocab.cpp
// applies for it, then what HF's tokenizer.json of that family adds (Qwen2's NFC normalizer;
// Llama 3's ignore_merges, which llama.cpp sets for the same names) and llama.cpp's add_bos
// default. The first row of each pattern is the name concord writes.
constexpr GgufPreTokenizer kGgufPreTokenizers[] = {
    {"default", SplitPattern::kNone, false, false, false},  // only without merges
    {"qwen2", SplitPattern::kQwen2, true, false, false},
    {"deepseek-r1-qwen", SplitPattern::kQwen2, true, false, false},  // Qwen2.5's tokenizer
    {"llama-bpe", SplitPattern::kLlama3, false, true, true},
    {"llama3", SplitPattern::kLlama3, false, true, true},
    {"llama-v3", SplitPattern::kLlama3, false, true, true},
    {"falcon3", SplitPattern::kLlama3, false, true, true},
    {"falcon-h1", SplitPattern::kLlama3, false, true, true},
    {"pixtral", SplitPattern::kLlama3, false, true, true},
    {"dbrx", SplitPattern::kLlama3, false, false, false},
    {"smaug-bpe", SplitPattern::kLlama3, false, false, false},
    {"gpt-2", SplitPattern::kGpt2, false, false, false},
    {"gpt2", SplitPattern::kGpt2, false, false, false},  // concord wrote this before issue 15
    {"phi-2", SplitPattern::kGpt2, false, false, false},
    {"mpt", SplitPattern::kGpt2, false, false, false},
    {"olmo", SplitPattern::kGpt2, false, false, false},
    {"jais", SplitPattern::kGpt2, false, false, false},
    {"smollm", SplitPattern::kDigitsGpt2, false, false, false},
    {"starcoder", SplitPattern::kDigitsGpt2, false, false, false},
    {"refact", SplitPattern::kDigitsGpt2, false, false, false},
    {"command-r", SplitPattern::kDigitsGpt2, false, false, false},
    {"codeshell", SplitPattern::kDigitsGpt2, false, false, false},
    {"exaone", SplitPattern::kDigitsGpt2, false, false, false},
    {"minerva-7b", SplitPattern::kDigitsGpt2, false, false, false},
};

}  // namespace

std::string_view split_pattern_regex(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2:
    case SplitPattern::kDigitsGpt2: return kGpt2Regex;
    case SplitPattern::kQwen2: return kQwen2Regex;
    case SplitPattern::kLlama3: return kLlama3Regex;
    case SplitPattern::kNone: break;
  }
  return {};
}

bool split_pattern_from_regex(std::string_view regex, SplitPattern& pattern) {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kQwen2, SplitPattern::kLlama3}) {
    if (regex == split_pattern_regex(p)) {
      pattern = p;
      return true;
    }
  }
  return false;
}

std::span<const GgufPreTokenizer> gguf_pre_tokenizers() { return kGgufPreTokenizers; }

const GgufPreTokenizer* gguf_pre_tokenizer(std::string_view name) {
  for (const GgufPreTokenizer& p : kGgufPreTokenizers) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::string_view split_pattern_gguf_name(SplitPattern pattern) {
  for (const GgufPreTokenizer& p : kGgufPreTokenizers) {
    if (p.split == pattern) return p.name;
  }
  return "default";
}

void split_text(SplitPattern pattern, std::string_view text, SplitScratch& scratch,
                std::vector<std::pair<uint32_t, uint32_t>>& pieces) {
  if (text.empty()) return;
  if (pattern == SplitPattern::kNone) {
    pieces.emplace_back(0, static_cast<uint32_t>(text.size()));
    return;
  }
  scratch.cps.clear();
  scratch.flags.clear();
  scratch.offsets.clear();
  for (size_t pos = 0; pos < text.size();) {
    scratch.offsets.push_back(static_cast<uint32_t>(pos));
    const char32_t c = next_code_point(text, pos);
    scratch.cps.push_back(c);
    scratch.flags.push_back(char_flags(c));
  }
  scratch.offsets.push_back(static_cast<uint32_t>(text.size()));
  const Text t{scratch.cps.data(), scratch.flags.data(), scratch.cps.size()};
  if (pattern == SplitPattern::kDigitsGpt2) {
    // HF's Sequence[Digits(individual_digits), ByteLevel]: every \p{N} is a piece of its own,
    // and the GPT-2 regex runs on each stretch between them as on a text of its own (its
    // \s+(?!\S) sees the stretch's end as the end of the text), as llama.cpp's two regexes do.
    for (size_t i = 0; i < t.n;) {
      if (t.flags[i] & kNumber) {
        pieces.emplace_back(scratch.offsets[i], scratch.offsets[i + 1]);
        ++i;
        continue;
      }
      size_t stop = i + 1;
      while (stop < t.n && !(t.flags[stop] & kNumber)) ++stop;
      const Text stretch{t.cp, t.flags, stop};
      while (i < stop) {
        const size_t e = match_gpt2(stretch, i);
        pieces.emplace_back(scratch.offsets[i], scratch.offsets[e]);
        i = e;
      }
    }
    return;
  }
  for (size_t i = 0; i < t.n;) {
    size_t e = 0;
    switch (pattern) {
      case SplitPattern::kGpt2: e = match_gpt2(t, i); break;
      case SplitPattern::kQwen2: e = match_qwen2(t, i, 1); break;
      case SplitPattern::kLlama3: e = match_qwen2(t, i, 3); break;
      case SplitPattern::kDigitsGpt2:
      case SplitPattern::kNone: break;
    }
    pieces.emplace_back(scratch.offsets[i], scratch.offsets[e]);
    i = e;
  }
}

}  // namespace concord::io::tokenizer_detail
