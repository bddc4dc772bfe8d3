// A simulator of expert-parallel MoE layers at scale (issue 23; docs/moe.md "Simulated scale").
//
// Every MoE layer of expert-parallel serving is a barrier: each rank computes the rows routed to
// the experts on its slots, then all ranks meet at the exchange (concord's MPI_Allgatherv, or the
// dispatch/combine all-to-all of data-parallel attention), so the layer lasts as long as the
// slowest rank plus the exchange. With that barrier the discrete-event model of a layer reduces
// to one event per rank (its arrival at the exchange) and one for the layer (the last arrival plus
// the exchange): the simulator computes them per layer and batch from
// - the batch's routing: tokens per expert, from a recorded trace (`concord generate
//   --routing-trace`: each token's top-k experts per MoE layer, replayed pass by pass or resampled
//   into batches) or a synthetic Zipf-skewed, bursty router;
// - the placement (serve/eplb.h: contiguous, EPLB, speed-aware, the exact optimum; and
//   tail_search below) made from a separate planning window of batches, as a serving system plans
//   from past statistics;
// - the router among an expert's replicas: `even` (the i-th holder takes rows [n·i/c, n·(i+1)/c),
//   what concord's ranks run) or `balanced` (per batch, each expert's rows poured onto its holders
//   to level their times — the per-batch re-routing SGLang adds to EPLB);
// - a cost model: a rank's compute = (pass_s + piece_s · pieces + row_s · rows) / speed, where a
//   piece is an expert slice with rows on the rank (one weight read and GEMM launch), and the
//   exchange = exchange_pass_s + exchange_row_s · (rows the busiest rank receives). Fitted from
//   real runs (`concord ep-sim --calibrate`: `--ep-stats` plus `--routing-trace` of the same run).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "concord/serve/eplb.h"

