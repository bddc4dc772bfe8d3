// Text around the engine: chat templates for a single user turn and UTF-8-safe streaming.
//
// Chat templates: a Jinja engine is out of scope. render_chat recognises the template families
// by their markers and renders what HF's apply_chat_template(messages, tokenize=False,
// add_generation_prompt=True) renders for [system?, user]:
//   ChatML ("<|im_start|>"), Qwen2 / Qwen2.5 / SmolLM2: a default system turn when the template
//     has one ("You are Qwen, created by Alibaba Cloud. ...", "You are a helpful AI assistant
//     named SmolLM, trained by Hugging Face"), taken from the template's text;
//   ChatML with "enable_thinking" (Qwen3): no default system; with thinking off the generation
//     prompt ends in an empty "<think>\n\n</think>\n\n" block, as Qwen3's template writes it;
//   Llama 3 ("<|start_header_id|>"): bos, turns "<|start_header_id|>ROLE<|end_header_id|>\n\n
//     CONTENT<|eot_id|>" with contents trimmed; Llama 3.1+ templates ("Cutting Knowledge Date")
//     always open with their system turn "Cutting Knowledge Date: December 2023\nToday Date:
//     DATE\n\n" + system (DATE: the template's date_string default, or today when it calls
//     strftime_now).
// Anything else (or no template): InputError naming what is supported.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace concord::serve {

struct ChatOptions {
  std::optional<std::string> system;
  bool enable_thinking = true;                   // Qwen3: false adds the empty <think> block
  std::string bos_token = "<|begin_of_text|>";   // Llama 3
  std::string today;                             // "26 Jul 2024" style; "" = the current date
};

std::string render_chat(std::string_view chat_template, std::string_view user,
                        const ChatOptions& options = {});

// Bytes of streamed tokens in, valid UTF-8 out: a character split across tokens is held back
// until its last byte arrives; bytes that cannot form a character (a stray continuation byte,
// an invalid lead, an overlong form, a surrogate, a code point above U+10FFFF, a character
// cut short by a byte that cannot continue it) become U+FFFD, one per maximal subpart
// (io/utf8.h). Every push and flush returns valid UTF-8, and the concatenation of a stream's
// outputs is io::utf8_lossy of its input, however the input was split.
class Utf8Stream {
 public:
  // Appends bytes; returns the decoded text up to the last character that is complete (or
  // replaced); an unfinished character at the end stays pending.
  std::string push(std::string_view bytes);
  // The end of the stream: an unfinished character becomes one U+FFFD.
  std::string flush();

 private:
  std::string pending_;
};

}  // namespace concord::serve
