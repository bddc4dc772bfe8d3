// The OpenAI HTTP protocol, as pure functions: request bodies of /v1/completions and
// /v1/chat/completions parsed and validated into a GenerationRequest, response and stream-chunk
// JSON built from finished or partial choices, OpenAI-style error bodies, server-sent events.
//
// No model, no sockets: the server (server.h) tokenizes, checks the context and runs the engine;
// everything a client can get wrong in a body is decided here, so it is unit-tested on its own
// (tests/serve/openai_test.cpp). docs/serve.md lists every field, default and error code.
//
// Validation policy: a known field with a wrong type or an out-of-range value is an ApiError 400
// naming the field (`param`); OpenAI fields concord does not implement are accepted only at
// their neutral value (penalties 0, best_of 1, no tools, ...) and 400 otherwise; fields OpenAI
// defines that change nothing here (user, metadata, ...) and unknown fields are ignored, as
// OpenAI-compatible servers do. The body must be valid UTF-8 JSON whose top level is an object.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "concord/serve/text.h"

namespace concord::serve::openai {

// An error with its HTTP status and OpenAI's error fields; error_body() is its JSON.
class ApiError : public std::exception {
 public:
  ApiError(int status, std::string type, std::string code, std::string message,
           std::string param = "");
  const char* what() const noexcept override { return message_.c_str(); }
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& code() const { return code_; }
  const std::string& param() const { return param_; }  // "" -> null
  const std::string& message() const { return message_; }

 private:
  int status_;
  std::string type_, code_, message_, param_;
};
// 400 invalid_request_error with `code` (invalid_type, invalid_value, missing_field, ...).
ApiError invalid_request(std::string code, std::string message, std::string param = "");

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_json(const ApiError& error);
std::string error_body(const ApiError& error);

enum class Endpoint { completions, chat };

// Limits of the protocol itself (the server adds its own: context, queue).
inline constexpr int64_t kMaxChoices = 128;     // n
inline constexpr int64_t kMaxStopStrings = 16;  // OpenAI allows 4
inline constexpr int64_t kMaxTopLogprobs = 20;  // the engine's bound

struct GenerationRequest {
  Endpoint endpoint = Endpoint::completions;
  std::optional<std::string> model;
  // completions: the prompt, as text or as token ids (exactly one of them is used)
  bool prompt_is_tokens = false;
  std::string prompt_text;
  std::vector<int64_t> prompt_tokens;  // ids as given (range-checked against the vocabulary later)
  // chat
  std::vector<ChatMessage> messages;
  bool enable_thinking = true;  // chat_template_kwargs.enable_thinking (Qwen3 templates)
  // sampling and length
  std::optional<int64_t> max_tokens;  // none: completions 16, chat until the context is full
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  int64_t n = 1;
  // output
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // completions: logprobs != null; chat: logprobs == true
  int32_t top_logprobs = 0;    // completions: the logprobs integer; chat: top_logprobs
  bool echo = false;           // completions only
  bool tokens_as_ids = false;  // return_tokens_as_token_ids (vLLM)
};

// Parse and validate a body; ApiError 400 for anything wrong (invalid UTF-8, malformed JSON,
// wrong types, out-of-range or unsupported values, a missing prompt / messages).
GenerationRequest parse_completion_request(std::string_view body);
GenerationRequest parse_chat_request(std::string_view body);
GenerationRequest parse_request(Endpoint endpoint, std::string_view body);

// How token ids are written in logprobs: their bytes as text (invalid UTF-8 -> U+FFFD), or
// "token_id:<id>" with return_tokens_as_token_ids.
struct TokenText {
  std::function<std::string(int32_t)> bytes;  // the raw bytes a token decodes to
  bool as_ids = false;
  std::string name(int32_t token) const;
};

struct Alternative {
  int32_t token;
  double logprob;
};
// One token of a choice as the response reports it.
struct LoggedToken {
  int32_t token = 0;
  std::optional<double> logprob;                // null: the first prompt token under echo
  std::optional<std::vector<Alternative>> top;  // null: the first prompt token under echo
  int64_t text_offset = 0;                      // code points of the choice's text before it
};
struct ChoiceOutput {
  std::string text;                 // completions: the prompt first under echo
  std::vector<LoggedToken> tokens;  // filled when logprobs were asked for
  std::string finish_reason;        // "stop" | "length"
};
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};
struct ResponseMeta {
  std::string id;       // "cmpl-…" / "chatcmpl-…"
  int64_t created = 0;  // unix seconds
  std::string model;
  std::string system_fingerprint;
  int64_t weights_version = -1;  // >= 0: reported as "weights_version" (POST /v1/weights)
};

// The whole non-streaming response.
nlohmann::json completion_response(const ResponseMeta& meta,
                                   const std::vector<ChoiceOutput>& choices, const Usage& usage,
                                   const TokenText& names, bool logprobs);
nlohmann::json chat_response(const ResponseMeta& meta, const std::vector<ChoiceOutput>& choices,
                             const Usage& usage, const TokenText& names, bool logprobs);

// The logprobs objects for a run of tokens (also used per stream chunk).
nlohmann::json completion_logprobs(const std::vector<LoggedToken>& tokens, const TokenText& names);
nlohmann::json chat_logprobs(const std::vector<LoggedToken>& tokens, const TokenText& names);

// One streamed piece of one choice. Chat: `role_first` sends the assistant role delta.
struct ChunkPiece {
  int64_t index = 0;
  std::string text;
  std::vector<LoggedToken> tokens;  // with logprobs
  std::optional<std::string> finish_reason;
  bool role_first = false;
};
// A stream chunk: "text_completion" (completions) or "chat.completion.chunk" objects; with
// include_usage every chunk carries "usage": null.
nlohmann::json stream_chunk(Endpoint endpoint, const ResponseMeta& meta, const ChunkPiece& piece,
                            const TokenText& names, bool logprobs, bool include_usage);
// The last chunk of include_usage: "choices": [] and the usage.
nlohmann::json usage_chunk(Endpoint endpoint, const ResponseMeta& meta, const Usage& usage);

// Server-sent events: "data: <json>\n\n" and the terminator "data: [DONE]\n\n".
std::string sse_event(const nlohmann::json& data);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// JSON text for the wire: invalid UTF-8 (which the server never produces) is replaced rather
// than thrown on.
std::string dump(const nlohmann::json& value);

// The number of Unicode code points of valid UTF-8 text (text_offset).
int64_t code_points(std::string_view text);

}  // namespace concord::serve::openai
