// Model::run_node (model.h): the forward pass one node at a time on buffers the caller placed —
// the memory scheduler's executor (sched/executor.h) drives it. The arithmetic is Model::forward's
// (model.cpp, block_dense.cpp, block_moe.cpp) call for call, so any valid order of the nodes
// writes the same logits bit for bit; the data flow (which buffers a node reads and writes) is
// sched/model_graph.cpp's, and every size is checked here before anything is written.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "concord/model/block.h"
#include "concord/model/block_layer.h"
#include "concord/model/kv_cache.h"
#include "concord/numerics/check.h"
#include "concord/tensor/gemm.h"

namespace concord::model {
namespace {

struct Call {
  const Model::NodeCall& c;

  [[noreturn]] void fail(const std::string& what) const {
    const std::string where = c.application < 0 ? std::string(c.node) : fmt::format("a{}.{}", c.application, c.node);
    throw InputError(fmt::format("[model] run_node {}: {}", where, what));
  }
  void counts(size_t in, size_t out) const {
    if (c.inputs.size() != in || c.input_bytes.size() != in)
      fail(fmt::format("{} inputs given, the node reads {}", c.inputs.size(), in));
    if (c.outputs.size() != out || c.output_bytes.size() != out)
      fail(fmt::format("{} outputs given, the node writes {}", c.outputs.size(), out));
  }
  // Input i holds at least `bytes` / output i exactly `bytes`.
  const float* in(size_t i, int64_t floats) const {
    if (c.input_bytes[i] < floats * 4) fail(fmt::format("input {} holds {} bytes, needs {}", i, c.input_bytes[i], floats * 4));
    return static_cast<const float*>(c.inputs[i]);
  }
  float* out(size_t i, int64_t floats) const {
    if (c.output_bytes[i] != floats * 4)
      fail(fmt::format("output {} holds {} bytes, the node writes {}", i, c.output_bytes[i], floats * 4));
    return static_cast<float*>(c.outputs[i]);
  }
  float* work(int64_t floats) const {
    if (c.workspace_bytes < floats * 4) fail(fmt::format("workspace of {} bytes, needs {}", c.workspace_bytes, floats * 4));
    return static_cast<float*>(c.workspace);
  }
};

// The routing buffer of an MoE application (top_k's output): (rows, k) expert ids as int32, then
// (rows, k) combine weights.
struct Routing {
  const int32_t* selected;
  const float* weight;
};
Routing routing_of(const void* buffer, int64_t rows, int64_t k) {
  const auto* ids = static_cast<const int32_t*>(buffer);
  return {ids, reinterpret_cast<const float*>(ids + rows * k)};
}

// Each pick's row among its expert's rows (the experts' rows are their tokens in ascending order)
// and each expert's row count.
struct PickRows {
  std::vector<int64_t> count, row_of;  // per expert; per pick (t * k + j)
};
PickRows pick_rows(const Routing& r, int64_t rows, int64_t k, int64_t experts) {
  PickRows p{std::vector<int64_t>(static_cast<size_t>(experts), 0), std::vector<int64_t>(static_cast<size_t>(rows * k))};
  for (int64_t t = 0; t < rows * k; ++t) p.row_of[static_cast<size_t>(t)] = p.count[static_cast<size_t>(r.selected[t])]++;
  return p;
}

// The tokens routed to expert e in ascending order.
std::vector<int32_t> expert_tokens(const Routing& r, int64_t rows, int64_t k, int64_t e) {
  std::vector<int32_t> tokens;
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < k; ++j)
      if (r.selected[t * k + j] == e) tokens.push_back(static_cast<int32_t>(t));
  return tokens;
}

// A block's backward node (LayerBlock::backward and DenseBlock::mlp_backward, call for call):
// d(output) in, d(input) and the weight gradients out; an accumulating dgrad (up into gate's d
// xn2, k and v into q's d xn1) adds into its third input, which its output is (or is copied to).
void run_backward_node(Model::Impl& m, const Model::NodeCall& call, const Call& k, const BlockNode& node,
                       const int32_t* positions) {
  const ModelConfig& c = m.config;
  const int64_t T = call.B * call.S, C = c.hidden_size, D = c.head_dim, F = c.intermediate_size;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int L = static_cast<int>(c.num_hidden_layers);
  const int layer = m.plan[static_cast<size_t>(call.application)].block;
  const LayerPrecision& attn = m.policy.for_layer(LayerClass::attention, layer, L);
  const LayerPrecision& mlp = m.policy.for_layer(LayerClass::mlp, layer, L);
  auto grad = [&](int param) { return m.grads[static_cast<size_t>(param)].data(); };
  // A block applied more than once (the schedule): its later applications' backward runs first
  // and writes the weight gradients, the earlier ones add to them (model_backward.cpp's `written`),
  // each application with its own GEMM streams (gemm_stream_id).
  const int repeat = m.plan[static_cast<size_t>(call.application)].repeat;
  bool accumulate = false;
  for (int64_t a = call.application + 1; a < m.applications(); ++a) accumulate |= m.plan[static_cast<size_t>(a)].block == layer;
  auto id = [&](int param) { return gemm_stream_id(param, repeat, m.specs.size()); };
  const std::string& name = node.name;
  // The accumulating dgrads: the running sum arrives as input 2.
  auto accumulated = [&](int64_t floats) {
    float* out = k.out(0, floats);
    const float* sum = k.in(2, floats);
    if (out != sum) std::memcpy(out, sum, sizeof(float) * static_cast<size_t>(floats));
    return out;
  };
  // Qwen3-MoE's layer (block_moe.cpp's mlp_backward, step by step).
  const int64_t E = c.num_experts, topk = c.num_experts_per_tok, Fm = c.moe_intermediate_size;
  if (name.rfind("expert.", 0) == 0) {
    // An expert on its rows: down (d y -> d h), swiglu, gate (d gate -> the d rows, x gathered
    // again from xn2 into the workspace), up (adding into the d rows, input 3). An expert no token
    // chose gets zero weight gradients (unless an earlier application adds to them).
    const int64_t e = std::stoll(name.substr(7));
    const std::string op = name.substr(name.rfind('.') + 1);
    if (op == "swiglu") {
      k.counts(3, 2);
      const int64_t n = call.output_bytes[0] / (4 * Fm);
      swiglu_backward(k.out(0, n * Fm), k.out(1, n * Fm), k.in(0, n * Fm), k.in(1, n * Fm), k.in(2, n * Fm), n, Fm);
      return;
    }
    const int64_t n = call.output_bytes[0] / (4 * (op == "down" ? Fm : C));
    if (n == 0) {
      k.counts(op == "down" ? 2 : op == "gate" ? 3 : 4, 1);
      if (!accumulate) std::fill(m.grads[static_cast<size_t>(node.param)].begin(), m.grads[static_cast<size_t>(node.param)].end(), 0.0f);
      return;
    }
    if (op == "down") {
      k.counts(2, 1);
      m.linear_backward(mlp, node.param, k.in(0, n * C), k.in(1, n * Fm), n, k.out(0, n * Fm), false, grad(node.param),
                        accumulate, call.step, id(node.param));
      return;
    }
    const bool up = op == "up";
    k.counts(up ? 4 : 3, 1);
    const std::vector<int32_t> tokens = expert_tokens(routing_of(k.in(2, T * topk * 2), T, topk), T, topk, e);
    if (static_cast<int64_t>(tokens.size()) != n)
      k.fail(fmt::format("the routing sends {} rows to expert {}, the buffers hold {}", tokens.size(), e, n));
    const float* xn2 = k.in(1, T * C);
    float* x = k.work(n * C);
    for (int64_t row = 0; row < n; ++row)
      std::memcpy(x + row * C, xn2 + int64_t{tokens[static_cast<size_t>(row)]} * C, sizeof(float) * static_cast<size_t>(C));
    float* drows = k.out(0, n * C);
    if (up) {
      const float* sum = k.in(3, n * C);
      if (drows != sum) std::memcpy(drows, sum, sizeof(float) * static_cast<size_t>(n * C));
    }
    m.linear_backward(mlp, node.param, k.in(0, n * Fm), x, n, drows, up, grad(node.param), accumulate, call.step, id(node.param));
    return;
  }
  if (node.op == NodeOp::combine) {
    // d y of every expert's rows (each its token's d out times its weight) and d w per pick, the
    // dot of d out with the expert's output row (in double).
    k.counts(static_cast<size_t>(E) + 2, static_cast<size_t>(E) + 1);
    const float* dout = k.in(0, T * C);
    const Routing r = routing_of(k.in(1, T * topk * 2), T, topk);
    const PickRows picks = pick_rows(r, T, topk, E);
    const std::vector<int64_t>& cursor = picks.count;
    const std::vector<int64_t>& row_of = picks.row_of;
    std::vector<const float*> y(static_cast<size_t>(E));
    std::vector<float*> dy(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      y[static_cast<size_t>(e)] = k.in(static_cast<size_t>(e) + 2, cursor[static_cast<size_t>(e)] * C);
      dy[static_cast<size_t>(e)] = k.out(static_cast<size_t>(e), cursor[static_cast<size_t>(e)] * C);
    }
    if (call.output_bytes[static_cast<size_t>(E)] != T * topk * 8) k.fail(fmt::format("d w holds {} bytes, needs {}", call.output_bytes[static_cast<size_t>(E)], T * topk * 8));
    auto* dw = static_cast<double*>(call.outputs[static_cast<size_t>(E)]);
#pragma omp parallel for schedule(static) if (T * C > 65536)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < topk; ++j) {
        const size_t tj = static_cast<size_t>(t * topk + j);
        const auto e = static_cast<size_t>(r.selected[tj]);
        const int64_t row = row_of[tj];
        double d = 0.0;
        for (int64_t col = 0; col < C; ++col) {
          dy[e][row * C + col] = r.weight[tj] * dout[t * C + col];
          d += static_cast<double>(dout[t * C + col]) * static_cast<double>(y[e][row * C + col]);
        }
        dw[tj] = d;
      }
    return;
  }
  if (node.op == NodeOp::top_k) {
    // d router logits through the top-k renormalisation and the softmax, per token in double (the
    // load-balancing loss's d p added to every expert's when given).
    const bool aux = call.inputs.size() == 4;
    k.counts(aux ? 4 : 3, 1);
    if (call.input_bytes[0] < T * topk * 8) k.fail("d w holds too few bytes");
    const auto* dw = static_cast<const double*>(call.inputs[0]);
    const float* probs = k.in(1, T * E);
    const Routing r = routing_of(k.in(2, T * topk * 2), T, topk);
    const double* aux_dp = nullptr;
    if (aux) {
      if (call.input_bytes[3] != E * 8) k.fail("the load-balancing gradient holds one double per expert");
      aux_dp = static_cast<const double*>(call.inputs[3]);
    }
    float* dlogits = k.out(0, T * E);
#pragma omp parallel for schedule(static) if (T > 64)
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> dp(static_cast<size_t>(E), 0.0);
      const float* pt = probs + t * E;
      if (c.norm_topk_prob) {
        double sum = 0.0, dot = 0.0;
        for (int64_t j = 0; j < topk; ++j) sum += pt[r.selected[t * topk + j]];
        for (int64_t j = 0; j < topk; ++j) dot += dw[t * topk + j] * static_cast<double>(r.weight[t * topk + j]);
        for (int64_t j = 0; j < topk; ++j) dp[static_cast<size_t>(r.selected[t * topk + j])] = (dw[t * topk + j] - dot) / sum;
      } else {
        for (int64_t j = 0; j < topk; ++j) dp[static_cast<size_t>(r.selected[t * topk + j])] = dw[t * topk + j];
      }
      if (aux_dp != nullptr)
        for (int64_t e = 0; e < E; ++e) dp[static_cast<size_t>(e)] += aux_dp[e];
      double inner = 0.0;
      for (int64_t e = 0; e < E; ++e) inner += dp[static_cast<size_t>(e)] * static_cast<double>(pt[e]);
      for (int64_t e = 0; e < E; ++e)
        dlogits[t * E + e] = static_cast<float>(static_cast<double>(pt[e]) * (dp[static_cast<size_t>(e)] - inner));
    }
    return;
  }
  if (node.op == NodeOp::router) {
    // d xn2: every expert's d rows added back per token (its picks in order), then the router's
    // dgrad; the router's weight gradient (fp32, outside the precision policy, as its forward).
    k.counts(static_cast<size_t>(E) + 3, 1);
    const float* dlogits = k.in(0, T * E);
    const float* xn2 = k.in(1, T * C);
    const Routing r = routing_of(k.in(2, T * topk * 2), T, topk);
    const PickRows picks = pick_rows(r, T, topk, E);
    const std::vector<int64_t>& cursor = picks.count;
    const std::vector<int64_t>& row_of = picks.row_of;
    std::vector<const float*> drows(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) drows[static_cast<size_t>(e)] = k.in(static_cast<size_t>(e) + 3, cursor[static_cast<size_t>(e)] * C);
    float* dxn = k.out(0, T * C);
    std::fill(dxn, dxn + T * C, 0.0f);
#pragma omp parallel for schedule(static) if (T * C > 65536)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < topk; ++j) {
        const size_t tj = static_cast<size_t>(t * topk + j);
        const float* from = drows[static_cast<size_t>(r.selected[tj])] + row_of[tj] * C;
        for (int64_t col = 0; col < C; ++col) dxn[t * C + col] += from[col];
      }
    const LayerParams& lp = m.layers[static_cast<size_t>(layer)];
    const float* wr = m.values[static_cast<size_t>(lp.router)].data();
    tensor::gemm(tensor::Trans::no, tensor::Trans::no, T, C, E, dlogits, E, wr, C, dxn, C, /*accumulate=*/true);
    tensor::gemm(tensor::Trans::yes, tensor::Trans::no, E, C, T, dlogits, E, xn2, C, grad(lp.router), C, accumulate);
    return;
  }
  if (node.op == NodeOp::linear) {
    const bool attention_side = name == "q" || name == "k" || name == "v" || name == "o";
    const int64_t in_width = name == "o" ? Hq * D : name == "down" ? F : C;
    const bool adds = name == "up" || name == "k" || name == "v";
    k.counts(adds ? 3 : 2, 1);
    float* dx = adds ? accumulated(T * in_width) : k.out(0, T * in_width);
    m.linear_backward(attention_side ? attn : mlp, node.param, k.in(0, T * node.width), k.in(1, T * in_width), T, dx, adds,
                      grad(node.param), accumulate, call.step, id(node.param));
    return;
  }
  switch (node.op) {
    case NodeOp::swiglu:
      k.counts(3, 2);
      swiglu_backward(k.out(0, T * F), k.out(1, T * F), k.in(0, T * F), k.in(1, T * F), k.in(2, T * F), T, F);
      return;
    case NodeOp::residual_add: {
      k.counts(2, 1);
      const float* dy = k.in(0, T * C);
      const float* branch = k.in(1, T * C);
      float* out = k.out(0, T * C);
      for (int64_t j = 0; j < T * C; ++j) out[j] = dy[j] + branch[j];  // add_into(dx, tmp)
      return;
    }
    case NodeOp::rmsnorm: {
      k.counts(3, 1);
      const float* w = m.values[static_cast<size_t>(node.param)].data();
      if (name == "input_norm" || name == "post_norm") {
        rmsnorm_backward(k.out(0, T * C), grad(node.param), k.in(0, T * C), k.in(1, T * C), w, k.in(2, T), T, C);
      } else {
        const int64_t heads = node.width / D;
        rmsnorm_backward(k.out(0, T * node.width), grad(node.param), k.in(0, T * node.width), k.in(1, T * node.width), w,
                         k.in(2, T * heads), T * heads, D);
      }
      return;
    }
    case NodeOp::rope: {
      k.counts(1, 1);
      const float* d = k.in(0, T * node.width);
      float* out = k.out(0, T * node.width);
      if (out != d) std::memcpy(out, d, sizeof(float) * static_cast<size_t>(T * node.width));
      rope_backward(out, positions, T, node.width / D, D, m.rope);
      return;
    }
    case NodeOp::attention:
      k.counts(5, 3);
      attention_backward(k.out(0, T * Hq * D), k.out(1, T * Hkv * D), k.out(2, T * Hkv * D), k.in(0, T * Hq * D),
                         k.in(1, call.B * Hq * call.S * call.S), k.in(2, T * Hq * D), k.in(3, T * Hkv * D), k.in(4, T * Hkv * D),
                         call.B, call.S, Hq, Hkv, D);
      return;
    default:
      k.fail("no backward node of this kind");
  }
}

}  // namespace

