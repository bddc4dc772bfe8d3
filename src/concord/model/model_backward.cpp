// The decoder's backward pass: gradients of the mean cross-entropy (forward_backward) or of a
// policy-gradient surrogate (forward_backward_policy) with respect to every parameter, through
// the same ops and the policy's dgrad / wgrad GEMM precisions. Only the loss head differs.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "concord/model/block.h"
#include "concord/model/block_layer.h"
#include "concord/model/logprob.h"
#include "concord/model/model_impl.h"
#include "concord/numerics/check.h"

namespace concord::model {

using tensor::Operand;
using tensor::Trans;

namespace {

// Random streams of the backward GEMMs: one per (step, weight, operand), so stochastic rounding
// and Hadamard signs never repeat across steps or weights and never depend on thread count.
uint64_t step_seed(uint64_t step) { return 0x9E3779B97F4A7C15ull * (step + 1); }

// dbias (N) (+)= column sums of dY (T, N), in fp64 over t = 0..T-1 in order: threads split the
// columns, never a sum, so the result does not depend on the thread count.
void bias_backward(float* dbias, const float* dy, int64_t T, int64_t N, bool accumulate) {
  constexpr int64_t kColumns = 64;
#pragma omp parallel for schedule(static) if (T * N > 65536)
  for (int64_t n0 = 0; n0 < N; n0 += kColumns) {
    const int64_t n1 = std::min(N, n0 + kColumns);
    double sums[kColumns] = {};
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = n0; n < n1; ++n) sums[n - n0] += dy[t * N + n];
    for (int64_t n = n0; n < n1; ++n)
      dbias[n] = static_cast<float>(sums[n - n0] + (accumulate ? dbias[n] : 0.0));
  }
}

// log p(target) and the entropy of softmax(x) for one row, in double: logp is logprob.h's
// definition at temperature 1 (the same function the sampler scores with), so learner and
// sampler score a token bit for bit alike; H = −Σ_v p_v logp_v.
void row_logprob_entropy(const float* x, int64_t V, int32_t target, double& logp,
                         double& entropy) {
  const std::span<const float> row(x, static_cast<size_t>(V));
  const SoftmaxStats s = softmax_stats_unchecked(row);
  double h = 0.0;
  for (int64_t v = 0; v < V; ++v) {
    const double lp = s.logprob(x[v]);
    const double p = std::exp(lp);
    if (p > 0) h -= p * lp;  // p log p → 0 as p → 0 (a −inf logit would give 0 · −inf)
  }
  logp = s.logprob(x[target]);
  entropy = h;
}

}  // namespace

void Model::Impl::linear_backward(const LayerPrecision& prec, int param, const float* dy,
                                  const float* x, int64_t T, float* dx, bool accumulate_dx,
                                  float* dw, bool accumulate_dw, uint64_t step, uint32_t gemm_id) {
  const int64_t N = specs[param].shape[0], K = specs[param].shape[1];
  const uint64_t seed = step_seed(step);
  if (dx != nullptr) {
    // dX (T, K) = dY (T, N) · W (N, K): reduction over N.
    const tensor::PreparedOperand& w = dgrad_weight(param);
    const OperandPrecision& r = prec[GemmRole::dgrad];
    tensor::prepare_operand(scratch_a, r.a, Operand::a, Trans::no, dy, T, N,
                            numerics::RandomStream{seed, gemm_id * 4 + 0});
    observe(GemmRole::dgrad, param, scratch_a, w, r);
    tensor::gemm_prepared(Trans::no, Trans::no, T, K, N, scratch_a, w, dx, K, accumulate_dx);
  }
  // dW (N, K) = dYᵀ (N, T) · X (T, K): reduction over the tokens T.
  const OperandPrecision& r = prec[GemmRole::wgrad];
  const uint64_t hadamard_seed = seed ^ (static_cast<uint64_t>(gemm_id) << 32);
  tensor::prepare_operand(scratch_a, r.a, Operand::a, Trans::yes, dy, T, N,
                          numerics::RandomStream{seed, gemm_id * 4 + 1}, r.hadamard, hadamard_seed);
  tensor::prepare_operand(scratch_b, r.b, Operand::b, Trans::no, x, T, K,
                          numerics::RandomStream{seed, gemm_id * 4 + 2}, r.hadamard, hadamard_seed);
  observe(GemmRole::wgrad, param, scratch_a, scratch_b, r);
  tensor::gemm_prepared(Trans::yes, Trans::no, N, K, T, scratch_a, scratch_b, dw, K, accumulate_dw);
  // The bias gradient reads dY in fp32, off the wgrad GEMM's grid (the bias is added in fp32).
  if (bias_of[param] >= 0) bias_backward(grads[bias_of[param]].data(), dy, T, N, accumulate_dw);
}

