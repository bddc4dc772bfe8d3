// Export rules (rne, sr, ef) from fp32 master weights to the served copy.
#include "concord/train/export.h"

#include <algorithm>
#include <unordered_map>

#include <fmt/format.h>

#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/numerics/error_feedback.h"

namespace concord::train {
namespace {

using numerics::Format;
using numerics::QuantDesc;
using numerics::Rounding;

class RoundingExport final : public ExportRule {
 public:
  RoundingExport(Format served, Rounding rounding, uint64_t seed)
      : desc_(QuantDesc::elementwise(served, rounding)), seed_(seed) {}
  std::string_view name() const override {
    return desc_.rounding == Rounding::stochastic ? "sr" : "rne";
  }
  void apply(int param, std::span<const float> master, std::span<float> served, int64_t rows,
             int64_t cols, uint64_t step) override {
    CONCORD_CHECK(master.size() == served.size(), "export: master and served sizes differ");
    if (desc_.element == Format::f32 || rows == 1) {
      std::copy(master.begin(), master.end(), served.begin());
      return;
    }
    // Random bits keyed by (seed, step, parameter): a fresh, reproducible draw every step.
    const numerics::RandomStream rng{seed_ ^ (0x9E3779B97F4A7C15ull * (step + 1)),
                                     static_cast<uint32_t>(param)};
    numerics::fake_quantize(desc_, master.data(), served.data(), rows, cols, rng);
  }

 private:
  QuantDesc desc_;
  uint64_t seed_;
};

class ErrorFeedbackExport final : public ExportRule {
 public:
  explicit ErrorFeedbackExport(Format served) : desc_(QuantDesc::elementwise(served)) {}
  std::string_view name() const override { return "ef"; }
  bool keeps_state() const override { return desc_.element != Format::f32; }
  void apply(int param, std::span<const float> master, std::span<float> served, int64_t rows,
             int64_t cols, uint64_t step) override {
    (void)step;
    if (desc_.element == Format::f32 || rows == 1) {
      std::copy(master.begin(), master.end(), served.begin());
      return;
    }
    auto it = quantizers_.find(param);
    if (it == quantizers_.end())
      it = quantizers_.emplace(param, numerics::ErrorFeedbackQuantizer(desc_, rows, cols)).first;
    it->second.step(master, served);
  }
  std::vector<std::pair<int, std::vector<float>>> state() const override {
    std::vector<std::pair<int, std::vector<float>>> out;
    for (const auto& [param, q] : quantizers_) out.emplace_back(param, std::vector<float>(q.error().begin(), q.error().end()));
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    return out;
  }
  void restore_state(int param, std::span<const float> values, int64_t rows, int64_t cols) override {
    if (rows < 1 || cols < 1 || values.size() != static_cast<size_t>(rows * cols))
      throw InputError(fmt::format("[export] ef: restored error of parameter {} has {} values, "
                                   "expected {} x {}", param, values.size(), rows, cols));
    auto it = quantizers_.find(param);
    if (it == quantizers_.end())
      it = quantizers_.emplace(param, numerics::ErrorFeedbackQuantizer(desc_, rows, cols)).first;
    it->second.set_error(values);
  }

 private:
  QuantDesc desc_;
  std::unordered_map<int, numerics::ErrorFeedbackQuantizer> quantizers_;
};

}  // namespace

void ExportRule::restore_state(int param, std::span<const float> values, int64_t rows, int64_t cols) {
  (void)values;
  (void)rows;
  (void)cols;
  throw InputError(fmt::format("[export] {}: keeps no state, yet a checkpoint holds state for parameter {}",
                               name(), param));
}

std::vector<std::string> export_rule_names() { return {"rne", "sr", "ef"}; }

void ExportRule::export_param(int param, const model::ParamSpec& spec, std::span<const float> master,
                              std::span<float> served, uint64_t step) {
  if (spec.served_in_f32()) {
    CONCORD_CHECK(master.size() == served.size(), "export: master and served sizes differ");
    std::copy(master.begin(), master.end(), served.begin());
    return;
  }
  apply(param, master, served, spec.shape[0], spec.shape[1], step);
}

std::unique_ptr<ExportRule> make_export_rule(std::string_view rule, Format served, uint64_t seed) {
  if (rule == "rne") return std::make_unique<RoundingExport>(served, Rounding::rne, seed);
  if (rule == "sr") return std::make_unique<RoundingExport>(served, Rounding::stochastic, seed);
  if (rule == "ef") return std::make_unique<ErrorFeedbackExport>(served);
  throw InputError(fmt::format("[export] unknown export rule '{}' (rne, sr, ef)", rule));
}

}  // namespace concord::train
