// The supervised warm-up of an RL run (loop.h): next-token training on task examples
// (prompt + answer + <|eos|>, loss on the answer and eos only; fp32; AdamW with a short linear
// warm-up and cosine decay) so that a small model starts GRPO with a non-zero reward, and the
// folder that caches its result (RlConfig::base: an HF-layout model folder plus warmup.json,
// written last, recording what produced it; reused only when it matches).
#pragma once

#include <cstdint>
#include <vector>

#include "concord/model/model.h"
#include "concord/rl/loop.h"
#include "concord/rl/tasks.h"

namespace concord::rl {

// Task example `index` of `seed` for the config's task and difficulty ("mixed": every task in
// turn, as generate_examples does).
TaskExample config_example(const RlConfig& c, uint64_t seed, uint64_t index);

// Every parameter's fp32 values in params() order; and back (then weights_changed()).
std::vector<std::vector<float>> model_weights(model::Model& m);
void set_model_weights(model::Model& m, const std::vector<std::vector<float>>& values);

struct WarmupResult {
  std::vector<std::vector<float>> weights;  // params() order of c.resolved_model()
  bool cached = false;                      // loaded from c.base
  double loss = 0;                          // the last warm-up step's loss (0 when cached)
};
// From c.base when its warmup.json matches, else trained here (from init_from or a seeded random
// init) and, when c.base is set, written there. progress: a line every 20% on stderr.
WarmupResult warm_up(const RlConfig& c, bool progress);

}  // namespace concord::rl