double Model::Impl::run_backward(const int32_t* tokens, const int32_t* targets, uint64_t step) {
  const int64_t T = tokens_count(), V = config.vocab_size;

  // Loss: mean over the targets that count.
  int64_t count = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (targets[t] >= V)
      throw InputError("[model] forward_backward: target id " + std::to_string(targets[t]) +
                       " outside the vocabulary");
    count += targets[t] >= 0;
  }
  if (count == 0) throw InputError("[model] forward_backward: every target is ignored (< 0)");
  double loss = cross_entropy_forward<float>(nullptr, logits, targets, T, V) /
                static_cast<double>(count);
  // Qwen3-MoE with output_router_logits: + coef · HF's load-balancing loss (block_layer.h).
  moe_aux = 0.0;
  moe_aux_dp.clear();
  if (config.moe() && config.output_router_logits) {
    moe_aux = model::moe_aux_loss(*this, moe_aux_dp);
    for (double& d : moe_aux_dp) d *= config.router_aux_loss_coef;
    loss += config.router_aux_loss_coef * moe_aux;
  }
  float* dlogits = arena.alloc(T * V);
  cross_entropy_backward(dlogits, logits, targets, T, V, 1.0 / static_cast<double>(count));
  backward_from_dlogits(tokens, dlogits, step);
  moe_aux_dp.clear();
  return loss;
}

