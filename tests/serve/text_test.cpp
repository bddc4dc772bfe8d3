// Chat templates rendered by family (expected strings: what HF's apply_chat_template renders for
// these templates with add_generation_prompt=True) and UTF-8 stream buffering.
#include <gtest/gtest.h>

#include <string>

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

TEST(Utf8Stream, HoldsSplitCharactersBack) {
  Utf8Stream s;
  const std::string euro = "\xE2\x82\xAC";  // U+20AC, 3 bytes
  EXPECT_EQ(s.push("a"), "a");
  EXPECT_EQ(s.push(euro.substr(0, 1)), "");
  EXPECT_EQ(s.push(euro.substr(1, 1)), "");
  EXPECT_EQ(s.push(euro.substr(2) + "b\xF0\x9F"), euro + "b");
  EXPECT_EQ(s.push("\x98\x80"), "\xF0\x9F\x98\x80");  // U+1F600
  EXPECT_EQ(s.push("\x80x"), "\x80x");                // a stray continuation byte passes
  EXPECT_EQ(s.push("\xC3"), "");
  EXPECT_EQ(s.flush(), "\xC3");
  EXPECT_EQ(s.flush(), "");
}

}  // namespace
}  // namespace concord::serve
