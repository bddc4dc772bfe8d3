// Speculative decoding on the real model, SmolLM2-135M-Instruct (the Q4_1 GGUF scripts/setup
// installs; CMake passes its path as CONCORD_SMOLLM2_GGUF): greedy speculative output is the
// plain greedy output token for token, log-probs included, three chat prompts batched, for the
// served precision (native W4A8 blocks) with prompt lookup and for the fp32 model with self
// drafters (mxfp4 weights, the first 10 of 30 layers). Labelled slow.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "concord/model/files.h"
#include "concord/serve/drafter.h"
#include "concord/serve/engine.h"

namespace concord::serve {
namespace {

namespace fs = std::filesystem;
const fs::path kModel = CONCORD_SMOLLM2_GGUF;

std::vector<Request> chat_requests(const io::Tokenizer& tok, const std::vector<int32_t>& stops) {
  std::vector<Request> out;
  for (const char* q : {"What is the capital of France?", "Write the numbers from 1 to 20, separated by commas.",
                        "Name three colours."}) {
    Request r;
    r.prompt = tok.encode_for_model(std::string("<|im_start|>user\n") + q + "<|im_end|>\n<|im_start|>assistant\n");
    r.sampling.temperature = 0;
    r.max_tokens = 24;
    r.stop_tokens = stops;
    out.push_back(r);
  }
  return out;
}

void expect_same(const std::vector<Completion>& plain, const std::vector<Completion>& spec, const std::string& what) {
  ASSERT_EQ(plain.size(), spec.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(spec[i].tokens, plain[i].tokens) << what << ", prompt " << i;
    EXPECT_EQ(spec[i].logprobs, plain[i].logprobs) << what << ", prompt " << i;
  }
}

TEST(SmolLM2Speculative, GreedyOutputIsThePlainGreedyOutput) {
  ASSERT_TRUE(fs::exists(kModel)) << kModel << " is missing: run scripts/setup";
  for (const char* policy : {"native", "fp32"}) {
    model::LoadedModel m = model::load_model(kModel, policy);
    const std::vector<Request> rs = chat_requests(*m.source.tokenizer, m.source.stop_token_ids);
    Engine plain_engine(m.model, {.max_sequences = 3});
    const std::vector<Completion> plain = plain_engine.generate(rs);
    std::vector<std::string> drafters = {"ngram"};
    if (std::string(policy) == "fp32") drafters = {"ngram", "self:mxfp4", "self:layers=10"};
    for (const std::string& d : drafters) {
      Engine e(m.model, {.max_sequences = 3});
      e.set_drafter(make_builtin_drafter(parse_drafter_spec(d), m.model, d, 3, e.options().max_context),
                    {.draft_tokens = 4});
      expect_same(plain, e.generate(rs), std::string(policy) + " / " + d);
      EXPECT_GT(e.stats().speculation.rounds, 0) << d;
    }
  }
}

}  // namespace
}  // namespace concord::serve
