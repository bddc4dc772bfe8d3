// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator, so the random word for element i depends only on (seed, stream, i)
// and never on which thread handles it or in what order.
#pragma once

#include <array>
#include <cstdint>

namespace concord::numerics {

using PhiloxBlock = std::array<uint32_t, 4>;

// One Philox4x32-10 evaluation: 4 words from a 128-bit counter and a 64-bit key.
constexpr PhiloxBlock philox4x32_10(PhiloxBlock counter, std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * counter[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * counter[2];
    const auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    counter = {hi1 ^ counter[1] ^ key[0], lo1, hi0 ^ counter[3] ^ key[1], lo0};
    key[0] += kW0;
    key[1] += kW1;
  }
  return counter;
}

// The random stream of one tensor: element i gets word (i mod 4) of the block at counter
// (i / 4, stream). Four consecutive elements share one Philox evaluation.
struct RandomStream {
  uint64_t seed = 0;
  uint32_t stream = 0;

  constexpr PhiloxBlock block(uint64_t block_index) const {
    return philox4x32_10({static_cast<uint32_t>(block_index),
                          static_cast<uint32_t>(block_index >> 32), stream, 0u},
                         {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  }
  constexpr uint32_t word(uint64_t element_index) const {
    return block(element_index >> 2)[element_index & 3];
  }
};

}  // namespace concord::numerics
