// Chat-template rendering by family, UTF-8-safe streaming and stop strings (text.h).
#include "concord/serve/text.h"

#include <algorithm>
#include <ctime>
#include <utility>

#include <fmt/format.h>

#include "concord/io/utf8.h"
#include "concord/numerics/check.h"

namespace concord::serve {
namespace {

bool contains(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

// Python's str.isspace for one code point (Jinja's trim is Python's str.strip()).
bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// The code point of the well-formed sequence at s[i] of length n (1..4).
char32_t code_point(std::string_view s, size_t i, size_t n) {
  const auto byte = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k])); };
  if (n == 1) return byte(0);
  char32_t c = byte(0) & (0x7Fu >> n);
  for (size_t k = 1; k < n; ++k) c = (c << 6) | (byte(k) & 0x3Fu);
  return c;
}

// Jinja's trim: Python's str.strip(), Unicode whitespace off both ends. Bytes that are not
// well-formed UTF-8 are not whitespace.
std::string trim(std::string_view s) {
  size_t b = 0, prefix = 0;
  while (b < s.size()) {
    const size_t n = io::utf8_sequence(s, b, prefix);
    if (n == 0 || !python_space(code_point(s, b, n))) break;
    b += n;
  }
  size_t e = s.size();
  while (e > b) {
    size_t start = e - 1;  // back to the lead byte of the last character
    while (start > b && e - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    const size_t n = io::utf8_sequence(s, start, prefix);
    if (n != e - start || !python_space(code_point(s, start, n))) break;
    e = start;
  }
  return std::string(s.substr(b, e - b));
}

// The default system turn a Qwen2-style template writes as a literal:
// '<|im_start|>system\nTEXT<|im_end|>\n' with no expression inside. The newline is the escape
// "\n" in Qwen2's tokenizer_config.json and a real newline in SmolLM2's GGUF
// tokenizer.chat_template; Jinja reads both as a newline, and TEXT's escapes as Python does.
std::optional<std::string> chatml_default_system(std::string_view tpl) {
  for (const std::string_view open : {std::string_view("<|im_start|>system\\n"),
                                      std::string_view("<|im_start|>system\n")}) {
    for (size_t at = tpl.find(open); at != std::string_view::npos; at = tpl.find(open, at + 1)) {
      const size_t begin = at + open.size();
      const size_t end = tpl.find("<|im_end|>", begin);
      if (end == std::string_view::npos) break;
      const std::string_view text = tpl.substr(begin, end - begin);
      if (text.empty() || contains(text, "'") || contains(text, "\"") || contains(text, "{") ||
          contains(text, "+"))
        continue;
      // Undo the string literal's escapes as Jinja (Python) reads them: \n \t \r \\ (and
      // \' \", which the check above already keeps out); any other backslash stays as written.
      std::string out;
      for (size_t i = 0; i < text.size(); ++i) {
        const char next = i + 1 < text.size() ? text[i + 1] : '\0';
        const char* unescaped = nullptr;
        if (text[i] == '\\') {
          switch (next) {
            case 'n': unescaped = "\n"; break;
            case 't': unescaped = "\t"; break;
            case 'r': unescaped = "\r"; break;
            case '\\': unescaped = "\\"; break;
            default: break;
          }
        }
        if (unescaped) {
          out += unescaped;
          ++i;
        } else {
          out += text[i];
        }
      }
      return out;
    }
  }
  return std::nullopt;
}

std::string llama3_date(std::string_view tpl, const ChatOptions& o) {
  if (!o.today.empty()) return o.today;
  const std::string_view key = "date_string = \"";
  const size_t at = tpl.find(key);
  if (!contains(tpl, "strftime_now") && at != std::string_view::npos) {
    const size_t end = tpl.find('"', at + key.size());
    if (end != std::string_view::npos) return std::string(tpl.substr(at + key.size(), end - at - key.size()));
  }
  const std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%d %b %Y", std::localtime(&now));
  return buf;
}

// Python's str.strip(chars) / lstrip / rstrip with one character set.
std::string_view lstrip(std::string_view s, std::string_view chars) {
  const size_t b = s.find_first_not_of(chars);
  return b == std::string_view::npos ? std::string_view() : s.substr(b);
}
std::string_view rstrip(std::string_view s, std::string_view chars) {
  const size_t e = s.find_last_not_of(chars);
  return e == std::string_view::npos ? std::string_view() : s.substr(0, e + 1);
}

// Qwen3's template: earlier assistant turns lose their reasoning; the ones after the last user
// query keep it. Transcribed from its Jinja (tools aside, which concord does not render).
void render_qwen3_turns(std::string& out, const std::vector<ChatMessage>& messages, bool has_system) {
  // The last user message that is not a wrapped tool response (the template walks backwards).
  size_t last_query = messages.size() - 1;
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string_view c = messages[i].content;
    const bool tool_response = c.starts_with("<tool_response>") && c.ends_with("</tool_response>");
    if (messages[i].role == "user" && !tool_response) {
      last_query = i;
      break;
    }
  }
  for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "assistant") {
      out += fmt::format("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
      continue;
    }
    std::string_view content = m.content, reasoning;
    if (const size_t close = content.find("</think>"); close != std::string_view::npos) {
      // content.split('</think>')[-1].lstrip('\n'), and
      // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n').
      const std::string_view before = rstrip(content.substr(0, close), "\n");
      const size_t open = before.rfind("<think>");
      reasoning = lstrip(open == std::string_view::npos ? before : before.substr(open + 7), "\n");
      content = lstrip(content.substr(content.rfind("</think>") + 8), "\n");
    }
    const bool last = i + 1 == messages.size();
    if (i > last_query && (last || !reasoning.empty())) {
      out += fmt::format("<|im_start|>assistant\n<think>\n{}\n</think>\n\n{}", lstrip(rstrip(reasoning, "\n"), "\n"),
                         lstrip(content, "\n"));
    } else {
      out += fmt::format("<|im_start|>assistant\n{}", content);
    }
    out += "<|im_end|>\n";
  }
}

