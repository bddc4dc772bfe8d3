// Chat-template rendering by family and UTF-8-safe streaming (text.h).
#include "concord/serve/text.h"

#include <ctime>

#include <fmt/format.h>

#include "concord/io/utf8.h"
#include "concord/numerics/check.h"

namespace concord::serve {
namespace {

bool contains(std::string_view s, std::string_view what) { return s.find(what) != std::string_view::npos; }

// Jinja's trim: whitespace off both ends.
std::string trim(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

// The default system turn a Qwen2-style template writes as a literal:
// '<|im_start|>system\nTEXT<|im_end|>\n' with no expression inside. The newline is the escape
// "\n" in Qwen2's tokenizer_config.json and a real newline in SmolLM2's GGUF
// tokenizer.chat_template; Jinja reads both as a newline.
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
      std::string out;  // undo the string literal's \n escapes
      for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
          out += '\n';
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

}  // namespace

std::string render_chat(std::string_view tpl, std::string_view user, const ChatOptions& o) {
  if (tpl.empty())
    throw InputError("[chat] the model has no chat template (tokenizer_config.json "
                     "chat_template); run without --chat");
  if (contains(tpl, "<|im_start|>")) {
    std::string out;
    const bool qwen3 = contains(tpl, "enable_thinking");
    if (o.system) {
      out += fmt::format("<|im_start|>system\n{}<|im_end|>\n", *o.system);
    } else if (!qwen3) {
      if (auto d = chatml_default_system(tpl)) out += fmt::format("<|im_start|>system\n{}<|im_end|>\n", *d);
    }
    out += fmt::format("<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n", user);
    if (qwen3 && !o.enable_thinking) out += "<think>\n\n</think>\n\n";
    return out;
  }
  if (contains(tpl, "<|start_header_id|>")) {
    auto turn = [](std::string_view role, std::string_view content) {
      return fmt::format("<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>", role, trim(content));
    };
    std::string out = o.bos_token;
    if (contains(tpl, "Cutting Knowledge Date")) {
      out += "<|start_header_id|>system<|end_header_id|>\n\n";
      out += fmt::format("Cutting Knowledge Date: December 2023\nToday Date: {}\n\n", llama3_date(tpl, o));
      out += trim(o.system.value_or("")) + "<|eot_id|>";
    } else if (o.system) {
      out += turn("system", *o.system);
    }
    out += turn("user", user);
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
  }
  throw InputError("[chat] the chat template is neither ChatML (<|im_start|>, Qwen2/Qwen3) nor "
                   "Llama 3 (<|start_header_id|>), the families concord renders; run without --chat "
                   "and write the prompt in the model's format");
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

}  // namespace concord::serve
