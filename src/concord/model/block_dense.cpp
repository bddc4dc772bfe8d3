// The decoder-layer blocks' common attention half (LayerBlock, block_layer.h) and the dense
// SwiGLU layer (Qwen3 / Qwen2 / Llama): forward and backward side by side.
#include <cstring>

#include "concord/model/block_layer.h"
#include "concord/numerics/check.h"

namespace concord::model {
namespace {

void add_into(float* dst, const float* src, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

// ---- the attention half, shared by every layer type ---------------------------------------------

float* LayerBlock::forward(Model::Impl& m, const BlockPass& p, LayerActivations& a,
                           const AttentionFn& attention) const {
  attention_inputs(m, p, a);
  attention(p, a);
  attention_output(m, p, a);
  float* x_out = mlp_forward(m, p, a);
  const int64_t n = p.T * m.config.hidden_size;
  const float* x_mid = a.x_mid;
  for (int64_t j = 0; j < n; ++j) x_out[j] += x_mid[j];
  return x_out;
}

void LayerBlock::backward(Model::Impl& m, const BlockPass& p, const LayerActivations& a, const BackwardScratch& s,
                          float* dx, bool accumulate, uint64_t step) const {
  const ModelConfig& c = m.config;
  const int64_t T = p.T, C = c.hidden_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const int L = static_cast<int>(c.num_hidden_layers);
  const LayerParams& lp = params(m);
  const LayerPrecision& attn = m.policy.for_layer(LayerClass::attention, layer_, L);
  auto id = [&](int param) { return gemm_stream_id(param, p.repeat, m.specs.size()); };
  auto grad = [&](int param) { return m.grads[static_cast<size_t>(param)].data(); };
  // dx holds d(layer output) = d(x_mid) through the residual.
  mlp_backward(m, p, a, s, dx, accumulate, step);  // s.dxn = d(xn2)
  rmsnorm_backward(s.tmp, grad(lp.post_norm), s.dxn, a.x_mid, m.values[lp.post_norm].data(), a.rstd2, T, C);
  add_into(dx, s.tmp, T * C);  // dx = d(x_mid)

  m.linear_backward(attn, lp.o, dx, a.att, T, s.datt, false, grad(lp.o), accumulate, step, id(lp.o));
  attention_backward(s.dq, s.dk, s.dv, s.datt, a.probs, a.q, a.k, a.v, m.B, m.S, Hq, Hkv, D);
  rope_backward(s.dq, p.positions, T, Hq, D, m.rope);
  rope_backward(s.dk, p.positions, T, Hkv, D, m.rope);
  const float* gq = s.dq;
  const float* gk = s.dk;
  if (c.qk_norm()) {
    rmsnorm_backward(s.dq_raw, grad(lp.q_norm), s.dq, a.q_raw, m.values[lp.q_norm].data(), a.rstd_q, T * Hq, D);
    rmsnorm_backward(s.dk_raw, grad(lp.k_norm), s.dk, a.k_raw, m.values[lp.k_norm].data(), a.rstd_k, T * Hkv, D);
    gq = s.dq_raw;
    gk = s.dk_raw;
  }
  m.linear_backward(attn, lp.q, gq, a.xn1, T, s.dxn, false, grad(lp.q), accumulate, step, id(lp.q));
  m.linear_backward(attn, lp.k, gk, a.xn1, T, s.dxn, true, grad(lp.k), accumulate, step, id(lp.k));
  m.linear_backward(attn, lp.v, s.dv, a.xn1, T, s.dxn, true, grad(lp.v), accumulate, step, id(lp.v));
  rmsnorm_backward(s.tmp, grad(lp.input_norm), s.dxn, a.x_in, m.values[lp.input_norm].data(), a.rstd1, T, C);
  add_into(dx, s.tmp, T * C);  // dx = d(x_in) = d(the previous application's output)
}

std::vector<BlockNode> LayerBlock::describe(const Model::Impl& m) const {
  const ModelConfig& c = m.config;
  const int64_t C = c.hidden_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const LayerParams& lp = params(m);
  const std::vector<GemmRole> gemm = {GemmRole::forward, GemmRole::dgrad, GemmRole::wgrad};
  std::vector<BlockNode> n;
  auto node = [&](NodeOp op, std::string name, int param, int64_t width, bool is_gemm = false) {
    n.push_back({op, std::move(name), param, width, is_gemm ? gemm : std::vector<GemmRole>{}});
  };
  node(NodeOp::rmsnorm, "input_norm", lp.input_norm, C);
  node(NodeOp::linear, "q", lp.q, Hq * D, true);
  node(NodeOp::linear, "k", lp.k, Hkv * D, true);
  node(NodeOp::linear, "v", lp.v, Hkv * D, true);
  if (c.qk_norm()) {
    node(NodeOp::rmsnorm, "q_norm", lp.q_norm, Hq * D);
    node(NodeOp::rmsnorm, "k_norm", lp.k_norm, Hkv * D);
  }
  node(NodeOp::rope, "rope_q", -1, Hq * D);
  node(NodeOp::rope, "rope_k", -1, Hkv * D);
  node(NodeOp::attention, "attention", -1, Hq * D);
  node(NodeOp::linear, "o", lp.o, C, true);
  node(NodeOp::residual_add, "residual_attention", -1, C);
  node(NodeOp::rmsnorm, "post_norm", lp.post_norm, C);
  describe_mlp(m, n);
  node(NodeOp::residual_add, "residual_mlp", -1, C);
  return n;
}

// Before attention: a.x_in given; fills rstd1, xn1, q_raw, k_raw, v, rstd_q, rstd_k, q, k.
void LayerBlock::attention_inputs(Model::Impl& m, const BlockPass& p, LayerActivations& a) const {
  const ModelConfig& c = m.config;
  const int64_t T = p.T, C = c.hidden_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  const LayerParams& lp = params(m);
  const LayerPrecision& attn =
      m.policy.for_layer(LayerClass::attention, layer_, static_cast<int>(c.num_hidden_layers));
  tensor::Arena& work = *p.work;
  a.rstd1 = work.alloc(T);
  a.xn1 = work.alloc(T * C);
  rmsnorm_forward(a.xn1, a.rstd1, a.x_in, m.values[lp.input_norm].data(), T, C, c.rms_norm_eps);
  a.q_raw = work.alloc(T * Hq * D);
  a.k_raw = work.alloc(T * Hkv * D);
  a.v = work.alloc(T * Hkv * D);
  m.linear_forward_rows(attn, lp.q, a.xn1, T, a.q_raw, p.row_splits);
  m.linear_forward_rows(attn, lp.k, a.xn1, T, a.k_raw, p.row_splits);
  m.linear_forward_rows(attn, lp.v, a.xn1, T, a.v, p.row_splits);
  a.q = work.alloc(T * Hq * D);
  a.k = work.alloc(T * Hkv * D);
  if (c.qk_norm()) {
    a.rstd_q = work.alloc(T * Hq);
    a.rstd_k = work.alloc(T * Hkv);
    rmsnorm_forward(a.q, a.rstd_q, a.q_raw, m.values[lp.q_norm].data(), T * Hq, D, c.rms_norm_eps);
    rmsnorm_forward(a.k, a.rstd_k, a.k_raw, m.values[lp.k_norm].data(), T * Hkv, D, c.rms_norm_eps);
  } else {
    std::memcpy(a.q, a.q_raw, sizeof(float) * static_cast<size_t>(T * Hq * D));
    std::memcpy(a.k, a.k_raw, sizeof(float) * static_cast<size_t>(T * Hkv * D));
  }
  rope_forward(a.q, p.positions, T, Hq, D, m.rope);
  rope_forward(a.k, p.positions, T, Hkv, D, m.rope);
}

// After attention: a.att given; fills x_mid (o + residual), rstd2, xn2.
void LayerBlock::attention_output(Model::Impl& m, const BlockPass& p, LayerActivations& a) const {
  const ModelConfig& c = m.config;
  const int64_t T = p.T, C = c.hidden_size;
  const LayerParams& lp = params(m);
  const LayerPrecision& attn =
      m.policy.for_layer(LayerClass::attention, layer_, static_cast<int>(c.num_hidden_layers));
  tensor::Arena& work = *p.work;
  a.x_mid = work.alloc(T * C);
  m.linear_forward_rows(attn, lp.o, a.att, T, a.x_mid, p.row_splits);
  for (int64_t j = 0; j < T * C; ++j) a.x_mid[j] += a.x_in[j];
  a.rstd2 = work.alloc(T);
  a.xn2 = work.alloc(T * C);
  rmsnorm_forward(a.xn2, a.rstd2, a.x_mid, m.values[lp.post_norm].data(), T, C, c.rms_norm_eps);
}

// ---- the dense SwiGLU layer --------------------------------------------------------------------

namespace {

class DenseBlock final : public LayerBlock {
 public:
  explicit DenseBlock(int layer) : LayerBlock(layer) {}
  std::string_view kind() const override { return "dense"; }

 private:
  float* mlp_forward(Model::Impl& m, const BlockPass& p, LayerActivations& a) const override {
    const int64_t T = p.T, C = m.config.hidden_size, F = m.config.intermediate_size;
    const LayerParams& lp = params(m);
    const LayerPrecision& mlp = mlp_precision(m);
    tensor::Arena& work = *p.work;
    a.gate = work.alloc(T * F);
    a.up = work.alloc(T * F);
    a.h = work.alloc(T * F);
    m.linear_forward_rows(mlp, lp.gate, a.xn2, T, a.gate, p.row_splits);
    m.linear_forward_rows(mlp, lp.up, a.xn2, T, a.up, p.row_splits);
    swiglu_forward(a.h, a.gate, a.up, T, F);
    float* out = work.alloc(T * C);
    m.linear_forward_rows(mlp, lp.down, a.h, T, out, p.row_splits);
    return out;
  }

  void mlp_backward(Model::Impl& m, const BlockPass& p, const LayerActivations& a, const BackwardScratch& s,
                    const float* dout, bool accumulate, uint64_t step) const override {
    const int64_t T = p.T, F = m.config.intermediate_size;
    const LayerParams& lp = params(m);
    const LayerPrecision& mlp = mlp_precision(m);
    auto id = [&](int param) { return gemm_stream_id(param, p.repeat, m.specs.size()); };
    auto grad = [&](int param) { return m.grads[static_cast<size_t>(param)].data(); };
    m.linear_backward(mlp, lp.down, dout, a.h, T, s.dh, false, grad(lp.down), accumulate, step, id(lp.down));
    swiglu_backward(s.dgate, s.dup, s.dh, a.gate, a.up, T, F);
    m.linear_backward(mlp, lp.gate, s.dgate, a.xn2, T, s.dxn, false, grad(lp.gate), accumulate, step, id(lp.gate));
    m.linear_backward(mlp, lp.up, s.dup, a.xn2, T, s.dxn, true, grad(lp.up), accumulate, step, id(lp.up));
  }

  void describe_mlp(const Model::Impl& m, std::vector<BlockNode>& n) const override {
    const int64_t C = m.config.hidden_size, F = m.config.intermediate_size;
    const LayerParams& lp = params(m);
    const std::vector<GemmRole> gemm = {GemmRole::forward, GemmRole::dgrad, GemmRole::wgrad};
    n.push_back({NodeOp::linear, "gate", lp.gate, F, gemm});
    n.push_back({NodeOp::linear, "up", lp.up, F, gemm});
    n.push_back({NodeOp::swiglu, "swiglu", -1, F, {}});
    n.push_back({NodeOp::linear, "down", lp.down, C, gemm});
  }
};

}  // namespace

std::unique_ptr<Block> make_dense_block(int layer) { return std::make_unique<DenseBlock>(layer); }

}  // namespace concord::model
