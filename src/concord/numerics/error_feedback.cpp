// Error-feedback quantizer (see error_feedback.h).
#include "concord/numerics/error_feedback.h"

#include <algorithm>
#include <string>

#include "concord/numerics/check.h"

namespace concord::numerics {

ErrorFeedbackQuantizer::ErrorFeedbackQuantizer(const QuantDesc& desc, int64_t rows, int64_t cols)
    : desc_(desc), rows_(rows), cols_(cols) {
  validate(desc, rows, cols);
  const auto n = static_cast<size_t>(rows * cols);
  error_.assign(n, 0.0f);
  carried_.resize(n);
  dequantized_.resize(n);
}

QuantizedTensor ErrorFeedbackQuantizer::step(std::span<const float> x, std::span<float> served,
                                             RandomStream rng) {
  if (x.size() != error_.size()) {
    throw InputError("[error-feedback] input has " + std::to_string(x.size()) +
                     " values, the quantizer was built for " + std::to_string(error_.size()));
  }
  for (size_t i = 0; i < x.size(); ++i) carried_[i] = x[i] + error_[i];
  QuantizedTensor q = quantize(desc_, carried_.data(), rows_, cols_, rng);
  dequantize(q, dequantized_.data());
  for (size_t i = 0; i < x.size(); ++i) error_[i] = carried_[i] - dequantized_[i];
  if (!served.empty()) {
    CONCORD_CHECK(served.size() == x.size(), "served buffer size");
    std::copy(dequantized_.begin(), dequantized_.end(), served.begin());
  }
  return q;
}

void ErrorFeedbackQuantizer::set_error(std::span<const float> e) {
  if (e.size() != error_.size()) {
    throw InputError("[error-feedback] restored error has " + std::to_string(e.size()) +
                     " values, expected " + std::to_string(error_.size()));
  }
  std::copy(e.begin(), e.end(), error_.begin());
}

void ErrorFeedbackQuantizer::reset() { std::fill(error_.begin(), error_.end(), 0.0f); }

}  // namespace concord::numerics
