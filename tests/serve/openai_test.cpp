// The OpenAI protocol without a model: request validation (types, ranges, unsupported fields,
// UTF-8), error bodies, response and stream-chunk JSON (openai.h).
#include "concord/serve/openai.h"

#include <gtest/gtest.h>

#include <string>

namespace concord::serve::openai {
namespace {

using nlohmann::json;

// The ApiError a body raises (status 0 when it parses).
ApiError error_of(Endpoint endpoint, const std::string& body) {
  try {
    parse_request(endpoint, body);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "", "", "parsed");
}

void expect_400(Endpoint endpoint, const std::string& body, const std::string& code,
                const std::string& param) {
  const ApiError e = error_of(endpoint, body);
  EXPECT_EQ(e.status(), 400) << body;
  EXPECT_EQ(e.type(), "invalid_request_error") << body;
  EXPECT_EQ(e.code(), code) << body << ": " << e.message();
  EXPECT_EQ(e.param(), param) << body << ": " << e.message();
}

TEST(OpenAiRequest, CompletionDefaultsAndFields) {
  const GenerationRequest d = parse_completion_request(R"({"prompt": "hi"})");
  EXPECT_EQ(d.prompt_text, "hi");
  EXPECT_FALSE(d.prompt_is_tokens);
  EXPECT_FALSE(d.max_tokens.has_value());
  EXPECT_EQ(d.temperature, 1.0f);
  EXPECT_EQ(d.top_p, 1.0f);
  EXPECT_EQ(d.top_k, 0);
  EXPECT_EQ(d.n, 1);
  EXPECT_FALSE(d.seed.has_value());
  EXPECT_FALSE(d.logprobs);
  EXPECT_FALSE(d.stream);

  const GenerationRequest r = parse_completion_request(
      R"({"model": "m", "prompt": [1, 2, 3], "max_tokens": 7, "temperature": 0, "top_p": 0.5,
          "top_k": -1, "min_p": 0.1, "seed": 18446744073709551615, "stop": ["a", "bc"], "n": 3,
          "logprobs": 4, "echo": true, "stream": false, "stream_options": {"include_usage": true},
          "return_tokens_as_token_ids": true, "user": "u", "presence_penalty": 0,
          "logit_bias": {}, "best_of": 1, "some_future_field": [1, {"x": 2}]})");
  EXPECT_EQ(r.model, "m");
  EXPECT_TRUE(r.prompt_is_tokens);
  EXPECT_EQ(r.prompt_tokens, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_EQ(r.temperature, 0.0f);
  EXPECT_EQ(r.top_p, 0.5f);
  EXPECT_EQ(r.top_k, 0);  // -1: off
  EXPECT_FLOAT_EQ(r.min_p, 0.1f);
  EXPECT_EQ(r.seed, 18446744073709551615ull);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 4);
  EXPECT_TRUE(r.echo);
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.tokens_as_ids);

  // One prompt wrapped in a list; null means "not given".
  EXPECT_EQ(parse_completion_request(R"({"prompt": ["x"], "max_tokens": null})").prompt_text, "x");
  EXPECT_EQ(parse_completion_request(R"({"prompt": [[5, 6]]})").prompt_tokens,
            (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(parse_completion_request(R"({"prompt": "x", "stop": "END"})").stop,
            (std::vector<std::string>{"END"}));
  EXPECT_EQ(parse_completion_request(R"({"prompt": "x", "logprobs": 0})").logprobs, true);
}

TEST(OpenAiRequest, ChatMessagesAndFields) {
  const GenerationRequest r = parse_chat_request(
      R"({"messages": [{"role": "developer", "content": "be brief"},
                       {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                       {"role": "assistant", "content": "ok", "name": "bot"},
                       {"role": "user", "content": "again"}],
          "max_tokens": 5, "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 3,
          "tool_choice": "none", "response_format": {"type": "text"}})");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.max_tokens, 9);  // max_completion_tokens wins
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 3);
  EXPECT_FALSE(
      parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}]})").max_tokens);
  EXPECT_TRUE(
      parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}]})").enable_thinking);
  EXPECT_FALSE(parse_chat_request(R"({"messages": [{"role": "user", "content": "x"}],
                                      "chat_template_kwargs": {"enable_thinking": false}})")
                   .enable_thinking);
}

