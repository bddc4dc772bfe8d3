// The decoder (Qwen3 / Qwen2 / Llama family) that learner and sampler share: parameters under
// their Hugging Face names, a forward pass to logits, and forward + backward to gradients.
//
// Parameter names and shapes (HF's), W is (out, in):
//   model.embed_tokens.weight                      (V, C)
//   model.layers.{i}.input_layernorm.weight        (C)
//   model.layers.{i}.self_attn.q_proj.weight       (Hq*D, C)
//   model.layers.{i}.self_attn.k_proj.weight       (Hkv*D, C)
//   model.layers.{i}.self_attn.v_proj.weight       (Hkv*D, C)
//   model.layers.{i}.self_attn.o_proj.weight       (C, Hq*D)
//   model.layers.{i}.self_attn.{q,k,v}_proj.bias   (out)      Qwen2; Llama attention_bias
//   model.layers.{i}.self_attn.o_proj.bias         (C)        Llama attention_bias
//   model.layers.{i}.self_attn.q_norm.weight       (D)        Qwen3 only
//   model.layers.{i}.self_attn.k_norm.weight       (D)        Qwen3 only
//   model.layers.{i}.post_attention_layernorm.weight (C)
//   model.layers.{i}.mlp.gate_proj.weight          (F, C)
//   model.layers.{i}.mlp.up_proj.weight            (F, C)
//   model.layers.{i}.mlp.down_proj.weight          (C, F)
//   model.norm.weight                              (C)
//   lm_head.weight                                 (V, C)     absent when embeddings are tied
// Each is registered with its kind and class (params.h: the one table of these names and of the
// GGUF ones); code outside model/ and io/ looks weights up by kind and layer, not by name.
// The values held here are the *served* weights the forward pass uses; the fp32 master copy
// and the export rule that makes them live in train/.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "concord/model/config.h"
#include "concord/model/params.h"
#include "concord/model/policy.h"

namespace concord::tensor {
struct PreparedOperand;
class QuantWeight;  // quant_gemm.h
}

