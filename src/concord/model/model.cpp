// The decoder's parameters, weight preparation and forward pass (model_backward.cpp: backward).
#include "concord/model/model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include <fmt/format.h>
#include <xxhash.h>

#include "concord/model/block.h"
#include "concord/model/block_layer.h"
#include "concord/model/model_impl.h"
#include "concord/model/expert_pager.h"
#include "concord/model/expert_pager.h"
#include "concord/numerics/check.h"
#include "concord/numerics/philox.h"

namespace concord::model {

using tensor::Operand;
using tensor::Trans;

std::vector<ParamSpec> parameter_specs(const ModelConfig& c) {
  const int64_t C = c.hidden_size, D = c.head_dim, F = c.intermediate_size;
  std::vector<ParamSpec> specs;
  auto add = [&](ParamKind kind, int layer, std::vector<int64_t> shape, int expert = -1) {
    specs.push_back({hf_param_name(kind, layer, expert), std::move(shape), kind, layer, expert});
  };
  add(ParamKind::embed, -1, {c.vocab_size, C});
  for (int i = 0; i < static_cast<int>(c.num_hidden_layers); ++i) {
    add(ParamKind::input_norm, i, {C});
    const int64_t q_out = c.num_attention_heads * D, kv_out = c.num_key_value_heads * D;
    add(ParamKind::q, i, {q_out, C});
    if (c.qkv_bias()) add(ParamKind::q_bias, i, {q_out});
    add(ParamKind::k, i, {kv_out, C});
    if (c.qkv_bias()) add(ParamKind::k_bias, i, {kv_out});
    add(ParamKind::v, i, {kv_out, C});
    if (c.qkv_bias()) add(ParamKind::v_bias, i, {kv_out});
    add(ParamKind::o, i, {C, q_out});
    if (c.output_bias()) add(ParamKind::o_bias, i, {C});
    if (c.qk_norm()) {
      add(ParamKind::q_norm, i, {D});
      add(ParamKind::k_norm, i, {D});
    }
    add(ParamKind::post_norm, i, {C});
    if (c.is_moe_layer(i)) {
      const int64_t E = c.num_experts, Fm = c.moe_intermediate_size;
      add(ParamKind::router, i, {E, C});
      for (int e = 0; e < static_cast<int>(E); ++e) {
        add(ParamKind::expert_gate, i, {Fm, C}, e);
        add(ParamKind::expert_up, i, {Fm, C}, e);
        add(ParamKind::expert_down, i, {C, Fm}, e);
      }
      continue;
    }
    add(ParamKind::gate, i, {F, C});
    add(ParamKind::up, i, {F, C});
    add(ParamKind::down, i, {C, F});
  }
  if (c.recurrent()) add(ParamKind::adapter, -1, {C, 2 * C});
  add(ParamKind::final_norm, -1, {C});
  if (!c.tie_word_embeddings) add(ParamKind::lm_head, -1, {c.vocab_size, C});
  return specs;
}

Model::Impl::Impl(ModelConfig c, PrecisionPolicy p, StoredWeights stored_weights)
    : config(std::move(c)), policy(std::move(p)), specs(parameter_specs(config)) {
  config.validate("model config");
  for (size_t i = 0; i < specs.size(); ++i) index[specs[i].name] = static_cast<int>(i);
  stored.resize(specs.size());
  for (auto& [name, w] : stored_weights) {
    auto it = index.find(name);
    if (it == index.end() || !specs[it->second].is_matrix())
      throw InputError(fmt::format("[model] stored weight '{}' is not a matrix parameter of this {} "
                                   "config", name, config.architecture));
    const ParamSpec& spec = specs[it->second];
    CONCORD_CHECK(w != nullptr, "stored weight without blocks");
    if (w->rows() != spec.shape[0] || w->cols() != spec.shape[1])
      throw InputError(fmt::format("[model] stored weight '{}' is {} x {}, the config implies {} x {}",
                                   name, w->rows(), w->cols(), spec.shape[0], spec.shape[1]));
    stored[it->second] = std::move(w);
    any_stored = true;
  }
  // A stored weight has no fp32 values: the served model holds only its blocks.
  for (size_t i = 0; i < specs.size(); ++i)
    values.emplace_back(stored[i] ? 0 : static_cast<size_t>(specs[i].numel()), 0.0f);
  grads.resize(specs.size());
  prepared.resize(specs.size());
  bias_of.assign(specs.size(), -1);
  embed = final_norm = lm_head = -1;
  layers.assign(static_cast<size_t>(config.num_hidden_layers), LayerParams{});
  for (size_t i = 0; i < specs.size(); ++i) {
    const int at = static_cast<int>(i);
    const ParamSpec& s = specs[i];
    LayerParams* l = s.layer >= 0 ? &layers[static_cast<size_t>(s.layer)] : nullptr;
    switch (s.kind) {
      case ParamKind::embed: embed = at; break;
      case ParamKind::final_norm: final_norm = at; break;
      case ParamKind::adapter: adapter = at; break;
      case ParamKind::lm_head: lm_head = at; break;
      case ParamKind::input_norm: l->input_norm = at; break;
      case ParamKind::q: l->q = at; break;
      case ParamKind::k: l->k = at; break;
      case ParamKind::v: l->v = at; break;
      case ParamKind::o: l->o = at; break;
      case ParamKind::q_norm: l->q_norm = at; break;
      case ParamKind::k_norm: l->k_norm = at; break;
      case ParamKind::post_norm: l->post_norm = at; break;
      case ParamKind::gate: l->gate = at; break;
      case ParamKind::up: l->up = at; break;
      case ParamKind::down: l->down = at; break;
      case ParamKind::router: l->router = at; break;
      case ParamKind::expert_gate: l->expert_gate.push_back(at); break;
      case ParamKind::expert_up: l->expert_up.push_back(at); break;
      case ParamKind::expert_down: l->expert_down.push_back(at); break;
      case ParamKind::q_bias: case ParamKind::k_bias: case ParamKind::v_bias: case ParamKind::o_bias: break;
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::optional<ParamKind> weight = bias_weight_kind(specs[i].kind);
    if (weight) bias_of[static_cast<size_t>(find_param(specs, *weight, specs[i].layer))] = static_cast<int>(i);
  }
  if (config.tie_word_embeddings) lm_head = embed;
  for (int i = 0; i < static_cast<int>(config.num_hidden_layers); ++i)
    blocks.push_back(config.is_moe_layer(i) ? make_moe_block(i) : make_dense_block(i));
  depth = config.recurrent() ? config.mean_recurrence : 0;
  build_plan();
  rope = RopeTable::build(config.max_position_embeddings, config.head_dim, config.rope_theta);
}

Model::Impl::~Impl() = default;

// The GEMM precision a weight belongs to (its registered class; last layers per the policy).
// The tied embedding is the head's weight.
static const LayerPrecision& precision_of(const Model::Impl& m, int param) {
  const int L = static_cast<int>(m.config.num_hidden_layers);
  if (param == m.lm_head) return m.policy.for_layer(LayerClass::lm_head, 0, L);
  const ParamSpec& spec = m.specs[static_cast<size_t>(param)];
  const std::optional<LayerClass> cls = spec.gemm_class();
  CONCORD_CHECK(cls.has_value(), "parameter " + spec.name + " is not a GEMM weight");
  return m.policy.for_layer(*cls, spec.layer, L);
}

const PreparedWeight& Model::Impl::weight(int param) {
  PreparedWeight& w = prepared[param];
  if (w.valid) return w;
  if (values[param].empty() && specs[param].numel() > 0)  // Model::release_expert
    throw InputError(fmt::format("[model] '{}' is not held here (an expert released under expert parallelism): the "
                                 "placement computes an expert this rank does not hold",
                                 specs[param].name));
  const LayerPrecision& prec = precision_of(*this, param);
  const int64_t N = specs[param].shape[0], K = specs[param].shape[1];
  const float* W = values[param].data();
  // Forward Y = X·Wᵀ reads W as op(B) = Wᵀ (stored (N, K)); dgrad dX = dY·W reads it as is.
  tensor::prepare_operand(w.forward, prec[GemmRole::forward].b, Operand::b, Trans::yes, W, N, K);
  // Packed once into the kernels' panels (bf16 when the values are): the forward GEMMs stream
  // them instead of re-packing W per call — decode's M = 1..8 GEMMs are bound by that stream.
  tensor::prepack_b(w.forward, Trans::yes);
  // A snapshot of what the copies were built from: a copy that outlives a change of the values
  // (a missed weights_changed) is detectable later (rl/sync.h's derived-state check).
  w.source_hash = XXH3_64bits(W, sizeof(float) * static_cast<size_t>(N * K));
  w.valid = true;
  w.dgrad_valid = false;
  return w;
}

const tensor::PreparedOperand& Model::Impl::dgrad_weight(int param) {
  PreparedWeight& w = prepared[param];
  weight(param);
  if (!w.dgrad_valid) {
    const int64_t N = specs[param].shape[0], K = specs[param].shape[1];
    tensor::prepare_operand(w.dgrad, precision_of(*this, param)[GemmRole::dgrad].b, Operand::b, Trans::no,
                            values[param].data(), N, K);
    w.dgrad_valid = true;
  }
  return w.dgrad;
}

void Model::Impl::ensure_grads() {
  require_fp32_values("training (gradients)");
  for (size_t i = 0; i < specs.size(); ++i)
    if (grads[i].empty()) grads[i].assign(static_cast<size_t>(specs[i].numel()), 0.0f);
}

void Model::Impl::require_fp32_values(std::string_view what) const {
  if (!any_stored) return;
  for (size_t i = 0; i < specs.size(); ++i)
    if (stored[i])
      throw InputError(fmt::format(
          "[model] {} needs fp32 weights, but this model serves its file's quantized blocks as "
          "stored ('{}' is {}); load it with a precision policy (--policy fp32, bf16, ...) to "
          "dequantize them", what, specs[i].name, tensor::block_quant_name(stored[i]->type())));
}

void Model::Impl::embed_tokens(float* x, const int32_t* tokens, int64_t T) {
  const int64_t V = config.vocab_size, C = config.hidden_size;
  if (!stored[embed]) {
    embedding_forward(x, tokens, embedding_table(), T, V, C);
    return;
  }
  for (int64_t t = 0; t < T; ++t)
    if (tokens[t] < 0 || tokens[t] >= V)
      throw InputError(fmt::format("[model] token id {} outside the vocabulary [0, {})", tokens[t], V));
  // The lookup of a stored table dequantizes the rows it reads (exact, tensor/quant_gemm.h).
  for (int64_t t = 0; t < T; ++t) tensor::dequantize_rows(*stored[embed], tokens[t], 1, x + t * C);
}

const float* Model::Impl::embedding_table() {
  const auto& desc = policy.layer_class[static_cast<int>(LayerClass::embedding)][GemmRole::forward].b;
  if (!desc) return values[embed].data();
  if (!embedding_lookup_valid) {
    // The lookup reads rows of the table, so its blocks run along C (a row).
    tensor::PreparedOperand q;
    const int64_t V = config.vocab_size, C = config.hidden_size;
    tensor::prepare_operand(q, desc, Operand::a, Trans::no, values[embed].data(), V, C);
    embedding_lookup.assign(q.data, q.data + V * C);
    for (float& x : embedding_lookup) x *= q.tensor_scale;
    embedding_lookup_valid = true;
  }
  return embedding_lookup.data();
}

void Model::Impl::linear_forward(const LayerPrecision& prec, int param, const float* x, int64_t T,
                                 float* y, const int32_t* pos) {
  const int64_t N = specs[param].shape[0], K = specs[param].shape[1];
  if (stored[param]) {
    // The file's blocks as stored: activations quantized per row to 8-bit blocks, integer dot
    // products (tensor/quant_gemm.h). Row-local, so batch- and cache-invariant like the GEMM.
    if (forward_kernel)
      throw InputError(fmt::format("[model] kernel variants replace fp32 GEMMs; '{}' is served as "
                                   "stored ({}) — load the model with --policy fp32 to compare "
                                   "kernels on its dequantized weights", specs[param].name,
                                   tensor::block_quant_name(stored[param]->type())));
    tensor::quant_gemm(*stored[param], x, T, K, y, N);
  } else {
    linear_forward_fp(prec, param, x, T, y, pos);
  }
  add_bias(param, y, T);
}

void Model::Impl::add_bias(int param, float* y, int64_t T) const {
  const int64_t N = specs[param].shape[0];
  if (bias_of[param] >= 0) {  // the bias is added in fp32 after the GEMM, as HF's nn.Linear does
    const float* bias = values[bias_of[param]].data();
#pragma omp parallel for schedule(static) if (T * N > 65536)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) y[t * N + n] += bias[n];
  }
}

void Model::Impl::linear_forward_fp(const LayerPrecision& prec, int param, const float* x,
                                    int64_t T, float* y, const int32_t* pos) {
  const int64_t N = specs[param].shape[0], K = specs[param].shape[1];
  const PreparedWeight& w = weight(param);
  tensor::prepare_operand(scratch_a, prec[GemmRole::forward].a, Operand::a, Trans::no, x, T, K);
  observe(GemmRole::forward, param, scratch_a, w.forward, prec[GemmRole::forward]);
  if (forward_kernel) {
    CONCORD_CHECK(pos != nullptr, "a forward GEMM kernel needs the rows' positions");
    forward_kernel(ForwardGemm{specs[param].name, T, N, K, &scratch_a, &w.forward,
                               std::span<const int32_t>(pos, static_cast<size_t>(T)), y});
  } else {
    tensor::gemm_prepared(Trans::no, Trans::yes, T, N, K, scratch_a, w.forward, y, N);
  }
}

void Model::Impl::run_forward(const int32_t* tokens, int64_t batch, int64_t seq) {
  const ModelConfig& c = config;
  if (seq > c.max_position_embeddings)
    throw InputError(fmt::format("[model] sequence length {} exceeds max_position_embeddings {}",
                                 seq, c.max_position_embeddings));
  B = batch;
  S = seq;
  const int64_t T = B * S, C = c.hidden_size, V = c.vocab_size;
  const int L = static_cast<int>(c.num_hidden_layers);
  arena.reset();
  arena.reset_high_water();  // Model::activation_memory: this pass's
  positions.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions[t] = static_cast<int32_t>(t % S);
  const int64_t A = applications();
  acts.assign(static_cast<size_t>(A), LayerActivations{});
  row_positions = positions.data();

  float* x = arena.alloc(T * C);
  embed_tokens(x, tokens, T);
  // A recurrent model: iterations before first_grad_iteration run without keeping activations
  // (truncated backprop), their state carried in `carry`.
  injection = nullptr;
  adapter_in.assign(static_cast<size_t>(c.recurrent() ? depth : 0), nullptr);
  first_grad_iteration = backprop_iterations > 0 ? std::max<int64_t>(0, depth - backprop_iterations) : 0;
  float* carry = c.recurrent() && first_grad_iteration > 0 ? arena.alloc(T * C) : nullptr;
  size_t no_grad_mark = 0;
  // The blocks (block.h) are shared with the KV-cache forward; only attention differs: here over
  // the whole sequences at once, saving probs for the backward pass.
  const AttentionFn keep_probs = [&](const BlockPass&, LayerActivations& a) { full_attention(a, true); };
  const AttentionFn drop_probs = [&](const BlockPass&, LayerActivations& a) { full_attention(a, false); };
  for (int64_t app = 0; app < A; ++app) {
    const Application& ap = plan[static_cast<size_t>(app)];
    const bool no_grad = ap.iteration >= 0 && ap.iteration < first_grad_iteration;
    if (ap.enters_iteration) {
      float* s = x;
      if (ap.iteration == 0) {  // x is the prelude's output e
        injection = x;
        s = arena.alloc(T * C);
        initial_state(s, positions.data(), T);
      }
      if (no_grad) no_grad_mark = arena.mark();
      float* cat = arena.alloc(T * 2 * C);
      x = arena.alloc(T * C);
      adapter_forward(s, injection, T, cat, x, {});
      if (!no_grad) adapter_in[static_cast<size_t>(ap.iteration)] = cat;
    }
    LayerActivations& a = acts[static_cast<size_t>(app)];
    a.x_in = x;
    const BlockPass pass{static_cast<int>(app), ap.repeat, T, positions.data(), &arena, {}};
    const Model::Recompute mode = no_grad ? Model::Recompute::keep : recompute_of(app);
    if (mode == Model::Recompute::block) {
      // Only the input is kept: the output is copied below the block's activations, which are
      // released; the backward runs this forward again (recompute_for_backward).
      float* out = arena.alloc(T * C);
      const size_t mark = arena.mark();
      const float* y = blocks[static_cast<size_t>(ap.block)]->forward(*this, pass, a, drop_probs);
      std::memcpy(out, y, sizeof(float) * static_cast<size_t>(T * C));
      arena.rewind(mark);
      a = LayerActivations{};
      a.x_in = x;
      x = out;
    } else {
      x = blocks[static_cast<size_t>(ap.block)]->forward(*this, pass, a,
                                                         mode == Model::Recompute::attention ? drop_probs : keep_probs);
    }
    if (no_grad && ap.core_layer == c.n_layers_in_recurrent_block - 1) {
      // The iteration's output is all that is kept of it.
      std::memcpy(carry, x, sizeof(float) * static_cast<size_t>(T * C));
      arena.rewind(no_grad_mark);
      for (int64_t b = app - c.n_layers_in_recurrent_block + 1; b <= app; ++b) acts[static_cast<size_t>(b)] = {};
      x = carry;
    }
  }
  x_final = x;
  rstd_final = arena.alloc(T);
  xn_final = arena.alloc(T * C);
  rmsnorm_forward(xn_final, rstd_final, x_final, values[final_norm].data(), T, C, c.rms_norm_eps);
  logits = arena.alloc(T * V);
  linear_forward(policy.for_layer(LayerClass::lm_head, 0, L), lm_head, xn_final, T, logits,
                 positions.data());
  row_positions = nullptr;
}

Model::Model(ModelConfig config, PrecisionPolicy policy)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(policy))) {}
Model::Model(ModelConfig config, PrecisionPolicy policy, StoredWeights stored)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(policy), std::move(stored))) {}
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;