void Model::Impl::backward_from_dlogits(const int32_t* tokens, const float* dlogits,
                                        uint64_t step) {
  const ModelConfig& c = config;
  const int64_t T = tokens_count(), C = c.hidden_size, D = c.head_dim, F = c.intermediate_size;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, V = c.vocab_size;
  const int L = static_cast<int>(c.num_hidden_layers);
  ensure_grads();
  for (size_t p = 0; p < specs.size(); ++p)
    if (!specs[p].is_matrix()) std::fill(grads[p].begin(), grads[p].end(), 0.0f);

  // lm_head (tied: its weight gradient lands in the embedding's, which the lookup adds to).
  float* dxn = arena.alloc(T * C);
  float* dx = arena.alloc(T * C);
  float* tmp = arena.alloc(T * C);
  const uint32_t head_id = static_cast<uint32_t>(specs.size());
  linear_backward(policy.for_layer(LayerClass::lm_head, 0, L), lm_head, dlogits, xn_final, T, dxn,
                  false, grads[lm_head].data(), false, step, head_id);
  rmsnorm_backward(dx, grads[final_norm].data(), dxn, x_final, values[final_norm].data(),
                   rstd_final, T, C);

  BackwardScratch scratch{};
  scratch.dxn = dxn;
  scratch.tmp = tmp;
  scratch.dq = arena.alloc(T * Hq * D);
  scratch.dk = arena.alloc(T * Hkv * D);
  scratch.dv = arena.alloc(T * Hkv * D);
  scratch.dq_raw = arena.alloc(T * Hq * D);
  scratch.dk_raw = arena.alloc(T * Hkv * D);
  scratch.datt = arena.alloc(T * Hq * D);
  scratch.dgate = arena.alloc(T * F);
  scratch.dup = arena.alloc(T * F);
  scratch.dh = arena.alloc(T * F);
  // Applications in reverse; a block's weight gradients are written by its last application
  // and added to by the earlier ones (block.h).
  // A recurrent model: entering iteration i, x = adapter([s, e]); its backward splits
  // d[s, e] into ds (on to iteration i - 1, or dropped at the first iteration with gradient:
  // s0, or the state of an iteration run without gradient, is a constant) and de, summed over
  // the iterations into d(prelude output).
  std::vector<char> written(blocks.size(), 0);
  bool adapter_written = false;
  float* de = c.recurrent() ? arena.alloc(T * C) : nullptr;
  float* dcat = c.recurrent() ? arena.alloc(T * 2 * C) : nullptr;
  if (de) std::fill(de, de + T * C, 0.0f);
  for (int64_t app = applications() - 1; app >= 0; --app) {
    const Application& ap = plan[static_cast<size_t>(app)];
    const auto block = static_cast<size_t>(ap.block);
    const BlockPass pass{static_cast<int>(app), ap.repeat, T, positions.data(), &arena, {}};
    const size_t mark = recompute_for_backward(app);  // Model::Recompute: what the forward dropped
    blocks[block]->backward(*this, pass, acts[static_cast<size_t>(app)], scratch, dx, written[block] != 0, step);
    arena.rewind(mark);
    release_recomputed(app);  // no pointer into the released memory stays behind
    written[block] = 1;
    if (!ap.enters_iteration) continue;
    const float* cat = adapter_in[static_cast<size_t>(ap.iteration)];
    CONCORD_CHECK(cat != nullptr, "backward through a core iteration run without gradient");
    linear_backward(policy.for_layer(LayerClass::mlp, -1, L), adapter, dx, cat, T, dcat, false,
                    grads[adapter].data(), adapter_written, step,
                    gemm_stream_id(adapter, ap.iteration, specs.size()));
    adapter_written = true;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < C; ++k) {
        dx[t * C + k] = dcat[t * 2 * C + k];
        de[t * C + k] += dcat[t * 2 * C + C + k];
      }
    if (ap.iteration == first_grad_iteration) {
      std::memcpy(dx, de, sizeof(float) * static_cast<size_t>(T * C));
      app = c.n_layers_in_prelude;  // on to the prelude's last application (the loop decrements)
    }
  }
  if (c.recurrent() && !adapter_written) std::fill(grads[adapter].begin(), grads[adapter].end(), 0.0f);
  if (!c.tie_word_embeddings) std::fill(grads[embed].begin(), grads[embed].end(), 0.0f);
  embedding_backward(grads[embed].data(), dx, tokens, T, V, C);
}

double Model::forward_backward_policy(std::span<const int32_t> tokens,
                                      std::span<const int32_t> targets, int64_t B, int64_t T,
                                      const PolicyLossFn& loss, uint64_t step) {
  Impl& m = *impl_;
  m.require_fp32_values("forward_backward_policy");
  const int64_t V = m.config.vocab_size;
  if (B <= 0 || T <= 0 || static_cast<int64_t>(tokens.size()) != B * T)
    throw InputError(fmt::format("[model] forward_backward_policy: {} tokens for B={} x T={}",
                                 tokens.size(), B, T));
  if (targets.size() != tokens.size())
    throw InputError(fmt::format("[model] forward_backward_policy: {} targets for {} tokens",
                                 targets.size(), tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= V)
      throw InputError(fmt::format("[model] forward_backward_policy: token id {} outside the "
                                   "vocabulary [0, {})", tokens[i], V));
    if (targets[i] >= V)
      throw InputError(fmt::format("[model] forward_backward_policy: target id {} outside the "
                                   "vocabulary [0, {}); use a negative target to ignore a row",
                                   targets[i], V));
  }
  if (!loss) throw InputError("[model] forward_backward_policy: no loss function given");
  m.run_forward(tokens.data(), B, T);

  const int64_t rows = B * T;
  const size_t n = static_cast<size_t>(rows);
  std::vector<double> logp(n, 0.0), entropy(n, 0.0), coef(n, 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    if (targets[static_cast<size_t>(t)] < 0) continue;
    row_logprob_entropy(m.logits + t * V, V, targets[static_cast<size_t>(t)],
                        logp[static_cast<size_t>(t)], entropy[static_cast<size_t>(t)]);
  }
  loss(logp, entropy, coef);

  // dlogits row t = −coef[t] · (softmax − onehot): d(coef·logp)/dx = coef · (onehot − softmax).
  std::vector<double> row_scale(n);
  double surrogate = 0.0;  // in ascending t, independent of the thread count
  for (size_t t = 0; t < n; ++t) {
    if (!std::isfinite(coef[t]))
      throw InputError(fmt::format("[model] forward_backward_policy: the loss gave coefficient {} "
                                   "to row {}; coefficients must be finite", coef[t], t));
    if (targets[t] < 0 && coef[t] != 0.0)
      throw InputError(fmt::format("[model] forward_backward_policy: the loss gave coefficient {} "
                                   "to row {}, whose target is ignored (< 0); it must be 0",
                                   coef[t], t));
    row_scale[t] = -coef[t];
    surrogate += coef[t] * logp[t];
  }
  float* dlogits = m.arena.alloc(rows * V);
  cross_entropy_backward_rows(dlogits, m.logits, targets.data(), rows, V, row_scale.data());
  m.backward_from_dlogits(tokens.data(), dlogits, step);
  return surrogate;
}