void Model::run_node(const NodeCall& call) {
  Impl& m = *impl_;
  const ModelConfig& c = m.config;
  const CachedRows* cached = call.cached;
  const Call k{call};
  if (cached != nullptr) {
    const size_t n = cached->inputs.size();
    if (cached->cache == nullptr || n == 0 || cached->start.size() != n || cached->row_splits.size() != n + 1 ||
        cached->logit_splits.size() != n + 1 || cached->row_splits[0] != 0 || cached->logit_splits[0] != 0 ||
        static_cast<int64_t>(cached->positions.size()) != cached->row_splits[n] ||
        static_cast<int64_t>(cached->logit_positions.size()) != cached->logit_splits[n])
      k.fail("the cached rows are inconsistent (a cache, one start per input, row and logit splits, a position per row)");
    if (c.recurrent() && m.adaptive_exit)
      k.fail("adaptive exit decides each token's iterations as it runs: its cached pass is not a node list");
  } else if (call.B < 1 || call.S < 1 || call.S > c.max_position_embeddings) {
    throw InputError(fmt::format("[model] run_node: {} sequences of {} tokens (1..{} tokens each)", call.B, call.S,
                                 c.max_position_embeddings));
  }
  const int64_t T = cached != nullptr ? cached->row_splits.back() : call.B * call.S;
  const int64_t C = c.hidden_size, D = c.head_dim, V = c.vocab_size;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int L = static_cast<int>(c.num_hidden_layers);
  std::vector<int32_t> own_positions;
  if (cached == nullptr) {
    own_positions.resize(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) own_positions[static_cast<size_t>(t)] = static_cast<int32_t>(t % call.S);
  }
  const std::span<const int32_t> positions = cached != nullptr ? cached->positions : std::span<const int32_t>(own_positions);
  // A cached pass quantizes each input's rows on their own where the quantizer's scale spans rows
  // (forward_cached's row_splits); the full-sequence forward quantizes the batch together.
  const std::span<const int64_t> splits = cached != nullptr ? cached->row_splits : std::span<const int64_t>();
  struct RowPositions {  // the forward-GEMM hook sees the rows' positions, as in run_forward
    Impl& m;
    RowPositions(Impl& impl, const int32_t* p) : m(impl) { m.row_positions = p; }
    ~RowPositions() { m.row_positions = nullptr; }
  } row_positions(m, positions.data());

  auto grad = [&](int param) { return m.grads[static_cast<size_t>(param)].data(); };
  auto backward_checks = [&] {
    if (cached != nullptr) k.fail("a cached pass has no backward");
    m.require_fp32_values("the training step's backward");
  };
  // Truncated backpropagation: the first core iteration with gradient (its input state is a constant).
  const int64_t first_grad =
      c.recurrent() && m.backprop_iterations > 0 && m.backprop_iterations < m.depth ? m.depth - m.backprop_iterations : 0;
  if (call.application < 0) {
    if (call.node == "loss") {  // Model::Impl::run_backward's head: the mean loss and d logits
      backward_checks();
      k.counts(2, 2);
      if (call.input_bytes[1] != T * 4) k.fail(fmt::format("the targets hold {} bytes, need {}", call.input_bytes[1], T * 4));
      if (call.output_bytes[1] != 8) k.fail("the loss output holds 8 bytes (a double)");
      const float* logits = k.in(0, T * V);
      const auto* targets = static_cast<const int32_t*>(call.inputs[1]);
      int64_t count = 0;
      for (int64_t t = 0; t < T; ++t) {
        if (targets[t] >= V) k.fail(fmt::format("target id {} outside the vocabulary", targets[t]));
        count += targets[t] >= 0;
      }
      if (count == 0) k.fail("every target is ignored (< 0)");
      const double loss = cross_entropy_forward<float>(nullptr, logits, targets, T, V) / static_cast<double>(count);
      cross_entropy_backward(k.out(0, T * V), logits, targets, T, V, 1.0 / static_cast<double>(count));
      std::memcpy(call.outputs[1], &loss, sizeof(double));
      // The gradients the backward adds into start at zero (backward_from_dlogits).
      m.ensure_grads();
      for (size_t p = 0; p < m.specs.size(); ++p)
        if (!m.specs[p].is_matrix()) std::fill(m.grads[p].begin(), m.grads[p].end(), 0.0f);
      if (!c.tie_word_embeddings) std::fill(m.grads[static_cast<size_t>(m.embed)].begin(), m.grads[static_cast<size_t>(m.embed)].end(), 0.0f);
      return;
    }
    if (call.node == "aux_loss") {
      // Qwen3-MoE's load-balancing loss (block_moe.cpp's moe_aux_loss) from every MoE
      // application's routing and router probabilities, in application order: the loss in place
      // (cross-entropy + coef · aux, in double as forward_backward adds it) and coef · d aux / d p.
      backward_checks();
      if (!c.moe() || !c.output_router_logits) k.fail("only Qwen3-MoE with output_router_logits has a load-balancing loss");
      const int64_t E = c.num_experts, topk = c.num_experts_per_tok;
      if (call.inputs.size() < 3 || call.inputs.size() % 2 != 1) k.fail("the loss, then each MoE application's routing and probabilities");
      k.counts(call.inputs.size(), 2);
      if (call.input_bytes[0] != 8 || call.output_bytes[0] != 8) k.fail("the loss is 8 bytes (a double)");
      if (call.output_bytes[1] != E * 8) k.fail(fmt::format("the gradient per expert is {} bytes", E * 8));
      std::vector<double> picks(static_cast<size_t>(E), 0.0), prob_sum(static_cast<size_t>(E), 0.0);
      double rows = 0.0;
      for (size_t i = 1; i < call.inputs.size(); i += 2) {
        const Routing r = routing_of(k.in(i, T * topk * 2), T, topk);
        const float* probs = k.in(i + 1, T * E);
        for (int64_t j = 0; j < T * topk; ++j) picks[static_cast<size_t>(r.selected[j])] += 1.0;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t e = 0; e < E; ++e) prob_sum[static_cast<size_t>(e)] += probs[t * E + e];
        rows += static_cast<double>(T);
      }
      double aux = 0.0;
      auto* dp = static_cast<double*>(call.outputs[1]);
      for (int64_t e = 0; e < E; ++e) {
        const double f = picks[static_cast<size_t>(e)] / rows;
        aux += f * (prob_sum[static_cast<size_t>(e)] / rows);
        dp[e] = static_cast<double>(E) * f / rows * c.router_aux_loss_coef;
      }
      aux *= static_cast<double>(E);
      double loss = 0;
      std::memcpy(&loss, call.inputs[0], sizeof(double));
      loss += c.router_aux_loss_coef * aux;
      std::memcpy(call.outputs[0], &loss, sizeof(double));
      m.moe_aux = aux;
      return;
    }
    if (call.node == "lm_head.bwd") {
      backward_checks();
      k.counts(2, 1);
      m.linear_backward(m.policy.for_layer(LayerClass::lm_head, 0, L), m.lm_head, k.in(0, T * V), k.in(1, T * C), T,
                        k.out(0, T * C), false, grad(m.lm_head), false, call.step, static_cast<uint32_t>(m.specs.size()));
      return;
    }
    if (call.node == "final_norm.bwd") {
      backward_checks();
      k.counts(3, 1);
      rmsnorm_backward(k.out(0, T * C), grad(m.final_norm), k.in(0, T * C), k.in(1, T * C),
                       m.values[static_cast<size_t>(m.final_norm)].data(), k.in(2, T), T, C);
      return;
    }
    if (call.node == "de_init") {  // recurrent: d e starts at zero (model_backward.cpp)
      backward_checks();
      if (!c.recurrent()) k.fail("only a depth-recurrent model sums d e");
      k.counts(0, 1);
      float* de = k.out(0, T * C);
      std::fill(de, de + T * C, 0.0f);
      return;
    }
    if (call.node == "embed.bwd") {
      backward_checks();
      k.counts(2, 0);
      if (call.input_bytes[1] != T * 4) k.fail(fmt::format("the tokens hold {} bytes, need {}", call.input_bytes[1], T * 4));
      embedding_backward(grad(m.embed), k.in(0, T * C), static_cast<const int32_t*>(call.inputs[1]), T, V, C);
      return;
    }
    if (call.node == "embed") {
      k.counts(1, 1);
      if (call.input_bytes[0] != T * 4) k.fail(fmt::format("the tokens hold {} bytes, need {}", call.input_bytes[0], T * 4));
      const auto* tokens = static_cast<const int32_t*>(call.inputs[0]);
      for (int64_t t = 0; t < T; ++t)
        if (tokens[t] < 0 || tokens[t] >= V) k.fail(fmt::format("token {} at row {} outside the vocabulary 0..{}", tokens[t], t, V - 1));
      m.embed_tokens(k.out(0, T * C), tokens, T);
    } else if (call.node == "fill_skipped") {
      // A recurrent model's cached pass, after its core: the iteration slots beyond the depth get
      // the last iteration's rows, and every input ran `depth` iterations (forward_cached's).
      if (cached == nullptr || !c.recurrent()) k.fail("only a depth-recurrent model's cached pass fills iteration slots");
      k.counts(1, 0);
      for (size_t i = 0; i < cached->inputs.size(); ++i)
        m.fill_skipped_iterations(*cached->cache, cached->inputs[i].slot, cached->start[i],
                                  cached->row_splits[i + 1] - cached->row_splits[i], m.depth);
      m.iterations_used.assign(cached->inputs.size(), static_cast<int32_t>(m.depth));
    } else if (call.node == "select_logits") {
      // A cached pass: the rows whose logits its inputs ask for (LogitRows), input by input.
      if (cached == nullptr) k.fail("only a cached pass selects logit rows");
      k.counts(1, 1);
      const float* x = k.in(0, T * C);
      float* out = k.out(0, static_cast<int64_t>(cached->logit_positions.size()) * C);
      for (size_t i = 0; i < cached->inputs.size(); ++i) {
        const int64_t take = cached->logit_splits[i + 1] - cached->logit_splits[i];
        const int64_t first = cached->row_splits[i + 1] - take;
        std::memcpy(out + cached->logit_splits[i] * C, x + first * C, sizeof(float) * static_cast<size_t>(take * C));
      }
    } else if (call.node == "final_norm") {
      // A cached pass normalises its logit rows only (row-local: the same values as all rows').
      const int64_t R = cached != nullptr ? static_cast<int64_t>(cached->logit_positions.size()) : T;
      k.counts(1, 2);
      rmsnorm_forward(k.out(0, R * C), k.out(1, R), k.in(0, R * C), m.values[static_cast<size_t>(m.final_norm)].data(), R, C,
                      c.rms_norm_eps);
    } else if (call.node == "lm_head") {
      k.counts(1, 1);
      if (cached != nullptr) {  // forward_cached's: the logit rows at their positions, per input
        const auto R = static_cast<int64_t>(cached->logit_positions.size());
        m.row_positions = cached->logit_positions.data();
        m.linear_forward_rows(m.policy.for_layer(LayerClass::lm_head, 0, L), m.lm_head, k.in(0, R * C), R,
                              k.out(0, R * V), cached->logit_splits);
      } else {
        m.linear_forward(m.policy.for_layer(LayerClass::lm_head, 0, L), m.lm_head, k.in(0, T * C), T, k.out(0, T * V),
                         positions.data());
      }
    } else {
      k.fail("no such model-level node (embed, select_logits, final_norm, lm_head)");
    }
    return;
  }

  if (call.application >= m.applications()) k.fail(fmt::format("the pass has applications 0..{}", m.applications() - 1));
  if (c.recurrent() && call.node == "adapter.bwd") {
    // d[s, e] = d x · W (workspace), the adapter's weight gradient (written by the last iteration,
    // added to by the earlier ones, each with its own GEMM streams); d e += its second half (the
    // running sum arrives as input 2, the output takes or copies it), d s = its first half for
    // the previous iteration (none at the first: s0 is a constant).
    backward_checks();
    const Application& ap = m.plan[static_cast<size_t>(call.application)];
    if (!ap.enters_iteration) k.fail("the application does not enter a core iteration");
    if (ap.iteration < first_grad) k.fail("the iteration runs without gradient (truncated backpropagation)");
    k.counts(3, ap.iteration > first_grad ? 2 : 1);
    float* dcat = k.work(T * 2 * C);
    m.linear_backward(m.policy.for_layer(LayerClass::mlp, -1, L), m.adapter, k.in(0, T * C), k.in(1, T * 2 * C), T, dcat,
                      false, m.grads[static_cast<size_t>(m.adapter)].data(), ap.iteration < m.depth - 1, call.step,
                      gemm_stream_id(m.adapter, ap.iteration, m.specs.size()));
    const float* de_in = k.in(2, T * C);
    float* de = k.out(0, T * C);
    float* ds = ap.iteration > first_grad ? k.out(1, T * C) : nullptr;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < C; ++j) {
        if (ds != nullptr) ds[t * C + j] = dcat[t * 2 * C + j];
        de[t * C + j] = de_in[t * C + j] + dcat[t * 2 * C + C + j];
      }
    return;
  }
  if (c.recurrent() && (call.node == "init_state" || call.node == "adapter")) {
    if (!m.plan[static_cast<size_t>(call.application)].enters_iteration)
      k.fail("the application does not enter a core iteration");
    if (call.node == "init_state") {  // s0 of every row (the model's state seed)
      k.counts(0, 1);
      m.initial_state(k.out(0, T * C), positions.data(), T);
    } else {  // [s, e] and x = adapter([s, e])
      k.counts(2, 2);
      m.adapter_forward(k.in(0, T * C), k.in(1, T * C), T, k.out(0, T * 2 * C), k.out(1, T * C), splits);
    }
    return;
  }
  const int layer = m.plan[static_cast<size_t>(call.application)].block;
  const LayerParams& lp = m.layers[static_cast<size_t>(layer)];
  if (m.described.empty()) {
    for (const auto& block : m.blocks) m.described.push_back(block->describe(m));
  }
  const std::vector<BlockNode>& nodes = m.described[static_cast<size_t>(layer)];
  const BlockNode* node = nullptr;
  const bool backward = call.node.size() > 4 && call.node.substr(call.node.size() - 4) == ".bwd";
  const std::string_view base = backward ? call.node.substr(0, call.node.size() - 4) : call.node;
  for (const BlockNode& n : nodes)
    if (n.name == base) node = &n;
  if (node == nullptr) k.fail(fmt::format("block {} has no such node", layer));
  if (backward) {
    backward_checks();
    run_backward_node(m, call, k, *node, own_positions.data());
    return;
  }
  const std::string& name = node->name;
  const LayerPrecision& attn = m.policy.for_layer(LayerClass::attention, layer, L);
  const LayerPrecision& mlp = m.policy.for_layer(LayerClass::mlp, layer, L);
  const int64_t E = c.num_experts, topk = c.num_experts_per_tok, Fm = c.moe_intermediate_size;

  switch (node->op) {
    case NodeOp::rmsnorm: {
      k.counts(1, 2);
      const float* w = m.values[static_cast<size_t>(node->param)].data();
      if (name == "input_norm" || name == "post_norm") {
        rmsnorm_forward(k.out(0, T * C), k.out(1, T), k.in(0, T * C), w, T, C, c.rms_norm_eps);
      } else {  // q_norm, k_norm: rows of head_dim
        const int64_t heads = node->width / D;
        rmsnorm_forward(k.out(0, T * node->width), k.out(1, T * heads), k.in(0, T * node->width), w, T * heads, D,
                        c.rms_norm_eps);
      }
      return;
    }
    case NodeOp::rope: {
      k.counts(1, 1);
      const float* x = k.in(0, T * node->width);
      float* y = k.out(0, T * node->width);
      if (y != x) std::memcpy(y, x, sizeof(float) * static_cast<size_t>(T * node->width));
      rope_forward(y, positions.data(), T, node->width / D, D, m.rope);
      return;
    }
    case NodeOp::attention: {
      if (cached != nullptr) {
        // forward_cached's attention: each input's new k and v rows appended to its slot's rows
        // of this application, then every row attends to its sequence's positions 0..pos (each
        // row's scores in its own part of the workspace, so rows run in parallel).
        k.counts(3, 1);
        KvCache& cache = *cached->cache;
        const int64_t W = Hkv * D;
        const int64_t row_sets = c.recurrent() ? c.n_layers_in_prelude + cache.core_slots() * c.n_layers_in_recurrent_block +
                                                     c.n_layers_in_coda
                                               : m.applications();
        if (cache.num_layers() != row_sets || cache.row_width() != W)
          k.fail(fmt::format("the KV cache holds {} row sets of {} floats, the model runs {} of {}", cache.num_layers(),
                             cache.row_width(), row_sets, W));
        // A recurrent model's core iteration i writes its layer's slot i mod core_slots.
        const int64_t set = m.cache_row_set(call.application, cache.core_slots());
        const float* q = k.in(0, T * Hq * D);
        const float* kk = k.in(1, T * W);
        const float* vv = k.in(2, T * W);
        float* att = k.out(0, T * Hq * D);
        // Row r's scores (Hq x its keys) at scratch[r]: packed one after another when the
        // workspace is exactly their total, else each in a region of Hq x capacity (a plan made
        // with room for more keys: CachedShape::key_capacity).
        int64_t keys = 0, packed = 0;
        for (int32_t p : positions) {
          keys = std::max<int64_t>(keys, int64_t{p} + 1);
          packed += Hq * (int64_t{p} + 1);
        }
        const int64_t capacity = call.workspace_bytes / (4 * T * Hq);
        if (capacity < keys && call.workspace_bytes < 4 * packed)
          k.fail(fmt::format("workspace of {} bytes: {} rows need scores over {} keys ({} bytes packed)", call.workspace_bytes,
                             T, keys, 4 * packed));
        std::vector<float*> scratch(static_cast<size_t>(T));
        auto* scores = static_cast<float*>(call.workspace);
        for (int64_t r = 0, at = 0; r < T; ++r) {
          scratch[static_cast<size_t>(r)] = scores + (capacity >= keys ? r * Hq * capacity : at);
          at += Hq * (int64_t{positions[static_cast<size_t>(r)]} + 1);
        }
        const size_t n = cached->inputs.size();
        std::vector<const float*> k_of(n), v_of(n);
        std::vector<int64_t> row_input(static_cast<size_t>(T));
        for (size_t i = 0; i < n; ++i) {
          const int slot = cached->inputs[i].slot;
          const int64_t first = cached->row_splits[i], rows = cached->row_splits[i + 1] - first;
          const auto bytes = sizeof(float) * static_cast<size_t>(rows * W);
          std::memcpy(cache.keys(slot, set) + cached->start[i] * W, kk + first * W, bytes);
          std::memcpy(cache.values(slot, set) + cached->start[i] * W, vv + first * W, bytes);
          k_of[i] = cache.keys(slot, set);
          v_of[i] = cache.values(slot, set);
          for (int64_t r = first; r < first + rows; ++r) row_input[static_cast<size_t>(r)] = static_cast<int64_t>(i);
        }
#pragma omp parallel for schedule(dynamic, 1) if (T > 1)
        for (int64_t r = 0; r < T; ++r) {
          const auto i = static_cast<size_t>(row_input[static_cast<size_t>(r)]);
          attention_query_row(att + r * Hq * D, nullptr, q + r * Hq * D, k_of[i], v_of[i], positions[static_cast<size_t>(r)] + 1,
                              W, Hq, Hkv, D, scratch[static_cast<size_t>(r)]);
        }
        return;
      }
      const bool keep_probs = call.outputs.size() == 2;
      k.counts(3, keep_probs ? 2 : 1);
      const int64_t probs = call.B * Hq * call.S * call.S;
      float* p = keep_probs ? k.out(1, probs) : k.work(probs);
      attention_forward(k.out(0, T * Hq * D), p, k.in(0, T * Hq * D), k.in(1, T * Hkv * D), k.in(2, T * Hkv * D), call.B,
                        call.S, Hq, Hkv, D);
      return;
    }
    case NodeOp::residual_add: {
      k.counts(2, 1);
      const float* x = k.in(0, T * C);
      const float* y = k.in(1, T * C);
      float* out = k.out(0, T * C);
      // The branch's output plus the stream, as the block adds them (out may be the branch's buffer).
      for (int64_t j = 0; j < T * C; ++j) out[j] = y[j] + x[j];
      return;
    }
    case NodeOp::swiglu: {
      k.counts(2, 1);
      if (name == "swiglu") {
        swiglu_forward(k.out(0, T * node->width), k.in(0, T * node->width), k.in(1, T * node->width), T, node->width);
        return;
      }
      const int64_t rows = call.output_bytes[0] / (4 * Fm);  // an expert's: its rows, checked by out()
      float* h = k.out(0, rows * Fm);
      if (rows > 0) swiglu_forward(h, k.in(0, rows * Fm), k.in(1, rows * Fm), rows, Fm);
      return;
    }
    case NodeOp::router: {
      k.counts(1, 1);
      tensor::gemm(tensor::Trans::no, tensor::Trans::yes, T, E, C, k.in(0, T * C), C,
                   m.values[static_cast<size_t>(lp.router)].data(), C, k.out(0, T * E), E);
      return;
    }
    case NodeOp::top_k: {
      const bool keep_probs = call.outputs.size() == 2;
      k.counts(1, keep_probs ? 2 : 1);
      const float* logits = k.in(0, T * E);
      float* routing = k.out(0, T * topk * 2);
      float* probs = keep_probs ? k.out(1, T * E) : k.work(T * E);
      auto* selected = reinterpret_cast<int32_t*>(routing);
      float* weight = routing + T * topk;
      for (int64_t t = 0; t < T; ++t) moe_route_row(c, logits + t * E, probs + t * E, selected + t * topk, weight + t * topk);
      return;
    }
    case NodeOp::combine: {
      k.counts(static_cast<size_t>(E) + 1, 1);
      const Routing r = routing_of(k.in(static_cast<size_t>(E), T * topk * 2), T, topk);
      std::vector<const float*> y(static_cast<size_t>(E));
      const PickRows picks = pick_rows(r, T, topk, E);
      const std::vector<int64_t>& cursor = picks.count;
      const std::vector<int64_t>& row_of = picks.row_of;
      for (int64_t e = 0; e < E; ++e) y[static_cast<size_t>(e)] = k.in(static_cast<size_t>(e), cursor[static_cast<size_t>(e)] * C);
      float* out = k.out(0, T * C);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t col = 0; col < C; ++col) {
          double acc = 0.0;
          for (int64_t j = 0; j < topk; ++j) {
            const size_t tj = static_cast<size_t>(t * topk + j);
            acc += static_cast<double>(r.weight[tj]) *
                   static_cast<double>(y[static_cast<size_t>(r.selected[tj])][row_of[tj] * C + col]);
          }
          out[t * C + col] = static_cast<float>(acc);
        }
      return;
    }
    case NodeOp::linear:
      break;
  }

  // Linear nodes: the attention projections, the dense MLP, an expert's projections.
  if (name.rfind("expert.", 0) == 0) {
    const int64_t e = std::stoll(name.substr(7));
    const std::string op = name.substr(name.rfind('.') + 1);
    // Every projection reads the expert's tokens (ascending) from the routing: gate and up
    // gather their rows of xn2 into the workspace; the GEMM hook sees each row's own position.
    const bool down = op == "down";
    k.counts(2, 1);
    const std::vector<int32_t> tokens = expert_tokens(routing_of(k.in(1, T * topk * 2), T, topk), T, topk, e);
    const auto rows = static_cast<int64_t>(tokens.size());
    // A cached pass: the expert's rows grouped by input (ascending tokens: each input's contiguous).
    std::vector<int64_t> expert_splits;
    for (int64_t split : splits)
      expert_splits.push_back(std::lower_bound(tokens.begin(), tokens.end(), static_cast<int32_t>(split)) - tokens.begin());
    float* y = k.out(0, rows * (down ? C : Fm));
    if (rows == 0) return;
    std::vector<int32_t> pos(tokens.size());
    for (size_t row = 0; row < tokens.size(); ++row) pos[row] = positions[static_cast<size_t>(tokens[row])];
    const float* x = nullptr;
    if (down) {
      x = k.in(0, rows * Fm);
    } else {
      const float* xn2 = k.in(0, T * C);
      float* gathered = k.work(rows * C);
      for (size_t row = 0; row < tokens.size(); ++row)
        std::memcpy(gathered + static_cast<int64_t>(row) * C, xn2 + int64_t{tokens[row]} * C, sizeof(float) * static_cast<size_t>(C));
      x = gathered;
    }
    m.row_positions = pos.data();
    m.linear_forward_rows(mlp, node->param, x, rows, y, expert_splits);
    return;
  }
  k.counts(1, 1);
  const bool attention_side = name == "q" || name == "k" || name == "v" || name == "o";
  const int64_t in_width = name == "o" ? Hq * D : name == "down" ? c.intermediate_size : C;
  m.linear_forward_rows(attention_side ? attn : mlp, node->param, k.in(0, T * in_width), T, k.out(0, T * node->width), splits);
}

}  // namespace concord::model
