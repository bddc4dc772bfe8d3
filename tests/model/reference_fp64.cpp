// The fp64 reference decoder (see reference_fp64.h): plain loops, no code shared with src/.
#include "reference_fp64.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>

namespace reference {
namespace {

using Matrix = std::vector<double>;  // row-major

[[noreturn]] void fail(const std::string& message) {
  throw std::invalid_argument("[reference_fp64] " + message);
}

size_t at(int64_t i) { return static_cast<size_t>(i); }

std::string layer_prefix(int64_t layer) { return "model.layers." + std::to_string(layer) + "."; }

const std::vector<double>& weight(const Weights& weights, const std::string& name) {
  const auto it = weights.find(name);
  if (it == weights.end()) fail("missing weight '" + name + "'");
  return it->second;
}

// y (N, out) = x (N, in) · Wᵀ, W (out, in).
Matrix linear(const Matrix& x, int64_t N, int64_t in, const std::vector<double>& W, int64_t out) {
  Matrix y(at(N * out), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0.0;
      for (int64_t k = 0; k < in; ++k) sum += x[at(n * in + k)] * W[at(o * in + k)];
      y[at(n * out + o)] = sum;
    }
  return y;
}

// Each of the N rows of width `width` (starting at row * width): v / sqrt(mean(v²) + eps) * g.
Matrix rmsnorm(const Matrix& x, int64_t N, int64_t width, const std::vector<double>& gain,
               double eps) {
  Matrix y(x.size());
  for (int64_t n = 0; n < N; ++n) {
    double sum_squares = 0.0;
    for (int64_t i = 0; i < width; ++i) sum_squares += x[at(n * width + i)] * x[at(n * width + i)];
    const double inverse_rms = 1.0 / std::sqrt(sum_squares / static_cast<double>(width) + eps);
    for (int64_t i = 0; i < width; ++i)
      y[at(n * width + i)] = x[at(n * width + i)] * inverse_rms * gain[at(i)];
  }
  return y;
}

// HF's apply_rotary_pos_emb on rows (B*T, heads*D): out = v·cos + rotate_half(v)·sin with
// rotate_half(v) = (-v[D/2:], v[:D/2]) and the same angle for elements i and i + D/2.
void rope_in_place(Matrix& x, int64_t B, int64_t T, int64_t heads, int64_t D, double theta) {
  const int64_t half = D / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        double* v = &x[at(((b * T + t) * heads + h) * D)];
        for (int64_t i = 0; i < half; ++i) {
          const double inverse_frequency =
              std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
          const double angle = static_cast<double>(t) * inverse_frequency;
          const double c = std::cos(angle), s = std::sin(angle);
          const double x1 = v[i], x2 = v[i + half];
          v[i] = x1 * c - x2 * s;
          v[i + half] = x2 * c + x1 * s;
        }
      }
}

// Causal GQA attention: q (B*T, Hq*D), k and v (B*T, Hkv*D) -> (B*T, Hq*D).
Matrix attention(const Matrix& q, const Matrix& k, const Matrix& v, int64_t B, int64_t T,
                 int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t group = Hq / Hkv;  // HF's repeat_kv: query head h reads kv head h / group
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Matrix out(at(B * T * Hq * D), 0.0);
  std::vector<double> p(at(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kv = h / group;
      for (int64_t t = 0; t < T; ++t) {
        const double* qt = &q[at(((b * T + t) * Hq + h) * D)];
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t s = 0; s <= t; ++s) {
          const double* ks = &k[at(((b * T + s) * Hkv + kv) * D)];
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) dot += qt[d] * ks[d];
          p[at(s)] = dot * scale;
          max_score = std::max(max_score, p[at(s)]);
        }
        double sum = 0.0;
        for (int64_t s = 0; s <= t; ++s) {
          p[at(s)] = std::exp(p[at(s)] - max_score);
          sum += p[at(s)];
        }
        double* ot = &out[at(((b * T + t) * Hq + h) * D)];
        for (int64_t s = 0; s <= t; ++s) {
          const double* vs = &v[at(((b * T + s) * Hkv + kv) * D)];
          for (int64_t d = 0; d < D; ++d) ot[d] += p[at(s)] / sum * vs[d];
        }
      }
    }
  return out;
}

