// Small helpers the model tests share: seeded token ids and a bitwise comparison of float rows.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <vector>

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

}  // namespace concord_test
