// Held-out evaluation of a trained model, for depth recurrence above all (docs/recurrence.md):
// the loss of one checkpoint at many test depths, and token-by-token decoding through the KV
// cache at a fixed depth or with adaptive exit (iterations per token, tokens/s).
//
// `concord eval --run DIR` rebuilds the run's own validation batches from DIR/config.json (the
// corpus, split and sequence length the run was trained and validated on) and evaluates
// DIR/final.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "concord/model/model.h"
#include "concord/train/data.h"
#include "concord/train/trainer.h"

namespace concord::train {

// The run's validation batches (as the trainer builds them) and its config.
struct RunData {
  TrainConfig config;
  std::vector<Batch> validation;
};
RunData load_run_data(const std::filesystem::path& run_dir);

// Mean cross-entropy (nats per byte for the byte tokenizer) over every target of `batches`,
// full forward at the model's current depth.
double mean_loss(model::Model& m, const std::vector<Batch>& batches);

struct DecodeEval {
  double loss = 0;                  // nats per token over the decoded targets
  double iterations_per_token = 0;  // core iterations (recurrent), mean over tokens
  double tokens_per_second = 0;     // single-stream decode
  int64_t tokens = 0;
};
// Decodes the first `rows` rows of the batches one sequence and one token at a time through a
// KV cache (the single-stream decode adaptive exit is for), scoring each target: at the model's
// depth, or with `exit` (Model::set_adaptive_exit) when given; adaptive exit is off afterwards.
DecodeEval decode_eval(model::Model& m, const std::vector<Batch>& batches, int64_t rows,
                       std::optional<model::Model::AdaptiveExit> exit);

// Exact-match accuracy on `problems` additions whose operands have exactly `digits` digits
// (addition_problems with `seed`, the sum in `order`): the prompt "\na+b=" (a line start, as in
// the training text), then greedy decoding until '\n' or digits + 2 tokens, at the model's
// current depth.
double addition_accuracy(model::Model& m, int digits, int64_t problems, uint64_t seed,
                         SumOrder order = SumOrder::msb_first);

}  // namespace concord::train