std::string render_chatml(std::string_view tpl, const std::vector<ChatMessage>& messages, bool has_system,
                          const ChatOptions& o) {
  std::string out;
  const bool qwen3 = contains(tpl, "enable_thinking");
  if (has_system) {
    out += fmt::format("<|im_start|>system\n{}<|im_end|>\n", messages.front().content);
  } else if (!qwen3) {
    if (auto d = chatml_default_system(tpl)) out += fmt::format("<|im_start|>system\n{}<|im_end|>\n", *d);
  }
  if (qwen3) {
    render_qwen3_turns(out, messages, has_system);
  } else {
    for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i)
      out += fmt::format("<|im_start|>{}\n{}<|im_end|>\n", messages[i].role, messages[i].content);
  }
  out += "<|im_start|>assistant\n";
  if (qwen3 && !o.enable_thinking) out += "<think>\n\n</think>\n\n";
  return out;
}

std::string render_llama3(std::string_view tpl, const std::vector<ChatMessage>& messages, bool has_system,
                          const ChatOptions& o) {
  auto turn = [](std::string_view role, std::string_view content) {
    return fmt::format("<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>", role, trim(content));
  };
  std::string out = o.bos_token;
  if (contains(tpl, "Cutting Knowledge Date")) {
    out += "<|start_header_id|>system<|end_header_id|>\n\n";
    out += fmt::format("Cutting Knowledge Date: December 2023\nToday Date: {}\n\n", llama3_date(tpl, o));
    out += (has_system ? trim(messages.front().content) : std::string()) + "<|eot_id|>";
  } else if (has_system) {
    out += turn("system", messages.front().content);
  }
  for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) out += turn(messages[i].role, messages[i].content);
  out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace

