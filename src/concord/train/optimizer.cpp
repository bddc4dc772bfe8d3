// AdamW, the learning-rate schedule and the global gradient norm (see optimizer.h).
#include "concord/train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "concord/numerics/check.h"
#include "concord/train/binary.h"

namespace concord::train {
namespace {

// Elementwise loops below this size stay on one thread (a parallel region costs more).
constexpr int64_t kParallelMin = 1 << 15;

}  // namespace

void LrSchedule::validate() const {
  if (!(peak_lr >= 0.0) || !(min_lr >= 0.0) || !std::isfinite(peak_lr) || !std::isfinite(min_lr)) {
    throw InputError(fmt::format(
        "[schedule] learning rates must be finite and >= 0 (peak {}, min {})", peak_lr, min_lr));
  }
  if (warmup_steps < 0 || total_steps < 0 || total_steps < warmup_steps) {
    throw InputError(fmt::format(
        "[schedule] need 0 <= warmup_steps <= total_steps (warmup {}, total {}); shorten the "
        "warmup or train longer",
        warmup_steps, total_steps));
  }
}

double LrSchedule::at(int64_t step) const {
  validate();
  if (step < 0) throw InputError(fmt::format("[schedule] step {} is negative", step));
  if (step < warmup_steps) {
    return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (step >= total_steps) return min_lr;  // also covers total == warmup (no decay phase)
  const double progress = static_cast<double>(step - warmup_steps) /
                          static_cast<double>(total_steps - warmup_steps);
  return min_lr + (peak_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

double global_grad_norm(std::span<const ParamView> params) {
  // The blocks, in parameter order: (parameter, first element).
  std::vector<std::pair<size_t, int64_t>> blocks;
  for (size_t p = 0; p < params.size(); ++p) {
    const auto n = static_cast<int64_t>(params[p].grad.size());
    for (int64_t begin = 0; begin < n; begin += kNormBlock) blocks.emplace_back(p, begin);
  }
  std::vector<double> partial(blocks.size(), 0.0);
  const auto block_count = static_cast<int64_t>(blocks.size());
#pragma omp parallel for schedule(static) if (block_count > 2)
  for (int64_t b = 0; b < block_count; ++b) {
    const auto [p, begin] = blocks[static_cast<size_t>(b)];
    const std::span<const float> g = params[p].grad;
    const int64_t end = std::min<int64_t>(begin + kNormBlock, static_cast<int64_t>(g.size()));
    double sum = 0.0;
    for (int64_t i = begin; i < end; ++i) {
      const double x = g[static_cast<size_t>(i)];
      sum += x * x;
    }
    partial[static_cast<size_t>(b)] = sum;
  }
  double total = 0.0;
  for (const double s : partial) total += s;
  return std::sqrt(total);
}

AdamW::AdamW(AdamWConfig config) : config_(config) {
  const AdamWConfig& c = config_;
  if (!(c.beta1 >= 0.0 && c.beta1 < 1.0) || !(c.beta2 >= 0.0 && c.beta2 < 1.0)) {
    throw InputError(fmt::format("[adamw] betas must lie in [0, 1) (beta1 {}, beta2 {})",
                                 c.beta1, c.beta2));
  }
  if (!(c.eps > 0.0) || !(c.weight_decay >= 0.0) || std::isnan(c.grad_clip)) {
    throw InputError(fmt::format(
        "[adamw] need eps > 0 and weight_decay >= 0 (eps {}, weight_decay {}, grad_clip {})",
        c.eps, c.weight_decay, c.grad_clip));
  }
}

double AdamW::step(std::span<const ParamView> params, double lr) {
  if (!std::isfinite(lr) || lr < 0.0) {
    throw InputError(fmt::format("[adamw] learning rate {} must be finite and >= 0", lr));
  }
  for (const ParamView& p : params) {
    if (p.value.size() != p.grad.size()) {
      throw InputError(fmt::format("[adamw] parameter '{}' has {} values but {} gradients",
                                   p.name, p.value.size(), p.grad.size()));
    }
    const auto it = state_.find(p.name);
    if (it != state_.end() && it->second.exp_avg.size() != p.value.size()) {
      throw InputError(fmt::format(
          "[adamw] parameter '{}' has {} values but its optimizer state has {} (a checkpoint of "
          "another model shape?)",
          p.name, p.value.size(), it->second.exp_avg.size()));
    }
  }
  const double norm = global_grad_norm(params);
  if (!std::isfinite(norm)) return norm;  // skipped: see the header

  const double clip_scale =
      (config_.grad_clip > 0.0 && norm > config_.grad_clip) ? config_.grad_clip / norm : 1.0;
  const int64_t t = steps_ + 1;
  apply(params, lr, clip_scale, t);
  steps_ = t;
  return norm;
}

AdamWElement::AdamWElement(const AdamWConfig& c, double lr, int64_t t, bool decay)
    : beta1(c.beta1),
      beta2(c.beta2),
      eps(c.eps),
      step_size(lr / (1.0 - std::pow(c.beta1, static_cast<double>(t)))),
      bias2_sqrt(std::sqrt(1.0 - std::pow(c.beta2, static_cast<double>(t)))),
      decay_factor(decay ? 1.0 - lr * c.weight_decay : 1.0) {}

void AdamW::apply(std::span<const ParamView> params, double lr, double clip_scale, int64_t t) {
  for (const ParamView& p : params) {
    Moments& st = state_[std::string(p.name)];
    if (st.exp_avg.empty() && !p.value.empty()) {
      st.exp_avg.assign(p.value.size(), 0.0f);
      st.exp_avg_sq.assign(p.value.size(), 0.0f);
    }
    const AdamWElement update(config_, lr, t, p.decay);
    float* value = p.value.data();
    const float* grad = p.grad.data();
    float* m = st.exp_avg.data();
    float* v = st.exp_avg_sq.data();
    const auto n = static_cast<int64_t>(p.value.size());
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) update(value[i], m[i], v[i], static_cast<double>(grad[i]) * clip_scale);
  }
}

OptimizerMemory AdamW::memory() const {
  OptimizerMemory out;
  for (const auto& [name, st] : state_) {
    out.other_weights += static_cast<int64_t>(st.exp_avg.size());
    out.other_bytes += static_cast<int64_t>((st.exp_avg.capacity() + st.exp_avg_sq.capacity()) * sizeof(float));
  }
  return out;
}

const AdamW::Moments& AdamW::moments(std::string_view name) const {
  const auto it = state_.find(name);
  if (it == state_.end()) {
    throw InputError(fmt::format("[adamw] no optimizer state for parameter '{}'", name));
  }
  return it->second;
}

std::vector<std::string> AdamW::state_names() const {
  std::vector<std::string> names;
  names.reserve(state_.size());
  for (const auto& [name, st] : state_) names.push_back(name);
  return names;
}

bool AdamW::has_state(std::string_view name) const { return state_.find(name) != state_.end(); }

std::span<const float> AdamW::exp_avg(std::string_view name) const {
  return moments(name).exp_avg;
}

std::span<const float> AdamW::exp_avg_sq(std::string_view name) const {
  return moments(name).exp_avg_sq;
}

void AdamW::set_state(std::string_view name, std::span<const float> exp_avg,
                      std::span<const float> exp_avg_sq) {
  if (exp_avg.size() != exp_avg_sq.size()) {
    throw InputError(fmt::format("[adamw] parameter '{}': exp_avg has {} values, exp_avg_sq {}",
                                 name, exp_avg.size(), exp_avg_sq.size()));
  }
  Moments& st = state_[std::string(name)];
  st.exp_avg.assign(exp_avg.begin(), exp_avg.end());
  st.exp_avg_sq.assign(exp_avg_sq.begin(), exp_avg_sq.end());
}

void AdamW::set_steps_taken(int64_t steps) {
  if (steps < 0) throw InputError(fmt::format("[adamw] step count {} is negative", steps));
  steps_ = steps;
}

void AdamW::clear_state() {
  state_.clear();
  steps_ = 0;
}

std::vector<TensorView> AdamW::state_views(std::span<const TensorView> params) const {
  std::vector<TensorView> views;
  for (const TensorView& param : params) {
    if (!has_state(param.name)) continue;
    views.push_back({param.name + ".exp_avg", param.shape, exp_avg(param.name)});
    views.push_back({param.name + ".exp_avg_sq", param.shape, exp_avg_sq(param.name)});
  }
  return views;
}

void AdamW::restore_state(std::span<const NamedTensor> tensors, std::span<const TensorView> params,
                          int64_t steps_taken) {
  std::map<std::string, std::pair<const NamedTensor*, const NamedTensor*>> pairs;
  for (const NamedTensor& t : tensors) {
    std::string_view name = t.name;
    if (name.ends_with(".exp_avg")) {
      name.remove_suffix(8);
      pairs[std::string(name)].first = &t;
    } else if (name.ends_with(".exp_avg_sq")) {
      name.remove_suffix(11);
      pairs[std::string(name)].second = &t;
    } else {
      throw InputError(fmt::format("[checkpoint] optimizer tensor '{}' is not an AdamW moment",
                                   t.name));
    }
  }
  for (const auto& [name, pair] : pairs) {
    if (pair.first == nullptr || pair.second == nullptr) {
      throw InputError(fmt::format("[checkpoint] parameter '{}' has only one of exp_avg and "
                                   "exp_avg_sq",
                                   name));
    }
    if (params.empty()) continue;
    const auto param = std::find_if(params.begin(), params.end(),
                                    [&](const TensorView& v) { return v.name == name; });
    if (param == params.end() || param->values.size() != pair.first->values.size())
      throw InputError(fmt::format("[checkpoint] optimizer state of '{}' ({} values) matches no "
                                   "parameter of that size",
                                   name, pair.first->values.size()));
  }
  if (steps_taken < 0)
    throw InputError(fmt::format("[checkpoint] optimizer step count {} is negative", steps_taken));
  clear_state();
  for (const auto& [name, pair] : pairs) set_state(name, pair.first->values, pair.second->values);
  set_steps_taken(steps_taken);
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config) {
  if (config.name == "adamw") return std::make_unique<AdamW>(config.adamw);
  if (config.name == "latent-adamw")
    return std::make_unique<BinaryOptimizer>(BinaryMethod::latent_adamw, config.binary, config.adamw);
  if (config.name == "bop") return std::make_unique<BinaryOptimizer>(BinaryMethod::bop, config.binary, config.adamw);
  if (config.name == "ed") return std::make_unique<BinaryOptimizer>(BinaryMethod::ed, config.binary, config.adamw);
  throw InputError(fmt::format("[optimizer] unknown optimizer '{}' (known: {})", config.name,
                               fmt::join(optimizer_names(), ", ")));
}

std::vector<std::string> optimizer_names() { return {"adamw", "latent-adamw", "bop", "ed"}; }

namespace {
// The binary optimizers' keys kept one value per output channel.
constexpr std::string_view kPerRowKeys[] = {"alpha", "alpha_exp_avg", "alpha_exp_avg_sq"};
}  // namespace

std::vector<std::string> optimizer_state_keys() {
  // Longer keys first: "alpha_exp_avg_sq" must not be read as "<param>.alpha_exp_avg" + "_sq".
  std::vector<std::string> keys = {"alpha_exp_avg_sq", "alpha_exp_avg", "exp_avg_sq", "exp_avg", "alpha",
                                   "row_grad_sq", "col_grad_sq", "grad_sq", "sign", "residual", "latent", "bop_ema"};
  return keys;
}

std::vector<int64_t> optimizer_state_shape(std::string_view key, std::span<const int64_t> param_shape) {
  for (std::string_view k : kPerRowKeys)
    if (k == key) return {param_shape.empty() ? 0 : param_shape[0]};
  if (key == "grad_sq") return {1};  // ed rms: the per-tensor statistic
  if (key == "row_grad_sq") return {param_shape.empty() ? 0 : param_shape[0]};  // ed factored: per row
  if (key == "col_grad_sq") return {param_shape.size() < 2 ? 0 : param_shape[1]};  // and per column
  return {param_shape.begin(), param_shape.end()};
}

}  // namespace concord::train
