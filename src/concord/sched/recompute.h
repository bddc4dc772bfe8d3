// Selective recomputation in the training step (issue 24): which activations the forward drops
// and the backward recomputes (Model::set_recompute: per application keep, attention — the
// probabilities — or block — everything but the input), what that saves, what it costs, and the
// plan of least extra compute under a memory budget.
//
// The memory model is the model's activation arena (a bump allocator: the forward allocates
// every application's activations in order, the backward its gradient scratch once, then per
// application in reverse what recomputation and the block's backward need, released after it):
// training_memory predicts the live bytes of that arena at its worst moment, each allocation
// rounded up to 64 bytes as the arena rounds it, and the tests check the prediction against
// Model::activation_memory().live_high_water byte for byte for every plan.
//
// Planning. The objective is additive (the recomputation's FLOPs), the constraint is not: the
// peak is what the applications keep plus the largest transient any one needs (its recomputation
// and its backward's scratch). With transients fixed it is a multiple-choice knapsack — NP-hard
// (0/1 knapsack is the case of two modes per item and no transients: an item's weight its kept
// bytes, its value its recompute cost), pseudo-polynomial in bytes; with recomputation chained
// through arbitrary graphs (a recomputed tensor's inputs recomputed in turn) it is the pebble game
// with recomputation, PSPACE-complete in general (Gilbert, Lengauer and Tarjan 1980; Checkmate,
// Jain et al. 2020, solves it as an ILP). Here:
//   - recompute_exact: branch and bound over every application's mode (exhaustive: 3^A plans,
//     pruned by cost and by a memory lower bound), exact, for models of up to ~14 applications;
//   - plan_recompute: exact for a model whose applications fall into few classes of identical
//     blocks (every decoder: dense layers, MoE layers) by enumerating how many of each class take
//     each mode — the class's applications are interchangeable in the backward's peak, and the
//     forward's is smallest with the recomputed ones first;
//   - recompute_greedy: the heuristic beyond (drop attention probabilities first, then whole
//     blocks, each time the move that saves the most bytes per FLOP), checked against the exact
//     plans in the tests.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "concord/model/model.h"

namespace concord::sched {

using Recompute = model::Model::Recompute;

struct TrainingMemory {
  int64_t peak = 0;              // bytes: the activation arena's live high-water mark
  std::string peak_at;           // "forward, application 3", "backward, application 7", "loss head"
  int64_t kept = 0;              // after the forward: what it keeps for the backward, and the head's
  int64_t backward_scratch = 0;  // the backward's gradient buffers (allocated once, with dlogits)
  double step_flops = 0;         // one training step without recomputation (forward + 2x backward)
  double recompute_flops = 0;    // what the plan adds
};

// The training step of B sequences of S tokens (forward_backward) under `modes` (one per
// application of the schedule; empty: keep everywhere). InputError: a depth-recurrent model, a
// list of the wrong length.
TrainingMemory training_memory(const model::ModelConfig& c, int64_t B, int64_t S, std::span<const Recompute> modes);

struct RecomputePlan {
  std::vector<Recompute> modes;
  TrainingMemory memory;
};
// The plan of least recompute FLOPs (then fewest bytes) whose peak is at most `budget` bytes;
// nullopt when none fits (not even every application in block mode). Exact (see above).
std::optional<RecomputePlan> plan_recompute(const model::ModelConfig& c, int64_t B, int64_t S, int64_t budget);
// Exhaustive branch and bound over every application's mode (InputError past 16 applications).
std::optional<RecomputePlan> recompute_exact(const model::ModelConfig& c, int64_t B, int64_t S, int64_t budget);
// The greedy heuristic; nullopt when it finds no plan under the budget.
std::optional<RecomputePlan> recompute_greedy(const model::ModelConfig& c, int64_t B, int64_t S, int64_t budget);

// The trade-off (Checkmate's curve): the exact plan at each of `points` budgets spread evenly
// from the smallest achievable peak (every application block) to keeping everything.
std::vector<RecomputePlan> recompute_curve(const model::ModelConfig& c, int64_t B, int64_t S, int points);

// The plan of least activation memory: every application a block, or its attention where a block
// is not allowed (an MoE layer of a model with output_router_logits).
std::vector<Recompute> smallest_plan(const model::ModelConfig& c);
// "3 keep, 1 attention, 26 block"
std::string recompute_summary(std::span<const Recompute> modes);

std::string recompute_name(Recompute r);  // "keep", "attention", "block"
Recompute recompute_from_name(const std::string& name);  // InputError otherwise

}  // namespace concord::sched