Model Model::twin() const {
  if (impl_->pager)
    throw InputError("[model] a model whose experts are paged under a memory cap has no twin (one pager, one pass at a "
                     "time): run it without --memory-cap, or without a second worker");
  StoredWeights stored;
  for (size_t i = 0; i < impl_->specs.size(); ++i)
    if (impl_->stored[i]) stored.emplace(impl_->specs[i].name, impl_->stored[i]);
  Model m(impl_->config, impl_->policy, std::move(stored));
  for (size_t i = 0; i < impl_->specs.size(); ++i)
    if (!impl_->stored[i]) m.impl_->values[i] = impl_->values[i];
  m.weights_changed();
  return m;
}
Model& Model::operator=(Model&&) noexcept = default;

const ModelConfig& Model::config() const { return impl_->config; }
const PrecisionPolicy& Model::policy() const { return impl_->policy; }
void Model::set_policy(PrecisionPolicy policy) {
  impl_->policy = std::move(policy);
  weights_changed();
}
const std::vector<ParamSpec>& Model::params() const { return impl_->specs; }

std::vector<BlockNode> Model::describe_block(int block) const {
  if (block < 0 || block >= static_cast<int>(impl_->blocks.size()))
    throw InputError(fmt::format("[model] describe_block: block {} outside 0..{}", block,
                                 static_cast<int>(impl_->blocks.size()) - 1));
  return impl_->blocks[static_cast<size_t>(block)]->describe(*impl_);
}

