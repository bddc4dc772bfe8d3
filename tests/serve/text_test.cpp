// Chat templates rendered by family (expected strings: what HF's apply_chat_template renders for
// these templates with add_generation_prompt=True) and the UTF-8 stream decoder.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "concord/io/utf8.h"
#include "concord/numerics/check.h"
#include "concord/serve/text.h"

namespace concord::serve {
namespace {

// Excerpts of the real templates, as stored in tokenizer_config.json (JSON-decoded).
const std::string kQwen25 =
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are "
    "a helpful assistant.' }}{%- endif %}{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}";
const std::string kQwen3 =
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + "
    "'<|im_end|>\\n' }}{%- endif %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}";
const std::string kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}";
const std::string kLlama31 =
    "{%- if not date_string is defined %}{%- set date_string = \"26 Jul 2024\" %}{%- endif %}"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}{{- \"Cutting Knowledge Date: "
    "December 2023\\n\" }}";

TEST(ChatTemplate, ChatMlQwen2WithDefaultSystem) {
  EXPECT_EQ(render_chat(kQwen25, "Hi"),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
            "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  ChatOptions o;
  o.system = "Be brief.";
  EXPECT_EQ(render_chat(kQwen25, "Hi", o),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
}

// SmolLM2's GGUF tokenizer.chat_template writes its newlines as real newlines inside the Jinja
// string literals (Qwen2's tokenizer_config.json has the escape "\n"); both are one newline.
constexpr std::string_view kSmolLM2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";

TEST(ChatTemplate, SmolLM2DefaultSystemWithRealNewlines) {
  EXPECT_EQ(render_chat(kSmolLM2, "Hi"),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  ChatOptions o;
  o.system = "Be brief.";
  EXPECT_EQ(render_chat(kSmolLM2, "Hi", o),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Qwen3ThinkingOnAndOff) {
  EXPECT_EQ(render_chat(kQwen3, " two words "),
            "<|im_start|>user\n two words <|im_end|>\n<|im_start|>assistant\n");
  ChatOptions o;
  o.enable_thinking = false;
  o.system = "S";
  EXPECT_EQ(render_chat(kQwen3, "Q", o),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, Llama3) {
  ChatOptions o;
  o.system = "  Sys ";
  EXPECT_EQ(render_chat(kLlama3, " Hello\n", o),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nSys<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render_chat(kLlama31, "Hello"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, UnknownFamiliesAreErrors) {
  EXPECT_THROW(render_chat("", "x"), InputError);
  EXPECT_THROW(render_chat("{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}", "x"),
               InputError);
}

const std::string kFFFD = "\xEF\xBF\xBD";

std::string fffd(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += kFFFD;
  return out;
}

// Every piece the stream returns for `pieces`, then the flush, concatenated; each piece must be
// valid UTF-8 on its own.
std::string stream(const std::vector<std::string>& pieces) {
  Utf8Stream s;
  std::string out;
  for (const std::string& piece : pieces) {
    const std::string ready = s.push(piece);
    EXPECT_EQ(io::invalid_utf8_offset(ready), std::string::npos) << "push returned invalid UTF-8";
    out += ready;
  }
  const std::string rest = s.flush();
  EXPECT_EQ(io::invalid_utf8_offset(rest), std::string::npos) << "flush returned invalid UTF-8";
  return out + rest;
}

TEST(Utf8Stream, HoldsSplitCharactersBack) {
  Utf8Stream s;
  const std::string euro = "\xE2\x82\xAC";  // U+20AC, 3 bytes
  EXPECT_EQ(s.push("a"), "a");
  EXPECT_EQ(s.push(euro.substr(0, 1)), "");
  EXPECT_EQ(s.push(euro.substr(1, 1)), "");
  EXPECT_EQ(s.push(euro.substr(2) + "b\xF0\x9F"), euro + "b");
  EXPECT_EQ(s.push("\x98\x80"), "\xF0\x9F\x98\x80");  // U+1F600
  EXPECT_EQ(s.push("\xC3"), "");
  EXPECT_EQ(s.push("\xA9"), "\xC3\xA9");  // U+00E9
  EXPECT_EQ(s.flush(), "");
}

TEST(Utf8Stream, ReplacesWhatCanNeverBeACharacter) {
  Utf8Stream s;
  EXPECT_EQ(s.push("\x80x"), kFFFD + "x");  // a stray continuation byte
  EXPECT_EQ(s.push("\xE2"), "");            // could still be a character ...
  EXPECT_EQ(s.push("A"), kFFFD + "A");      // ... until a byte that cannot continue it
  EXPECT_EQ(s.push("\xF0\x9F\x98"), "");
  EXPECT_EQ(s.flush(), kFFFD);              // the stream ends inside a character
  EXPECT_EQ(s.flush(), "");
}

// One U+FFFD per maximal subpart (Unicode 15, section 3.9 "U+FFFD Substitution of Maximal
// Subparts"; Rust's from_utf8_lossy and WHATWG agree), fed whole and byte by byte.
TEST(Utf8Stream, ReplacementFollowsMaximalSubparts) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\xFF", fffd(1)},                            // never a UTF-8 byte
      {"a\xFE" "b", "a" + fffd(1) + "b"},
      {"\xC0\xAF", fffd(2)},                        // overlong '/': C0 is never a lead
      {"\xC1\xBF", fffd(2)},
      {"\xE0\x80\xAF", fffd(3)},                    // overlong 3-byte form: E0 needs A0..BF next
      {"\xF0\x80\x80\xAF", fffd(4)},                // overlong 4-byte form
      {"\xED\xA0\x80", fffd(3)},                    // U+D800, a surrogate: ED needs 80..9F next
      {"\xED\xBF\xBF", fffd(3)},                    // U+DFFF
      {"\xF4\x90\x80\x80", fffd(4)},                // U+110000, above the last code point
      {"\xF5\x80\x80\x80", fffd(4)},                // F5..FF are never leads
      {"\xE2\x82x", fffd(1) + "x"},                 // a cut-short character: one U+FFFD
      {"\xF0\x9F\x98" "a", fffd(1) + "a"},
      {"\xE2\x82\xE2\x82\xAC", fffd(1) + "\xE2\x82\xAC"},
      {"\xED\x9F\xBF", "\xED\x9F\xBF"},             // U+D7FF, just below the surrogates
      {"\xEE\x80\x80", "\xEE\x80\x80"},             // U+E000, just above
      {"\xF4\x8F\xBF\xBF", "\xF4\x8F\xBF\xBF"},     // U+10FFFF
      {"\xC2\x80", "\xC2\x80"},                     // U+0080, the shortest 2-byte form
  };
  for (const auto& [input, expected] : cases) {
    EXPECT_EQ(stream({input}), expected) << "whole: " << ::testing::PrintToString(input);
    std::vector<std::string> bytes;
    for (char c : input) bytes.emplace_back(1, c);
    EXPECT_EQ(stream(bytes), expected) << "byte by byte: " << ::testing::PrintToString(input);
    EXPECT_EQ(io::utf8_lossy(input), expected) << "utf8_lossy: " << ::testing::PrintToString(input);
  }
}

// However the bytes are split, the stream gives utf8_lossy of the whole (so a token boundary
// never changes the text), and every piece is valid UTF-8. Seeded; deterministic.
TEST(Utf8Stream, AnySplitGivesTheLossyDecodingOfTheWhole) {
  std::mt19937 rng(26);
  const std::vector<std::string> atoms = {"a", " ", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80",
                                          "\xED\x9F\xBF", "\xF4\x8F\xBF\xBF"};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string input;
    const int n = static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) {
      if (rng() % 3 == 0) {
        input += static_cast<char>(rng() % 256);  // any byte: often invalid
      } else {
        input += atoms[rng() % atoms.size()];
      }
    }
    std::vector<std::string> pieces;
    for (size_t at = 0; at < input.size();) {
      const size_t len = std::min<size_t>(input.size() - at, rng() % 5);
      pieces.push_back(input.substr(at, len));  // empty pieces too
      at += len;
    }
    ASSERT_EQ(stream(pieces), io::utf8_lossy(input)) << ::testing::PrintToString(input);
  }
}

}  // namespace
}  // namespace concord::serve
