// Model::Impl, shared by the forward (model.cpp) and backward (model_backward.cpp) passes:
// parameters, the cached quantized weights, and the activations the backward pass reads.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "concord/model/model.h"
#include "concord/model/ops.h"
#include "concord/tensor/arena.h"
#include "concord/tensor/qgemm.h"
#include "concord/tensor/quant_gemm.h"

namespace concord::model {

class Block;  // block.h

// Indices of one decoder layer's parameters in Impl::values.
struct LayerParams {
  int input_norm = -1, q = -1, k = -1, v = -1, o = -1, q_norm = -1, k_norm = -1, post_norm = -1;
  int gate = -1, up = -1, down = -1;  // dense MLP
  int router = -1;                    // MoE layer: the router and each expert's projections
  std::vector<int> expert_gate, expert_up, expert_down;
};

struct MoeActivations;  // block_moe.cpp

// A weight on the grids its GEMM roles need, rebuilt when the weights change.
struct PreparedWeight {
  tensor::PreparedOperand forward;  // b of Y = X·Wᵀ
  tensor::PreparedOperand dgrad;    // b of dX = dY·W: built on the first backward that needs it
                                    // (a model that only serves never builds it)
  uint64_t source_hash = 0;         // XXH3-64 of the fp32 values the copies were built from
  bool valid = false;               // forward and source_hash current
  bool dgrad_valid = false;         // dgrad current (never without valid)
};

// Activations of one decoder layer saved by the forward pass for the backward pass; all point
// into the arena. T = B*S rows.
struct LayerActivations {
  float* x_in;     // (T, C) residual stream entering the layer
  float* rstd1;    // (T)
  float* xn1;      // (T, C) input of q/k/v projections
  float* q_raw;    // (T, Hq*D) q projection (before QK-norm)
  float* k_raw;    // (T, Hkv*D)
  float* rstd_q;   // (T*Hq) QK-norm statistics (Qwen3)
  float* rstd_k;   // (T*Hkv)
  float* q;        // (T, Hq*D) after QK-norm and RoPE: attention's input
  float* k;        // (T, Hkv*D)
  float* v;        // (T, Hkv*D)
  float* probs;    // (B, Hq, S, S)
  float* att;      // (T, Hq*D) attention output, input of o_proj
  float* x_mid;    // (T, C) residual stream after attention
  float* rstd2;    // (T)
  float* xn2;      // (T, C) input of gate/up projections
  float* gate;     // (T, F)
  float* up;       // (T, F)
  float* h;        // (T, F) silu(gate) * up, input of down_proj
  std::shared_ptr<MoeActivations> moe;  // an MoE layer's routing and expert activations
};

// One block application of a pass (block.h): the schedule's, or a recurrent model's prelude,
// core iterations and coda unrolled at the current depth (Model::Impl::build_plan).
struct Application {
  int block = 0;
  int repeat = 0;                 // earlier applications of the same block in the pass
  int iteration = -1;             // recurrent: the core iteration (0..depth-1), -1 outside the core
  bool enters_iteration = false;  // the first core layer of an iteration: adapter([s, e]) runs first
  int core_layer = -1;            // recurrent: the layer's index within the core (0..R-1), -1 outside
};

// Whether an activation quantizer treats every row on its own (a row's GEMM result does not depend
// on the other rows): none, a plain cast, or 1-D blocks along K without stochastic rounding.
bool rows_quantized_independently(const std::optional<numerics::QuantDesc>& d);

struct Model::Impl {
  ModelConfig config;
  PrecisionPolicy policy;
  std::vector<ParamSpec> specs;
  std::unordered_map<std::string, int> index;
  std::vector<std::vector<float>> values;  // served weights (empty for a stored weight)
  std::vector<std::vector<float>> grads;   // empty until ensure_grads()
  // Per parameter: its blocks when it is served at the file's precision (model.h StoredWeights).
  std::vector<std::shared_ptr<const tensor::QuantWeight>> stored;
  bool any_stored = false;
  std::vector<LayerParams> layers;
  std::vector<std::unique_ptr<Block>> blocks;  // per decoder layer (block.h)
  std::vector<Application> plan;                // the applications of the next pass, in order
  int embed = -1, final_norm = -1, lm_head = -1;  // lm_head == embed when tied
  int adapter = -1;                               // recurrent: model.adapter.weight
  // Depth recurrence (docs/recurrence.md): core iterations of the next pass; the training
  // backward's truncation (gradient through the last `backprop_iterations`, 0: all); s0's seed.
  int64_t depth = 0;
  int64_t backprop_iterations = 0;
  uint64_t state_seed = 0;
  std::optional<Model::AdaptiveExit> adaptive_exit;
  std::vector<int32_t> iterations_used;  // per input of the last forward_cached (recurrent)
  std::vector<std::vector<BlockNode>> described;  // run_node: each block's node list, made once
  std::vector<int> bias_of;  // per parameter: index of its bias (Qwen2 q/k/v), or -1
  RopeTable rope;