namespace concord::model {

class ExpertPager;  // expert_pager.h

// The parameters a config implies, in a fixed order (embeddings, layers in order, norm, head),
// each registered with its kind, class and layer (params.h).
std::vector<ParamSpec> parameter_specs(const ModelConfig& config);

// What one GEMM of a pass saw: its role, the weight it belongs to, and both operands as they
// reached the kernel (on their grids). Given to an observer for tests and audits.
struct GemmRecord {
  GemmRole role;
  std::string_view weight;  // HF name of the weight the GEMM belongs to
  const tensor::PreparedOperand* a;
  const tensor::PreparedOperand* b;
  std::optional<numerics::QuantDesc> desc_a, desc_b;  // the policy's descriptors for a and b
};
using GemmObserver = std::function<void(const GemmRecord&)>;

// One node of a block, as data (Model::describe_block): what the memory scheduler and the kernel
// contracts name and size; Model::forward does not run through this description (the memory
// scheduler's executor does, node by node: Model::run_node). `width` is the
// floats per row (token) of the node's output; a linear node lists the GEMM roles it runs in a
// training step (forward; dgrad and wgrad in the backward).
enum class NodeOp : uint8_t { rmsnorm, linear, rope, attention, residual_add, swiglu, router, top_k, combine };
std::string_view node_op_name(NodeOp op);
struct BlockNode {
  NodeOp op;
  std::string name;  // "q", "input_norm", "attention", ... (unique within the block)
  int param = -1;    // index into params() of the weight it reads; -1 for none
  int64_t width = 0;
  std::vector<GemmRole> roles;
};

// One forward GEMM of a linear layer, Y = A·Wᵀ, handed to a replacement kernel (audit/kernels.h
// builds the named kernel variants that contracts compare: other reduction orders, fp64
// accumulation, batch-dependent splits). a holds the M activation rows (M, K) and b the weight
// (N, K), both as prepared operands: values on their grids without the per-tensor scales, which
// the kernel must apply after the sum (tensor/qgemm.h's gemm_prepared is the contract it
// replaces). positions[r] is row r's position in its sequence. The kernel writes y (M, N, row
// stride N); the model adds the bias afterwards.
struct ForwardGemm {
  std::string_view weight;
  int64_t M = 0, N = 0, K = 0;
  const tensor::PreparedOperand* a = nullptr;
  const tensor::PreparedOperand* b = nullptr;
  std::span<const int32_t> positions;
  float* y = nullptr;
};
using ForwardGemmKernel = std::function<void(const ForwardGemm&)>;

class KvCache;  // kv_cache.h
// Which logits a cached forward returns for one input: none (a prefill chunk that is not the
// prompt's last), the last new token's (prefill's end, a decode step), or every new token's.
enum class LogitRows : uint8_t { none, last, all };
// One sequence's part of a cached forward pass: `tokens` are appended to the sequence in `slot`
// at positions cache.length(slot), cache.length(slot) + 1, ...
struct CachedInput {
  int slot = 0;
  std::span<const int32_t> tokens;
  LogitRows logits = LogitRows::last;
};
// Rows of logits a cached forward over `inputs` writes.
int64_t logit_rows(std::span<const CachedInput> inputs);

// A recurrent model's initial state s0 for a token at `position` under `seed` (C floats):
// zeros for state_init "zero"; for "random", element c is a standard normal truncated to
// [-3, 3] (resampled outside) times state_init_std, drawn by Box-Muller from the Philox stream
// (seed, position) at counter 64·c + attempt — independent of batch, thread count and pass.
std::vector<float> recurrent_initial_state(const ModelConfig& config, uint64_t seed, int64_t position);

// Weights served as the model file stores them (a GGUF's Q4_0 / Q4_1 / Q8_0 blocks), by HF name:
// the forward GEMMs of such a weight run the W4A8 / W8A8 kernels of tensor/quant_gemm.h on its
// blocks, and the model holds no fp32 copy of it (docs/engine.md, "Serving a file's own
// precision"). Shared, so copies of a model (an engine per thread) share one set of blocks.
using StoredWeights = std::map<std::string, std::shared_ptr<const tensor::QuantWeight>, std::less<>>;

// Expert parallelism (issue 23): each of `ranks` processes computes the experts [first_expert(r),
// first_expert(r + 1)) of every MoE layer on the rows routed to them; every process holds the whole
// batch and computes the same routing (attention and the router are replicated), so expert e's
// output rows are the same rows [begin[e], begin[e+1]) everywhere. `exchange` then fills the other
// ranks' rows of y (MPI: rl/channel.h make_mpi_expert_parallel); after it every rank combines all
// rows in the single-process order, so its logits are the single-process model's bit for bit.
// Inference only (a backward needs every expert's activations).
struct ExpertParallel {
  using RowRanges = std::vector<std::pair<int64_t, int64_t>>;  // [first, last) gathered rows
  int rank = 0, ranks = 1;
  // The experts on each rank's slots, per application (serve/eplb.h makes them); empty: every MoE
  // application splits the experts contiguously, rank r holding [rE/R, (r+1)E/R). An expert on c
  // slots (replicas) has its n rows split among them in order: the i-th holder (ranks ascending,
  // a rank's slots in order) computes rows [b + n·i/c, b + n·(i+1)/c) of the expert's [b, b + n)
  // (SGLang's per-batch re-routing among replicas). Splitting an expert's rows changes no bit
  // under row-local quantizers; NVFP4 / per-tensor FP8 share a scale across rows and are not split
  // (the caller's check: serve::rows_quantize_alone).
  std::vector<std::vector<std::vector<int64_t>>> rank_experts;
  // With rank_experts, another split of a replicated expert's rows among its holders (the
  // balanced router of serve/ep_sim.h, levelling the ranks' predicted finishing times): given the
  // application and the layer's rows per expert, per expert the (rank, rows) of its holders in
  // ascending rank order, summing to its rows; the rows are laid out in that order. Every rank
  // computes the same split from the same routing. Empty: the even split above.
  std::function<std::vector<std::vector<std::pair<int64_t, int64_t>>>(int64_t application,
                                                                      const std::vector<int64_t>& counts)>
      split;
  // y (rows, C): expert outputs in gathered order; pieces[r] the row ranges rank r computed (this
  // rank's are filled); afterwards every rank's ranges must be filled.
  std::function<void(float* y, const std::vector<RowRanges>& pieces, int64_t C)> exchange;
  // A slow rank (--slow-rank): after its experts, this rank busy-waits (slow_factor - 1) times the
  // time they took, as a GPU that many times slower would.
  double slow_factor = 1.0;
  // Measured per application (accumulated over passes): seconds computing this rank's experts
  // (slowness included), seconds in exchange (waiting for the slowest rank, then the transfer),
  // the rows this rank's experts computed, the rows of the layer, and passes.
  struct Layer {
    double compute_s = 0, exchange_s = 0;
    int64_t rows = 0, layer_rows = 0, passes = 0;
    std::vector<double> pass_compute_s, pass_exchange_s;  // the same, pass by pass
  };
  std::vector<Layer> layers;
  int64_t first_expert(int64_t num_experts, int r) const { return num_experts * r / ranks; }