std::string_view node_op_name(NodeOp op) {
  switch (op) {
    case NodeOp::rmsnorm: return "rmsnorm";
    case NodeOp::linear: return "linear";
    case NodeOp::rope: return "rope";
    case NodeOp::attention: return "attention";
    case NodeOp::residual_add: return "residual_add";
    case NodeOp::swiglu: return "swiglu";
    case NodeOp::router: return "router";
    case NodeOp::top_k: return "top_k";
    case NodeOp::combine: return "combine";
  }
  return "?";
}

static int find_param(const Model::Impl& m, std::string_view name) {
  auto it = m.index.find(std::string(name));
  if (it == m.index.end())
    throw InputError(fmt::format("[model] no parameter named '{}' in this {} config", name,
                                 m.config.architecture));
  return it->second;
}

// A parameter's index, refusing a stored weight (which has no fp32 values).
static int find_fp32_param(const Model::Impl& m, std::string_view name) {
  const int p = find_param(m, name);
  if (m.stored[p])
    throw InputError(fmt::format("[model] '{}' is served as stored ({} blocks) and has no fp32 values; "
                                 "load the model with a precision policy (--policy fp32, bf16, ...) "
                                 "to dequantize it", name, tensor::block_quant_name(m.stored[p]->type())));
  return p;
}
std::span<float> Model::param(std::string_view name) { return impl_->values[find_fp32_param(*impl_, name)]; }
std::span<const float> Model::param(std::string_view name) const {
  return impl_->values[find_fp32_param(*impl_, name)];
}
std::span<float> Model::grad(std::string_view name) {
  const int p = find_fp32_param(*impl_, name);
  impl_->ensure_grads();
  return impl_->grads[p];
}
const tensor::QuantWeight* Model::stored_weight(std::string_view name) const {
  return impl_->stored[find_param(*impl_, name)].get();
}
bool Model::has_stored_weights() const { return impl_->any_stored; }

