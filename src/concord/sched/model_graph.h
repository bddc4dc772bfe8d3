// A model pass as a sched::Graph (sched.h): the decoder's node list (Model::describe_block, the
// list the passes interpret) turned into tensors and data flow, with fp32 activation sizes for T
// tokens of B sequences.
//
//   embed -> per application of the schedule: the block's nodes -> final_norm -> lm_head
//
// The graph is the data flow Model::run_node follows (model.h): each node's inputs and outputs in
// the order listed here, which the executor (executor.h) hands it.
//
// Dense block: input_norm (x -> xn1 + rstd1), q/k/v (xn1 -> q_raw/k_raw/v), q_norm/k_norm (->
// q/k + rstd), rope_q/rope_k (in place on q/k; without QK-norm they read q_raw/k_raw into q/k),
// attention (q, k, v -> att; its probabilities B x Hq x S x S: workspace in inference, a second
// output kept in training), o (att -> o), residual_attention (x, o -> x_mid, in place on o, as the
// block writes o_proj's output into x_mid), post_norm (-> xn2 + rstd2), gate/up (xn2 -> gate/up),
// swiglu (gate, up -> h; the backward reads all three), down (h -> y), residual_mlp (x_mid, y ->
// x_out, in place on y). Qwen3-MoE: router (xn2 -> logits), top_k (-> routing: (rows, k) expert
// ids as int32 then (rows, k) weights; the softmax's probabilities are workspace, or a second
// output kept in training), per expert gate/up (xn2, routing -> its rows; the gathered rows of
// xn2 are workspace), swiglu, down (h, routing -> its rows), combine (every expert's rows, then
// routing -> y). An expert's rows are `expert_rows` (Model::RouterStats::counts of the batch:
// exact, what the executor needs) or else T·k/E rounded up (the balanced load, a planning figure).
//
// Passes: `forward` (inference: only the logits are kept); `prefill` (an engine prefill chunk: T
// new tokens for each of B sequences after `context` cached ones, each returning its last row's
// logits) and `decode` (the same with T = 1: one decode step) — both the cached pass of a
// CachedShape below, which the executor runs on a KvCache as Model::forward_cached does: each
// application's attention appends its new k and v rows to the cache and holds every row's scores
// as workspace; the cache itself is the KvCache's memory, outside the graph (Graph::outside_bytes);
// `select_logits` copies the rows whose logits are asked for, and the final norm and LM head run on
// those only; and `train` (the forward as the training step runs it: every activation the backward reads is kept — LayerActivations — so
// scheduling can only reorder independent branches; its peak is what the backward starts from).
// `step` is the whole training step (Model::forward_backward) of a dense, Qwen3-MoE or
// depth-recurrent decoder (`de_init`, and per iteration with gradient `adapter.bwd`, which adds
// its d e into a running sum in place and hands d s to the previous iteration; under truncated
// backpropagation the iterations without gradient have no backward nodes and keep nothing): the training
// forward, then `loss` (logits, targets -> d_logits and the loss, 8 bytes, kept), `lm_head.bwd`,
// `final_norm.bwd`, per application in reverse the block's backward nodes (`down.bwd`,
// `swiglu.bwd`, `gate.bwd`, `up.bwd` — adding into gate's d xn2 in place —, `post_norm.bwd`,
// `residual_mlp.bwd`, `o.bwd`, `attention.bwd`, `rope_q.bwd` / `rope_k.bwd` (in place),
// `q_norm.bwd` / `k_norm.bwd`, `q.bwd`, `k.bwd` and `v.bwd` — adding into q's d xn1 in place —,
// `input_norm.bwd`, `residual_attention.bwd`), then `embed.bwd`. Nothing of the forward is kept:
// each activation is freed after its last backward reader, the memory a freeing allocator needs.
// Weight gradients are the model's (outside the graph); a block applied more than once adds its
// earlier applications' into its later ones' (the dx chain orders them as the model does). An MoE
// layer's backward replaces the dense MLP's: `combine.bwd` (d out -> every expert's d y rows and
// d w per pick, in double), per expert `expert.E.down.bwd`, `.swiglu.bwd`, `.gate.bwd` and
// `.up.bwd` (its x rows gathered from xn2 again into the workspace; up adds into gate's d rows in
// place), `top_k.bwd` (d w, the router probabilities -> d router logits) and `router.bwd` (the
// experts' d rows added back per token, plus the router's dgrad -> d xn2). With
// output_router_logits, `aux_loss` reads every MoE application's routing and probabilities after
// `loss` (renamed `ce_loss`), adds coef · aux into the loss in place and hands every top_k.bwd the
// load-balancing gradient per expert.
//
// A depth-recurrent model's pass is its plan at the model's current depth (Model::set_depth):
// the prelude's blocks, per core iteration `init_state` (the first: s0, no inputs) and `adapter`
// (s, e -> [s, e] and x; the prelude's output e is read by every iteration's adapter), the core's
// blocks, then the coda's. Its cached passes write iteration i into the KV cache's slot i mod
// core_slots and end with `fill_skipped` (the slots past the depth get the last iteration's rows).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "concord/model/model.h"
#include "concord/sched/sched.h"

namespace concord::sched {

enum class Pass { forward, prefill, decode, train, step };
// "forward" | "prefill" | "decode" | "train" | "step"; InputError otherwise
Pass pass_from_name(const std::string& name);

// Per application, the rows routed to each expert (an empty list for a dense application).
using ExpertRows = std::vector<std::vector<int64_t>>;
Graph model_graph(const model::Model& m, Pass pass, int64_t tokens, int64_t sequences = 1,
                  const ExpertRows* expert_rows = nullptr, int64_t context = 0);

// A cached pass as the engine runs it (Model::forward_cached's inputs; serve::Engine's step):
// per input, the tokens its slot holds before the pass, its new tokens and which of their rows
// give logits. `key_capacity` > 0 gives every row's attention scores room for that many keys (at
// least the longest row's context + tokens), so that one plan serves the steps of a growing
// context; 0: exactly the longest row's. Pass::prefill and Pass::decode above are this with B
// alike inputs returning their last row's logits.
struct CachedShape {
  std::vector<int64_t> context, tokens;
  std::vector<model::LogitRows> logits;
  int64_t key_capacity = 0;
};
Graph model_graph(const model::Model& m, const CachedShape& shape, const ExpertRows* expert_rows = nullptr);

}  // namespace concord::sched