  // Re-placement between passes (concord generate --replan-every; needs rank_experts and a model
  // whose experts are fp32 values, one application per block): every `replan_every` passes,
  // before the first MoE layer of a pass, `plan` turns the tokens routed to each expert since the
  // last plan (`window`, per application) into the next rank_experts. An expert a rank newly holds
  // is sent by its lowest current holder through `send_recv` (collective: every rank walks the
  // same moves in the same order; the sender's bytes in, the receiver's out) and checked against
  // `expert_hash` (XXH3-64 of each expert's bytes as loaded, per application: the weight-sync
  // content check) before it is used; an expert no longer held is released.
  int64_t replan_every = 0;
  std::function<std::vector<std::vector<std::vector<int64_t>>>(const std::vector<std::vector<int64_t>>& window)> plan;
  std::function<void(int src, int dst, std::vector<uint8_t>& bytes)> send_recv;
  std::vector<std::vector<uint64_t>> expert_hash;
  bool corrupt_next_move = false;  // a test hook: one byte of the next received expert flipped
  std::vector<std::vector<int64_t>> window;
  int64_t passes_since_plan = 0;
  // Measured: plans made, experts received by this rank and their bytes, seconds moving them.
  int64_t replans = 0, moved_in = 0, moved_bytes = 0;
  double move_s = 0;
  int64_t placements_kept = 0;  // layers whose new placement `plan` declined (the move would not pay)

  // Data-parallel attention (docs/moe.md): each rank runs its own sequences — its own batch and KV
  // cache — instead of every rank the whole batch. An MoE application sends each of this rank's
  // routed rows to a rank that computes its expert (an expert on several ranks: this rank's rows of
  // it split among them in order), through `alltoallv` (a parcel of bytes to every rank, one back
  // from every rank: MPI_Alltoallv); that rank runs each expert it holds once, on the rows every
  // rank sent it (in rank order), and sends the outputs back the same way; each rank then combines
  // its own tokens in the single-process order. Under row-local quantizers a row's output does not
  // depend on the rows beside it (the batch-invariant GEMM), so a rank's logits are those of the
  // single model running that rank's sequences, bit for bit; NVFP4 / per-tensor FP8 / stochastic
  // activations are refused. Every rank joins every MoE application of every pass: a rank with
  // nothing of its own to run calls Model::expert_parallel_idle_pass() while others run a pass.
  // Not with re-placement (each rank would count only its own tokens' loads).
  bool data_parallel = false;
  using Parcels = std::vector<std::vector<uint8_t>>;
  std::function<Parcels(const Parcels& to_rank)> alltoallv;
  // Measured with data_parallel: rows sent to other ranks and received from them, over all passes.
  int64_t rows_sent = 0, rows_received = 0;
};

class Model {
 public:
  explicit Model(ModelConfig config, PrecisionPolicy policy = PrecisionPolicy::preset("fp32"));
  // A model whose `stored` weights stay in their file's blocks. Every stored name must be a
  // matrix parameter of `config` with the parameter's shape; the embedding table may be one
  // (its lookup dequantizes the rows it reads). Such a model serves (forward, forward_cached);
  // param(), grad(), the backward passes and visit_derived_weights refuse its stored weights
  // with an InputError that says how to load fp32 values instead.
  Model(ModelConfig config, PrecisionPolicy policy, StoredWeights stored);
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  // A model with this one's config, policy and weights for another thread (concord serve's
  // prefill worker): the stored blocks shared, the fp32 values copied, its own derived weights.
  // Its passes give this model's bits. Settings of the passes (depth, adaptive exit, router
  // statistics, recomputation) are not carried.
  Model twin() const;