void Model::init_random(uint64_t seed, float std) {
  impl_->require_fp32_values("init_random");
  for (size_t p = 0; p < impl_->specs.size(); ++p) {
    std::vector<float>& v = impl_->values[p];
    if (!impl_->specs[p].is_matrix()) {
      const bool bias = std::find(impl_->bias_of.begin(), impl_->bias_of.end(), static_cast<int>(p)) !=
                        impl_->bias_of.end();
      std::fill(v.begin(), v.end(), bias ? 0.0f : 1.0f);  // biases start at 0, as HF's Linear
      continue;
    }
    // Box-Muller on Philox words keyed by (seed, parameter index, element pair): the same
    // weights for any thread count.
    const numerics::RandomStream rng{seed, static_cast<uint32_t>(p)};
    const int64_t n = static_cast<int64_t>(v.size());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i += 2) {
      const numerics::PhiloxBlock w = rng.block(static_cast<uint64_t>(i) / 2);
      const double u1 = (static_cast<double>(w[0]) + 1.0) / 4294967297.0;  // (0, 1]
      const double u2 = static_cast<double>(w[1]) / 4294967296.0;
      const double r = std::sqrt(-2.0 * std::log(u1));
      v[i] = static_cast<float>(std * r * std::cos(2.0 * M_PI * u2));
      if (i + 1 < n) v[i + 1] = static_cast<float>(std * r * std::sin(2.0 * M_PI * u2));
    }
  }
  weights_changed();
}

