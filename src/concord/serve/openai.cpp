// The OpenAI protocol: request validation and response / chunk JSON (openai.h).
#include "concord/serve/openai.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <utility>

#include "concord/io/utf8.h"

namespace concord::serve::openai {

using nlohmann::json;

ApiError::ApiError(int status, std::string type, std::string code, std::string message,
                   std::string param)
    : status_(status),
      type_(std::move(type)),
      code_(std::move(code)),
      message_(std::move(message)),
      param_(std::move(param)) {}

ApiError invalid_request(std::string code, std::string message, std::string param) {
  return ApiError(400, "invalid_request_error", std::move(code), std::move(message),
                  std::move(param));
}

json error_json(const ApiError& error) {
  json e = {{"message", error.message()},
            {"type", error.type()},
            {"param", nullptr},
            {"code", error.code()}};
  if (!error.param().empty()) e["param"] = error.param();
  return json{{"error", std::move(e)}};
}

std::string error_body(const ApiError& error) { return dump(error_json(error)); }

std::string dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

int64_t code_points(std::string_view text) {
  int64_t n = 0;
  for (const char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

namespace {

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
      return "a non-integer number";
    default:
      return "an integer";
  }
}

ApiError wrong_type(const std::string& field, const char* expected, const json& got) {
  return invalid_request("invalid_type",
                         fmt::format("'{}' must be {}, not {}", field, expected, type_name(got)),
                         field);
}

ApiError bad_value(const std::string& field, const std::string& message) {
  return invalid_request("invalid_value", fmt::format("'{}' {}", field, message), field);
}

ApiError unsupported(const std::string& field, const std::string& message) {
  return invalid_request("unsupported", fmt::format("'{}' {}", field, message), field);
}

// The fields of the body object; null counts as absent everywhere (OpenAI's clients send null
// for "not given").
class Fields {
 public:
  explicit Fields(const json& object) : object_(object) {}

  const json* get(const std::string& name) const {
    const auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<bool> boolean(const std::string& name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw wrong_type(name, "a boolean", *v);
    return v->get<bool>();
  }

  // An integer in [min, max] (JSON integers only: 5.0 is not an integer here).
  std::optional<int64_t> integer(const std::string& name, int64_t min, int64_t max) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    return integer_value(name, *v, min, max);
  }

  // A finite number in the domain [min, max] with open ends as asked.
  std::optional<double> number(const std::string& name, double min, double max, bool min_open,
                               bool max_open, const char* domain) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw wrong_type(name, "a number", *v);
    const double x = v->get<double>();
    const bool ok =
        std::isfinite(x) && (min_open ? x > min : x >= min) && (max_open ? x < max : x <= max);
    if (!ok) throw bad_value(name, fmt::format("must be {}, not {}", domain, v->dump()));
    return x;
  }

  std::optional<std::string> string(const std::string& name) const {
    const json* v = get(name);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw wrong_type(name, "a string", *v);
    return v->get<std::string>();
  }

  static int64_t integer_value(const std::string& name, const json& v, int64_t min, int64_t max) {
    if (!v.is_number_integer()) throw wrong_type(name, "an integer", v);
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max))
      throw bad_value(name, fmt::format("must be at most {}, not {}", max, v.dump()));
    const int64_t x =
        v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>()) : v.get<int64_t>();
    if (x < min || x > max) {
      if (max == std::numeric_limits<int64_t>::max())
        throw bad_value(name, fmt::format("must be at least {}, not {}", min, x));
      throw bad_value(name, fmt::format("must be in [{}, {}], not {}", min, max, x));
    }
    return x;
  }

 private:
  const json& object_;
};