  const ModelConfig& config() const;
  const PrecisionPolicy& policy() const;
  void set_policy(PrecisionPolicy policy);

  const std::vector<ParamSpec>& params() const;
  // The nodes of decoder block `block` (0..num_hidden_layers-1) in execution order; which
  // applications run it is config().schedule (block.h).
  std::vector<BlockNode> describe_block(int block) const;
  // One node of the forward pass over B sequences of S tokens (positions 0..S-1), run on
  // buffers the caller placed: Model::forward's arithmetic node by node, for the memory
  // scheduler's executor (sched/executor.h), which owns where every tensor lives and in what
  // order the nodes run. `node` is "embed", "final_norm", "lm_head" (application -1) or a node
  // of describe_block(block of `application`). Inputs, outputs and their sizes follow
  // sched/model_graph.h's data flow for the node (its convention, documented there); the
  // training pass's extra outputs (attention probabilities, router probabilities) are taken when
  // given. Sizes are checked against what the node writes (InputError naming the node): an MoE
  // expert's buffers must hold exactly the rows the routing sent it. An output may be the
  // buffer of the input the graph lets it overwrite (RoPE after QK-norm, the residual adds).
  // Running every node of the pass in any order that respects its data flow writes the logits
  // Model::forward writes, bit for bit.
  // A cached pass's rows (an engine step: Model::forward_cached's inputs), for run_node: the
  // new tokens of every input concatenated, each row at its own position. The caller reserved
  // each slot's cache rows for the pass (KvCache::reserve) and sets the lengths after it.
  struct CachedRows {
    KvCache* cache = nullptr;
    std::span<const CachedInput> inputs;
    std::span<const int64_t> start;          // per input: the slot's length before the pass
    std::span<const int64_t> row_splits;     // inputs + 1: input i's rows are [split i, split i+1)
    std::span<const int32_t> positions;      // per row
    std::span<const int32_t> logit_positions;  // per logit row (the rows LogitRows asks for)
    std::span<const int64_t> logit_splits;     // inputs + 1, over the logit rows
  };
  struct NodeCall {
    std::string_view node;
    int64_t application = -1;
    int64_t B = 0, S = 0;
    std::span<const void* const> inputs;
    std::span<const int64_t> input_bytes;
    std::span<void* const> outputs;
    std::span<const int64_t> output_bytes;
    void* workspace = nullptr;
    int64_t workspace_bytes = 0;
    uint64_t step = 0;  // the training step's backward nodes: seeds their GEMMs (forward_backward's `step`)
    // A cached pass (sched's prefill / decode graphs): B and S are ignored, the rows are these.
    // Its "attention" appends each input's k and v to its slot and attends over the slot's rows
    // (the workspace holds each row's scores, rows x Hq x key_capacity floats); "select_logits"
    // copies the logit rows out of the last hidden state; "final_norm" and "lm_head" run on those.
    // Model::forward_cached's arithmetic, bit for bit (logits and cache rows).
    const CachedRows* cached = nullptr;
  };
  // The training step's nodes (sched/model_graph.h, pass `step`) are run here too: "loss" (mean
  // cross-entropy over targets >= 0; it also zeroes the gradients the backward adds into),
  // "lm_head.bwd", "final_norm.bwd", "embed.bwd" and a block node's "<node>.bwd"; they write the
  // model's gradients (grad()) as forward_backward does, bit for bit. Dense decoders (any
  // schedule), Qwen3-MoE ("combine.bwd", an expert's ".bwd" nodes, "top_k.bwd", "router.bwd",
  // and "aux_loss" with output_router_logits) and depth-recurrent ones ("de_init" and an entering
  // application's "adapter.bwd"; truncated backpropagation too).
  void run_node(const NodeCall& call);
  // The stored (file-precision) weight of a parameter, or nullptr when it has fp32 values.
  const tensor::QuantWeight* stored_weight(std::string_view name) const;
  bool has_stored_weights() const;
  // fp32 values and gradients of a parameter by HF name; throws InputError for unknown names
  // and for stored weights (which have no fp32 values). Gradients are allocated on first use
  // (a model that only serves never holds them).
  std::span<float> param(std::string_view name);
  std::span<const float> param(std::string_view name) const;
  std::span<float> grad(std::string_view name);
  // Seeded init: normal(0, std) for matrices (Philox, independent of thread count), 1 for norms,
  // 0 for biases.
  void init_random(uint64_t seed, float std = 0.02f);
  // Call after the weights changed (a sync or an optimizer step): quantized and pre-packed copies
  // of the weights are rebuilt lazily from the new values on the next forward.
  void weights_changed();
  // Builds every weight's forward copy now (its grid, packed panels, the embedding lookup
  // table), as the next forward would on first use: a server prepares at load so that its first
  // request does not pay for it. progress(done, total) after each weight.
  void prepare_weights(const std::function<void(int64_t done, int64_t total)>& progress = {});