void Model::set_gemm_observer(GemmObserver observer) { impl_->observer = std::move(observer); }
void Model::set_forward_gemm_kernel(ForwardGemmKernel kernel) {
  impl_->forward_kernel = std::move(kernel);
}

void Model::visit_derived_weights(const std::function<void(const DerivedWeight&)>& fn) {
  // The GEMM weights in params() order: every matrix but an untied embedding table (its lookup
  // copy is not a GEMM operand) and an MoE router (its GEMM runs on the fp32 values, no copy);
  // a tied table is visited once, as lm_head's weight.
  impl_->require_fp32_values("visit_derived_weights (the weight sync's checks)");
  for (size_t p = 0; p < impl_->specs.size(); ++p) {
    const int param = static_cast<int>(p);
    if (!impl_->specs[p].is_matrix() || impl_->specs[p].kind == ParamKind::router ||
        (param == impl_->embed && param != impl_->lm_head))
      continue;
    const PreparedWeight& w = impl_->weight(param);
    fn(DerivedWeight{impl_->specs[p].name, w.source_hash, &w.forward});
  }
}

void Model::prepare_weights(const std::function<void(int64_t, int64_t)>& progress) {
  Impl& m = *impl_;
  std::vector<int> todo;
  for (size_t p = 0; p < m.specs.size(); ++p)
    if (m.specs[p].is_matrix() && !m.stored[p] && m.specs[p].kind != ParamKind::router &&
        (static_cast<int>(p) != m.embed || m.embed == m.lm_head))
      todo.push_back(static_cast<int>(p));
  const auto total = static_cast<int64_t>(todo.size()) + 1;
  if (!m.stored[m.embed]) m.embedding_table();
  if (progress) progress(1, total);
  for (size_t i = 0; i < todo.size(); ++i) {
    m.weight(todo[i]);
    if (progress) progress(static_cast<int64_t>(i) + 2, total);
  }
}

void Model::weights_changed() {
  for (PreparedWeight& w : impl_->prepared) w.valid = false;
  impl_->embedding_lookup_valid = false;
}

static void check_tokens(const Model::Impl& m, std::span<const int32_t> tokens, int64_t B, int64_t T,
                         const char* what) {
  if (B <= 0 || T <= 0 || static_cast<int64_t>(tokens.size()) != B * T)
    throw InputError(fmt::format("[model] {}: {} tokens for B={} x T={}", what, tokens.size(), B, T));
  for (int32_t t : tokens)
    if (t < 0 || t >= m.config.vocab_size)
      throw InputError(fmt::format("[model] {}: token id {} outside the vocabulary [0, {})", what,
                                   t, m.config.vocab_size));
}

void Model::Impl::full_attention(LayerActivations& a, bool keep_probs) {
  const ModelConfig& c = config;
  const int64_t T = B * S, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  a.att = arena.alloc(T * Hq * D);
  const size_t mark = arena.mark();
  a.probs = arena.alloc(B * Hq * S * S);
  attention_forward(a.att, a.probs, a.q, a.k, a.v, B, S, Hq, Hkv, D);
  if (!keep_probs) {
    arena.rewind(mark);  // the probabilities were the arena's last allocation
    a.probs = nullptr;
  }
}

