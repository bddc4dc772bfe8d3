// Tensor: an fp32 tensor that owns its data — contiguous, row-major, shape kept in the object.
//
// The model's parameters and gradients live in Tensors; short-lived activations come from an
// Arena (arena.h). Quantized storage is numerics::QuantizedTensor (codes + scales + descriptor).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "concord/numerics/check.h"

namespace concord::tensor {

class Tensor {
 public:
  Tensor() = default;
  // Zero-filled. Throws InputError for a negative dimension.
  explicit Tensor(std::vector<int64_t> shape)
      : shape_(std::move(shape)), data_(static_cast<size_t>(count(shape_))) {}
  // A copy of `values`, which must hold exactly numel(shape) floats.
  Tensor(std::vector<int64_t> shape, std::span<const float> values) : Tensor(std::move(shape)) {
    if (values.size() != data_.size()) {
      throw InputError("[tensor] " + std::to_string(values.size()) + " values for a shape of " +
                       std::to_string(data_.size()) + " elements (pass exactly numel values)");
    }
    std::copy(values.begin(), values.end(), data_.begin());
  }

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t rank() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const { return static_cast<int64_t>(data_.size()); }
  // Dimension i; negative i counts from the back (-1 = last). Throws InputError when out of range.
  int64_t dim(int i) const {
    const int64_t r = rank();
    if (i < -r || i >= r) {
      throw InputError("[tensor] dim(" + std::to_string(i) + ") of a rank-" + std::to_string(r) +
                       " tensor (use an index in [-rank, rank))");
    }
    return shape_[static_cast<size_t>(i < 0 ? i + r : i)];
  }

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  std::span<float> span() { return data_; }
  std::span<const float> span() const { return data_; }

 private:
  static int64_t count(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) {
      if (d < 0) throw InputError("[tensor] negative dimension " + std::to_string(d));
      n *= d;
    }
    return n;
  }
  std::vector<int64_t> shape_;
  std::vector<float> data_;
};

}  // namespace concord::tensor
