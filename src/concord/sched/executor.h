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
// Model::forward's (a cached pass: Model::forward_cached's, logits and KV cache rows) bit for bit;
// the tests and `concord sched --run` check both that and the memory figures.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "concord/model/kv_cache.h"
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

// Memory a planned execution reuses from call to call (the engine's activation arena): it grows
// to the largest plan it is given and is never filled or instrumented — a run on it trusts the
// plan's offsets (replay_plan checks a plan; the tests check every planner's under the canary), and
// its Execution::high_water is the plan's arena.
class ArenaMemory {
 public:
  ArenaMemory() = default;
  ArenaMemory(const ArenaMemory&) = delete;
  ArenaMemory& operator=(const ArenaMemory&) = delete;
  ~ArenaMemory();
  void reserve(int64_t bytes);  // at least `bytes`, 64-byte aligned (contents not kept)
  unsigned char* data() { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  unsigned char* data_ = nullptr;
  int64_t bytes_ = 0;
};

// A cached pass — an engine step, Model::forward_cached's `inputs` on `cache` — through the graph
// of their shape (model_graph(m, CachedShape)): each slot's new k and v rows are appended to the
// cache (its own memory, outside the arena) and its length advanced; the logits (the rows the
// inputs' LogitRows ask for, input by input) and the cache rows equal forward_cached's bit for bit.
// Planned with `memory` null: a fresh, instrumented arena as above; given: that memory, reused.
Execution execute_planned(model::Model& m, const Graph& g, const Order& order, const ArenaPlan& plan,
                          model::KvCache& cache, std::span<const model::CachedInput> inputs,
                          ArenaMemory* memory = nullptr);
Execution execute_dynamic(model::Model& m, const Graph& g, const Order& order, model::KvCache& cache,
                          std::span<const model::CachedInput> inputs);

// A cached pass's graph, order and plan made ready to run many times (the engine: one per step
// shape): the order and the plan are checked once (replay_plan), the graph's buffers and readers
// worked out once. run() is execute_planned on `memory` with the logits written into `logits`
// (logit rows x V floats, exactly).
class PreparedPass {
 public:
  PreparedPass(Graph graph, Order order, ArenaPlan plan);
  PreparedPass(PreparedPass&&) noexcept;
  PreparedPass& operator=(PreparedPass&&) noexcept;
  ~PreparedPass();
  const Graph& graph() const;
  const Order& order() const;
  const ArenaPlan& plan() const;
  Execution run(model::Model& m, model::KvCache& cache, std::span<const model::CachedInput> inputs, ArenaMemory& memory,
                std::span<float> logits) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The exact expert rows of a forward over `tokens` (B sequences of S): per application, the rows
// routed to each expert (empty for a dense application) — Model::forward with router statistics on.
std::vector<std::vector<int64_t>> expert_rows_of(model::Model& m, std::span<const int32_t> tokens, int64_t B,
                                                 int64_t S);

// A topological order drawn at random (each step a uniformly chosen ready node): the tests'
// "every valid reordering".
Order random_order(const Graph& g, uint64_t seed);

}  // namespace concord::sched
