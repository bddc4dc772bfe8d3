// The split patterns of byte-level BPE, checked by hand (each expectation was worked out from
// the regex's backtracking semantics, and agrees with HF tokenizers' Split pre-tokenizer).
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "concord/io/tokenizer_impl.h"

namespace concord::io::tokenizer_detail {
namespace {

std::vector<std::string> pieces(SplitPattern pattern, const std::string& text) {
  SplitScratch scratch;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  split_text(pattern, text, scratch, ranges);
  std::vector<std::string> out;
  size_t expected_begin = 0;
  for (const auto& [begin, end] : ranges) {
    EXPECT_EQ(begin, expected_begin) << "pieces must cover the text in order";
    EXPECT_LT(begin, end) << "no empty piece";
    out.push_back(text.substr(begin, end - begin));
    expected_begin = end;
  }
  EXPECT_EQ(expected_begin, text.size());
  return out;
}

using Pieces = std::vector<std::string>;

TEST(TokenizerSplit, Qwen2Words) {
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "Hello world"), (Pieces{"Hello", " world"}));
  // One non-letter, non-digit, non-newline character may lead a word: "(" and "\t" do.
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "(hello"), (Pieces{"(hello"}));
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "don'T\tgo"), (Pieces{"don", "'T", "\tgo"}));
}

TEST(TokenizerSplit, Qwen2ContractionsAreCaseInsensitive) {
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "it's"), (Pieces{"it", "'s"}));
  // " '" cannot start a contraction (the space comes first), so it is punctuation.
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "'S 'LL"), (Pieces{"'S", " '", "LL"}));
  // (?i) folds U+017F LATIN SMALL LETTER LONG S to 's': the contraction is "'ſ" alone.
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "x'\u017Ft"), (Pieces{"x", "'\u017F", "t"}));
  // A contraction is tried first, even before a longer word.
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "'sorry"), (Pieces{"'s", "orry"}));
}

TEST(TokenizerSplit, Qwen2DigitsOneByOneLlama3ByThree) {
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "12345"), (Pieces{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(pieces(SplitPattern::kLlama3, "12345"), (Pieces{"123", "45"}));
  EXPECT_EQ(pieces(SplitPattern::kLlama3, "a1234567 89"),
            (Pieces{"a", "123", "456", "7", " ", "89"}));
}

TEST(TokenizerSplit, Qwen2Whitespace) {
  // \s*[\r\n]+ takes the run up to its last newline; \s+(?!\S) leaves one space for the word.
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "x  \n\n  y"), (Pieces{"x", "  \n\n", " ", " y"}));
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "\r\n\r\n x"), (Pieces{"\r\n\r\n", " x"}));
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "  \t\n a"), (Pieces{"  \t\n", " a"}));
  // At the end of the text the lookahead holds: the whole run.
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "end   "), (Pieces{"end", "   "}));
  // NBSP is whitespace (White_Space) and also may lead a word.
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "a\u00A0\u00A0b"), (Pieces{"a", "\u00A0", "\u00A0b"}));
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "a \u3000b"), (Pieces{"a", " ", "\u3000b"}));
}

TEST(TokenizerSplit, Qwen2Punctuation) {
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "a ... b"), (Pieces{"a", " ...", " b"}));
  // Punctuation keeps the newlines that follow it.
  EXPECT_EQ(pieces(SplitPattern::kQwen2, "!!!\n\nx"), (Pieces{"!!!\n\n", "x"}));
}

TEST(TokenizerSplit, Gpt2) {
  EXPECT_EQ(pieces(SplitPattern::kGpt2, "it's"), (Pieces{"it", "'s"}));
  EXPECT_EQ(pieces(SplitPattern::kGpt2, "IT'S"), (Pieces{"IT", "'", "S"}));  // case-sensitive
  EXPECT_EQ(pieces(SplitPattern::kGpt2, "x'\u017Ft"), (Pieces{"x", "'", "\u017Ft"}));
  EXPECT_EQ(pieces(SplitPattern::kGpt2, "  hello"), (Pieces{" ", " hello"}));
  EXPECT_EQ(pieces(SplitPattern::kGpt2, "a1 22"), (Pieces{"a", "1", " 22"}));
  EXPECT_EQ(pieces(SplitPattern::kGpt2, "hi!!  \n"), (Pieces{"hi", "!!", "  \n"}));
  EXPECT_EQ(pieces(SplitPattern::kGpt2, "x  y"), (Pieces{"x", " ", " y"}));
}