  // Logits (B*T, V) for B sequences of T tokens (positions 0..T-1).
  void forward(std::span<const int32_t> tokens, int64_t B, int64_t T, std::span<float> logits);
  // The same pass's lm_head input — the final norm's output, (B*T, hidden_size): the rows the
  // logits are (hidden · lm_headᵀ) of (concord contract dump --hidden; docs/cuda.md's contract).
  void forward_lm_head_input(std::span<const int32_t> tokens, int64_t B, int64_t T, std::span<float> hidden);
  // Mean cross-entropy over targets >= 0 (targets < 0 are ignored), and the gradients of that
  // mean with respect to every parameter (overwritten, not accumulated). `step` seeds the
  // stochastic rounding and Hadamard signs of the backward GEMMs.
  float forward_backward(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                         int64_t B, int64_t T, uint64_t step = 0);
  // Qwen3-MoE with output_router_logits: HF's load-balancing loss of the last forward_backward
  // (unscaled; the returned loss includes router_aux_loss_coef times it, and the gradients its
  // gradient). 0 for other models. forward_backward_policy adds none.
  double moe_aux_loss() const;
  // The experts the last forward or forward_backward routed each row of `application` to:
  // (B*T, num_experts_per_tok), ascending expert id per row; empty for a dense application.
  std::vector<int32_t> moe_selected(int64_t application) const;
  // Router statistics: while on, every forward (training and KV-cache) adds, per application of
  // an MoE block, the tokens routed to each expert (top-k picks; a token counts once per pick).
  // counts[a] is (num_experts) for an MoE application and empty for a dense one. Off by default;
  // turning it on (or reset) zeroes the counts.
  struct RouterStats {
    std::vector<std::vector<int64_t>> counts;  // per application
    int64_t rows = 0;                          // token rows routed per MoE application
  };
  void set_router_stats(bool on);
  RouterStats router_stats() const;
  // Routing trace: while on, every forward (training and KV-cache) appends, per application of an
  // MoE block, each token's top-k experts (ascending per token, tokens in pass order) and the
  // tokens of the pass — the per-token record `concord ep-sim` replays (serve/ep_sim.h). Off by
  // default; turning it on (or off) empties it.
  struct RouterTrace {
    std::vector<std::vector<int32_t>> selected;   // per application: (tokens · k); empty if dense
    std::vector<std::vector<int64_t>> pass_rows;  // per application: the tokens of each pass
  };
  void set_router_trace(bool on);
  const RouterTrace& router_trace() const;
  // One expert of an MoE block as bytes (its gate, up and down fp32 values, in that order), put
  // back (the derived copies rebuilt on the next use), released (its values freed: a pass that
  // reaches it throws), and whether it is held; the bytes of expert weights held. A model serving
  // stored blocks refuses the first three (InputError).
  std::vector<uint8_t> expert_bytes(int64_t block, int64_t expert) const;
  void set_expert_bytes(int64_t block, int64_t expert, std::span<const uint8_t> bytes);
  void release_expert(int64_t block, int64_t expert);
  bool holds_expert(int64_t block, int64_t expert) const;
  int64_t expert_bytes_held() const;
  // Expert parallelism (ExpertParallel above); nullptr: every expert here (the default).
  void set_expert_parallel(std::shared_ptr<ExpertParallel> ep);
  // Expert parallelism with data-parallel attention: a pass with no tokens of this rank's own — for
  // every MoE application it computes the rows other ranks send to its experts and sends them back
  // (collective: the other ranks run a pass meanwhile). InputError without data_parallel.
  void expert_parallel_idle_pass();
  const ExpertParallel* expert_parallel() const;
  // Experts under a memory cap (expert_pager.h; load_model_paged in files.h makes one): every
  // expert the pager lists must be served as stored blocks (its placeholders until paged in).
  // expert_bytes_held() is then what the pager holds. Not with expert parallelism; a model with a
  // pager has no twin. nullptr: off.
  void set_expert_pager(std::shared_ptr<ExpertPager> pager);
  ExpertPager* expert_pager() const;

