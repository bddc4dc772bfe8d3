// Depth recurrence (ConcordRecurrentForCausalLM, Huginn-style; docs/recurrence.md): the plan of
// block applications at a depth, the initial state, the adapter, and the Model's settings. The
// passes (model.cpp, decode.cpp, model_backward.cpp) run the plan.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "concord/model/block.h"
#include "concord/model/model_impl.h"
#include "concord/numerics/check.h"
#include "concord/numerics/philox.h"

namespace concord::model {

void Model::Impl::build_plan() {
  const ModelConfig& c = config;
  const int64_t A = c.applications_at(depth);
  plan.assign(static_cast<size_t>(A), Application{});
  std::vector<int> seen(static_cast<size_t>(c.num_hidden_layers), 0);
  const int64_t P = c.n_layers_in_prelude, R = c.n_layers_in_recurrent_block;
  for (int64_t a = 0; a < A; ++a) {
    Application& ap = plan[static_cast<size_t>(a)];
    ap.block = c.block_of_at(a, depth);
    ap.repeat = seen[static_cast<size_t>(ap.block)]++;
    if (c.recurrent() && a >= P && a < P + depth * R) {
      ap.iteration = static_cast<int>((a - P) / R);
      ap.core_layer = static_cast<int>((a - P) % R);
      ap.enters_iteration = ap.core_layer == 0;
    }
  }
}

int64_t Model::Impl::cache_row_set(int64_t app, int64_t core_slots) const {
  const ModelConfig& c = config;
  if (!c.recurrent()) return app;
  const int64_t P = c.n_layers_in_prelude, R = c.n_layers_in_recurrent_block;
  const Application& ap = plan[static_cast<size_t>(app)];
  if (app < P) return app;
  if (ap.iteration >= 0) return P + (ap.iteration % core_slots) * R + ap.core_layer;
  return P + core_slots * R + (app - P - depth * R);  // the coda
}

std::vector<float> recurrent_initial_state(const ModelConfig& config, uint64_t seed, int64_t position) {
  if (!config.recurrent())
    throw InputError(fmt::format("[model] recurrent_initial_state: {} is not recurrent", config.architecture));
  const int64_t C = config.hidden_size;
  std::vector<float> s(static_cast<size_t>(C), 0.0f);
  if (config.state_init == "zero") return s;
  const numerics::RandomStream rng{seed, static_cast<uint32_t>(position)};
  for (int64_t c = 0; c < C; ++c) {
    double z = 0.0;
    for (uint64_t attempt = 0; attempt < 64; ++attempt) {
      // Box-Muller on one Philox block; |z| <= 3 holds with probability 0.9973 per attempt, so
      // 64 attempts all failing (probability 1e-164) never happens; z stays 0 then.
      const numerics::PhiloxBlock w = rng.block(static_cast<uint64_t>(c) * 64 + attempt);
      const double u1 = (static_cast<double>(w[0]) + 1.0) / 4294967297.0;  // (0, 1]
      const double u2 = static_cast<double>(w[1]) / 4294967296.0;
      const double cand = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
      if (std::abs(cand) <= 3.0) {
        z = cand;
        break;
      }
    }
    s[static_cast<size_t>(c)] = static_cast<float>(z * config.state_init_std);
  }
  return s;
}

void Model::Impl::initial_state(float* s, const int32_t* pos, int64_t T) const {
  const int64_t C = config.hidden_size;
  if (config.state_init == "zero") {
    std::fill(s, s + T * C, 0.0f);
    return;
  }
#pragma omp parallel for schedule(static) if (T > 16)
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> row = recurrent_initial_state(config, state_seed, pos[t]);
    std::memcpy(s + t * C, row.data(), sizeof(float) * static_cast<size_t>(C));
  }
}

void Model::Impl::adapter_forward(const float* s, const float* e, int64_t T, float* cat, float* x,
                                  std::span<const int64_t> row_splits) {
  const int64_t C = config.hidden_size;
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(cat + t * 2 * C, s + t * C, sizeof(float) * static_cast<size_t>(C));
    std::memcpy(cat + t * 2 * C + C, e + t * C, sizeof(float) * static_cast<size_t>(C));
  }
  const int L = static_cast<int>(config.num_hidden_layers);
  linear_forward_rows(policy.for_layer(LayerClass::mlp, -1, L), adapter, cat, T, x, row_splits);
}

static Model::Impl& recurrent_impl(Model::Impl& m, const char* what) {
  if (!m.config.recurrent())
    throw InputError(fmt::format("[model] {}: {} is not a depth-recurrent model "
                                 "(ConcordRecurrentForCausalLM)", what, m.config.architecture));
  return m;
}

void Model::set_depth(int64_t depth) {
  Impl& m = recurrent_impl(*impl_, "set_depth");
  if (depth < 1 || depth > 4096)
    throw InputError(fmt::format("[model] set_depth: depth {} outside 1..4096", depth));
  if (m.depth == depth) return;
  m.depth = depth;
  m.build_plan();
}

int64_t Model::depth() const { return impl_->depth; }
int64_t Model::backprop_iterations() const { return impl_->backprop_iterations; }

void Model::set_backprop_iterations(int64_t k) {
  Impl& m = recurrent_impl(*impl_, "set_backprop_iterations");
  if (k < 0) throw InputError(fmt::format("[model] set_backprop_iterations: {} < 0", k));
  m.backprop_iterations = k;
}

void Model::set_state_seed(uint64_t seed) { recurrent_impl(*impl_, "set_state_seed").state_seed = seed; }

void Model::set_adaptive_exit(std::optional<AdaptiveExit> exit) {
  Impl& m = recurrent_impl(*impl_, "set_adaptive_exit");
  if (exit && (!(exit->kl_threshold >= 0) || exit->max_iterations < 0 || exit->max_iterations > 4096))
    throw InputError(fmt::format("[model] set_adaptive_exit: kl_threshold {} must be >= 0 and "
                                 "max_iterations {} in 0..4096", exit->kl_threshold, exit->max_iterations));
  m.adaptive_exit = exit;
}

std::vector<int32_t> Model::last_iterations() const { return impl_->iterations_used; }
bool Model::adaptive_exit_on() const { return impl_->config.recurrent() && impl_->adaptive_exit.has_value(); }

}  // namespace concord::model
