// numerics/exp.h's vector path against libm's std::exp on every one of the 2^32 floats (label
// slow: ~15 s on one core).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "concord/numerics/exp.h"

namespace {

namespace detail = concord::numerics::detail;

TEST(ExpExhaustive, VectorPathEqualsLibmOnEveryFloat) {
  if (!detail::exp_avx2_fma_supported()) GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  constexpr uint64_t kChunk = uint64_t{1} << 16;
  int64_t diffs = 0;
  uint32_t first_bad = 0;
#pragma omp parallel for schedule(dynamic, 64) reduction(+ : diffs)
  for (uint64_t c = 0; c < (uint64_t{1} << 32) / kChunk; ++c) {
    std::vector<float> in(kChunk), got(kChunk);
    for (uint64_t i = 0; i < kChunk; ++i) in[i] = std::bit_cast<float>(static_cast<uint32_t>(c * kChunk + i));
    got = in;
    detail::exp_shifted_avx2_fma(got.data(), static_cast<int64_t>(kChunk), 0.0f);
    for (uint64_t i = 0; i < kChunk; ++i) {
      const float want = std::exp(in[i] - 0.0f);
      if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want)) {
        ++diffs;
#pragma omp critical(exp_first_bad)
        first_bad = std::bit_cast<uint32_t>(in[i]);
      }
    }
  }
  EXPECT_EQ(diffs, 0) << "e.g. the input with bits 0x" << std::hex << first_bad;
}

}  // namespace
