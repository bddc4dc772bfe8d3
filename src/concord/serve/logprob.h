// The log-probability definition the sampler uses: model/logprob.h's, the one the learner and
// the sync probe use too (not a copy). See there for the definition and its errors.
#pragma once

#include "concord/model/logprob.h"

namespace concord::serve {

using model::full_logprobs;
using model::logprob_temperature;
using model::softmax_stats;
using model::SoftmaxStats;
using model::token_logprob;

}  // namespace concord::serve