double Model::forward_backward_distill(std::span<const int32_t> tokens, std::span<const float> teacher_logits,
                                       int64_t B, int64_t T, uint64_t step) {
  Impl& m = *impl_;
  m.require_fp32_values("forward_backward_distill");
  const int64_t V = m.config.vocab_size;
  if (B <= 0 || T <= 0 || static_cast<int64_t>(tokens.size()) != B * T)
    throw InputError(fmt::format("[model] forward_backward_distill: {} tokens for B={} x T={}", tokens.size(), B, T));
  if (static_cast<int64_t>(teacher_logits.size()) != B * T * V)
    throw InputError(fmt::format("[model] forward_backward_distill: {} teacher logits for {} rows of a vocabulary of {}",
                                 teacher_logits.size(), B * T, V));
  for (const int32_t t : tokens)
    if (t < 0 || t >= V)
      throw InputError(fmt::format("[model] forward_backward_distill: token id {} outside the vocabulary [0, {})", t, V));
  for (size_t i = 0; i < teacher_logits.size(); ++i)
    if (!std::isfinite(teacher_logits[i]))
      throw InputError(fmt::format("[model] forward_backward_distill: teacher logit {} of row {} is {}", i % V, i / V,
                                   teacher_logits[i]));
  m.run_forward(tokens.data(), B, T);
  const int64_t rows = B * T;
  float* dlogits = m.arena.alloc(rows * V);
  std::vector<double> kl(static_cast<size_t>(rows));
  const double inv_rows = 1.0 / static_cast<double>(rows);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < rows; ++t) {
    const std::span<const float> s(m.logits + t * V, static_cast<size_t>(V));
    const std::span<const float> u(teacher_logits.data() + t * V, static_cast<size_t>(V));
    // logprob.h's definitions: the KL is kl_divergence(u, s); its gradient in s is q − p.
    const SoftmaxStats ss = softmax_stats_unchecked(s), su = softmax_stats_unchecked(u);
    double k = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double lu = su.logprob(u[static_cast<size_t>(v)]), ls = ss.logprob(s[static_cast<size_t>(v)]);
      const double pu = std::exp(lu);
      if (pu > 0) k += pu * (lu - ls);
      dlogits[t * V + v] = static_cast<float>((std::exp(ls) - pu) * inv_rows);
    }
    kl[static_cast<size_t>(t)] = k;
  }
  double total = 0;  // in ascending rows: independent of the thread count
  for (const double k : kl) total += k;
  m.backward_from_dlogits(tokens.data(), dlogits, step);
  return total * inv_rows;
}

}  // namespace concord::model
