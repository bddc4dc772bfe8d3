// GRPO advantages and the PPO-clip loss with IS correction and k3 KL, per token, in double
// (the formulas are in grpo.h; docs/rl.md explains them with verl's and NeMo-RL's names).
#include "concord/rl/grpo.h"

#include <algorithm>
#include <array>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/numerics/check.h"

namespace concord::rl {

namespace {

struct IsModeName {
  IsMode mode;
  std::string_view name;
};
constexpr std::array<IsModeName, 5> kIsModes{{{IsMode::none, "none"},
                                              {IsMode::token_tis, "token_tis"},
                                              {IsMode::seq_tis, "seq_tis"},
                                              {IsMode::token_mask, "token_mask"},
                                              {IsMode::seq_mask, "seq_mask"}}};

void check_config(const PolicyLossConfig& c) {
  auto fail = [](const std::string& what) { throw InputError("[rl] policy loss: " + what); };
  if (!(c.clip_low >= 0 && c.clip_low < 1))
    fail(fmt::format("clip_low {} must be in [0, 1)", c.clip_low));
  if (!(c.clip_high >= 0) || !std::isfinite(c.clip_high))
    fail(fmt::format("clip_high {} must be finite and >= 0", c.clip_high));
  if (!(c.kl_coef >= 0) || !std::isfinite(c.kl_coef))
    fail(fmt::format("kl_coef {} must be finite and >= 0", c.kl_coef));
  if (!(c.is_cap > 0) || !std::isfinite(c.is_cap))
    fail(fmt::format("is_cap {} must be finite and > 0", c.is_cap));
  if (!(c.mask_lo >= 0 && c.mask_lo <= c.mask_hi) || !std::isfinite(c.mask_hi))
    fail(fmt::format("mask range [{}, {}] must satisfy 0 <= lo <= hi < inf", c.mask_lo,
                     c.mask_hi));
}

void check_finite(std::span<const double> v, const char* what, size_t seq) {
  for (size_t t = 0; t < v.size(); ++t)
    if (!std::isfinite(v[t]))
      throw InputError(fmt::format("[rl] policy loss: sequence {} token {}: {} log-prob {} is not "
                                   "finite", seq, t, what, v[t]));
}

}  // namespace

std::string_view is_mode_name(IsMode m) {
  for (const IsModeName& e : kIsModes)
    if (e.mode == m) return e.name;
  return "?";
}

std::vector<std::string> is_mode_names() {
  std::vector<std::string> names;
  for (const IsModeName& e : kIsModes) names.emplace_back(e.name);
  return names;
}

IsMode is_mode_from_name(std::string_view name) {
  for (const IsModeName& e : kIsModes)
    if (e.name == name) return e.mode;
  throw InputError(fmt::format("[rl] unknown importance-sampling mode '{}'; use one of: {}", name,
                               fmt::join(is_mode_names(), ", ")));
}

nlohmann::json PolicyLossStats::to_json() const {
  return {{"actor/loss", loss},
          {"actor/pg_loss", pg_loss},
          {"actor/kl_loss", kl},
          {"actor/pg_clipfrac", clip_fraction},
          {"actor/is_weight_mean", is_weight_mean},
          {"actor/is_masked_fraction", masked_fraction},
          {"actor/entropy", entropy},
          {"actor/tokens", tokens}};
}

std::vector<double> group_advantages(std::span<const double> rewards, int64_t group_size,
                                     bool normalize_std, double eps) {
  if (group_size <= 0)
    throw InputError(fmt::format("[rl] advantages: group size {} must be > 0", group_size));
  const size_t g = static_cast<size_t>(group_size);
  if (rewards.size() % g != 0)
    throw InputError(fmt::format("[rl] advantages: {} rewards do not split into groups of {}",
                                 rewards.size(), group_size));
  if (!(eps >= 0) || !std::isfinite(eps))
    throw InputError(fmt::format("[rl] advantages: eps {} must be finite and >= 0", eps));
  for (size_t i = 0; i < rewards.size(); ++i)
    if (!std::isfinite(rewards[i]))
      throw InputError(fmt::format("[rl] advantages: reward {} of sequence {} is not finite",
                                   rewards[i], i));
  std::vector<double> adv(rewards.size());
  for (size_t start = 0; start < rewards.size(); start += g) {
    const std::span<const double> group = rewards.subspan(start, g);
    double mean = 0;
    for (double r : group) mean += r;
    mean /= static_cast<double>(g);
    double var = 0;
    for (double r : group) var += (r - mean) * (r - mean);
    const double std_dev = std::sqrt(var / static_cast<double>(g));
    for (size_t i = 0; i < g; ++i) {
      const double centered = group[i] - mean;
      adv[start + i] = normalize_std ? centered / (std_dev + eps) : centered;
    }
  }
  return adv;
}

PolicyLossStats policy_loss(std::span<const SequenceLogprobs> seqs,
                            std::span<const std::vector<double>> learner_logp,
                            std::span<const std::vector<double>> entropy,
                            const PolicyLossConfig& config,
                            std::span<std::vector<double>> coef) {
  check_config(config);
  if (learner_logp.size() != seqs.size() || coef.size() != seqs.size())
    throw InputError(fmt::format("[rl] policy loss: {} sequences but {} learner log-prob rows and "
                                 "{} coefficient rows", seqs.size(), learner_logp.size(),
                                 coef.size()));
  if (!entropy.empty() && entropy.size() != seqs.size())
    throw InputError(fmt::format("[rl] policy loss: {} sequences but {} entropy rows", seqs.size(),
                                 entropy.size()));
  int64_t n_tokens = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceLogprobs& s = seqs[i];
    const size_t n = learner_logp[i].size();
    const bool ref_ok = s.ref_logp.size() == n || (s.ref_logp.empty() && config.kl_coef == 0);
    if (s.old_logp.size() != n || s.sampler_logp.size() != n || !ref_ok ||
        (!entropy.empty() && entropy[i].size() != n))
      throw InputError(fmt::format(
          "[rl] policy loss: sequence {} has {} learner log-probs but {} old, {} sampler, {} "
          "reference{} (all must match; reference log-probs are needed when kl_coef > 0)",
          i, n, s.old_logp.size(), s.sampler_logp.size(), s.ref_logp.size(),
          entropy.empty() ? "" : fmt::format(", {} entropies", entropy[i].size())));
    if (!std::isfinite(s.advantage))
      throw InputError(fmt::format("[rl] policy loss: sequence {} advantage {} is not finite", i,
                                   s.advantage));
    check_finite(learner_logp[i], "learner", i);
    check_finite(s.old_logp, "old", i);
    check_finite(s.sampler_logp, "sampler", i);
    check_finite(s.ref_logp, "reference", i);
    n_tokens += static_cast<int64_t>(n);
  }

