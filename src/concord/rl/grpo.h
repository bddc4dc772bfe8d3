// GRPO with the PPO-clip loss, an optional KL penalty to a reference policy, and importance
// sampling between the sampler's and the learner's log-probs (docs/design.md systems #1, #7).
//
// Per sequence i of a group of G sequences of one prompt, with rewards R_1..R_G:
//   advantage A_i = (R_i − mean R) / (std R + eps)      (std: population; normalize_std = false
//                                                         drops the division, Dr. GRPO)
// Per token t of a completion, with
//   l_t  = learner log-prob now (θ),  o_t = learner log-prob when the batch was sampled (θ_old),
//   s_t  = sampler log-prob (the engine's, model/logprob.h),  q_t = reference policy's log-prob,
//   ρ_t  = exp(l_t − o_t)            the PPO ratio (1 on the first update of a batch),
//   w_t  = the sampler→learner importance weight from `is` (treated as a constant):
//          none        1
//          token_tis   min(exp(o_t − s_t), C)                         token-level truncated IS
//          seq_tis     min(exp(Σ_t (o_t − s_t)), C), same for every token of the sequence
//          token_mask  1 if exp(o_t − s_t) ∈ [lo, hi] else 0 (token dropped)
//          seq_mask    1 if exp(Σ_t (o_t − s_t)) ∈ [lo, hi] else 0 (sequence dropped)
//   the clipped surrogate  J_t = w_t · min(ρ_t A, clip(ρ_t, 1 − ε_low, 1 + ε_high) A)
//   the KL penalty (k3)    K_t = exp(q_t − l_t) − (q_t − l_t) − 1     (≥ 0; 0 when kl_coef = 0)
// loss L = −(1/N) Σ_t J_t + β (1/N) Σ_t K_t, N = every completion token of the batch
// ("token-mean", verl's default loss_agg_mode). ∂L/∂l_t is returned per token, the form
// Model::forward_backward_policy takes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace concord::rl {

enum class IsMode : uint8_t { none, token_tis, seq_tis, token_mask, seq_mask };
std::string_view is_mode_name(IsMode m);
IsMode is_mode_from_name(std::string_view name);  // InputError listing the names
std::vector<std::string> is_mode_names();

struct PolicyLossConfig {
  double clip_low = 0.2, clip_high = 0.2;  // ε_low, ε_high
  double kl_coef = 0;                      // β (0: no reference policy needed)
  IsMode is = IsMode::none;
  double is_cap = 2.0;                     // C of token/seq TIS
  double mask_lo = 0.5, mask_hi = 2.0;     // [lo, hi] of token/seq masking
};

// Group-relative advantages: rewards in groups of group_size consecutive sequences.
std::vector<double> group_advantages(std::span<const double> rewards, int64_t group_size,
                                     bool normalize_std = true, double eps = 1e-6);

// One sequence's completion tokens as the loss sees them (all spans the same length).
struct SequenceLogprobs {
  std::span<const double> old_logp;      // o_t
  std::span<const double> sampler_logp;  // s_t
  std::span<const double> ref_logp;      // q_t (empty when kl_coef == 0)
  double advantage = 0;
};

// What one loss evaluation saw (means over the batch's tokens). to_json() names them as verl's
// actor metrics where verl has one: actor/loss, actor/pg_loss, actor/kl_loss, actor/pg_clipfrac,
// actor/entropy; and actor/is_weight_mean, actor/is_masked_fraction, actor/tokens.
struct PolicyLossStats {
  double loss = 0, pg_loss = 0, kl = 0;   // L, −(1/N)ΣJ, (1/N)ΣK
  double clip_fraction = 0;               // tokens where the clip was active
  double is_weight_mean = 0;              // mean w_t
  double masked_fraction = 0;             // tokens with w_t = 0 from masking
  double entropy = 0;                     // mean entropy of the learner's distributions
  int64_t tokens = 0;
  nlohmann::json to_json() const;
};

// The loss over a batch and its gradient with respect to each l_t: learner_logp[i] holds l_t
// of sequence i, coef[i] receives ∂L/∂l_t (same shapes as learner_logp). entropy[i] (may be
// empty) is averaged into the stats. A batch without tokens gives zero stats and no
// coefficients. InputError on shape mismatches, non-finite log-probs or advantages, or a config
// out of range (clip_low in [0, 1), clip_high >= 0, kl_coef >= 0, is_cap > 0, 0 <= lo <= hi).
PolicyLossStats policy_loss(std::span<const SequenceLogprobs> seqs,
                            std::span<const std::vector<double>> learner_logp,
                            std::span<const std::vector<double>> entropy,
                            const PolicyLossConfig& config,
                            std::span<std::vector<double>> coef);

}  // namespace concord::rl
