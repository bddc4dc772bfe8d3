// Export rules: how the fp32 master weights become the served copy the forward pass uses.
//   rne  round to nearest even into the served format (the baseline; a small update that does not
//        cross half a served ulp is lost every step)
//   sr   stochastic rounding, random bits keyed by (seed, step, parameter): unbiased
//   ef   error feedback: the rounding error of each step is carried into the next
// Norm weights (1-D) are served in fp32 whatever the format (the policy keeps norms in fp32).
// ef keeps state (the carried error): state()/restore_state() hand it to checkpoints (the trainer
// and the RL loop save it as "export.<name>" in state.safetensors; train/checkpoint.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "concord/model/params.h"
#include "concord/numerics/format.h"

namespace concord::train {

class ExportRule {
 public:
  virtual ~ExportRule() = default;
  virtual std::string_view name() const = 0;
  // Write the served copy of parameter `param` (rows x cols; rows = 1 for 1-D) for `step`.
  virtual void apply(int param, std::span<const float> master, std::span<float> served,
                     int64_t rows, int64_t cols, uint64_t step) = 0;
  // The served copy of registered parameter `spec` (index `param`): the fp32 values for a
  // parameter served in f32 (ParamSpec::served_in_f32), else apply() on its rows and columns.
  void export_param(int param, const model::ParamSpec& spec, std::span<const float> master,
                    std::span<float> served, uint64_t step);

  // The state a checkpoint must hold to continue bit-identically: (parameter, values) for each
  // parameter with state (ef: its carried error, rows x cols); empty for stateless rules.
  virtual std::vector<std::pair<int, std::vector<float>>> state() const { return {}; }
  // Whether state() is non-empty once a matrix has been exported (ef into a format narrower
  // than f32): a checkpoint of such a rule without state cannot continue bit-identically.
  virtual bool keeps_state() const { return false; }
  // Puts back one entry of state(); InputError for a rule without state or a size mismatch.
  virtual void restore_state(int param, std::span<const float> values, int64_t rows, int64_t cols);
};

// rne | sr | ef into `served`; f32 makes every rule a copy. seed keys sr's random bits.
std::unique_ptr<ExportRule> make_export_rule(std::string_view rule, numerics::Format served,
                                             uint64_t seed);
std::vector<std::string> export_rule_names();

}  // namespace concord::train