size_t Model::Impl::recompute_for_backward(int64_t app) {
  const size_t mark = arena.mark();
  const Model::Recompute mode = recompute_of(app);
  if (mode == Model::Recompute::keep) return mark;
  const ModelConfig& c = config;
  const int64_t T = B * S, D = c.head_dim, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads;
  LayerActivations& a = acts[static_cast<size_t>(app)];
  if (mode == Model::Recompute::attention) {
    a.probs = arena.alloc(B * Hq * S * S);
    float* att = arena.alloc(T * Hq * D);  // equals the kept a.att bit for bit; discarded
    attention_forward(att, a.probs, a.q, a.k, a.v, B, S, Hq, Hkv, D);
    return mark;
  }
  // block: the forward again from the kept input, keeping everything until the rewind.
  const Application& ap = plan[static_cast<size_t>(app)];
  const BlockPass pass{static_cast<int>(app), ap.repeat, T, positions.data(), &arena, {}};
  const bool stats = router_stats_on, trace = router_trace_on;
  router_stats_on = router_trace_on = false;  // counted once, in the forward
  row_positions = positions.data();
  const AttentionFn keep_probs = [&](const BlockPass&, LayerActivations& x) { full_attention(x, true); };
  blocks[static_cast<size_t>(ap.block)]->forward(*this, pass, a, keep_probs);
  row_positions = nullptr;
  router_stats_on = stats;
  router_trace_on = trace;
  return mark;
}

void Model::Impl::release_recomputed(int64_t app) {
  LayerActivations& a = acts[static_cast<size_t>(app)];
  switch (recompute_of(app)) {
    case Model::Recompute::keep:
      return;
    case Model::Recompute::attention:
      a.probs = nullptr;
      return;
    case Model::Recompute::block: {
      float* x_in = a.x_in;
      a = LayerActivations{};
      a.x_in = x_in;
      return;
    }
  }
}

void Model::set_recompute(std::vector<Recompute> per_application) {
  Impl& m = *impl_;
  const ModelConfig& c = m.config;
  if (!per_application.empty()) {
    if (c.recurrent()) throw InputError("[model] set_recompute: a depth-recurrent model recomputes nothing yet");
    if (static_cast<int64_t>(per_application.size()) != m.applications())
      throw InputError(fmt::format("[model] set_recompute: {} modes for a schedule of {} applications",
                                   per_application.size(), m.applications()));
    for (int64_t app = 0; app < m.applications(); ++app)
      if (per_application[static_cast<size_t>(app)] == Recompute::block && c.output_router_logits &&
          c.is_moe_layer(m.plan[static_cast<size_t>(app)].block))
        throw InputError(fmt::format("[model] set_recompute: application {} is an MoE layer and the model adds the "
                                     "load-balancing loss (output_router_logits), which reads its routing after the "
                                     "forward: recompute its attention only, or keep it", app));
  }
  m.recompute = std::move(per_application);
}

const std::vector<Model::Recompute>& Model::recompute() const { return impl_->recompute; }

Model::ActivationMemory Model::activation_memory() const {
  const tensor::Arena& a = impl_->arena;
  return {static_cast<int64_t>(a.bytes_live_high_water()), static_cast<int64_t>(a.bytes_high_water()),
          static_cast<int64_t>(a.bytes_reserved())};
}

void Model::forward(std::span<const int32_t> tokens, int64_t B, int64_t T, std::span<float> logits) {
  check_tokens(*impl_, tokens, B, T, "forward");
  const int64_t V = impl_->config.vocab_size;
  if (static_cast<int64_t>(logits.size()) != B * T * V)
    throw InputError(fmt::format("[model] forward: logits buffer holds {} floats, needs {}",
                                 logits.size(), B * T * V));
  impl_->run_forward(tokens.data(), B, T);
  std::memcpy(logits.data(), impl_->logits, sizeof(float) * static_cast<size_t>(B * T * V));
}

void Model::forward_lm_head_input(std::span<const int32_t> tokens, int64_t B, int64_t T, std::span<float> hidden) {
  check_tokens(*impl_, tokens, B, T, "forward_lm_head_input");
  const int64_t C = impl_->config.hidden_size;
  if (static_cast<int64_t>(hidden.size()) != B * T * C)
    throw InputError(fmt::format("[model] forward_lm_head_input: buffer holds {} floats, needs {}", hidden.size(),
                                 B * T * C));
  impl_->run_forward(tokens.data(), B, T);
  std::memcpy(hidden.data(), impl_->xn_final, sizeof(float) * static_cast<size_t>(B * T * C));
}

double Model::moe_aux_loss() const { return impl_->moe_aux; }

void Model::set_router_stats(bool on) {
  impl_->router_stats_on = on;
  impl_->router_counts.assign(static_cast<size_t>(impl_->applications()), {});
  impl_->router_rows = 0;
}

Model::RouterStats Model::router_stats() const { return {impl_->router_counts, impl_->router_rows}; }

void Model::set_router_trace(bool on) {
  impl_->router_trace_on = on;
  impl_->router_trace.selected.assign(static_cast<size_t>(impl_->applications()), {});
  impl_->router_trace.pass_rows.assign(static_cast<size_t>(impl_->applications()), {});
}

const Model::RouterTrace& Model::router_trace() const { return impl_->router_trace; }