TEST(OpenAiRequest, BodyLevelErrors) {
  expect_400(Endpoint::completions, "", "invalid_json", "");
  expect_400(Endpoint::completions, "{\"prompt\": ", "invalid_json", "");
  expect_400(Endpoint::completions, "[1, 2]", "invalid_json", "");
  expect_400(Endpoint::completions, R"({"prompt": "x", "max_tokens": 1e400})", "invalid_json", "");
  expect_400(Endpoint::completions, "\"text\"", "invalid_json", "");
  expect_400(Endpoint::completions, "{\"prompt\": \"\xff\"}", "invalid_utf8", "");
  expect_400(Endpoint::completions, "{\"prompt\": \"\xc3\"}", "invalid_utf8", "");  // cut character
  expect_400(Endpoint::completions, "{\"prompt\": \"\xed\xa0\x80\"}", "invalid_utf8",
             "");  // surrogate
  const ApiError e = error_of(Endpoint::completions, "{\"prompt\": \"ab\xff\"}");
  EXPECT_NE(e.message().find("byte 14"), std::string::npos) << e.message();
}

TEST(OpenAiRequest, WrongTypesAndRanges) {
  const auto c = Endpoint::completions;
  expect_400(c, R"({})", "missing_field", "prompt");
  expect_400(c, R"({"prompt": 5})", "invalid_type", "prompt");
  expect_400(c, R"({"prompt": []})", "invalid_value", "prompt");
  expect_400(c, R"({"prompt": ["a", "b"]})", "unsupported", "prompt");
  expect_400(c, R"({"prompt": [1, -2]})", "invalid_value", "prompt[1]");
  expect_400(c, R"({"prompt": [1, 2.5]})", "invalid_type", "prompt[1]");
  expect_400(c, R"({"prompt": [1, 4294967296]})", "invalid_value", "prompt[1]");
  expect_400(c, R"({"prompt": "x", "max_tokens": "5"})", "invalid_type", "max_tokens");
  expect_400(c, R"({"prompt": "x", "max_tokens": 5.0})", "invalid_type", "max_tokens");
  expect_400(c, R"({"prompt": "x", "max_tokens": -1})", "invalid_value", "max_tokens");
  expect_400(c, R"({"prompt": "x", "max_tokens": 1e300})", "invalid_type", "max_tokens");
  expect_400(c, R"({"prompt": "x", "max_tokens": 99999999999999999999})", "invalid_type",
             "max_tokens");
  expect_400(c, R"({"prompt": "x", "temperature": -0.1})", "invalid_value", "temperature");
  expect_400(c, R"({"prompt": "x", "temperature": 1e39})", "invalid_value", "temperature");
  expect_400(c, R"({"prompt": "x", "temperature": true})", "invalid_type", "temperature");
  expect_400(c, R"({"prompt": "x", "top_p": 0})", "invalid_value", "top_p");
  expect_400(c, R"({"prompt": "x", "top_p": 1.5})", "invalid_value", "top_p");
  expect_400(c, R"({"prompt": "x", "top_k": -2})", "invalid_value", "top_k");
  expect_400(c, R"({"prompt": "x", "min_p": 2})", "invalid_value", "min_p");
  expect_400(c, R"({"prompt": "x", "seed": -1})", "invalid_value", "seed");
  expect_400(c, R"({"prompt": "x", "seed": 1.5})", "invalid_type", "seed");
  expect_400(c, R"({"prompt": "x", "n": 0})", "invalid_value", "n");
  expect_400(c, R"({"prompt": "x", "n": 129})", "invalid_value", "n");
  expect_400(c, R"({"prompt": "x", "logprobs": 21})", "invalid_value", "logprobs");
  expect_400(c, R"({"prompt": "x", "logprobs": true})", "invalid_type", "logprobs");
  expect_400(c, R"({"prompt": "x", "echo": 1})", "invalid_type", "echo");
  expect_400(c, R"({"prompt": "x", "stream": "yes"})", "invalid_type", "stream");
  expect_400(c, R"({"prompt": "x", "stream_options": {"include_usage": 1}})", "invalid_type",
             "stream_options.include_usage");
  expect_400(c, R"({"prompt": "x", "stop": 3})", "invalid_type", "stop");
  expect_400(c, R"({"prompt": "x", "stop": ["a", 3]})", "invalid_type", "stop[1]");
  expect_400(c, R"({"prompt": "x", "stop": [""]})", "invalid_value", "stop");
  expect_400(
      c,
      R"({"prompt": "x", "stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]})",
      "invalid_value", "stop");
  expect_400(c, R"({"prompt": "x", "model": 3})", "invalid_type", "model");
  expect_400(c, R"({"prompt": "x", "stream": true, "echo": true, "logprobs": 1})", "unsupported",
             "echo");
  // Not implemented: only the neutral value.
  expect_400(c, R"({"prompt": "x", "presence_penalty": 0.5})", "unsupported", "presence_penalty");
  expect_400(c, R"({"prompt": "x", "frequency_penalty": -1})", "unsupported", "frequency_penalty");
  expect_400(c, R"({"prompt": "x", "logit_bias": {"5": 10}})", "unsupported", "logit_bias");
  expect_400(c, R"({"prompt": "x", "best_of": 2})", "unsupported", "best_of");
  expect_400(c, R"({"prompt": "x", "suffix": "tail"})", "unsupported", "suffix");

  const auto chat = Endpoint::chat;
  expect_400(chat, R"({})", "missing_field", "messages");
  expect_400(chat, R"({"messages": []})", "invalid_value", "messages");
  expect_400(chat, R"({"messages": "hi"})", "invalid_type", "messages");
  expect_400(chat, R"({"messages": [{"content": "x"}]})", "missing_field", "messages[0].role");
  expect_400(chat, R"({"messages": [{"role": "user"}]})", "missing_field", "messages[0].content");
  expect_400(chat, R"({"messages": [{"role": "tool", "content": "x"}]})", "unsupported",
             "messages[0].role");
  expect_400(
      chat,
      R"({"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]})",
      "invalid_value", "messages[1].role");
  expect_400(chat, R"({"messages": [{"role": "user", "content": 5}]})", "invalid_type",
             "messages[0].content");
  expect_400(
      chat,
      R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
      "unsupported", "messages[0].content[0].type");
  expect_400(chat, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})",
             "invalid_value", "max_tokens");
  expect_400(chat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
             "invalid_value", "top_logprobs");
  expect_400(chat, R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 1})",
             "invalid_type", "logprobs");
  expect_400(
      chat,
      R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": 0}})",
      "invalid_type", "chat_template_kwargs.enable_thinking");
  expect_400(chat,
             R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
             "unsupported", "tools");
  expect_400(
      chat,
      R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}})",
      "unsupported", "response_format");
}