// y += bias on every one of the N rows of width `width`.
void add_bias(Matrix& y, int64_t N, int64_t width, const std::vector<double>& bias) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < width; ++i) y[at(n * width + i)] += bias[at(i)];
}

void add_in_place(Matrix& x, const Matrix& y) {
  for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
}

void check_config(const Config& c) {
  if (c.vocab <= 0 || c.hidden <= 0 || c.intermediate <= 0 || c.layers < 0 || c.heads <= 0 ||
      c.kv_heads <= 0 || c.head_dim <= 0)
    fail("config sizes must be positive");
  if (c.heads % c.kv_heads != 0) fail("heads must be a multiple of kv_heads (GQA)");
  if (c.head_dim % 2 != 0) fail("head_dim must be even (RoPE rotates pairs)");
  if (!(c.eps > 0.0) || !(c.theta > 0.0)) fail("eps and theta must be positive");
  if (c.core > 0 && (c.prelude < 0 || c.prelude + c.core > c.layers || c.depth < 0))
    fail("recurrence: need 0 <= prelude, prelude + core <= layers, depth >= 0");
}

void check_weights(const Config& config, const Weights& weights) {
  const auto shapes = parameter_shapes(config);
  for (const auto& [name, shape] : shapes) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    const auto& w = weight(weights, name);
    if (static_cast<int64_t>(w.size()) != numel)
      fail("weight '" + name + "' has " + std::to_string(w.size()) + " values; the config implies " +
           std::to_string(numel));
  }
  if (weights.size() != shapes.size())
    for (const auto& [name, values] : weights) {
      bool known = false;
      for (const auto& spec : shapes) known = known || spec.first == name;
      if (!known) fail("unexpected weight '" + name + "' (tied models have no lm_head.weight)");
    }
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const Config& c) {
  const int64_t C = c.hidden, F = c.intermediate, D = c.head_dim;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab, C}});
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = layer_prefix(l);
    out.push_back({p + "self_attn.q_proj.weight", {c.heads * D, C}});
    if (c.qkv_bias) out.push_back({p + "self_attn.q_proj.bias", {c.heads * D}});
    out.push_back({p + "self_attn.k_proj.weight", {c.kv_heads * D, C}});
    if (c.qkv_bias) out.push_back({p + "self_attn.k_proj.bias", {c.kv_heads * D}});
    out.push_back({p + "self_attn.v_proj.weight", {c.kv_heads * D, C}});
    if (c.qkv_bias) out.push_back({p + "self_attn.v_proj.bias", {c.kv_heads * D}});
    out.push_back({p + "self_attn.o_proj.weight", {C, c.heads * D}});
    if (c.output_bias) out.push_back({p + "self_attn.o_proj.bias", {C}});
    if (c.qwen3) {
      out.push_back({p + "self_attn.q_norm.weight", {D}});
      out.push_back({p + "self_attn.k_norm.weight", {D}});
    }
    if (c.experts > 0) {
      out.push_back({p + "mlp.gate.weight", {c.experts, C}});
      for (int64_t e = 0; e < c.experts; ++e) {
        const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
        out.push_back({x + "gate_proj.weight", {c.moe_intermediate, C}});
        out.push_back({x + "up_proj.weight", {c.moe_intermediate, C}});
        out.push_back({x + "down_proj.weight", {C, c.moe_intermediate}});
      }
    } else {
      out.push_back({p + "mlp.gate_proj.weight", {F, C}});
      out.push_back({p + "mlp.up_proj.weight", {F, C}});
      out.push_back({p + "mlp.down_proj.weight", {C, F}});
    }
    out.push_back({p + "input_layernorm.weight", {C}});
    out.push_back({p + "post_attention_layernorm.weight", {C}});
  }
  if (c.core > 0) out.push_back({"model.adapter.weight", {C, 2 * C}});
  out.push_back({"model.norm.weight", {C}});
  if (!c.tied) out.push_back({"lm_head.weight", {c.vocab, C}});
  return out;
}

