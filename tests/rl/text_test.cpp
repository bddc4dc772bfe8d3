// rl/text.h: an RL run's prompts and completions — the byte form the recorded runs use, unchanged,
// and a model folder's tokenizer with its chat template (the instruct-model form of issue 22).
#include "concord/rl/text.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concord/io/tokenizer.h"
#include "concord/serve/text.h"
#include "concord/train/data.h"

namespace {

namespace fs = std::filesystem;
using concord::rl::RlText;
using concord::rl::TaskExample;
using concord::rl::task;

// The Qwen3-style BPE the tokenizer tests train on the KJV (4096 tokens, <|im_start|> and friends).
const fs::path kTokenizerJson = fs::path(CONCORD_TEST_DATA_DIR) / "tokenizer" / "qwen3_kjv_4096.json";
const char* kChatMl =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

// A model folder with no weights (RlText reads config, tokenizer and template only).
fs::path model_folder(const std::string& name, bool chat) {
  const fs::path dir = fs::temp_directory_path() / ("concord_rl_text_test_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const concord::io::Tokenizer tok = concord::io::Tokenizer::load(kTokenizerJson);
  write_file(dir / "config.json",
             R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
                 "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
                 "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "tie_word_embeddings": true,
                 "eos_token_id": )" + std::to_string(tok.encode("<|im_end|>").at(0)) +
                 R"(, "vocab_size": )" + std::to_string(tok.vocab_size()) + "}");
  fs::copy_file(kTokenizerJson, dir / "tokenizer.json");
  if (chat) {
    write_file(dir / "tokenizer_config.json",
               nlohmann::json{{"chat_template", kChatMl}}.dump());
  }
  return dir;
}

// The byte form is what every recorded run used: the prompt's bytes, stops at <|eos|> or a
// newline, the first line scored.
TEST(RlText, TheByteFormIsTheRecordedOne) {
  const RlText t;
  EXPECT_EQ(t.kind(), RlText::Kind::bytes);
  const TaskExample e = task("add").generate(0, 0, 4);  // 5905+8594 = 14499
  EXPECT_EQ(t.prompt(e), concord::train::ByteTokenizer{}.encode(e.prompt));
  EXPECT_EQ(t.stop_tokens(), (std::vector<int32_t>{concord::train::ByteTokenizer::kEos, '\n'}));
  std::vector<int32_t> c = concord::train::ByteTokenizer{}.encode("14499");
  c.push_back(concord::train::ByteTokenizer::kEos);
  EXPECT_EQ(t.completion(c), "14499");
  EXPECT_EQ(t.reward(e, c), 1.0);
  EXPECT_EQ(t.stop_strings(), (std::vector<std::string>{"\n"}));
}

// An instruct model: the instruction as the chat turn, its tokenizer, its stop id, the reply's
// last number scored.
TEST(RlText, AChatModelIsAskedTheInstructionAndScoredOnItsLastNumber) {
  const fs::path dir = model_folder("chat", true);
  const RlText t = RlText::of_model(dir.string());
  const concord::io::Tokenizer tok = concord::io::Tokenizer::load(kTokenizerJson);
  const int32_t im_end = tok.encode("<|im_end|>").at(0);
  EXPECT_EQ(t.kind(), RlText::Kind::chat);
  EXPECT_EQ(std::string(t.name()), "chat");
  const TaskExample e = task("add").generate(0, 0, 4);
  const std::string rendered = concord::serve::render_chat(kChatMl, e.instruction);
  EXPECT_EQ(rendered, "<|im_start|>user\nWhat is 5905 + 8594? Reply with only the number.<|im_end|>\n"
                      "<|im_start|>assistant\n");
  EXPECT_EQ(t.prompt(e), tok.encode_for_model(rendered));
  EXPECT_EQ(t.stop_tokens(), (std::vector<int32_t>{im_end}));
  EXPECT_TRUE(t.stop_strings().empty());
  std::vector<int32_t> reply = tok.encode("5905 + 8594 = 14499.");
  reply.push_back(im_end);
  EXPECT_EQ(t.completion(reply), "5905 + 8594 = 14499.");
  EXPECT_EQ(t.reward(e, reply), 1.0);
  // Text after the stop token is not the reply.
  std::vector<int32_t> after = tok.encode("It is 14498");
  after.push_back(im_end);
  for (int32_t id : tok.encode(" 14499")) after.push_back(id);
  EXPECT_EQ(t.reward(e, after), 0.0);
  fs::remove_all(dir);
}

// A tokenizer without a template: the completion form in the model's tokens.
TEST(RlText, AModelWithoutATemplateGetsTheCompletionFormInItsTokens) {
  const fs::path dir = model_folder("plain", false);
  const RlText t = RlText::of_model(dir.string());
  const concord::io::Tokenizer tok = concord::io::Tokenizer::load(kTokenizerJson);
  EXPECT_EQ(t.kind(), RlText::Kind::tokens);
  const TaskExample e = task("reverse").generate(0, 0, 4);  // ybtsxe -> exstby
  EXPECT_EQ(t.prompt(e), tok.encode_for_model(e.prompt));
  std::vector<int32_t> c = tok.encode("exstby\nmore");
  EXPECT_EQ(t.reward(e, c), 1.0);  // up to the newline (a stop token when "\n" is one token)
  EXPECT_EQ(t.stop_strings(), (std::vector<std::string>{"\n"}));
  fs::remove_all(dir);
}

}  // namespace
