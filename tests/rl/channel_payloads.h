// Deterministic test payloads for the transport tests: every byte depends on (who, version,
// index), so a wrong version, a stale buffer, a shifted copy or another sampler's rollouts all
// show as a byte mismatch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace concord::rl::testing {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// who = 0: the learner's weights; who = i: sampler i's rollouts.
inline std::vector<uint8_t> test_bytes(uint64_t who, uint64_t version, size_t size) {
  std::vector<uint8_t> out(size);
  const uint64_t seed = splitmix64(who * 0x100000001b3ULL ^ splitmix64(version));
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<uint8_t>(splitmix64(seed + i) >> 56);
  return out;
}

}  // namespace concord::rl::testing