  std::vector<PreparedWeight> prepared;  // per parameter (matrices only)
  std::vector<float> embedding_lookup;   // the embedding table on its lookup grid (if quantized)
  bool embedding_lookup_valid = false;

  tensor::Arena arena;
  // The last forward's shape and saved activations.
  int64_t B = 0, S = 0;
  std::vector<int32_t> positions;
  std::vector<LayerActivations> acts;  // per application of the schedule
  float* x_final = nullptr;     // (T, C) residual stream after the last layer
  float* rstd_final = nullptr;  // (T)
  float* xn_final = nullptr;    // (T, C) input of lm_head
  float* logits = nullptr;      // (T, V)
  // A recurrent model's training forward: the prelude's output e and, per core iteration that
  // the backward runs through, the adapter's input [s, e] (T, 2C); nullptr for iterations run
  // without gradient (their activations are not kept).
  float* injection = nullptr;
  std::vector<float*> adapter_in;
  int64_t first_grad_iteration = 0;
  tensor::PreparedOperand scratch_a;  // activation operand, reused across GEMMs
  tensor::PreparedOperand scratch_b;
  // Per expert, d(coef · aux)/d p of the MoE load-balancing loss for the backward in progress
  // (block_layer.h's moe_aux_loss scaled by router_aux_loss_coef); empty: no aux loss.
  std::vector<double> moe_aux_dp;
  double moe_aux = 0.0;  // the last training forward's aux loss (unscaled), 0 without one
  std::shared_ptr<ExpertParallel> ep;  // expert parallelism (Model::set_expert_parallel)
  std::shared_ptr<ExpertPager> pager;  // experts under a memory cap (Model::set_expert_pager)
  bool router_stats_on = false;
  std::vector<std::vector<int64_t>> router_counts;  // per application (Model::RouterStats)
  int64_t router_rows = 0;
  bool router_trace_on = false;
  Model::RouterTrace router_trace;  // Model::set_router_trace
  std::vector<Model::Recompute> recompute;  // per application; empty: keep everywhere
  Model::Recompute recompute_of(int64_t app) const {
    return recompute.empty() ? Model::Recompute::keep : recompute[static_cast<size_t>(app)];
  }
  // The training forward's attention of one application (B sequences of S): att, and probs unless
  // `keep_probs` is false (then computed at the arena's top and released at once).
  void full_attention(LayerActivations& a, bool keep_probs);
  // The backward's recomputation of application `app` (Model::Recompute), before its backward:
  // returns the arena mark to rewind to after it.
  size_t recompute_for_backward(int64_t app);
  // After that application's backward and the rewind: what was recomputed is dropped again.
  void release_recomputed(int64_t app);
  GemmObserver observer;
  ForwardGemmKernel forward_kernel;           // replaces gemm_prepared in linear_forward if set
  const int32_t* row_positions = nullptr;     // positions of the rows the layer GEMMs see now

  void observe(GemmRole role, int param, const tensor::PreparedOperand& a,
               const tensor::PreparedOperand& b, const OperandPrecision& prec) const {
    if (observer) observer(GemmRecord{role, specs[param].name, &a, &b, prec.a, prec.b});
  }