std::string render_chat(std::string_view tpl, std::span<const ChatMessage> messages, const ChatOptions& o) {
  if (tpl.empty())
    throw InputError("[chat] the model has no chat template (tokenizer_config.json "
                     "chat_template); run without --chat");
  const bool chatml = contains(tpl, "<|im_start|>"), llama3 = contains(tpl, "<|start_header_id|>");
  if (!chatml && !llama3)
    throw InputError("[chat] the chat template is neither ChatML (<|im_start|>, Qwen2/Qwen3) nor "
                     "Llama 3 (<|start_header_id|>), the families concord renders; run without --chat "
                     "and write the prompt in the model's format");
  // One list with the system message first, if there is one.
  std::vector<ChatMessage> conversation;
  if (o.system) conversation.push_back({"system", *o.system});
  conversation.insert(conversation.end(), messages.begin(), messages.end());
  if (conversation.empty()) throw InputError("[chat] the conversation has no messages");
  const size_t offset = o.system ? 1 : 0;  // errors name the caller's message index
  for (size_t i = 0; i < conversation.size(); ++i) {
    const std::string& role = conversation[i].role;
    if (role == "system" && i > 0)
      throw InputError(o.system && i == 1
                           ? std::string("[chat] two system messages: the options' and the conversation's")
                           : fmt::format("[chat] message {}: a system message may only come first", i - offset));
    if (role != "system" && role != "user" && role != "assistant")
      throw InputError(fmt::format("[chat] message {} has role '{}'; the roles are system, user and assistant",
                                   i - offset, role));
  }
  const bool has_system = conversation.front().role == "system";
  if (chatml) return render_chatml(tpl, conversation, has_system, o);
  return render_llama3(tpl, conversation, has_system, o);
}

std::string render_chat(std::string_view tpl, std::string_view user, const ChatOptions& o) {
  const ChatMessage turn{"user", std::string(user)};
  return render_chat(tpl, std::span<const ChatMessage>(&turn, 1), o);
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_ += bytes;
  std::string ready;
  ready.reserve(pending_.size() + 8);
  size_t i = 0, prefix = 0;
  while (i < pending_.size()) {
    const size_t n = io::utf8_sequence(pending_, i, prefix);
    if (n > 0) {
      ready.append(pending_, i, n);
      i += n;
    } else if (io::utf8_incomplete_at_end(pending_, i)) {
      break;  // the rest of this character is still to come
    } else {
      ready += io::kReplacementCharacter;  // one per maximal invalid subpart, as utf8_lossy
      i += prefix;
    }
  }
  pending_.erase(0, i);
  return ready;
}

std::string Utf8Stream::flush() {
  std::string rest = io::utf8_lossy(pending_);  // an unfinished character: one U+FFFD
  pending_.clear();
  return rest;
}

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (size_t i = 0; i < stops_.size(); ++i) {
    if (stops_[i].empty()) throw InputError(fmt::format("[stop] stop string {} is empty; remove it", i));
    if (io::invalid_utf8_offset(stops_[i]) != std::string::npos)
      throw InputError(fmt::format("[stop] stop string {} is not valid UTF-8", i));
  }
}

std::string StopStrings::push(std::string_view text) {
  if (stopped_) return "";
  std::string buffer = std::move(held_);
  held_.clear();
  buffer += text;
  // The earliest-ending occurrence: per stop, its first occurrence ends first (one length).
  size_t best_end = std::string::npos, best_start = 0;
  for (const std::string& stop : stops_) {
    const size_t at = buffer.find(stop);
    if (at == std::string::npos) continue;
    const size_t end = at + stop.size();
    if (end < best_end || (end == best_end && at < best_start)) {
      best_end = end;
      best_start = at;
    }
  }
  if (best_end != std::string::npos) {
    stopped_ = true;
    buffer.resize(best_start);
    return buffer;
  }
  // No stop is complete, so any future occurrence starts inside the longest suffix that is a
  // proper prefix of some stop string; everything before it is final.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (size_t k = std::min(buffer.size(), stop.size() - 1); k > hold; --k) {
      if (std::string_view(buffer).substr(buffer.size() - k) == std::string_view(stop).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  held_.assign(buffer, buffer.size() - hold, hold);
  buffer.erase(buffer.size() - hold);  // hold <= buffer.size(): k never exceeds it
  return buffer;
}

std::string StopStrings::flush() {
  std::string rest = std::move(held_);  // a stop never completes here: push checked every byte
  held_.clear();
  return rest;
}

}  // namespace concord::serve
