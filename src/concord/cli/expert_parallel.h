// Expert parallelism's setup shared by `concord generate` and `concord serve` (docs/moe.md).
#pragma once

#include <string>

#include "concord/model/model.h"
#include "concord/serve/ep_sim.h"

namespace concord::cli {

// Ranks hold only their experts' weights: with `replan`, every expert's content hash taken first,
// as loaded (the weight-sync check of an expert moved later); then the experts not on this rank's
// slots released. A model serving its file's stored blocks keeps every expert (they move as fp32
// values), and then may not re-place (`replan`: InputError "--replan-every: ...").
void hold_own_experts(model::Model& m, model::ExpertParallel& ep, bool replan);

// A cost model JSON (`concord ep-sim --calibrate --cost-out`): pass_s, piece_s, row_s,
// exchange_pass_s, exchange_row_s (numbers >= 0) and optionally exchange (alltoall | allgather).
// InputError "[layer] path: ..." otherwise.
serve::epsim::CostModel read_ep_cost(const std::string& path, const std::string& layer);

}  // namespace concord::cli