json parse_body(std::string_view body) {
  const size_t bad = io::invalid_utf8_offset(body);
  if (bad != std::string_view::npos)
    throw invalid_request("invalid_utf8",
                          fmt::format("the request body is not valid UTF-8 (at byte {})", bad));
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {  // parse_error, and out_of_range for 1e400
    throw invalid_request("invalid_json",
                          fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!j.is_object())
    throw invalid_request(
        "invalid_json",
        fmt::format("the request body must be a JSON object, not {}", type_name(j)));
  return j;
}

std::vector<int64_t> token_ids(const std::string& field, const json& array) {
  std::vector<int64_t> ids;
  ids.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i)
    ids.push_back(Fields::integer_value(fmt::format("{}[{}]", field, i), array[i], 0,
                                        std::numeric_limits<int32_t>::max()));
  return ids;
}

void parse_prompt(const Fields& f, GenerationRequest& r) {
  const json* p = f.get("prompt");
  if (!p) throw invalid_request("missing_field", "'prompt' is required", "prompt");
  if (p->is_string()) {
    r.prompt_text = p->get<std::string>();
    return;
  }
  if (!p->is_array()) throw wrong_type("prompt", "a string or an array of token ids", *p);
  if (p->empty()) throw bad_value("prompt", "must not be an empty array");
  if ((*p)[0].is_string() || (*p)[0].is_array()) {
    // A list of prompts: one is accepted (clients wrap a single prompt); several are not.
    if (p->size() > 1)
      throw unsupported("prompt", fmt::format("holds {} prompts; send one prompt per request "
                                              "(concurrent requests are batched together)",
                                              p->size()));
    const json& only = (*p)[0];
    if (only.is_string()) {
      r.prompt_text = only.get<std::string>();
      return;
    }
    if (only.empty()) throw bad_value("prompt[0]", "must not be an empty array");
    r.prompt_is_tokens = true;
    r.prompt_tokens = token_ids("prompt[0]", only);
    return;
  }
  r.prompt_is_tokens = true;
  r.prompt_tokens = token_ids("prompt", *p);
}

std::string message_content(const std::string& field, const json& content,
                            const std::string& role) {
  if (content.is_null()) {
    if (role == "assistant") return "";
    throw wrong_type(field, "a string or an array of text parts", content);
  }
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw wrong_type(field, "a string or an array of text parts", content);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string part = fmt::format("{}[{}]", field, i);
    const json& c = content[i];
    if (!c.is_object()) throw wrong_type(part, "an object {\"type\": \"text\", \"text\": ...}", c);
    const Fields pf(c);
    const auto type = pf.string("type");
    if (!type)
      throw invalid_request("missing_field", fmt::format("'{}.type' is required", part),
                            part + ".type");
    if (*type != "text")
      throw unsupported(part + ".type",
                        fmt::format("is '{}'; only text parts are supported", *type));
    const auto t = pf.string("text");
    if (!t)
      throw invalid_request("missing_field", fmt::format("'{}.text' is required", part),
                            part + ".text");
    text += *t;
  }
  return text;
}

void parse_messages(const Fields& f, GenerationRequest& r) {
  const json* m = f.get("messages");
  if (!m) throw invalid_request("missing_field", "'messages' is required", "messages");
  if (!m->is_array()) throw wrong_type("messages", "an array", *m);
  if (m->empty()) throw bad_value("messages", "must not be empty");
  for (size_t i = 0; i < m->size(); ++i) {
    const std::string field = fmt::format("messages[{}]", i);
    const json& msg = (*m)[i];
    if (!msg.is_object()) throw wrong_type(field, "an object {\"role\", \"content\"}", msg);
    const Fields mf(msg);
    auto role = mf.string("role");
    if (!role)
      throw invalid_request("missing_field", fmt::format("'{}.role' is required", field),
                            field + ".role");
    if (*role == "developer") role = "system";  // OpenAI's newer name for the system role
    if (*role != "system" && *role != "user" && *role != "assistant")
      throw unsupported(
          field + ".role",
          fmt::format("is '{}'; the roles are system (or developer), user and assistant", *role));
    if (*role == "system" && i != 0)
      throw bad_value(field + ".role", "is 'system'; a system message may only come first");
    if (msg.contains("tool_calls") && !msg["tool_calls"].is_null())
      throw unsupported(field + ".tool_calls", "is not supported (no tool calling)");
    const auto it = msg.find("content");
    if (it == msg.end())
      throw invalid_request("missing_field", fmt::format("'{}.content' is required", field),
                            field + ".content");
    r.messages.push_back({*role, message_content(field + ".content", *it, *role)});
  }
}

