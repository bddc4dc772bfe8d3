// How an RL run turns a task example into prompt tokens and a completion's tokens back into the
// text its reward reads (rl/tasks.h, docs/tasks.md):
//   bytes  the byte tokenizer of the models `concord rl` warms up itself (and of any init_from
//          folder whose vocabulary is those 259 ids): the "Q: ..\nA: " prompt, stops at the end
//          token or a newline, the reward reads the first line;
//   chat   a model folder with a tokenizer and a chat template (an instruct model such as
//          SmolLM2-135M-Instruct): the example's instruction as the user turn of the template
//          (its default system turn included, as HF's apply_chat_template renders it), the
//          model's tokenizer (BOS where its vocabulary adds one), stops at the model's stop ids,
//          the reward reads the reply's last number or word (AnswerForm::last);
//   tokens a model folder with a tokenizer and no template: the "Q: ..\nA: " prompt in its
//          tokens, stops at its stop ids or a newline token, the reward reads the first line.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "concord/rl/tasks.h"

namespace concord::io {
class Tokenizer;
}

namespace concord::rl {

class RlText {
 public:
  enum class Kind : uint8_t { bytes, chat, tokens };
  // The byte form.
  RlText();
  // The form of a model folder (or GGUF file): bytes when it has no tokenizer or a byte-level
  // one of at most 259 ids, else chat (when it has a chat template and `use_chat_template`) or
  // tokens.
  static RlText of_model(const std::string& path, bool use_chat_template = true);

  Kind kind() const { return kind_; }
  const char* name() const;  // "bytes", "chat", "tokens"
  AnswerForm form() const { return kind_ == Kind::chat ? AnswerForm::last : AnswerForm::line; }
  std::vector<int32_t> prompt(const TaskExample& example) const;
  // The text of a completion: its tokens up to the first stop token, decoded (special tokens
  // skipped).
  std::string completion(std::span<const int32_t> tokens) const;
  const std::vector<int32_t>& stop_tokens() const { return stops_; }
  // Stop strings for an OpenAI-API sampler (POST /v1/completions "stop"): "\n" unless chat.
  std::vector<std::string> stop_strings() const;
  double reward(const TaskExample& example, std::span<const int32_t> completion_tokens) const;

 private:
  Kind kind_ = Kind::bytes;
  std::shared_ptr<const io::Tokenizer> tokenizer_;
  std::string chat_template_;
  std::vector<int32_t> stops_;
};

}  // namespace concord::rl
