// Peak-memory scheduling of a computation graph (issue 24, seed system #6 of DESIGN.md): the
// memory model of an operator order, schedulers that minimise its peak — program order, greedy,
// an exact dynamic program over down-sets that returns a certificate, brute force for small
// graphs — lower bounds, and offset planners that place every tensor in one arena.
//
// The memory model (what sched::peak computes and every scheduler minimises). Tensors are byte
// buffers. A graph input (no producer) is live from the start until its last consumer has run; a
// tensor a node produces is allocated when the node runs and freed once its last consumer has run;
// a `keep` tensor (a graph output, a training step's saved activation read by the backward) is
// never freed. While node v runs, the live bytes are everything allocated and not yet freed, plus
// v's outputs and its workspace. In place: when v names an input its first output may overwrite
// (`inplace_input`) and that input's last consumer is v and the input is not kept and at least as
// large, the output takes the input's buffer and adds no bytes. Inputs are freed after v, so a
// node's inputs and outputs are live together (except the in-place pair). The peak of an order is
// the largest live total over its steps.
//
// Certificates. dp_schedule explores the down-sets of the graph (sets of nodes closed under
// predecessors: the states an order passes through) breadth-first with memoisation; when it
// finishes, its order's peak is the minimum over all topological orders — the certificate is the
// exhaustive search itself (`lower_bound == peak`, `optimal`). Given a state or time budget it
// stops early and reports the best order found (its own partial DP completed greedily) and the
// best proven lower bound: the largest of the working-set bound and the smallest peak any
// unfinished partial order can still reach. Brute force (every topological order) checks the DP
// on small graphs in the tests.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace concord::sched {

struct Tensor {
  std::string name;
  int64_t bytes = 0;
  int producer = -1;   // node index, -1: a graph input
  bool keep = false;   // never freed (graph output, saved activation)
};

struct Node {
  std::string name;
  std::vector<int> inputs, outputs;  // tensor indices
  int64_t workspace = 0;             // scratch bytes while the node runs
  int inplace_input = -1;            // index into inputs whose buffer outputs[0] may take
};

struct Graph {
  std::vector<Tensor> tensors;
  std::vector<Node> nodes;
  // Memory the computation reads and writes outside its tensors (a cached pass's KV cache, which
  // outlives the pass in its own allocation): reported beside the peak, never planned.
  int64_t outside_bytes = 0;

  int add_tensor(std::string name, int64_t bytes, bool keep = false);
  // Adds a node producing `outputs` (their producer is set) from `inputs`; returns its index.
  int add_node(std::string name, std::vector<int> inputs, std::vector<int> outputs, int64_t workspace = 0,
               int inplace_input = -1);
  // InputError naming the problem: a tensor produced twice, an index out of range, a cycle,
  // negative sizes, an in-place index outside the inputs.
  void validate() const;
  std::vector<std::vector<int>> successors() const;  // node -> nodes that read its outputs
};

using Order = std::vector<int>;  // node indices, each once

// Each tensor's buffer under the memory model: the tensor itself, or for an in-place output whose
// input may be overwritten, that input's buffer (the root tensor's index).
std::vector<int> buffer_of(const Graph& g);

struct StepMemory {
  int node = 0;
  int64_t live = 0;  // bytes live while it runs
};
// The live bytes at every step of `order` (InputError when it is not a topological order).
std::vector<StepMemory> memory_profile(const Graph& g, const Order& order);
int64_t peak(const Graph& g, const Order& order);
bool is_topological(const Graph& g, const Order& order);

// Schedulers.
Order program_order(const Graph& g);  // node index order (validated topological)
// Greedy: at each step the ready node whose step has the smallest live total, ties by the most
// bytes it frees, then by index.
Order greedy_order(const Graph& g);

// Lower bounds on any order's peak.
int64_t working_set_bound(const Graph& g);  // max over nodes of what must be live while it runs

struct DpOptions {
  int64_t max_states = 2'000'000;  // down-sets kept at most; past it the search stops
  double max_seconds = 60;
};
struct DpResult {
  Order order;
  int64_t peak = 0;
  int64_t lower_bound = 0;  // == peak when optimal
  bool optimal = false;
  int64_t states = 0;       // down-sets explored
  double seconds = 0;
};
DpResult dp_schedule(const Graph& g, const DpOptions& options = {});

// Every topological order (small graphs: InputError past `max_nodes`); the best and its peak.
std::pair<Order, int64_t> brute_force_schedule(const Graph& g, int max_nodes = 10);

// Offset planning: one arena, each tensor at an offset for its lifetime under `order` (graph
// inputs from the start, kept tensors to the end; an in-place output shares its input's offset),
// each node's workspace for its own step.
// first_fit / best_fit: buffers by allocation step, each at the lowest offset free for its
// lifetime / in the smallest gap that fits. greedy_by_size: TFLM's GreedyMemoryPlanner (largest
// first, lowest offset). greedy_by_conflicts: TVM USMP's (most liveness conflicts first, lowest
// offset). hill_climb: TVM USMP's (random swaps of the greedy-by-size sequence kept when the
// arena does not grow; seeded, so a function of the graph and the order).
// exact: the smallest arena for the order — every buffer sequence placed lowest-fit, searched by
// branch and bound from the heuristics' best, pruned at the incumbent and stopped at the lower
// bound. Lowest-fit over sequences is complete: placing an optimal packing's buffers in order of
// their offsets, each at the lowest free offset, puts each at or below its optimal offset (by
// induction, every earlier conflicting buffer ends at or below it), so some sequence reaches the
// optimum. Past 2,000,000 search nodes it returns its best with `optimal` false.
enum class Planner { first_fit, best_fit, greedy_by_size, greedy_by_conflicts, hill_climb, exact };
inline constexpr Planner kPlanners[] = {Planner::first_fit, Planner::best_fit, Planner::greedy_by_size,
                                        Planner::greedy_by_conflicts, Planner::hill_climb};
const char* planner_name(Planner p);
struct Placement {
  int tensor = 0;                     // -1: the workspace of `node`
  int node = -1;
  int64_t offset = 0, bytes = 0;
  int first_step = 0, last_step = 0;  // steps (indices into order) it is live in, inclusive
};
struct ArenaPlan {
  std::vector<Placement> placements;  // one per tensor with bytes > 0, one per node workspace
  int64_t arena_bytes = 0;            // max over buffers of offset + bytes rounded up to alignment
  int64_t alignment = 64;             // every offset and buffer size is a multiple of it
  // The largest total of buffers (rounded up to the alignment) live at one step: no placement of
  // this order does better. `optimal`: the arena is proven smallest (it equals the bound, or the
  // exact planner's search finished).
  int64_t lower_bound = 0;
  bool optimal = false;
};
ArenaPlan plan_offsets(const Graph& g, const Order& order, Planner planner, int64_t alignment = 64);
// Checks a plan: tensors live at the same step never overlap, an in-place pair shares its
// offset; the arena's high-water mark measured by replaying the order in a byte arena (each
// allocation writes its bytes, each read checks them) — InputError on any violation.
int64_t replay_plan(const Graph& g, const Order& order, const ArenaPlan& plan);

// A seeded random DAG (tests, benchmarks): `nodes` nodes, each reading 1-3 earlier tensors (or
// graph inputs), sizes 1..max_bytes, some in-place, some kept.
Graph random_graph(int nodes, uint64_t seed, int64_t max_bytes = 1000);

}  // namespace concord::sched
