// An independent fp64 reference of the Qwen3 / Qwen2 / Llama decoder, for tests only: the clean, plain
// forward pass that concord's Model (src/concord/model/) and HF transformers' goldens are
// compared against (llm.c's pattern).
//
// Written from the definition in HF's modeling code (Qwen3ForCausalLM, Qwen2ForCausalLM,
// LlamaForCausalLM), not
// from concord's sources: it includes nothing from src/concord, has its own config struct, and
// keeps every value in std::vector<double>. Loops are the textbook ones, readable by eye; speed
// does not matter here.
//
//   x = embed_tokens[token]                                       (B*T, C)
//   per layer:
//     h = rmsnorm(x) * input_layernorm                            rmsnorm(v) = v / sqrt(mean(v²) + eps)
//     q = h Wqᵀ (B*T, Hq*D)   k = h Wkᵀ, v = h Wvᵀ (B*T, Hkv*D)   (+ bq, bk, bv: Qwen2)
//     Qwen3 only: q, k per head = rmsnorm over D * q_norm / k_norm
//     RoPE on q and k per head (HF's rotate_half layout: pairs (i, i + D/2)),
//       angle = pos * theta^(-2i/D), i < D/2, pos = 0..T-1 in each sequence
//     causal softmax attention, query head h reads kv head h / (Hq/Hkv), scale 1/sqrt(D)
//     x += attn Woᵀ                                               (+ bo: Llama attention_bias)
//     h = rmsnorm(x) * post_attention_layernorm
//     x += (silu(h Wgateᵀ) ⊙ h Wupᵀ) Wdownᵀ                       silu(z) = z / (1 + e^-z)
//   logits = (rmsnorm(x) * norm) Wheadᵀ, Whead = lm_head or (tied) embed_tokens   (B*T, V)
//
// Weights are keyed by HF parameter names (listed in src/concord/model/model.h); matrices are
// (out, in) row-major. Bad input throws std::invalid_argument naming the weight or argument.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace reference {

struct Config {
  bool qwen3 = true;  // QK-norm (Qwen3) or not (Llama, Qwen2)
  bool qkv_bias = false;     // q_proj/k_proj/v_proj.bias (Qwen2; Llama's attention_bias)
  bool output_bias = false;  // o_proj.bias (Llama's attention_bias)
  int64_t vocab = 0;         // V
  int64_t hidden = 0;        // C
  int64_t intermediate = 0;  // F
  int64_t layers = 0;        // L
  int64_t heads = 0;         // Hq
  int64_t kv_heads = 0;      // Hkv
  int64_t head_dim = 0;      // D (even)
  double eps = 1e-6;
  double theta = 10000.0;
  bool tied = true;  // lm_head = embed_tokens (no lm_head.weight)
  // Qwen3-MoE (every layer an MoE layer when experts > 0): router mlp.gate.weight (E, C),
  // softmax, the top_k largest probabilities (renormalised when norm_topk), SwiGLU experts
  // mlp.experts.{e}.{gate,up,down}_proj.weight of width moe_intermediate, weighted sum.
  int64_t experts = 0;
  int64_t top_k = 0;
  int64_t moe_intermediate = 0;
  bool norm_topk = false;
  // loss() adds aux_coef times HF's load-balancing loss over the MoE layers (0: none).
  double aux_coef = 0.0;
  // Depth recurrence when core > 0 (Huginn-style): layers [0, prelude) give e; s starts at
  // initial_state ((B*T, C); zeros when empty); `depth` times
  //   s = layers [prelude, prelude + core) applied to adapter · [s; e]
  // (model.adapter.weight, (C, 2C)); then layers [prelude + core, layers) run on s.
  int64_t prelude = 0;
  int64_t core = 0;
  int64_t depth = 0;
  std::vector<double> initial_state;
};

using Weights = std::map<std::string, std::vector<double>>;

// Every parameter the config implies, as (HF name, shape), in HF's named_parameters() order.
std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const Config& config);

// Logits (B*T, V) of B sequences of T tokens each (row b*T + t is sequence b, position t).
// Throws std::invalid_argument on a missing or wrongly sized weight, an extra weight, a token
// outside [0, V), or tokens.size() != B*T.
std::vector<double> forward_logits(const Config& config, const Weights& weights,
                                   const std::vector<int32_t>& tokens, int64_t B, int64_t T);

// A recurrent config's state s after its `depth` core iterations ((B*T, C)).
std::vector<double> recurrent_state(const Config& config, const Weights& weights,
                                    const std::vector<int32_t>& tokens, int64_t B, int64_t T);

// Mean over rows with target >= 0 of -log softmax(logits row)[target]; targets < 0 are ignored.
// Throws when a target is >= V, sizes disagree, or no target is >= 0.
double mean_cross_entropy(const std::vector<double>& logits, const std::vector<int32_t>& targets,
                          int64_t V);

// HF's load-balancing loss (load_balancing_loss_func without an attention mask) of the MoE
// layers: E · Σ_e f_e · P_e, f_e the share of top-k picks, P_e the mean probability of expert e.
double moe_aux_loss(const Config& config, const Weights& weights, const std::vector<int32_t>& tokens, int64_t B,
                    int64_t T);

// mean_cross_entropy(forward_logits(...), targets, V), plus aux_coef · moe_aux_loss when set.
double loss(const Config& config, const Weights& weights, const std::vector<int32_t>& tokens,
            const std::vector<int32_t>& targets, int64_t B, int64_t T);

// d loss / d weights[name][index] by a central difference with step h (in fp64; h = 1e-5
// gives an error around 1e-10 for the O(1)-scaled losses of the tests).
double loss_gradient_central_difference(const Config& config, Weights weights,
                                        const std::string& name, int64_t index,
                                        const std::vector<int32_t>& tokens,
                                        const std::vector<int32_t>& targets, int64_t B, int64_t T,
                                        double h = 1e-5);

// concord's next-token targets: targets[b*T + t] = tokens[b*T + t + 1], and -1 at t = T-1.
std::vector<int32_t> next_token_targets(const std::vector<int32_t>& tokens, int64_t B, int64_t T);

}  // namespace reference
