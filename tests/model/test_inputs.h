// Small helpers the model tests share: seeded token ids and a bitwise comparison of float rows.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "concord/model/model.h"

namespace concord_test {

// n token ids uniform in [0, vocab), seeded.
inline std::vector<int32_t> tokens_of(int64_t n, uint64_t seed, int64_t vocab) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Seeded random weights (normal(0, std) matrices) with 1-D weights at 1 + 0.1·normal, away from 1
// so that norm gradients are not degenerate.
inline void randomize_weights(concord::model::Model& m, uint64_t seed, float std = 0.1f) {
  m.init_random(seed, std);
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const concord::model::ParamSpec& s : m.params())
    if (!s.is_matrix())
      for (float& v : m.param(s.name)) v = 1.0f + 0.1f * normal(rng);
  m.weights_changed();
}

}  // namespace concord_test