void parse_stop(const Fields& f, GenerationRequest& r) {
  const json* s = f.get("stop");
  if (!s) return;
  if (s->is_string()) {
    r.stop.push_back(s->get<std::string>());
  } else if (s->is_array()) {
    if (static_cast<int64_t>(s->size()) > kMaxStopStrings)
      throw bad_value("stop", fmt::format("holds {} strings; at most {} are allowed", s->size(),
                                          kMaxStopStrings));
    for (size_t i = 0; i < s->size(); ++i) {
      if (!(*s)[i].is_string()) throw wrong_type(fmt::format("stop[{}]", i), "a string", (*s)[i]);
      r.stop.push_back((*s)[i].get<std::string>());
    }
  } else {
    throw wrong_type("stop", "a string or an array of strings", *s);
  }
  for (const std::string& stop : r.stop)
    if (stop.empty()) throw bad_value("stop", "must not contain an empty string");
}

// OpenAI fields concord does not implement: accepted only at their neutral value.
void check_unsupported(const Fields& f, Endpoint endpoint) {
  for (const char* name : {"presence_penalty", "frequency_penalty"})
    if (const auto v = f.number(name, -2, 2, false, false, "a number in [-2, 2]"); v && *v != 0)
      throw unsupported(name, "is not supported (only 0)");
  if (const auto v = f.number("repetition_penalty", 0, 1e9, true, false, "a number > 0");
      v && *v != 1)
    throw unsupported("repetition_penalty", "is not supported (only 1)");
  if (const json* v = f.get("logit_bias")) {
    if (!v->is_object()) throw wrong_type("logit_bias", "an object", *v);
    if (!v->empty()) throw unsupported("logit_bias", "is not supported (only {} or null)");
  }
  if (const auto v = f.integer("best_of", 1, std::numeric_limits<int64_t>::max()); v && *v != 1)
    throw unsupported("best_of", "is not supported (only 1)");
  if (endpoint == Endpoint::completions) {
    if (const auto v = f.string("suffix"); v && !v->empty())
      throw unsupported("suffix", "is not supported (insertion)");
    return;
  }
  for (const char* name : {"tools", "functions"}) {
    if (const json* v = f.get(name)) {
      if (!v->is_array()) throw wrong_type(name, "an array", *v);
      if (!v->empty()) throw unsupported(name, "is not supported (no tool calling)");
    }
  }
  for (const char* name : {"tool_choice", "function_call"}) {
    if (const json* v = f.get(name); v && !(v->is_string() && v->get<std::string>() == "none"))
      throw unsupported(name, "is not supported (no tool calling; only \"none\")");
  }
  if (const json* v = f.get("response_format")) {
    if (!v->is_object()) throw wrong_type("response_format", "an object", *v);
    const auto type = Fields(*v).string("type");
    if (!type || *type != "text")
      throw unsupported("response_format", "is not supported (only {\"type\": \"text\"})");
  }
}

}  // namespace

