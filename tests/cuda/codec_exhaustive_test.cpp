// The device codec's RNE encoder (src/concord/cuda/codec.h, compiled for the CPU) on all 2^32
// fp32 inputs against the numerics reference, for the element formats the GPU slice quantizes
// with, against the numerics fast path: bf16 (casts), e4m3 and e5m2 (MXFP8, per-tensor FP8), e2m1 (MXFP4, NVFP4) and ue4m3
// (NVFP4's block scales), under the overflow rule each is used with. Label slow.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "concord/cuda/codec.h"
#include "concord/numerics/convert.h"
#include "concord/numerics/scalar.h"

namespace concord::cuda {
namespace {

namespace nm = concord::numerics;

// Against numerics::encode_array, the SIMD path that simd_test holds bit-equal to encode_ref
// (the reference itself costs ~45 s a format here on two cores; the SIMD path a few).
void check_all_inputs(Elem f, Over over) {
  const auto nf = static_cast<nm::Format>(f);
  const auto no = static_cast<nm::Overflow>(over);
  const bool wide = spec_of(f).bits > 8, nibbles = spec_of(f).bits == 4;
  int64_t mismatches = 0;
  uint32_t first = 0;
#pragma omp parallel for schedule(static) reduction(+ : mismatches)
  for (int64_t hi = 0; hi < 65536; ++hi) {
    std::vector<float> x(65536);
    std::vector<uint8_t> codes(65536 * 2);
    for (uint32_t lo = 0; lo < 65536; ++lo) x[lo] = float_of((static_cast<uint32_t>(hi) << 16) | lo);
    nm::encode_array(nf, nm::Rounding::rne, no, x.data(), codes.data(), x.size());
    for (uint32_t lo = 0; lo < 65536; ++lo) {
      const uint32_t want = wide     ? (codes[2 * lo] | (uint32_t{codes[2 * lo + 1]} << 8))
                            : nibbles ? (codes[lo / 2] >> (4 * (lo & 1))) & 0xFu
                                      : codes[lo];
      if (encode(f, x[lo], Round::rne, over) != want) {
        if (mismatches++ == 0) {
#pragma omp critical
          first = bits_of(x[lo]);
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << nm::traits(nf).name << ": first mismatch at fp32 bits 0x" << std::hex << first;
}

TEST(DeviceCodecExhaustive, Bf16RneIeeeOnEveryFp32) { check_all_inputs(Elem::bf16, Over::ieee); }
TEST(DeviceCodecExhaustive, E4m3RneSaturateOnEveryFp32) { check_all_inputs(Elem::e4m3, Over::saturate); }
TEST(DeviceCodecExhaustive, E5m2RneSaturateOnEveryFp32) { check_all_inputs(Elem::e5m2, Over::saturate); }
TEST(DeviceCodecExhaustive, E2m1RneOnEveryFp32) { check_all_inputs(Elem::e2m1, Over::saturate); }
TEST(DeviceCodecExhaustive, Ue4m3RneSaturateOnEveryFp32) { check_all_inputs(Elem::ue4m3, Over::saturate); }

}  // namespace
}  // namespace concord::cuda