namespace {
// HF's load-balancing loss accumulators over the MoE layers (load_balancing_loss_func).
struct AuxSums {
  std::vector<double> picks, prob_sum;
  double rows = 0.0;
};
std::vector<double> forward_impl(const Config& c, const Weights& weights, const std::vector<int32_t>& tokens,
                                 int64_t B, int64_t T, AuxSums* aux, std::vector<double>* state_out = nullptr);
}  // namespace

std::vector<double> forward_logits(const Config& c, const Weights& weights,
                                   const std::vector<int32_t>& tokens, int64_t B, int64_t T) {
  return forward_impl(c, weights, tokens, B, T, nullptr);
}

std::vector<double> recurrent_state(const Config& c, const Weights& weights, const std::vector<int32_t>& tokens,
                                    int64_t B, int64_t T) {
  if (c.core <= 0) fail("recurrent_state: the config is not recurrent (core = 0)");
  std::vector<double> s;
  forward_impl(c, weights, tokens, B, T, nullptr, &s);
  return s;
}

namespace {
std::vector<double> forward_impl(const Config& c, const Weights& weights, const std::vector<int32_t>& tokens,
                                 int64_t B, int64_t T, AuxSums* aux, std::vector<double>* state_out) {
  check_config(c);
  check_weights(c, weights);
  if (B <= 0 || T <= 0 || static_cast<int64_t>(tokens.size()) != B * T)
    fail("forward_logits: tokens.size() = " + std::to_string(tokens.size()) + " must equal B*T = " +
         std::to_string(B * T));
  const int64_t N = B * T, C = c.hidden, F = c.intermediate, D = c.head_dim;
  const int64_t Hq = c.heads, Hkv = c.kv_heads;

  const auto& embed = weight(weights, "model.embed_tokens.weight");
  Matrix x(at(N * C));
  for (int64_t n = 0; n < N; ++n) {
    const int32_t token = tokens[at(n)];
    if (token < 0 || token >= c.vocab)
      fail("token " + std::to_string(token) + " at row " + std::to_string(n) + " is outside [0, " +
           std::to_string(c.vocab) + ")");
    for (int64_t i = 0; i < C; ++i) x[at(n * C + i)] = embed[at(token * C + i)];
  }

  const auto run_layer = [&](int64_t l) {
    const std::string p = layer_prefix(l);
    const auto w = [&](const std::string& suffix) -> const std::vector<double>& {
      return weight(weights, p + suffix);
    };
    // Attention block.
    const Matrix h = rmsnorm(x, N, C, w("input_layernorm.weight"), c.eps);
    Matrix q = linear(h, N, C, w("self_attn.q_proj.weight"), Hq * D);
    Matrix k = linear(h, N, C, w("self_attn.k_proj.weight"), Hkv * D);
    Matrix v = linear(h, N, C, w("self_attn.v_proj.weight"), Hkv * D);
    if (c.qkv_bias) {
      add_bias(q, N, Hq * D, w("self_attn.q_proj.bias"));
      add_bias(k, N, Hkv * D, w("self_attn.k_proj.bias"));
      add_bias(v, N, Hkv * D, w("self_attn.v_proj.bias"));
    }
    if (c.qwen3) {  // per-head RMSNorm over D, before RoPE
      q = rmsnorm(q, N * Hq, D, w("self_attn.q_norm.weight"), c.eps);
      k = rmsnorm(k, N * Hkv, D, w("self_attn.k_norm.weight"), c.eps);
    }
    rope_in_place(q, B, T, Hq, D, c.theta);
    rope_in_place(k, B, T, Hkv, D, c.theta);
    const Matrix a = attention(q, k, v, B, T, Hq, Hkv, D);
    Matrix o = linear(a, N, Hq * D, w("self_attn.o_proj.weight"), C);
    if (c.output_bias) add_bias(o, N, C, w("self_attn.o_proj.bias"));
    add_in_place(x, o);

    // MLP block (SwiGLU), or the MoE block: router, top-k, experts.
    const Matrix h2 = rmsnorm(x, N, C, w("post_attention_layernorm.weight"), c.eps);
    if (c.experts > 0) {
      const Matrix logits = linear(h2, N, C, w("mlp.gate.weight"), c.experts);
      const int64_t Fm = c.moe_intermediate;
      Matrix moe(at(N * C), 0.0);
      for (int64_t n = 0; n < N; ++n) {
        std::vector<double> prob(at(c.experts));
        double mx = logits[at(n * c.experts)];
        for (int64_t e = 0; e < c.experts; ++e) mx = std::max(mx, logits[at(n * c.experts + e)]);
        double sum = 0.0;
        for (int64_t e = 0; e < c.experts; ++e) sum += prob[at(e)] = std::exp(logits[at(n * c.experts + e)] - mx);
        for (double& pr : prob) pr /= sum;
        std::vector<int64_t> chosen;  // the top_k by probability, ties to the lower index
        for (int64_t j = 0; j < c.top_k; ++j) {
          int64_t best = -1;
          for (int64_t e = 0; e < c.experts; ++e) {
            if (std::find(chosen.begin(), chosen.end(), e) != chosen.end()) continue;
            if (best < 0 || prob[at(e)] > prob[at(best)]) best = e;
          }
          chosen.push_back(best);
        }
        double chosen_sum = 0.0;
        for (int64_t e : chosen) chosen_sum += prob[at(e)];
        if (aux != nullptr) {
          aux->picks.resize(at(c.experts), 0.0);
          aux->prob_sum.resize(at(c.experts), 0.0);
          for (int64_t e : chosen) aux->picks[at(e)] += 1.0;
          for (int64_t e = 0; e < c.experts; ++e) aux->prob_sum[at(e)] += prob[at(e)];
          if (n == 0) aux->rows += static_cast<double>(N);
        }
        const Matrix row(h2.begin() + n * C, h2.begin() + (n + 1) * C);
        for (int64_t e : chosen) {
          const std::string xp = "mlp.experts." + std::to_string(e) + ".";
          const Matrix g = linear(row, 1, C, w(xp + "gate_proj.weight"), Fm);
          const Matrix u = linear(row, 1, C, w(xp + "up_proj.weight"), Fm);
          Matrix act(g.size());
          for (size_t i = 0; i < act.size(); ++i) act[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
          const Matrix y = linear(act, 1, Fm, w(xp + "down_proj.weight"), C);
          const double weight = c.norm_topk ? prob[at(e)] / chosen_sum : prob[at(e)];
          for (int64_t i = 0; i < C; ++i) moe[at(n * C + i)] += weight * y[at(i)];
        }
      }
      add_in_place(x, moe);
    } else {
      const Matrix gate = linear(h2, N, C, w("mlp.gate_proj.weight"), F);
      const Matrix up = linear(h2, N, C, w("mlp.up_proj.weight"), F);
      Matrix act(gate.size());
      for (size_t i = 0; i < act.size(); ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      add_in_place(x, linear(act, N, F, w("mlp.down_proj.weight"), C));
    }
  };
  if (c.core == 0) {
    for (int64_t l = 0; l < c.layers; ++l) run_layer(l);
  } else {
    // Prelude; then depth times s = core(adapter · [s; e]); then the coda on s.
    for (int64_t l = 0; l < c.prelude; ++l) run_layer(l);
    const Matrix e = x;
    Matrix s = c.initial_state.empty() ? Matrix(at(N * C), 0.0) : c.initial_state;
    if (static_cast<int64_t>(s.size()) != N * C) fail("initial_state must hold B*T*C values");
    for (int64_t it = 0; it < c.depth; ++it) {
      Matrix cat(at(N * 2 * C));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < C; ++i) {
          cat[at(n * 2 * C + i)] = s[at(n * C + i)];
          cat[at(n * 2 * C + C + i)] = e[at(n * C + i)];
        }
      x = linear(cat, N, 2 * C, weight(weights, "model.adapter.weight"), C);
      for (int64_t l = c.prelude; l < c.prelude + c.core; ++l) run_layer(l);
      s = x;
    }
    if (state_out != nullptr) *state_out = s;
    x = s;
    for (int64_t l = c.prelude + c.core; l < c.layers; ++l) run_layer(l);
  }

  const Matrix final_hidden = rmsnorm(x, N, C, weight(weights, "model.norm.weight"), c.eps);
  const auto& head = c.tied ? embed : weight(weights, "lm_head.weight");
  return linear(final_hidden, N, C, head, c.vocab);
}

// E · Σ_e (picks_e / rows) · (Σ p_e / rows): HF's overall_loss * num_experts.
double moe_aux_of(const Config& c, const AuxSums& sums) {
  double total = 0.0;
  for (int64_t e = 0; e < c.experts; ++e) total += (sums.picks[at(e)] / sums.rows) * (sums.prob_sum[at(e)] / sums.rows);
  return static_cast<double>(c.experts) * total;
}
}  // namespace

double mean_cross_entropy(const std::vector<double>& logits, const std::vector<int32_t>& targets,
                          int64_t V) {
  if (V <= 0 || logits.size() != targets.size() * at(V))
    fail("mean_cross_entropy: logits.size() = " + std::to_string(logits.size()) +
         " must be targets.size() * V = " + std::to_string(targets.size()) + " * " +
         std::to_string(V));
  double total = 0.0;
  int64_t count = 0;
  for (size_t n = 0; n < targets.size(); ++n) {
    if (targets[n] < 0) continue;
    if (targets[n] >= V)
      fail("mean_cross_entropy: target " + std::to_string(targets[n]) + " at row " +
           std::to_string(n) + " is >= V = " + std::to_string(V));
    const double* row = &logits[n * at(V)];
    double max_logit = row[0];
    for (int64_t i = 1; i < V; ++i) max_logit = std::max(max_logit, row[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < V; ++i) sum += std::exp(row[i] - max_logit);
    total += max_logit + std::log(sum) - row[targets[n]];
    ++count;
  }
  if (count == 0) fail("mean_cross_entropy: no target >= 0, the mean is undefined");
  return total / static_cast<double>(count);
}

double loss(const Config& config, const Weights& weights, const std::vector<int32_t>& tokens,
            const std::vector<int32_t>& targets, int64_t B, int64_t T) {
  AuxSums sums;
  const double ce = mean_cross_entropy(forward_impl(config, weights, tokens, B, T, &sums), targets, config.vocab);
  if (config.aux_coef == 0.0 || sums.rows == 0.0) return ce;
  return ce + config.aux_coef * moe_aux_of(config, sums);
}

double moe_aux_loss(const Config& config, const Weights& weights, const std::vector<int32_t>& tokens, int64_t B,
                    int64_t T) {
  AuxSums sums;
  forward_impl(config, weights, tokens, B, T, &sums);
  return sums.rows == 0.0 ? 0.0 : moe_aux_of(config, sums);
}

double loss_gradient_central_difference(const Config& config, Weights weights,
                                        const std::string& name, int64_t index,
                                        const std::vector<int32_t>& tokens,
                                        const std::vector<int32_t>& targets, int64_t B, int64_t T,
                                        double h) {
  auto it = weights.find(name);
  if (it == weights.end()) fail("loss_gradient_central_difference: no weight '" + name + "'");
  if (index < 0 || index >= static_cast<int64_t>(it->second.size()))
    fail("loss_gradient_central_difference: index " + std::to_string(index) + " outside '" + name +
         "'");
  double& entry = it->second[at(index)];
  const double original = entry;
  entry = original + h;
  const double plus = loss(config, weights, tokens, targets, B, T);
  entry = original - h;
  const double minus = loss(config, weights, tokens, targets, B, T);
  return (plus - minus) / (2.0 * h);
}

std::vector<int32_t> next_token_targets(const std::vector<int32_t>& tokens, int64_t B, int64_t T) {
  if (static_cast<int64_t>(tokens.size()) != B * T)
    fail("next_token_targets: tokens.size() must equal B*T");
  std::vector<int32_t> targets(tokens.size(), -1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < T; ++t) targets[at(b * T + t)] = tokens[at(b * T + t + 1)];
  return targets;
}

}  // namespace reference