TEST(OpenAiErrors, ErrorBodyShape) {
  const ApiError e = invalid_request("invalid_value", "'n' must be in [1, 128], not 0", "n");
  const json j = json::parse(error_body(e));
  EXPECT_EQ(j, (json{{"error",
                      {{"message", "'n' must be in [1, 128], not 0"},
                       {"type", "invalid_request_error"},
                       {"param", "n"},
                       {"code", "invalid_value"}}}}));
  const json k = json::parse(error_body(ApiError(429, "rate_limit_error", "queue_full", "full")));
  EXPECT_TRUE(k["error"]["param"].is_null());
  EXPECT_EQ(k["error"]["type"], "rate_limit_error");
}

TokenText test_names(bool as_ids = false) {
  // Token t decodes to the letter 'a' + t, except 9: half of "é" (an invalid byte alone).
  return {[](int32_t t) {
            return t == 9 ? std::string("\xc3") : std::string(1, static_cast<char>('a' + t));
          },
          as_ids};
}

TEST(OpenAiResponse, CompletionWithLogprobs) {
  ResponseMeta meta{"cmpl-1", 42, "m", "concord-fp32"};
  ChoiceOutput c;
  c.text = "ab";
  c.finish_reason = "length";
  c.tokens = {{0, std::nullopt, std::nullopt, 0},
              {1, -0.5, std::vector<Alternative>{{1, -0.5}, {2, -1.5}}, 1},
              {9, -2.0, std::vector<Alternative>{}, 2}};
  const json j = completion_response(meta, {c}, {3, 2}, test_names(), true);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["id"], "cmpl-1");
  EXPECT_EQ(j["created"], 42);
  EXPECT_EQ(j["usage"],
            (json{{"prompt_tokens", 3}, {"completion_tokens", 2}, {"total_tokens", 5}}));
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], (json{"a", "b", "\xEF\xBF\xBD"}));  // a lone byte reads as U+FFFD
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_EQ(lp["token_logprobs"][1], -0.5);
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["top_logprobs"][1], (json{{"b", -0.5}, {"c", -1.5}}));
  EXPECT_EQ(lp["top_logprobs"][2], json::object());
  EXPECT_EQ(lp["text_offset"], (json{0, 1, 2}));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  // Without logprobs: null.
  EXPECT_TRUE(completion_response(meta, {c}, {3, 2}, test_names(), false)["choices"][0]["logprobs"]
                  .is_null());
  // Token ids instead of strings.
  const json ids = completion_logprobs(c.tokens, test_names(true));
  EXPECT_EQ(ids["tokens"], (json{"token_id:0", "token_id:1", "token_id:9"}));
  EXPECT_EQ(ids["top_logprobs"][1], (json{{"token_id:1", -0.5}, {"token_id:2", -1.5}}));
}

