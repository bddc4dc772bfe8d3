// Expert placement for expert-parallel MoE serving (issue 23; docs/moe.md "Placement").
//
// The problem, per MoE layer: E logical experts with loads w_e (tokens routed to them, from router
// statistics), S = R·s physical slots on R ranks (s slots each). A placement gives every expert
// c_e >= 1 replicas (Σ c_e = S) and puts the replicas on the slots; a replica serves w_e / c_e
// (the tokens split evenly among an expert's replicas). A rank's load is the sum over its slots;
// the layer waits for the largest, so the objective is the maximum rank load.
//
// eplb(): DeepSeek's EPLB (github.com/deepseek-ai/EPLB, eplb.py), re-implemented from its
// description and code: replicate_experts gives the next replica, S − E times, to the expert of
// largest w_e / c_e (ties to the lower index); balanced_packing sorts items by weight (descending,
// ties to the lower index) and puts each on the least loaded pack that still has room (ties to the
// lower pack), every pack taking exactly n / packs items. Hierarchical (groups of experts packed to
// nodes first, replicas made within a node, then packed to the node's ranks) when the groups
// divide among the nodes, else the global policy (one group, one node).
//
// optimal(): the exact optimum of the same problem by exhaustive search (small instances only:
// every replica-count vector, then a branch and bound over the slot assignment), so that a
// heuristic's distance from the best placement can be measured.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace concord::serve::eplb {

struct Placement {
  int64_t ranks = 0, slots_per_rank = 0;
  std::vector<int64_t> slot_expert;  // (ranks · slots_per_rank): the logical expert on each slot,
                                     // rank r's slots are [r·s, (r+1)·s)
  std::vector<int64_t> replicas;     // (E): c_e
  std::vector<int64_t> replica_rank; // (ranks · slots_per_rank): which replica of its expert (0..c_e-1)
};

// Each rank's slots: the experts on rank r's slots [r·s, (r+1)·s), in slot order.
std::vector<std::vector<int64_t>> rank_slots(const Placement& p);

// The loads of a placement: rank r's sum of w_e / c_e over its slots.
std::vector<double> rank_loads(const Placement& p, std::span<const double> load);
double max_rank_load(const Placement& p, std::span<const double> load);

// EPLB's packing of n items into `packs` packs of exactly n / packs items each (n a multiple of
// packs): the pack of each item. InputError otherwise.
std::vector<int64_t> balanced_packing(std::span<const double> weight, int64_t packs);

// EPLB for one layer: `load` (E) the tokens per expert, `ranks` × `slots_per_rank` physical slots
// (>= E), `groups` expert groups (E a multiple of it) and `nodes` (ranks a multiple of it).
// InputError naming what does not divide.
Placement eplb(std::span<const double> load, int64_t ranks, int64_t slots_per_rank, int64_t groups = 1,
               int64_t nodes = 1);

// Speed-aware placement (ViBE's idea for heterogeneous devices): rank r computes at relative speed
// speed[r] (> 0), so its time is its load / speed[r] and the layer waits for the largest time.
// Greedy on that objective: one replica of each expert, largest first, to the rank with room that
// leaves the least largest time (ties: the faster rank); then each remaining slot to the (expert,
// rank) replica that leaves the least largest time — so a slow rank, which must fill its slots
// too, gets small shares of cold experts. And EPLB's replicas packed largest first onto the rank
// whose time after taking one is least. The better of the two. O(S · E · ranks · S).
Placement speed_aware(std::span<const double> load, std::span<const double> speed, int64_t slots_per_rank);
// max over ranks of rank_loads / speed (speed empty: all 1).
double max_rank_time(const Placement& p, std::span<const double> load, std::span<const double> speed);

// The contiguous placement without replicas (the default of concord generate --expert-parallel):
// rank r holds experts [rE/R, (r+1)E/R); slots_per_rank is the largest share.
Placement contiguous(int64_t experts, int64_t ranks);

// The exact optimum of max_rank_time (max_rank_load when speed is empty) over every placement with
// these slots (exhaustive: for E <= 8 and ranks · slots_per_rank <= 12; InputError above). Ties:
// the first found.
Placement optimal(std::span<const double> load, int64_t ranks, int64_t slots_per_rank,
                  std::span<const double> speed = {});

// Checks a placement's invariants (every expert has >= 1 replica, the replicas fill every slot,
// equal slots per rank, replica_rank numbers each expert's replicas 0..c_e-1); InputError naming
// the first violation.
void check(const Placement& p, int64_t experts);

}  // namespace concord::serve::eplb
