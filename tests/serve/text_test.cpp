// Chat templates rendered by family (expected strings: what HF's apply_chat_template renders for
// these templates with add_generation_prompt=True), the UTF-8 stream decoder and stop strings.
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

// A default system literal with escapes inside its text: Jinja reads the string literal as
// Python does, so \n is a newline, \t a tab, \\ one backslash; a backslash before any other
// character stays. The expected text is Jinja's reading, written out by hand (HF's
// apply_chat_template gives the same: tests/python/test_chat_template.py).
constexpr std::string_view kEscapedSystem =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a bot.\\nRules:\\n\\t1. Be brief.\\r\\n\\t2. A \\\\n is "
    "not a newline; \\d stays.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + "
    "'\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|im_start|>assistant\\n' }}{% endif %}";

TEST(ChatTemplate, DefaultSystemWithEscapedCharacters) {
  EXPECT_EQ(render_chat(kEscapedSystem, "Hi"),
            "<|im_start|>system\nYou are a bot.\nRules:\n\t1. Be brief.\r\n\t2. A \\n is not a "
            "newline; \\d stays.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
}

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

// ---- Multi-turn (expected strings: HF apply_chat_template on the full real templates, Qwen3's
// tokenizer_config.json and SmolLM2's GGUF; tests/python/test_chat_template.py checks more) ----

std::vector<ChatMessage> chat(std::initializer_list<std::pair<const char*, const char*>> turns) {
  std::vector<ChatMessage> out;
  for (const auto& [role, content] : turns) out.push_back({role, content});
  return out;
}

TEST(ChatTemplate, SingleTurnIsTheMultiTurnOfOneUserMessage) {
  for (const std::string& tpl : {kQwen25, std::string(kSmolLM2), kQwen3, kLlama3, kLlama31}) {
    ChatOptions o;
    EXPECT_EQ(render_chat(tpl, "Hi", o), render_chat(tpl, chat({{"user", "Hi"}}), o));
    o.system = "S";
    EXPECT_EQ(render_chat(tpl, "Hi", o), render_chat(tpl, chat({{"system", "S"}, {"user", "Hi"}})));
  }
}

TEST(ChatTemplate, ChatMlMultiTurn) {
  EXPECT_EQ(render_chat(kSmolLM2, chat({{"user", "Q1"}, {"assistant", "A1"}, {"user", "Q2"}})),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n");
  // Consecutive turns of one role, and a final assistant turn closed before the prompt; an
  // assistant's <think> text is plain content outside Qwen3.
  EXPECT_EQ(render_chat(kQwen25, chat({{"system", "S"}, {"user", "a"}, {"user", "b"}, {"assistant", "<think>r</think>c"}})),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n"
            "<|im_start|>assistant\n<think>r</think>c<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, Qwen3DropsEarlierReasoning) {
  ChatOptions off;
  off.enable_thinking = false;
  EXPECT_EQ(render_chat(kQwen3, chat({{"user", "Q1"}, {"assistant", "<think>\nr1\n</think>\n\nA1"}, {"user", "Q2"}}), off),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2"
            "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // After the last user query the reasoning stays (stripped of newlines), before it goes.
  EXPECT_EQ(render_chat(kQwen3, chat({{"system", "S"}, {"user", "Q1"}, {"assistant", "<think>r1</think>A1"}, {"user", "Q2"},
                                      {"assistant", "<think>\n\nr2\n\n</think>\n\nA2"}})),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1"
            "<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2"
            "<|im_end|>\n<|im_start|>assistant\n");
  // The final message always gets a block, an earlier one after the query only with reasoning.
  EXPECT_EQ(render_chat(kQwen3, chat({{"user", "Q1"}, {"assistant", "A1"}, {"assistant", "<think>r</think>A2"}})),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>assistant\n"
            "<think>\nr\n</think>\n\nA2<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_chat(kQwen3, chat({{"user", "Q1"}, {"assistant", "A1"}})),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA1<|im_end|>\n"
            "<|im_start|>assistant\n");
  // A user message that is a wrapped tool response is not a query.
  EXPECT_EQ(render_chat(kQwen3, chat({{"user", "Q1"}, {"user", "<tool_response>x</tool_response>"},
                                      {"assistant", "<think>r</think>A2"}, {"assistant", "A3"}})),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>user\n<tool_response>x</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr\n</think>\n\nA2<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
            "</think>\n\nA3<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, Llama3MultiTurnTrimsUnicodeWhitespace) {
  // Jinja's trim is Python's str.strip(): U+00A0, U+3000, U+001C are whitespace too.
  EXPECT_EQ(render_chat(kLlama3, chat({{"user", "\xC2\xA0 Q1\xE3\x80\x80"}, {"assistant", "\x1c" "A1\n"}, {"user", "Q2"}})),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nQ1<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nA1<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nQ2<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render_chat(kLlama31, chat({{"system", " S "}, {"user", "Q1"}, {"assistant", "A1"}})),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge "
            "Date: December 2023\nToday Date: 26 Jul 2024\n\nS<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nQ1<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nA1<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Not whitespace: a non-breaking character that is not a space, and bytes that are not UTF-8.
  EXPECT_EQ(render_chat(kLlama3, chat({{"user", "\xE2\x81\xA0x\xC2"}})),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n\xE2\x81\xA0x\xC2<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, BadConversationsAreErrors) {
  for (const std::string& tpl : {kQwen25, kQwen3, kLlama3}) {
    EXPECT_THROW(render_chat(tpl, std::vector<ChatMessage>{}), InputError);
    EXPECT_THROW(render_chat(tpl, chat({{"tool", "x"}})), InputError);
    EXPECT_THROW(render_chat(tpl, chat({{"User", "x"}})), InputError);
    EXPECT_THROW(render_chat(tpl, chat({{"user", "x"}, {"system", "S"}})), InputError);
    ChatOptions o;
    o.system = "S";
    EXPECT_THROW(render_chat(tpl, chat({{"system", "T"}, {"user", "x"}}), o), InputError);
    EXPECT_NO_THROW(render_chat(tpl, chat({{"system", "T"}})));
  }
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

// ---- Stop strings ----

struct StopRun {
  std::vector<std::string> pieces;  // what each push returned
  std::string flushed;
  bool stopped = false;
  std::string text() const {
    std::string out;
    for (const std::string& p : pieces) out += p;
    return out + flushed;
  }
};

StopRun run_stops(const std::vector<std::string>& stops, const std::vector<std::string>& pushes) {
  StopStrings s(stops);
  StopRun run;
  for (const std::string& p : pushes) run.pieces.push_back(s.push(p));
  run.stopped = s.stopped();
  run.flushed = s.flush();
  return run;
}

// The reference, by brute force: scan the ends of the text; the first end at which some stop
// string ends stops it, and the longest stop ending there says where the text is cut.
std::pair<std::string, bool> reference_stop(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t longest = 0;
    for (const std::string& stop : stops)
      if (stop.size() <= end && text.compare(end - stop.size(), stop.size(), stop) == 0)
        longest = std::max(longest, stop.size());
    if (longest > 0) return {text.substr(0, end - longest), true};
  }
  return {text, false};
}

// The longest suffix of `text` that is a proper prefix of a stop: what must be held back.
size_t reference_hold(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& stop : stops)
    for (size_t k = 1; k < stop.size() && k <= text.size(); ++k)
      if (text.compare(text.size() - k, k, stop, 0, k) == 0) hold = std::max(hold, k);
  return hold;
}

TEST(StopStrings, EverySplitOfOneText) {
  const std::string text = "Hello STOP world";
  const std::vector<std::string> stops = {"STOP"};
  for (size_t i = 0; i <= text.size(); ++i) {
    const StopRun two = run_stops(stops, {text.substr(0, i), text.substr(i)});
    EXPECT_EQ(two.text(), "Hello ") << "split at " << i;
    EXPECT_TRUE(two.stopped);
    EXPECT_EQ(two.flushed, "");
    for (size_t j = i; j <= text.size(); ++j) {
      const StopRun three = run_stops(stops, {text.substr(0, i), text.substr(i, j - i), text.substr(j)});
      EXPECT_EQ(three.text(), "Hello ") << "split at " << i << ", " << j;
    }
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  const StopRun one_by_one = run_stops(stops, bytes);
  EXPECT_EQ(one_by_one.text(), "Hello ");
  // Byte by byte, each byte comes out as soon as it cannot start "STOP"; "S", "ST", "STO" wait.
  EXPECT_EQ(one_by_one.pieces[5], " ");
  EXPECT_EQ(one_by_one.pieces[6], "");
  EXPECT_EQ(one_by_one.pieces[8], "");
  EXPECT_EQ(one_by_one.pieces[9], "");  // the stop completes: nothing of it is emitted
  EXPECT_EQ(one_by_one.pieces[10], "");  // pushed after stopped()
}

TEST(StopStrings, EarliestOccurrenceWinsWhateverTheOrder) {
  for (const auto& stops : {std::vector<std::string>{"world", "lo"}, std::vector<std::string>{"lo", "world"}}) {
    EXPECT_EQ(run_stops(stops, {"hello world"}).text(), "hel");
    EXPECT_EQ(run_stops(stops, {"hel", "l", "o world"}).text(), "hel");
  }
  EXPECT_EQ(run_stops({"x", "b"}, {"abcx"}).text(), "a");
  // Ending at the same byte: the longest (it starts first).
  EXPECT_EQ(run_stops({"cd", "bcd"}, {"abcd"}).text(), "a");
  EXPECT_EQ(run_stops({"bcd", "cd"}, {"ab", "c", "d"}).text(), "a");
  // One stop strictly inside another: the inner one completes first, split or not.
  EXPECT_EQ(run_stops({"abcd", "bc"}, {"abcd"}).text(), "a");
  EXPECT_EQ(run_stops({"abcd", "bc"}, {"abc", "d"}).text(), "a");
  // A stop that is a prefix of another: the shorter completes first, at the same start.
  EXPECT_EQ(run_stops({"ab", "abc"}, {"xabc"}).text(), "x");
}

TEST(StopStrings, OverlappingPrefixes) {
  // "abab" in "ababab": stops at the first complete "abab".
  std::vector<std::string> bytes;
  for (char c : std::string("ababab")) bytes.emplace_back(1, c);
  StopRun r = run_stops({"abab"}, bytes);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text(), "");
  EXPECT_EQ(run_stops({"abab"}, {"xaba", "bab"}).text(), "x");
  // "aba" then "b..." resumes the match from the second 'a': "abaabab" -> "aba".
  r = run_stops({"abab"}, {"aba", "a", "bab"});
  EXPECT_EQ(r.pieces[0], "");    // "aba" could start "abab"
  EXPECT_EQ(r.pieces[1], "aba");  // "abaa": only the last "a" could start it now
  EXPECT_EQ(r.text(), "aba");
  // A failed match releases exactly what can no longer start the stop.
  StopStrings s({"abab"});
  EXPECT_EQ(s.push("aba"), "");
  EXPECT_EQ(s.push("c"), "abac");
  EXPECT_EQ(s.push("ab"), "");
  EXPECT_EQ(s.push("a"), "");  // "aba" held
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.flush(), "aba");
}

TEST(StopStrings, MultiByteStops) {
  const std::string e_acute = "\xC3\xA9";         // U+00E9
  const std::string euro = "\xE2\x82\xAC";        // U+20AC
  const std::string dong = "\xE2\x82\xAB";        // U+20AB: shares two bytes with the euro
  const std::string text = "caf" + e_acute + " 5" + dong + " 7" + euro + " rest";
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(run_stops({euro}, bytes).text(), "caf" + e_acute + " 5" + dong + " 7");
  EXPECT_EQ(run_stops({euro}, {text}).text(), "caf" + e_acute + " 5" + dong + " 7");
  EXPECT_EQ(run_stops({e_acute + " "}, bytes).text(), "caf");
  // Split between characters, each piece returned is valid UTF-8 (a held suffix starts with the
  // stop's first character).
  StopStrings s({euro + "!"});
  EXPECT_EQ(s.push("a" + euro), "a");
  EXPECT_EQ(s.push(dong), euro + dong);
  EXPECT_EQ(s.push(euro), "");
  EXPECT_EQ(s.push("!"), "");
  EXPECT_TRUE(s.stopped());
}

TEST(StopStrings, NoStopPassesEverythingThrough) {
  StopStrings none({});
  EXPECT_EQ(none.push("abc"), "abc");
  EXPECT_EQ(none.push(""), "");
  EXPECT_EQ(none.flush(), "");
  EXPECT_FALSE(none.stopped());
  // A stop that never completes: the held-back suffix comes out at flush.
  StopStrings s({"STOP"});
  EXPECT_EQ(s.push("abcST"), "abc");
  EXPECT_EQ(s.push("O"), "");
  EXPECT_EQ(s.flush(), "STO");
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.flush(), "");
}

TEST(StopStrings, NothingAfterStopped) {
  StopStrings s({"\n\n"});
  EXPECT_EQ(s.push("one\n"), "one");
  EXPECT_EQ(s.push("\ntwo"), "");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.push("three"), "");
  EXPECT_EQ(s.flush(), "");
  EXPECT_TRUE(s.stopped());
}

TEST(StopStrings, BadStopsAreInputErrors) {
  EXPECT_THROW(StopStrings({"ok", ""}), InputError);
  EXPECT_THROW(StopStrings({"\xC3"}), InputError);  // half a character could cut one in two
}

// Random texts over a small alphabet (with multi-byte characters, so stops overlap often) and
// random splits: the concatenated output is the brute-force reference, each push emits all but
// the longest suffix that could begin a stop, and, split at character boundaries, every piece is
// valid UTF-8. Seeded; deterministic.
TEST(StopStrings, RandomTextsAndSplitsMatchTheReference) {
  std::mt19937 rng(17);
  const std::vector<std::string> chars = {"a", "b", "\xC3\xA9", "\xE2\x82\xAC"};
  auto random_string = [&](size_t max_chars, std::vector<size_t>* boundaries) {
    std::string s;
    const size_t n = rng() % (max_chars + 1);
    for (size_t i = 0; i < n; ++i) {
      if (boundaries) boundaries->push_back(s.size());
      s += chars[rng() % chars.size()];
    }
    if (boundaries) boundaries->push_back(s.size());
    return s;
  };
  int stopped_runs = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::string> stops(rng() % 4);
    for (std::string& stop : stops) {
      do stop = random_string(4, nullptr);
      while (stop.empty());
    }
    std::vector<size_t> boundaries;
    const std::string text = random_string(30, &boundaries);
    const bool char_splits = trial % 2 == 0;
    std::vector<std::string> pushes;
    for (size_t at = 0; at < text.size();) {
      size_t next = std::min(text.size(), at + rng() % 6);  // empty pushes too
      if (char_splits) next = *std::lower_bound(boundaries.begin(), boundaries.end(), next);
      pushes.push_back(text.substr(at, next - at));
      at = next;
    }
    const auto [expected, expect_stop] = reference_stop(text, stops);
    StopStrings s(stops);
    std::string pushed, emitted;
    for (const std::string& p : pushes) {
      pushed += p;
      const std::string piece = s.push(p);
      emitted += piece;
      if (char_splits) {
        ASSERT_EQ(io::invalid_utf8_offset(piece), std::string::npos) << ::testing::PrintToString(piece);
      }
      if (!s.stopped()) {  // minimal latency: only a possible stop's start is held back
        ASSERT_EQ(emitted, pushed.substr(0, pushed.size() - reference_hold(pushed, stops)))
            << ::testing::PrintToString(text);
      }
    }
    ASSERT_EQ(s.stopped(), expect_stop) << ::testing::PrintToString(text);
    emitted += s.flush();
    ASSERT_EQ(emitted, expected) << ::testing::PrintToString(text) << " stops "
                                 << ::testing::PrintToString(stops);
    stopped_runs += expect_stop;
  }
  EXPECT_GT(stopped_runs, 500);  // the trials exercise stopping, not only pass-through
  EXPECT_LT(stopped_runs, 2500);
}

}  // namespace
}  // namespace concord::serve