TEST(OpenAiResponse, ChatWithLogprobs) {
  ResponseMeta meta{"chatcmpl-1", 1, "m", ""};
  ChoiceOutput c{"b", {{1, -0.25, std::vector<Alternative>{{1, -0.25}}, 0}}, "stop"};
  const json j = chat_response(meta, {c}, {1, 1}, test_names(), true);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_FALSE(j.contains("system_fingerprint"));
  EXPECT_EQ(j["choices"][0]["message"], (json{{"role", "assistant"}, {"content", "b"}}));
  const json& t = j["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(t["token"], "b");
  EXPECT_EQ(t["logprob"], -0.25);
  EXPECT_EQ(t["bytes"], (json{98}));
  EXPECT_EQ(t["top_logprobs"], (json{{{"token", "b"}, {"logprob", -0.25}, {"bytes", {98}}}}));
  // Raw bytes of a partial character stay raw.
  EXPECT_EQ(chat_logprobs({{9, -1.0, std::vector<Alternative>{}, 0}},
                          test_names())["content"][0]["bytes"],
            (json{0xc3}));
}

TEST(OpenAiStream, ChunksAndEvents) {
  ResponseMeta meta{"chatcmpl-1", 1, "m", ""};
  ChunkPiece first{0, "", {}, std::nullopt, true};
  const json a = stream_chunk(Endpoint::chat, meta, first, test_names(), false, true);
  EXPECT_EQ(a["object"], "chat.completion.chunk");
  EXPECT_EQ(a["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(a["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(a.contains("usage") && a["usage"].is_null());
  ChunkPiece last{1, "", {}, std::string("stop"), false};
  const json b = stream_chunk(Endpoint::chat, meta, last, test_names(), false, false);
  EXPECT_EQ(b["choices"][0]["delta"], json::object());
  EXPECT_EQ(b["choices"][0]["index"], 1);
  EXPECT_EQ(b["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(b.contains("usage"));
  ChunkPiece text{0, "hi", {{7, -1.0, std::vector<Alternative>{}, 4}}, std::nullopt, false};
  const json c = stream_chunk(Endpoint::completions, meta, text, test_names(), true, false);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "hi");
  EXPECT_EQ(c["choices"][0]["logprobs"]["tokens"], (json{"h"}));
  EXPECT_EQ(c["choices"][0]["logprobs"]["text_offset"], (json{4}));
  const json u = usage_chunk(Endpoint::completions, meta, {2, 3});
  EXPECT_EQ(u["choices"], json::array());
  EXPECT_EQ(u["usage"]["total_tokens"], 5);
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  EXPECT_EQ(code_points("a\xc3\xa9\xe2\x82\xac"), 3);
}

}  // namespace
}  // namespace concord::serve::openai
