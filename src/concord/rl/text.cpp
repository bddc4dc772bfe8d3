// rl/text.h: prompts and completions of an RL run, in bytes or in a model's tokens and template.
#include "concord/rl/text.h"

#include <algorithm>

#include "concord/io/tokenizer.h"
#include "concord/model/files.h"
#include "concord/serve/text.h"
#include "concord/train/data.h"

namespace concord::rl {

using train::ByteTokenizer;

RlText::RlText() : stops_{ByteTokenizer::kEos, '\n'} {}

RlText RlText::of_model(const std::string& path, bool use_chat_template) {
  model::ModelSource source = model::inspect_model(path);
  RlText t;
  if (!source.tokenizer || source.tokenizer->vocab_size() <= ByteTokenizer::vocab_size()) return t;
  t.tokenizer_ = std::make_shared<const io::Tokenizer>(std::move(*source.tokenizer));
  t.stops_ = source.stop_token_ids;
  if (use_chat_template && !source.chat_template.empty()) {
    t.kind_ = Kind::chat;
    t.chat_template_ = source.chat_template;
  } else {
    t.kind_ = Kind::tokens;
    const std::vector<int32_t> nl = t.tokenizer_->encode("\n");
    if (nl.size() == 1 && std::find(t.stops_.begin(), t.stops_.end(), nl[0]) == t.stops_.end())
      t.stops_.push_back(nl[0]);
  }
  return t;
}

const char* RlText::name() const {
  switch (kind_) {
    case Kind::bytes: return "bytes";
    case Kind::chat: return "chat";
    case Kind::tokens: return "tokens";
  }
  return "?";
}

std::vector<int32_t> RlText::prompt(const TaskExample& example) const {
  switch (kind_) {
    case Kind::bytes: return ByteTokenizer{}.encode(example.prompt);
    case Kind::chat: return tokenizer_->encode_for_model(serve::render_chat(chat_template_, example.instruction));
    case Kind::tokens: return tokenizer_->encode_for_model(example.prompt);
  }
  return {};
}

std::string RlText::completion(std::span<const int32_t> tokens) const {
  if (kind_ == Kind::bytes) {  // bytes up to the first special token
    std::string out;
    for (int32_t t : tokens) {
      if (t < 0 || t > 255) break;
      out.push_back(static_cast<char>(t));
    }
    return out;
  }
  size_t n = 0;
  while (n < tokens.size() && std::find(stops_.begin(), stops_.end(), tokens[n]) == stops_.end()) ++n;
  return tokenizer_->decode(tokens.subspan(0, n), true);
}

std::vector<std::string> RlText::stop_strings() const {
  if (kind_ == Kind::chat) return {};
  return {"\n"};
}

double RlText::reward(const TaskExample& example, std::span<const int32_t> completion_tokens) const {
  return task(example.task).reward(example, completion(completion_tokens), form());
}

}  // namespace concord::rl