  PolicyLossStats stats;
  stats.tokens = n_tokens;
  for (size_t i = 0; i < seqs.size(); ++i) coef[i].assign(learner_logp[i].size(), 0.0);
  if (n_tokens == 0) return stats;  // nothing to learn from: zero loss, no coefficients
  const double inv_n = 1.0 / static_cast<double>(n_tokens);
  const double lo = 1 - config.clip_low, hi = 1 + config.clip_high;
  double sum_j = 0, sum_k = 0, sum_w = 0, sum_entropy = 0;
  int64_t clipped = 0, masked = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SequenceLogprobs& s = seqs[i];
    const std::vector<double>& l = learner_logp[i];
    const size_t n = l.size();
    const double a = s.advantage;
    // The sequence-level ratio sampler → learner(θ_old), exp(Σ_t (o_t − s_t)).
    double seq_log_ratio = 0;
    for (size_t t = 0; t < n; ++t) seq_log_ratio += s.old_logp[t] - s.sampler_logp[t];
    const double seq_ratio = std::exp(seq_log_ratio);
    for (size_t t = 0; t < n; ++t) {
      const double token_ratio = std::exp(s.old_logp[t] - s.sampler_logp[t]);
      double w = 1;
      switch (config.is) {
        case IsMode::none: break;
        case IsMode::token_tis: w = std::min(token_ratio, config.is_cap); break;
        case IsMode::seq_tis: w = std::min(seq_ratio, config.is_cap); break;
        case IsMode::token_mask:
          w = token_ratio >= config.mask_lo && token_ratio <= config.mask_hi ? 1.0 : 0.0;
          break;
        case IsMode::seq_mask:
          w = seq_ratio >= config.mask_lo && seq_ratio <= config.mask_hi ? 1.0 : 0.0;
          break;
      }
      const bool is_mask = config.is == IsMode::token_mask || config.is == IsMode::seq_mask;
      masked += is_mask && w == 0;
      sum_w += w;

      const double rho = std::exp(l[t] - s.old_logp[t]);
      const double unclipped = rho * a;
      const double clipped_value = std::clamp(rho, lo, hi) * a;
      // min(ρA, clip(ρ)A): where the clipped term is the smaller one it is constant in l_t.
      const bool clip_active = clipped_value < unclipped;
      clipped += clip_active;
      double d_loss = 0;  // ∂L/∂l_t
      if (w != 0) {
        sum_j += w * (clip_active ? clipped_value : unclipped);
        if (!clip_active) d_loss -= inv_n * w * unclipped;  // ∂(ρA)/∂l = ρA
      }
      if (!s.ref_logp.empty()) {
        const double diff = s.ref_logp[t] - l[t];  // q − l
        const double e = std::exp(diff);
        sum_k += e - diff - 1;
        d_loss += config.kl_coef * inv_n * (1 - e);  // ∂K/∂l = −e^{q−l} + 1
      }
      coef[i][t] = d_loss;
      if (!entropy.empty()) sum_entropy += entropy[i][t];
    }
  }
  stats.pg_loss = -sum_j * inv_n;
  stats.kl = sum_k * inv_n;
  stats.loss = stats.pg_loss + config.kl_coef * stats.kl;
  stats.clip_fraction = static_cast<double>(clipped) * inv_n;
  stats.is_weight_mean = sum_w * inv_n;
  stats.masked_fraction = static_cast<double>(masked) * inv_n;
  stats.entropy = sum_entropy * inv_n;
  return stats;
}

}  // namespace concord::rl
