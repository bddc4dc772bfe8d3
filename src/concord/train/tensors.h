// Named fp32 tensors as checkpoints, optimizers and export rules hand them around.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace concord::train {

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// A tensor to save, without copying its values (they must stay alive during the call).
struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> values;
};

}  // namespace concord::train