GenerationRequest parse_request(Endpoint endpoint, std::string_view body) {
  const json j = parse_body(body);
  const Fields f(j);
  GenerationRequest r;
  r.endpoint = endpoint;
  r.model = f.string("model");
  if (endpoint == Endpoint::completions) {
    parse_prompt(f, r);
    r.max_tokens = f.integer("max_tokens", 0, std::numeric_limits<int64_t>::max());
    if (const auto lp = f.integer("logprobs", 0, kMaxTopLogprobs)) {
      r.logprobs = true;
      r.top_logprobs = static_cast<int32_t>(*lp);
    }
    r.echo = f.boolean("echo").value_or(false);
  } else {
    parse_messages(f, r);
    if (const json* kw = f.get("chat_template_kwargs")) {
      if (!kw->is_object()) throw wrong_type("chat_template_kwargs", "an object", *kw);
      const auto it = kw->find("enable_thinking");
      if (it != kw->end() && !it->is_null()) {
        if (!it->is_boolean())
          throw wrong_type("chat_template_kwargs.enable_thinking", "a boolean", *it);
        r.enable_thinking = it->get<bool>();
      }
    }
    r.max_tokens = f.integer("max_tokens", 1, std::numeric_limits<int64_t>::max());
    if (const auto m = f.integer("max_completion_tokens", 1, std::numeric_limits<int64_t>::max()))
      r.max_tokens = m;
    r.logprobs = f.boolean("logprobs").value_or(false);
    if (const auto top = f.integer("top_logprobs", 0, kMaxTopLogprobs)) {
      if (*top > 0 && !r.logprobs) throw bad_value("top_logprobs", "needs 'logprobs': true");
      r.top_logprobs = static_cast<int32_t>(*top);
    }
  }
  // Sampling: the engine's domains (sampling.h), as floats the engine holds.
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  r.temperature = static_cast<float>(
      f.number("temperature", 0, kFloatMax, false, false, "a number >= 0").value_or(1.0));
  r.top_p =
      static_cast<float>(f.number("top_p", 0, 1, true, false, "a number in (0, 1]").value_or(1.0));
  r.min_p =
      static_cast<float>(f.number("min_p", 0, 1, false, false, "a number in [0, 1]").value_or(0.0));
  const int64_t top_k = f.integer("top_k", -1, std::numeric_limits<int32_t>::max()).value_or(0);
  r.top_k = static_cast<int32_t>(top_k < 0 ? 0 : top_k);  // -1: off (vLLM)
  if (const json* s = f.get("seed")) {
    if (!s->is_number_integer()) throw wrong_type("seed", "an integer", *s);
    if (!s->is_number_unsigned() && s->get<int64_t>() < 0)
      throw bad_value("seed", fmt::format("must be in [0, 2^64 - 1], not {}", s->dump()));
    r.seed = s->get<uint64_t>();
  }
  parse_stop(f, r);
  r.n = f.integer("n", 1, kMaxChoices).value_or(1);
  r.stream = f.boolean("stream").value_or(false);
  if (const json* so = f.get("stream_options")) {
    if (!so->is_object()) throw wrong_type("stream_options", "an object", *so);
    const auto it = so->find("include_usage");
    if (it != so->end() && !it->is_null()) {
      if (!it->is_boolean()) throw wrong_type("stream_options.include_usage", "a boolean", *it);
      r.include_usage = it->get<bool>();
    }
  }
  r.tokens_as_ids = f.boolean("return_tokens_as_token_ids").value_or(false);
  if (r.stream && r.echo && r.logprobs)
    throw unsupported("echo",
                      "with 'stream' and 'logprobs' is not supported (the prompt's log-probs "
                      "are known only at the end; use a non-streaming request)");
  check_unsupported(f, endpoint);
  return r;
}

GenerationRequest parse_completion_request(std::string_view body) {
  return parse_request(Endpoint::completions, body);
}
GenerationRequest parse_chat_request(std::string_view body) {
  return parse_request(Endpoint::chat, body);
}

std::string TokenText::name(int32_t token) const {
  if (as_ids) return fmt::format("token_id:{}", token);
  return io::utf8_lossy(bytes(token));
}

json completion_logprobs(const std::vector<LoggedToken>& tokens, const TokenText& names) {
  json t = json::array(), lp = json::array(), top = json::array(), offsets = json::array();
  for (const LoggedToken& x : tokens) {
    t.push_back(names.name(x.token));
    lp.push_back(x.logprob ? json(*x.logprob) : json(nullptr));
    if (x.top) {
      json alternatives = json::object();
      for (const Alternative& a : *x.top) {
        const std::string key = names.name(a.token);
        if (!alternatives.contains(key)) alternatives[key] = a.logprob;  // the more probable wins
      }
      top.push_back(std::move(alternatives));
    } else {
      top.push_back(nullptr);
    }
    offsets.push_back(x.text_offset);
  }
  return json{{"tokens", std::move(t)},
              {"token_logprobs", std::move(lp)},
              {"top_logprobs", std::move(top)},
              {"text_offset", std::move(offsets)}};
}