// SmolLM's Sequence[Digits(individual_digits), ByteLevel]: every \p{N} alone, and GPT-2's
// regex on each stretch between digits as on a text of its own.
TEST(TokenizerSplit, DigitsThenGpt2) {
  const SplitPattern d = SplitPattern::kDigitsGpt2;
  EXPECT_EQ(pieces(d, "hello world"), (Pieces{"hello", " world"}));
  EXPECT_EQ(pieces(d, "abc 123 def"), (Pieces{"abc", " ", "1", "2", "3", " def"}));
  EXPECT_EQ(pieces(d, "a1 22"), (Pieces{"a", "1", " ", "2", "2"}));
  // The stretch "x  " ends before the digit, so \s+(?!\S) takes both spaces (GPT-2 alone on
  // the whole text gives "x", " ", " 1").
  EXPECT_EQ(pieces(d, "x  1"), (Pieces{"x", "  ", "1"}));
  EXPECT_EQ(pieces(SplitPattern::kGpt2, "x  1"), (Pieces{"x", " ", " 1"}));
  EXPECT_EQ(pieces(d, "it's 5's"), (Pieces{"it", "'s", " ", "5", "'s"}));
  // Digits of other scripts and other numbers (Nd, Nl, No) are \p{N} too.
  EXPECT_EQ(pieces(d, "\u0663\u0664x\u00BD"), (Pieces{"\u0663", "\u0664", "x", "\u00BD"}));
  EXPECT_EQ(pieces(d, "7"), (Pieces{"7"}));
  EXPECT_EQ(pieces(d, " \n"), (Pieces{" \n"}));
}

TEST(TokenizerSplit, PatternNamesRoundTrip) {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kQwen2, SplitPattern::kLlama3}) {
    SplitPattern back = SplitPattern::kNone;
    EXPECT_TRUE(split_pattern_from_regex(split_pattern_regex(p), back));
    EXPECT_EQ(back, p);
  }
  for (SplitPattern p : {SplitPattern::kNone, SplitPattern::kGpt2, SplitPattern::kQwen2,
                         SplitPattern::kLlama3, SplitPattern::kDigitsGpt2}) {
    const GgufPreTokenizer* named = gguf_pre_tokenizer(split_pattern_gguf_name(p));
    ASSERT_NE(named, nullptr);
    EXPECT_EQ(named->split, p);
  }
  EXPECT_EQ(split_pattern_gguf_name(SplitPattern::kDigitsGpt2), "smollm");
  EXPECT_EQ(split_pattern_gguf_name(SplitPattern::kGpt2), "gpt-2");
  EXPECT_EQ(gguf_pre_tokenizer("deepseek-llm"), nullptr);
  SplitPattern unused = SplitPattern::kNone;
  EXPECT_FALSE(split_pattern_from_regex("\\w+", unused));
}

TEST(TokenizerUnicode, LossyUtf8MatchesRust) {
  // Maximal subparts: a truncated 3-byte sequence is one U+FFFD; a stray continuation is one.
  EXPECT_EQ(utf8_lossy("a\xE4\xB8"), "a\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xE4\xB8z"), "\xEF\xBF\xBDz");
  EXPECT_EQ(utf8_lossy("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(invalid_utf8_offset("ok\xC0\xAF"), 2u);  // overlong
  EXPECT_EQ(invalid_utf8_offset("\xE4\xB8\xAD"), std::string_view::npos);
}

TEST(TokenizerUnicode, ByteLevelAlphabet) {
  EXPECT_EQ(byte_to_char()[' '], "\u0120");  // Ġ
  EXPECT_EQ(byte_to_char()['\n'], "\u010A");  // Ċ
  EXPECT_EQ(byte_to_char()['A'], "A");
  for (int b = 0; b < 256; ++b) {
    size_t pos = 0;
    EXPECT_EQ(char_to_byte(next_code_point(byte_to_char()[static_cast<size_t>(b)], pos)), b);
  }
  EXPECT_EQ(char_to_byte(' '), -1);
}

TEST(TokenizerUnicode, NfcComposes) {
  EXPECT_EQ(nfc("cafe\u0301"), "caf\u00E9");
  EXPECT_EQ(nfc("\u1100\u1161\u11A8"), "\uAC01");  // Hangul jamo
  EXPECT_EQ(nfc("\uFB01"), "\uFB01");              // compatibility characters stay
}

}  // namespace
}  // namespace concord::io::tokenizer_detail
