// Error-feedback quantizer (Fair Cast's "ef" export): a stateful quantizer that carries the
// rounding error of one step into the next, so that small updates accumulate instead of
// vanishing:  v = x + e;  q = Q(v);  e <- v - deq(q).
// Under RNE without saturation the carried error stays within half a quantum (one ulp of the
// target format at v) — the bound is tested in tests/numerics/error_feedback_test.cpp.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "concord/numerics/block.h"

namespace concord::numerics {

class ErrorFeedbackQuantizer {
 public:
  ErrorFeedbackQuantizer(const QuantDesc& desc, int64_t rows, int64_t cols);

  // Quantizes x + carried error; updates the error. If served is not null it receives deq(q).
  QuantizedTensor step(std::span<const float> x, std::span<float> served = {},
                       RandomStream rng = {});

  std::span<const float> error() const { return error_; }
  void set_error(std::span<const float> e);  // restore from a checkpoint
  void reset();
  const QuantDesc& desc() const { return desc_; }

 private:
  QuantDesc desc_;
  int64_t rows_, cols_;
  std::vector<float> error_;
  std::vector<float> carried_;  // v = x + e
  std::vector<float> dequantized_;
};

}  // namespace concord::numerics
