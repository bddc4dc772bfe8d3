// Expert parallelism's setup shared by `concord generate` and `concord serve` (docs/moe.md).
#pragma once

#include "concord/model/model.h"

namespace concord::cli {

// Ranks hold only their experts' weights: with `replan`, every expert's content hash taken first,
// as loaded (the weight-sync check of an expert moved later); then the experts not on this rank's
// slots released. A model serving its file's stored blocks keeps every expert (they move as fp32
// values), and then may not re-place (`replan`: InputError "--replan-every: ...").
void hold_own_experts(model::Model& m, model::ExpertParallel& ep, bool replan);

}  // namespace concord::cli
