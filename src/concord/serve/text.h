// Text around the engine: chat templates, UTF-8-safe streaming and stop strings.
//
// Chat templates: a Jinja engine is out of scope. render_chat recognises the template families
// by their markers and renders what HF's apply_chat_template(messages, tokenize=False,
// add_generation_prompt=True) renders for a conversation of system / user / assistant turns:
//   ChatML ("<|im_start|>"), Qwen2 / Qwen2.5 / SmolLM2: turns "<|im_start|>ROLE\nCONTENT
//     <|im_end|>\n"; when the first message is not a system one, the template's default system
//     turn if it has one ("You are Qwen, created by Alibaba Cloud. ...", "You are a helpful AI
//     assistant named SmolLM, trained by Hugging Face"), taken from the template's text with
//     its string literal's escapes read as Jinja reads them (\n, \t, \r, \\);
//   ChatML with "enable_thinking" (Qwen3): no default system; an assistant turn loses its
//     "<think>...</think>" reasoning, except after the last user query, where the reasoning is
//     kept in a "<think>\nR\n</think>\n\n" block (always for the final message, else when R is
//     not empty), as Qwen3's template does; with thinking off the generation prompt ends in an
//     empty "<think>\n\n</think>\n\n" block;
//   Llama 3 ("<|start_header_id|>"): bos, turns "<|start_header_id|>ROLE<|end_header_id|>\n\n
//     CONTENT<|eot_id|>" with contents trimmed (Jinja's trim: Unicode whitespace); Llama 3.1+
//     templates ("Cutting Knowledge Date") always open with their system turn "Cutting Knowledge
//     Date: December 2023\nToday Date: DATE\n\n" + system (DATE: the template's date_string
//     default, or today when it calls strftime_now).
// Anything else (or no template): InputError naming what is supported.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace concord::serve {

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant"
  std::string content;
};

struct ChatOptions {
  std::optional<std::string> system;
  bool enable_thinking = true;                   // Qwen3: false adds the empty <think> block
  std::string bos_token = "<|begin_of_text|>";   // Llama 3
  std::string today;                             // "26 Jul 2024" style; "" = the current date
};

// Multi-turn: what HF apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
// renders for `messages`, for the families above. Roles are system, user and assistant; a system
// message may only come first; consecutive messages of one role are rendered as they come, as
// the HF templates do; a final assistant message is closed and followed by the generation
// prompt. options.system, when set, is a first system message (InputError if `messages` has one
// too). InputError for an empty conversation, another role or a later system message.
std::string render_chat(std::string_view chat_template, std::span<const ChatMessage> messages,
                        const ChatOptions& options = {});

// Single turn: render_chat(template, [system (options.system)?, user]).
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

// Stop strings over streamed text, across token boundaries (OpenAI's `stop`). push() returns the
// text that can be emitted now; only the longest suffix that is a proper prefix of some stop
// string is held back, so the stream lags as little as it can. Once a stop string is complete,
// stopped() is true and the emitted text ends right before it (the stop string itself is not
// returned); later pushes and flushes return "". flush() at the end of the stream releases the
// held-back suffix.
//
// Which stop wins: the first one to be completed, i.e. the occurrence that ends earliest in the
// text; of those ending at the same byte, the longest (it starts first). Because that depends on
// the text alone, the emitted text is the same however the text is split into pushes. When no
// stop string contains another one strictly inside it, this is simply the earliest occurrence of
// any stop string; with stops {"abcd", "bc"} and text "abcd", "bc" completes first and the
// output is "a" (a generation driven token by token would have stopped there).
//
// Stops must be non-empty, valid UTF-8 (InputError otherwise); then, for valid UTF-8 input,
// every returned piece is valid UTF-8 (a held suffix starts with a stop's first character).
// Cost per push: O(stops * (pushed + held bytes) + stops * longest stop^2).
class StopStrings {
 public:
  explicit StopStrings(std::vector<std::string> stops);
  std::string push(std::string_view text);
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // pushed, not yet emitted: a proper prefix of some stop string
  bool stopped_ = false;
};

}  // namespace concord::serve