  // Distillation (a draft model for speculative decoding, serve/speculative.h): forward over
  // (B, T), then the mean over the B*T rows of KL(p_teacher || p_model), p_teacher the softmax
  // of `teacher_logits` (B*T, V) and p_model the model's, both at temperature 1, in double; the
  // gradients of that mean are written (overwritten). Returns the mean KL in nats. InputError
  // for sizes that do not match or non-finite teacher logits.
  double forward_backward_distill(std::span<const int32_t> tokens, std::span<const float> teacher_logits,
                                  int64_t B, int64_t T, uint64_t step = 0);

  // Policy-gradient pass (RL, rl/grpo.h): forward over (B, T), then `loss` is called once with
  // each row's log-prob of its target and the entropy of its distribution (both in double; rows
  // with target < 0 get 0 and must get coefficient 0) and fills coef[t] = ∂L/∂logp_t. The
  // backward pass then writes (overwrites) the gradients of the surrogate Σ_t coef[t]·logp_t,
  // coefficients held constant — the loss's gradient when L depends on θ only through the
  // logp_t. Returns Σ_t coef[t]·logp_t (double). `step` seeds the backward GEMMs as in
  // forward_backward.
  using PolicyLossFn = std::function<void(std::span<const double> logp,
                                          std::span<const double> entropy, std::span<double> coef)>;
  double forward_backward_policy(std::span<const int32_t> tokens,
                                 std::span<const int32_t> targets, int64_t B, int64_t T,
                                 const PolicyLossFn& loss, uint64_t step = 0);

  // What the forward GEMMs read of each weight (rl/sync.h's content and derived-state checks).
  // Prepares (quantizes, pre-packs) stale weights first, exactly as the next forward would.
  // For every matrix parameter in params() order: its name, the fp32 values the copy was built
  // from at the time it was built (a snapshot's hash, so a stale copy is detectable), and the
  // prepared forward operand (codes + scales in .quantized when quantized; .packed panels).
  struct DerivedWeight {
    std::string_view name;
    uint64_t source_hash = 0;  // XXH3-64 of the fp32 values the prepared copy was built from
    const tensor::PreparedOperand* forward = nullptr;
  };
  void visit_derived_weights(const std::function<void(const DerivedWeight&)>& fn);

  // The KV-cache forward (decode.cpp): appends every input's tokens to its sequence in `cache`
  // and writes logits (logit_rows(inputs), V), rows in input order. All inputs' rows share each
  // GEMM; a row's logits equal Model::forward's for the same sequence bit for bit wherever the
  // activation quantizer is row-local, and never depend on the other inputs (docs/engine.md).
  // InputError: slot not in use or repeated, no tokens, token id outside the vocabulary, a
  // sequence outgrowing the cache's capacity / max_position_embeddings, a mis-sized buffer.
  void forward_cached(KvCache& cache, std::span<const CachedInput> inputs, std::span<float> logits);