std::array<int, 3> Model::Impl::expert_params(int64_t block, int64_t expert) const {
  if (block < 0 || block >= static_cast<int64_t>(layers.size()) || !config.is_moe_layer(block))
    throw InputError(fmt::format("[model] block {} is not an MoE block of this model", block));
  const LayerParams& lp = layers[static_cast<size_t>(block)];
  if (expert < 0 || expert >= static_cast<int64_t>(lp.expert_gate.size()))
    throw InputError(fmt::format("[model] expert {} outside 0..{}", expert, lp.expert_gate.size() - 1));
  const auto e = static_cast<size_t>(expert);
  const std::array<int, 3> ids = {lp.expert_gate[e], lp.expert_up[e], lp.expert_down[e]};
  for (int id : ids)
    if (stored[static_cast<size_t>(id)])
      throw InputError(fmt::format("[model] expert weights are moved as fp32 values, and '{}' is served as stored {} "
                                   "blocks: load the model with a precision policy (--policy fp32, bf16, ...)",
                                   specs[static_cast<size_t>(id)].name,
                                   tensor::block_quant_name(stored[static_cast<size_t>(id)]->type())));
  return ids;
}

std::vector<uint8_t> Model::Impl::expert_bytes(int64_t block, int64_t expert) const {
  std::vector<uint8_t> out;
  for (int id : expert_params(block, expert)) {
    const std::vector<float>& v = values[static_cast<size_t>(id)];
    if (v.empty())
      throw InputError(fmt::format("[model] expert {} of block {} is not held here (released)", expert, block));
    const auto* b = reinterpret_cast<const uint8_t*>(v.data());
    out.insert(out.end(), b, b + v.size() * sizeof(float));
  }
  return out;
}

void Model::Impl::set_expert_bytes(int64_t block, int64_t expert, std::span<const uint8_t> bytes) {
  const std::array<int, 3> ids = expert_params(block, expert);
  size_t want = 0;
  for (int id : ids) want += static_cast<size_t>(specs[static_cast<size_t>(id)].numel()) * sizeof(float);
  if (bytes.size() != want)
    throw InputError(fmt::format("[model] expert {} of block {}: {} bytes given, its weights are {}", expert, block,
                                 bytes.size(), want));
  size_t at = 0;
  for (int id : ids) {
    std::vector<float>& v = values[static_cast<size_t>(id)];
    v.resize(static_cast<size_t>(specs[static_cast<size_t>(id)].numel()));
    std::memcpy(v.data(), bytes.data() + at, v.size() * sizeof(float));
    at += v.size() * sizeof(float);
    prepared[static_cast<size_t>(id)] = PreparedWeight{};  // rebuilt on the next use
  }
}

void Model::Impl::release_expert(int64_t block, int64_t expert) {
  for (int id : expert_params(block, expert)) {
    std::vector<float>().swap(values[static_cast<size_t>(id)]);
    prepared[static_cast<size_t>(id)] = PreparedWeight{};
  }
}

std::vector<uint8_t> Model::expert_bytes(int64_t block, int64_t expert) const { return impl_->expert_bytes(block, expert); }
void Model::set_expert_bytes(int64_t block, int64_t expert, std::span<const uint8_t> bytes) {
  impl_->set_expert_bytes(block, expert, bytes);
}
void Model::release_expert(int64_t block, int64_t expert) { impl_->release_expert(block, expert); }

bool Model::Impl::holds_expert_values(int64_t block, int64_t expert) const {
  for (int id : expert_params(block, expert))
    if (values[static_cast<size_t>(id)].empty()) return false;
  return true;
}

bool Model::holds_expert(int64_t block, int64_t expert) const { return impl_->holds_expert_values(block, expert); }

int64_t Model::expert_bytes_held() const {
  if (impl_->pager) return impl_->pager->stats().held;
  int64_t n = 0;
  for (const LayerParams& lp : impl_->layers)
    for (const std::vector<int>* ids : {&lp.expert_gate, &lp.expert_up, &lp.expert_down})
      for (int id : *ids)
        n += impl_->stored[static_cast<size_t>(id)]
                 ? static_cast<int64_t>(impl_->stored[static_cast<size_t>(id)]->bytes())
                 : static_cast<int64_t>(impl_->values[static_cast<size_t>(id)].size() * sizeof(float));
  return n;
}

