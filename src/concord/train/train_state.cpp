// The training state of a run (see train_state.h).
#include "concord/train/train_state.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "concord/io/safetensors.h"
#include "concord/numerics/check.h"
#include "concord/train/binary.h"

namespace concord::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::vector<std::vector<float>> values_of(model::Model& m) {
  std::vector<std::vector<float>> out;
  for (const model::ParamSpec& p : m.params()) {
    const auto v = m.param(p.name);
    out.emplace_back(v.begin(), v.end());
  }
  return out;
}

}  // namespace

TrainState::TrainState(const model::ModelConfig& config, const model::PrecisionPolicy& served_policy,
                       std::string_view export_rule, uint64_t seed, const OptimizerConfig& optimizer,
                       std::vector<std::vector<float>> initial)
    : specs_(model::parameter_specs(config)),
      master_(std::move(initial)),
      exporter_(make_export_rule(export_rule, served_policy.served_weights, seed)),
      optimizer_(make_optimizer(optimizer)) {
  if (master_.size() != specs_.size())
    throw InputError(fmt::format("[train] the initial weights hold {} tensors, the model {}", master_.size(),
                                 specs_.size()));
  for (size_t p = 0; p < specs_.size(); ++p)
    if (static_cast<int64_t>(master_[p].size()) != specs_[p].numel())
      throw InputError(fmt::format("[train] initial weight '{}' has {} values, the model {}", specs_[p].name,
                                   master_[p].size(), specs_[p].numel()));
  binary_rows_.assign(specs_.size(), 0);
  if (optimizer.is_binary()) {
    for (size_t p = 0; p < specs_.size(); ++p)
      if (is_binary_param(specs_[p], optimizer.binary)) binary_rows_[p] = specs_[p].shape[0];
    optimizer_->initialize(views({}));
  }
}

std::vector<ParamView> TrainState::views(std::span<const std::span<const float>> grads) {
  std::vector<ParamView> out;
  out.reserve(specs_.size());
  for (size_t p = 0; p < specs_.size(); ++p)
    out.push_back({specs_[p].name, master_[p], grads.empty() ? std::span<const float>{} : grads[p],
                   specs_[p].is_matrix(), binary_rows_[p]});
  return out;
}

int64_t TrainState::binary_weights() const {
  int64_t n = 0;
  for (size_t p = 0; p < specs_.size(); ++p)
    if (binary_rows_[p] > 0) n += specs_[p].numel();
  return n;
}

TrainState::TrainState(model::Model& m, const model::PrecisionPolicy& served_policy, std::string_view export_rule,
                       uint64_t seed, const OptimizerConfig& optimizer)
    : TrainState(m.config(), served_policy, export_rule, seed, optimizer, values_of(m)) {}

TrainState::~TrainState() = default;
TrainState::TrainState(TrainState&&) noexcept = default;
TrainState& TrainState::operator=(TrainState&&) noexcept = default;

std::vector<TensorView> TrainState::master_views() const {
  std::vector<TensorView> views;
  views.reserve(specs_.size());
  for (size_t p = 0; p < specs_.size(); ++p) views.push_back({specs_[p].name, specs_[p].shape, master_[p]});
  return views;
}

void TrainState::export_to(model::Model& served, int64_t step) {
  for (size_t p = 0; p < specs_.size(); ++p)
    exporter_->export_param(static_cast<int>(p), specs_[p], master_[p], served.param(specs_[p].name),
                            static_cast<uint64_t>(step));
  served.weights_changed();
}

void TrainState::copy_master_to(model::Model& m) const {
  for (size_t p = 0; p < specs_.size(); ++p) std::ranges::copy(master_[p], m.param(specs_[p].name).begin());
  m.weights_changed();
}

double TrainState::step(model::Model& grads_from, double lr) {
  std::vector<std::span<const float>> grads;
  grads.reserve(specs_.size());
  for (const model::ParamSpec& spec : specs_) grads.push_back(grads_from.grad(spec.name));
  return optimizer_->step(views(grads), lr);
}

std::vector<NamedTensor> TrainState::export_state() const {
  return export_state_tensors(*exporter_, master_views());
}

fs::path TrainState::save(const fs::path& run_dir, int64_t step, json state, int keep,
                          std::span<const NamedTensor> extra,
                          const std::vector<NamedTensor>* export_state_override) const {
  const std::vector<TensorView> model_views = master_views();
  const std::vector<TensorView> optimizer_views = optimizer_->state_views(model_views);
  const std::vector<NamedTensor> exported =
      export_state_override ? std::vector<NamedTensor>{} : export_state();
  const std::vector<NamedTensor>& rule_state = export_state_override ? *export_state_override : exported;
  std::vector<TensorView> state_views;
  for (const NamedTensor& t : extra) state_views.push_back({t.name, t.shape, t.values});
  for (const NamedTensor& t : rule_state) state_views.push_back({t.name, t.shape, t.values});
  state["optimizer_steps"] = optimizer_->steps_taken();
  return save_checkpoint(run_dir, step, model_views, optimizer_views, state, keep, state_views);
}

void TrainState::restore(const LoadedCheckpoint& ckpt, std::string_view layer) {
  const fs::path model_file = ckpt.dir / "model.safetensors";
  std::vector<std::vector<float>> master(specs_.size());
  for (size_t p = 0; p < specs_.size(); ++p) {
    const NamedTensor* t = find_tensor(ckpt.model, specs_[p].name);
    if (t == nullptr || t->values.size() != master_[p].size())
      throw InputError(fmt::format("[{}] {}: tensor '{}' is missing or has the wrong size", layer,
                                   model_file.string(), specs_[p].name));
    master[p] = t->values;
  }
  const json& steps = ckpt.state.contains("optimizer_steps") ? ckpt.state.at("optimizer_steps") : json(ckpt.step);
  if (!steps.is_number_integer() || steps.get<int64_t>() < 0)
    throw InputError(fmt::format("[{}] {}: 'optimizer_steps' must be an integer >= 0, got {}", layer,
                                 (ckpt.dir / "state.json").string(), steps.dump()));
  master_ = std::move(master);
  const std::vector<TensorView> views = master_views();
  try {
    optimizer_->restore_state(ckpt.optimizer, views, steps.get<int64_t>());
  } catch (const InputError& e) {
    throw InputError(fmt::format("[{}] {}: {}", layer, (ckpt.dir / "optimizer.safetensors").string(), e.what()));
  }
  restore_export_state(*exporter_, ckpt.state_tensors, views, ckpt.dir / "state.safetensors");
}

}  // namespace concord::train
