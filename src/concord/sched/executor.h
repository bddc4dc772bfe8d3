// The executor (issue 24): runs a model pass (model_graph.h) node by node in a given order, every
// tensor in memory the executor owns, and measures that memory itself.
//
//   - execute_planned: one arena of plan.arena_bytes; each tensor at its planned offset
//     (plan_offsets), each node's workspace at its own. The arena is instrumented twice: every
//     placement is checked against the buffers live at that moment (an overlap, or an offset past
//     the arena, is an InternalError naming both tensors) and raises the allocation high-water
//     mark; and the arena starts filled with a canary byte, so after the run the highest granule
//     any node wrote is read back from the memory itself (`touched_bytes`).
//   - execute_dynamic: each buffer malloc'd when its producer runs and freed once its last reader
//     has (an in-place output takes its input's buffer), a counter of the bytes held: its maximum
//     over the run is the memory model's live peak (sched::peak) when the model is right.
//
// Model::run_node does the arithmetic (model.h), so the logits of any valid order equal
// Model::forward's bit for bit; the tests and `concord sched --run` check both that and the
// memory figures.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "concord/model/model.h"
#include "concord/sched/sched.h"

namespace concord::sched {

struct Execution {
  std::vector<float> logits;        // (B*S, V); empty for the training step (its logits are not kept)
  double loss = 0;                  // the training step's mean loss (its gradients are the model's)
  int64_t high_water = 0;           // the largest live total the executor's allocations reached
  int64_t touched_bytes = 0;        // planned: the end of the highest arena granule written
  int64_t arena_bytes = 0;          // planned: the arena's size (the plan's)
  double seconds = 0;               // wall time of the nodes
};

// `g` is model_graph(m, pass, S, B[, expert rows]) — for an MoE model with the batch's exact
// expert rows (Model::RouterStats::counts of a forward over the same tokens); `tokens` (B*S).
// The training step's graph (pass `step`) also takes its `targets` (B*S) and the `step` that
// seeds the backward's GEMMs, and leaves the gradients in the model (Model::grad).
Execution execute_planned(model::Model& m, const Graph& g, const Order& order, const ArenaPlan& plan,
                          std::span<const int32_t> tokens, int64_t B, int64_t S, std::span<const int32_t> targets = {},
                          uint64_t step = 0);
Execution execute_dynamic(model::Model& m, const Graph& g, const Order& order, std::span<const int32_t> tokens,
                          int64_t B, int64_t S, std::span<const int32_t> targets = {}, uint64_t step = 0);

// The exact expert rows of a forward over `tokens` (B sequences of S): per application, the rows
// routed to each expert (empty for a dense application) — Model::forward with router statistics on.
std::vector<std::vector<int64_t>> expert_rows_of(model::Model& m, std::span<const int32_t> tokens, int64_t B,
                                                 int64_t S);

// A topological order drawn at random (each step a uniformly chosen ready node): the tests'
// "every valid reordering".
Order random_order(const Graph& g, uint64_t seed);

}  // namespace concord::sched