namespace {
json byte_list(const std::string& bytes) {
  json b = json::array();
  for (const char c : bytes) b.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return b;
}
}  // namespace

json chat_logprobs(const std::vector<LoggedToken>& tokens, const TokenText& names) {
  json content = json::array();
  for (const LoggedToken& x : tokens) {
    json top = json::array();
    if (x.top)
      for (const Alternative& a : *x.top)
        top.push_back({{"token", names.name(a.token)},
                       {"logprob", a.logprob},
                       {"bytes", byte_list(names.bytes(a.token))}});
    content.push_back({{"token", names.name(x.token)},
                       {"logprob", x.logprob ? json(*x.logprob) : json(nullptr)},
                       {"bytes", byte_list(names.bytes(x.token))},
                       {"top_logprobs", std::move(top)}});
  }
  return json{{"content", std::move(content)}, {"refusal", nullptr}};
}

namespace {
json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}
json head(const ResponseMeta& meta, const char* object) {
  json j = {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
  if (!meta.system_fingerprint.empty()) j["system_fingerprint"] = meta.system_fingerprint;
  if (meta.weights_version >= 0) j["weights_version"] = meta.weights_version;
  return j;
}
}  // namespace

json completion_response(const ResponseMeta& meta, const std::vector<ChoiceOutput>& choices,
                         const Usage& usage, const TokenText& names, bool logprobs) {
  json j = head(meta, "text_completion");
  json cs = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    cs.push_back({{"index", i},
                  {"text", c.text},
                  {"logprobs", logprobs ? completion_logprobs(c.tokens, names) : json(nullptr)},
                  {"finish_reason", c.finish_reason}});
  }
  j["choices"] = std::move(cs);
  j["usage"] = usage_json(usage);
  return j;
}

json chat_response(const ResponseMeta& meta, const std::vector<ChoiceOutput>& choices,
                   const Usage& usage, const TokenText& names, bool logprobs) {
  json j = head(meta, "chat.completion");
  json cs = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    cs.push_back({{"index", i},
                  {"message", {{"role", "assistant"}, {"content", c.text}}},
                  {"logprobs", logprobs ? chat_logprobs(c.tokens, names) : json(nullptr)},
                  {"finish_reason", c.finish_reason}});
  }
  j["choices"] = std::move(cs);
  j["usage"] = usage_json(usage);
  return j;
}

json stream_chunk(Endpoint endpoint, const ResponseMeta& meta, const ChunkPiece& piece,
                  const TokenText& names, bool logprobs, bool include_usage) {
  const bool chat = endpoint == Endpoint::chat;
  json j = head(meta, chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", piece.index}};
  json lp = nullptr;
  if (logprobs && !piece.tokens.empty())
    lp = chat ? chat_logprobs(piece.tokens, names) : completion_logprobs(piece.tokens, names);
  if (chat) {
    json delta = json::object();
    if (piece.role_first) {
      delta["role"] = "assistant";
      delta["content"] = piece.text;
    } else if (!piece.text.empty() || !piece.finish_reason) {
      delta["content"] = piece.text;
    }
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = piece.text;
  }
  choice["logprobs"] = std::move(lp);
  choice["finish_reason"] = piece.finish_reason ? json(*piece.finish_reason) : json(nullptr);
  j["choices"] = json::array({std::move(choice)});
  if (include_usage) j["usage"] = nullptr;
  return j;
}

json usage_chunk(Endpoint endpoint, const ResponseMeta& meta, const Usage& usage) {
  json j = head(meta, endpoint == Endpoint::chat ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = usage_json(usage);
  return j;
}

std::string sse_event(const json& data) { return "data: " + dump(data) + "\n\n"; }

}  // namespace concord::serve::openai