  Impl(ModelConfig c, PrecisionPolicy p, StoredWeights stored_weights = {});
  // plan for the schedule, or for `depth` core iterations (recurrent).
  void build_plan();
  int64_t applications() const { return static_cast<int64_t>(plan.size()); }
  // The KvCache row set application `app` reads and writes in a cache of `core_slots` core
  // iteration slots: iteration i's core layers use slot i mod core_slots.
  int64_t cache_row_set(int64_t app, int64_t core_slots) const;
  // Recurrent: x (T, C) = adapter([s, e]); cat (T, 2C) receives [s, e].
  void adapter_forward(const float* s, const float* e, int64_t T, float* cat, float* x,
                       std::span<const int64_t> row_splits);
  // s0 (T, C) for rows at `positions` (state_init; recurrent_initial_state in model.h).
  void initial_state(float* s, const int32_t* positions, int64_t T) const;
  ~Impl();
  // Allocates the gradients (zeros) on first use.
  void ensure_grads();
  // InputError when the model serves stored weights: `what` (a pass) needs fp32 values.
  void require_fp32_values(std::string_view what) const;
  // x (T, C) = the embedding rows of `tokens` on their lookup grid (dequantized rows of a stored
  // table).
  void embed_tokens(float* x, const int32_t* tokens, int64_t T);
  const PreparedWeight& weight(int param);
  // The gate, up and down parameters of an expert (InputError: not an MoE block or expert, or
  // served as stored blocks).
  std::array<int, 3> expert_params(int64_t block, int64_t expert) const;
  std::vector<uint8_t> expert_bytes(int64_t block, int64_t expert) const;  // Model::expert_bytes
  void set_expert_bytes(int64_t block, int64_t expert, std::span<const uint8_t> bytes);
  void release_expert(int64_t block, int64_t expert);
  bool holds_expert_values(int64_t block, int64_t expert) const;  // Model::holds_expert
  // The dgrad copy of a weight (built on first use after each change of the values).
  const tensor::PreparedOperand& dgrad_weight(int param);
  const float* embedding_table();
  // Y (T, N) = X (T, K) · Wᵀ (+ bias, when the weight has one) on the policy's forward grid.
  // pos: the rows' positions (for a forward GEMM kernel; may be null when none is set).
  void linear_forward(const LayerPrecision& prec, int param, const float* x, int64_t T, float* y,
                      const int32_t* pos);
  // linear_forward's GEMM for a weight with fp32 values (no bias).
  void linear_forward_fp(const LayerPrecision& prec, int param, const float* x, int64_t T,
                         float* y, const int32_t* pos);
  void add_bias(int param, float* y, int64_t T) const;
  // dX (T, K) (+)= dY (T, N) · W;  dW (N, K) (+)= dYᵀ · X;  dbias (N) (+)= column sums of dY.
  void linear_backward(const LayerPrecision& prec, int param, const float* dy, const float* x,
                       int64_t T, float* dx, bool accumulate_dx, float* dw, bool accumulate_dw,
                       uint64_t step, uint32_t gemm_id);
  void run_forward(const int32_t* tokens, int64_t B, int64_t S);
  // Rows at row_positions (may be null); quantizes per row group when the activation
  // quantizer's scale spans rows. row_splits: the first row of each sequence and T at the end
  // (a quantizer whose scale spans rows, NVFP4 or per-tensor FP8, runs per sequence); empty: all
  // T rows share each quantization.
  void linear_forward_rows(const LayerPrecision& prec, int param, const float* x, int64_t T,
                           float* y, std::span<const int64_t> row_splits);
  void run_forward_cached(KvCache& cache, std::span<const CachedInput> inputs, float* logits);
  void run_forward_cached_adaptive(KvCache& cache, std::span<const CachedInput> inputs, float* logits);
  // Recurrent: rows [first, first + rows) of the core slots of iterations `iterations`.. get the
  // rows of iteration iterations - 1 (the slots a token did not reach hold its latest state).
  void fill_skipped_iterations(KvCache& cache, int slot, int64_t first, int64_t rows, int64_t iterations);
  double run_backward(const int32_t* tokens, const int32_t* targets, uint64_t step);
  // The backward pass below the loss head, shared by run_backward (mean cross-entropy) and the
  // policy-gradient pass: gradients (overwritten) of every parameter from dlogits (T, V).
  void backward_from_dlogits(const int32_t* tokens, const float* dlogits, uint64_t step);
  int64_t tokens_count() const { return B * S; }
};

}  // namespace concord::model