void Model::set_expert_parallel(std::shared_ptr<ExpertParallel> ep) {
  if (ep) {
    if (impl_->pager) throw InputError("[model] expert parallelism with a memory cap on the experts: choose one");
    if (!impl_->config.moe())
      throw InputError(fmt::format("[model] expert parallelism: this {} has no experts", impl_->config.architecture));
    if (ep->ranks < 1 || ep->rank < 0 || ep->rank >= ep->ranks || !ep->exchange)
      throw InputError(fmt::format("[model] expert parallelism: rank {} of {} (and an exchange) is not a valid setup",
                                   ep->rank, ep->ranks));
    if (ep->ranks > impl_->config.num_experts)
      throw InputError(fmt::format("[model] expert parallelism over {} ranks: the model has {} experts, fewer than ranks",
                                   ep->ranks, impl_->config.num_experts));
    if (!(ep->slow_factor >= 1.0)) throw InputError("[model] expert parallelism: a slow factor must be >= 1");
    if (ep->data_parallel) {
      if (!ep->alltoallv) throw InputError("[model] data-parallel attention needs an all-to-all exchange");
      if (ep->replan_every > 0 || ep->split)
        throw InputError("[model] data-parallel attention with re-placement or a balanced split: each rank sees only "
                         "its own tokens' loads; choose one");
      if (impl_->config.recurrent())
        throw InputError("[model] data-parallel attention on a depth-recurrent model: its passes differ in depth "
                         "from rank to rank");
    }
    const ModelConfig& c = impl_->config;
    if (!ep->rank_experts.empty()) {
      if (static_cast<int64_t>(ep->rank_experts.size()) != impl_->applications())
        throw InputError(fmt::format("[model] expert placement for {} applications, the model has {}", ep->rank_experts.size(),
                                     impl_->applications()));
      for (int64_t a = 0; a < impl_->applications(); ++a) {
        if (!c.is_moe_layer(c.block_of(a))) continue;
        const auto& ranks = ep->rank_experts[static_cast<size_t>(a)];
        if (static_cast<int>(ranks.size()) != ep->ranks)
          throw InputError(fmt::format("[model] expert placement of application {}: {} ranks, the job has {}", a,
                                       ranks.size(), ep->ranks));
        std::vector<int64_t> held(static_cast<size_t>(c.num_experts), 0);
        for (const auto& experts : ranks)
          for (int64_t e : experts) {
            if (e < 0 || e >= c.num_experts)
              throw InputError(fmt::format("[model] expert placement of application {}: expert {} of {}", a, e, c.num_experts));
            ++held[static_cast<size_t>(e)];
          }
        for (int64_t e = 0; e < c.num_experts; ++e)
          if (held[static_cast<size_t>(e)] == 0)
            throw InputError(fmt::format("[model] expert placement of application {}: expert {} is on no rank", a, e));
      }
    }
    ep->layers.assign(static_cast<size_t>(impl_->applications()), {});
  }
  impl_->ep = std::move(ep);
}
const ExpertParallel* Model::expert_parallel() const { return impl_->ep.get(); }

void Model::expert_parallel_idle_pass() {
  Impl& m = *impl_;
  if (!m.ep || !m.ep->data_parallel)
    throw InputError("[model] an idle pass is for expert parallelism with data-parallel attention");
  for (size_t a = 0; a < m.plan.size(); ++a)
    m.blocks[static_cast<size_t>(m.plan[a].block)]->expert_parallel_idle(m, static_cast<int>(a));
}

void Model::set_expert_pager(std::shared_ptr<ExpertPager> pager) {
  if (pager) {
    if (impl_->ep) throw InputError("[model] a memory cap on the experts with expert parallelism: choose one");
    const ModelConfig& c = impl_->config;
    if (pager->experts().empty() || !c.moe())
      throw InputError(fmt::format("[model] a memory cap on the experts: this {} has no experts to page", c.architecture));
    for (const ExpertPager::Expert& x : pager->experts()) {
      if (x.block >= c.num_hidden_layers || !c.is_moe_layer(x.block) || x.expert >= c.num_experts)
        throw InputError(fmt::format("[model] the pager lists expert {} of block {}, which this model does not have", x.expert,
                                     x.block));
      const LayerParams& lp = impl_->layers[static_cast<size_t>(x.block)];
      const auto e = static_cast<size_t>(x.expert);
      const std::array<int, 3> ids = {lp.expert_gate[e], lp.expert_up[e], lp.expert_down[e]};
      int64_t bytes = 0;
      for (size_t j = 0; j < 3; ++j) {
        const auto& w = impl_->stored[static_cast<size_t>(ids[j])];
        if (x.params[j] != ids[j] || !w)
          throw InputError(fmt::format("[model] the pager's expert {} of block {} is not this model's stored weights",
                                       x.expert, x.block));
        bytes += static_cast<int64_t>(tensor::packed_quant_bytes(w->type(), w->rows(), w->cols()));
      }
      if (bytes != x.bytes)
        throw InputError(fmt::format("[model] the pager's expert {} of block {}: {} bytes listed, its blocks are {}",
                                     x.expert, x.block, x.bytes, bytes));
    }
  }
  impl_->pager = std::move(pager);
}
ExpertPager* Model::expert_pager() const { return impl_->pager.get(); }

std::vector<int32_t> Model::moe_selected(int64_t application) const {
  if (application < 0 || application >= static_cast<int64_t>(impl_->acts.size()))
    throw InputError(fmt::format("[model] moe_selected: application {} outside the last forward's 0..{}", application,
                                 static_cast<int64_t>(impl_->acts.size()) - 1));
  return moe_selected_of(impl_->acts[static_cast<size_t>(application)]);
}

float Model::forward_backward(std::span<const int32_t> tokens, std::span<const int32_t> targets,
                              int64_t B, int64_t T, uint64_t step) {
  impl_->require_fp32_values("forward_backward");
  check_tokens(*impl_, tokens, B, T, "forward_backward");
  if (targets.size() != tokens.size())
    throw InputError(fmt::format("[model] forward_backward: {} targets for {} tokens",
                                 targets.size(), tokens.size()));
  impl_->run_forward(tokens.data(), B, T);
  return static_cast<float>(impl_->run_backward(tokens.data(), targets.data(), step));
}

}  // namespace concord::model