  // ---- activation recomputation (the training passes; docs/sched.md) ------------------------
  // What the training forward keeps of each application of the schedule for the backward:
  //   keep       every activation (the default);
  //   attention  all but the attention probabilities (B·Hq·S·S floats, the largest for long
  //              sequences), recomputed from the kept q, k, v just before the application's
  //              backward (Korthikanti et al. 2022's selective recomputation);
  //   block      only the application's input; its backward re-runs the block's forward first
  //              (every application `block`: "checkpoint every layer").
  // Gradients and losses are bit for bit the same under every choice: the recomputation runs
  // the same code on the same inputs. InputError: a list whose length is not the schedule's
  // applications, a depth-recurrent model, `block` on an MoE application of a model with
  // output_router_logits (the load-balancing loss reads every application's routing after the
  // forward). moe_selected() of a `block` application is empty.
  enum class Recompute : uint8_t { keep, attention, block };
  void set_recompute(std::vector<Recompute> per_application);  // empty: keep everywhere
  const std::vector<Recompute>& recompute() const;
  // The activation arena (a pass's activations, the backward's scratch, recomputation) over the
  // last training or full forward pass (forward and backward): the high-water mark of its live
  // allocations (bytes, each rounded up to 64; what sched::training_memory predicts), of the top
  // of its bump allocation (the live bytes plus chunk tails skipped), and the bytes its chunks
  // hold (what the process holds for it).
  struct ActivationMemory {
    int64_t live_high_water = 0, high_water = 0, reserved = 0;
  };
  ActivationMemory activation_memory() const;

  // ---- depth recurrence (ConcordRecurrentForCausalLM; docs/recurrence.md) ------------------
  // Each throws InputError for a model that is not recurrent.
  // Core iterations r of later passes (>= 1; mean_recurrence until set). The parameters do not
  // depend on r: one checkpoint runs at any depth.
  void set_depth(int64_t depth);
  int64_t depth() const;
  // forward_backward / forward_backward_policy: the gradient flows through the last k core
  // iterations only (truncated backprop; the earlier ones run without keeping activations and
  // their output state is a constant); 0: through all of them.
  void set_backprop_iterations(int64_t k);
  int64_t backprop_iterations() const;
  // The seed of the initial state s0 (state_init "random"): s0's row at position t is
  // recurrent_initial_state(config, seed, t), the same in every pass, so the KV-cache forward
  // equals the full forward. The trainer sets a fresh seed per step. 0 until set.
  void set_state_seed(uint64_t seed);
  // Adaptive exit in forward_cached: each new token iterates the core until the KL divergence
  // KL(p_i || p_{i-1}) of successive iterates' next-token distributions (temperature 1, the coda
  // and head run on every iterate) falls below kl_threshold, or max_iterations (0: the depth)
  // are done. Every input of such a call must hold one token (a decode step; feed a prompt token
  // by token). The cache slots of the iterations a token skipped get its last iterate's keys
  // and values, so later tokens attend to its latest state (Huginn's rule). nullopt: off.
  struct AdaptiveExit {
    double kl_threshold = 1e-3;
    int64_t max_iterations = 0;
  };
  void set_adaptive_exit(std::optional<AdaptiveExit> exit);
  bool adaptive_exit_on() const;  // a recurrent model with adaptive exit set
  // Per input of the last forward_cached: the core iterations its last token ran.
  std::vector<int32_t> last_iterations() const;

  // Called for every GEMM of later passes (nullptr: none). For tests and audits; slows passes.
  void set_gemm_observer(GemmObserver observer);
  // Runs every forward GEMM of the linear layers (training forward and cached forward) through
  // `kernel` instead of concord's gemm_prepared (nullptr: back to concord's). For kernel
  // contracts (audit/); the backward GEMMs are not affected.
  void set_forward_gemm_kernel(ForwardGemmKernel kernel);

  struct Impl;  // model_impl.h (opaque to users)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace concord::model