namespace concord::serve::epsim {

// A routing trace: per MoE application, each token's top-k experts (tokens in pass order) and the
// tokens of each pass.
struct TraceLayer {
  int64_t application = 0;
  std::vector<int32_t> selected;   // (tokens · top_k)
  std::vector<int64_t> pass_rows;  // sums to tokens
};
struct Trace {
  int64_t experts = 0, top_k = 0;
  std::vector<TraceLayer> layers;
  int64_t tokens() const { return layers.empty() ? 0 : static_cast<int64_t>(layers[0].selected.size()) / top_k; }
};

// The JSON-lines file: a header {"routing_trace": 1, "num_experts", "num_experts_per_tok",
// "model"} and one line per MoE application {"application", "pass_rows": [...], "selected":
// [...]}. write_trace is atomic; read_trace validates (expert ids in range, the layers' tokens
// equal, pass_rows summing to them) and throws InputError naming the file and the problem.
void write_trace(const std::string& path, const Trace& trace, const std::string& model);
Trace read_trace(const std::string& path);
// Several traces of one model (other prompts) as one: layers matched by application.
Trace concat(std::span<const Trace> traces);

// One batch: per layer, the tokens routed to each expert (E).
struct Batch {
  std::vector<std::vector<int64_t>> counts;
};
// The trace's own passes, in order.
std::vector<Batch> passes_of(const Trace& trace);
// `batches` batches of `tokens` tokens each from the trace: `contiguous` windows at seeded random
// offsets (a prefill chunk), or tokens drawn at random with replacement (a decode batch of many
// requests). Seeded: the same batches for the same arguments.
std::vector<Batch> sample_batches(const Trace& trace, int64_t tokens, int64_t batches, bool contiguous, uint64_t seed);

// The synthetic router: expert e of a layer has popularity ∝ 1 / (rank_e + 1)^skew (a seeded
// permutation per layer); each batch multiplies every popularity by exp(burst · z), z standard
// normal per batch and expert (bursty batches), and each token picks top_k distinct experts with
// those weights. The permutations (the "model") come from router_seed, the batches from the seed
// of zipf_batches: the planning window and the run are other batches of the same model.
struct Zipf {
  int64_t experts = 256, top_k = 8, layers = 8, tokens = 4096;
  double skew = 1.0, burst = 0.5;
  uint64_t router_seed = 1;
};
std::vector<Batch> zipf_batches(const Zipf& z, int64_t batches, uint64_t seed);

struct CostModel {
  double pass_s = 0, piece_s = 0, row_s = 0;     // a rank's compute per layer
  double exchange_pass_s = 0, exchange_row_s = 0;  // the exchange per layer
  bool alltoall = false;  // false: every rank receives every other rank's rows (concord's
                          // MPI_Allgatherv); true: dispatch + combine, a rank receiving its rows
                          // from the other ranks and sending them back (2 · rows · (R-1)/R)
};
// A cost model roughly a GPU's (for when no calibration is given): 30 µs a pass, 8 µs a piece,
// 0.2 µs a row (a 2048-wide expert's SwiGLU at ~150 TFLOP/s), 25 µs + 7 KB a row at 50 GB/s.
CostModel default_gpu_cost();

enum class Router { even, balanced };

// Rows each rank computes (and the pieces) for one layer's counts under a placement.
struct RankWork {
  std::vector<double> rows, pieces;
};
RankWork rank_work(const eplb::Placement& p, std::span<const int64_t> counts, std::span<const double> speed,
                   const CostModel& cost, Router router);

// The router's split of each expert's rows among its holders as whole rows, for real ranks: per
// expert, (rank, rows) by ascending rank summing to its count (a rank holding two replicas takes
// both shares; the balanced router's fractional shares rounded by largest remainder, ties to the
// lower rank). Deterministic: every rank computes the same split from the same counts.
std::vector<std::vector<std::pair<int64_t, int64_t>>> row_shares(const std::vector<std::vector<int64_t>>& rank_slots,
                                                                   std::span<const int64_t> counts,
                                                                   std::span<const double> speed, const CostModel& cost,
                                                                   Router router);

struct LayerTime {
  double layer_s = 0, exchange_s = 0;
  std::vector<double> compute_s;  // per rank
  double imbalance = 0;           // max / mean rows over ranks (1 when no rows)
};
LayerTime layer_time(const RankWork& w, std::span<const double> speed, const CostModel& cost);

// layer_time of the rows a placement's rank slots compute (rank_slots' form of a placement, as
// model::ExpertParallel holds it) under the router.
LayerTime layer_time_of_slots(const std::vector<std::vector<int64_t>>& rank_slots, std::span<const int64_t> counts,
                              std::span<const double> speed, const CostModel& cost, Router router);

struct Summary {
  std::vector<double> layer_s;  // every layer of every batch
  double p50 = 0, p99 = 0, mean = 0, wait_share = 0, imbalance = 0;  // imbalance: mean over layers
};
// A lower bound of any placement's and router's layer time on these counts: the work spread over
// the ranks in proportion to their speeds (every expert with tokens read at least once), and the
// exchange at the mean rank's rows.
double layer_bound(std::span<const int64_t> counts, std::span<const double> speed, int64_t ranks, const CostModel& cost);
// p50/p99 and mean of layer_bound over the batches' layers (wait_share and imbalance 0).
Summary bound(std::span<const Batch> batches, std::span<const double> speed, int64_t ranks, const CostModel& cost);

// Runs the batches through one placement per layer (placements.size() == layers of the batches).
Summary simulate(std::span<const Batch> batches, std::span<const eplb::Placement> placements,
                 std::span<const double> speed, const CostModel& cost, Router router);

// concord's placement for a layer: a local search from `start` (EPLB's, or the speed-aware one)
// that lowers the tail of the layer time over the planning batches' counts of this layer, under
// the router that will run it: objective the mean of the slowest quarter of those layer times.
// Each try takes a rank that is the slowest in one of the worst batches and either swaps one of
// its slots with a slot of another rank, or turns another rank's spare replica (of an expert with
// more than one) into a replica of one of its experts; kept only when the objective falls. Seeded:
// the same placement for the same arguments. The placement is planned from batches other than
// those it is measured on (concord ep-sim's planning window), so the gain is not fitted noise.
eplb::Placement tail_search(const eplb::Placement& start, std::span<const std::vector<int64_t>> plan_counts,
                            std::span<const double> speed, const CostModel& cost, Router router, int64_t tries,
                            uint64_t seed);
// The objective tail_search lowers (the mean of the slowest quarter of the layer times).
double tail_objective(const eplb::Placement& p, std::span<const std::vector<int64_t>> plan_counts,
                      std::span<const double> speed, const CostModel& cost, Router router);

// The loads of each layer summed over batches (the planning statistics).
std::vector<std::vector<double>> layer_loads(std::span<const Batch> batches);

// Calibration against real runs (`concord generate --expert-parallel --ep-stats --routing-trace`).
struct RankRecord {
  int64_t application = 0, rank = 0, passes = 0, rows = 0;
  double compute_s = 0, wait_s = 0, slow_factor = 1;
  std::vector<int64_t> slots;  // the experts the rank held (its slots)
  std::vector<double> pass_compute_s, pass_wait_s;  // per pass (empty in older files)
};
struct MeasuredRun {
  std::string name;
  std::vector<RankRecord> records;
  Trace trace;
};
std::vector<RankRecord> read_ep_stats(const std::string& path);
// Least squares (non-negative: the best of the fits over subsets of the terms) of the compute and
// exchange terms, with each pass's pieces and rows recomputed from the trace: per pass and rank
// (compute / slow factor on 1, pieces, rows; the exchange of the rank that waited least on 1 and
// the rows received) where the records have passes, else per application over its passes.
CostModel fit(std::span<const MeasuredRun> runs);
// Per MoE application of a run: the measured layer time (the slowest rank's compute plus the least
// wait: the exchange once the last rank arrived) and
// the predicted (the slowest rank's compute + the exchange), summed over the trace's passes and
// pass by pass (the measured passes empty in older files).
struct Prediction {
  int64_t application = 0;
  double measured_s = 0, predicted_s = 0;
  std::vector<double> measured_pass_s, predicted_pass_s;
};
std::vector<Prediction> predict(const MeasuredRun& run, const CostModel& cost);

// p-th quantile (0..1) of the values (nearest rank on the sorted copy).
double quantile(std::vector<double> values, double p);

}  // namespace concord::serve::epsim
