// Stochastic rounding draws an independent word per element: element i of a tensor uses word
// i mod 4 of Philox4x32-10(counter = (i/4, stream), key = seed) (docs/numerics.md). Unbiasedness
// alone cannot see two neighbours sharing a word (each still rounds up half the time), so:
//  - every decision is compared with the one that word gives, the word computed here from
//    philox4x32_10 itself (its known answers are in philox_test.cpp), for scalar SR
//    (encode_array), block SR (MX, reference and every SIMD path) and error feedback;
//  - independently of Philox, the decisions of elements i and i + lag (lag 1..5) agree about half
//    the time: for a vector of identical values exactly halfway between two codes, each
//    decision is a fair coin, and the number of agreements over n disjoint pairs is
//    Binomial(n, 1/2) when they are independent (n when a word is shared). The bound is 6
//    standard deviations: a false failure has probability below 2e-9 per count (the seeds are
//    fixed, so the outcome is deterministic; the bound says how unlucky a seed would have to be).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "concord/numerics/block.h"
#include "concord/numerics/convert.h"
#include "concord/numerics/error_feedback.h"
#include "concord/numerics/philox.h"
#include "concord/numerics/scalar.h"

namespace concord::numerics {
namespace {

// Word i of (seed, stream), straight from the Philox primitive.
uint32_t philox_word(uint64_t seed, uint32_t stream, uint64_t i) {
  const uint64_t block = i / 4;
  const PhiloxBlock w = philox4x32_10(
      {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), stream, 0u},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  return w[i % 4];
}

// SR with fraction delta = k/4 of the step: away from zero iff D + r >= 2^32, D = k * 2^30.
bool away_expected(uint32_t word, int k) {
  return uint64_t{word} + (uint64_t{static_cast<unsigned>(k)} << 30) >= (uint64_t{1} << 32);
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::generic, Isa::avx2, Isa::avx512, Isa::wide16})
    if (isa_supported(isa)) out.push_back(isa);
  return out;
}

// Agreements between decisions i and i + lag over disjoint pairs (i = 2*lag*j + r, r < lag).
void expect_independent_neighbours(const std::vector<bool>& away, const std::string& what) {
  size_t ups = 0;
  for (bool a : away) ups += a;
  const double n_all = static_cast<double>(away.size());
  EXPECT_LE(std::fabs(static_cast<double>(ups) - n_all / 2), 6 * std::sqrt(n_all) / 2)
      << what << ": " << ups << " of " << away.size() << " rounded up (fraction 1/2 expected)";
  for (size_t lag = 1; lag <= 5; ++lag) {
    size_t pairs = 0, agree = 0;
    for (size_t start = 0; start + 2 * lag <= away.size(); start += 2 * lag)
      for (size_t r = 0; r < lag; ++r, ++pairs) agree += away[start + r] == away[start + r + lag];
    const double n = static_cast<double>(pairs);
    EXPECT_LE(std::fabs(static_cast<double>(agree) - n / 2), 6 * std::sqrt(n) / 2)
        << what << ": elements i and i+" << lag << " rounded the same way in " << agree << " of "
        << pairs << " pairs (independent: about half)";
  }
}

constexpr size_t kN = 8192;

// Scalar SR through encode_array on every ISA, from element index `first`: values lo + k/4 of
// the step between two codes (delta = k/4) for bf16 (the SIMD codecs; step 2^-7 at 1) and for
// int8 / int4 (formats without a fast codec: encode_array's scalar loop).
struct Between {
  Format format;
  float lo, hi;  // two neighbouring codes' values
};
const Between kBetween[] = {{Format::bf16, 1.0f, 1.0f + 0x1p-7f}, {Format::int8, 10.0f, 11.0f},
                            {Format::int4, 2.0f, 3.0f}};

TEST(StochasticRounding, EncodeArrayUsesThePhiloxWordOfEachElement) {
  const Isa saved = active_isa();
  for (Isa isa : supported_isas()) {
    set_active_isa(isa);
    for (const Between& b : kBetween) {
      for (const auto& [seed, stream, first] : {std::tuple<uint64_t, uint32_t, uint64_t>{7, 0, 0},
                                                {7, 1, 0}, {8, 0, 0}, {0x123456789abcull, 3, 1001}}) {
        for (int k = 1; k <= 3; ++k) {
          const float x = b.lo + static_cast<float>(k) * (b.hi - b.lo) / 4;
          const std::vector<float> in(kN, x);
          std::vector<uint8_t> codes(code_bytes(b.format, static_cast<int64_t>(kN)));
          encode_array(b.format, Rounding::stochastic, Overflow::saturate, in.data(), codes.data(), kN,
                       RandomStream{seed, stream}, first);
          std::vector<bool> away(kN);
          size_t mismatches = 0;
          for (size_t i = 0; i < kN; ++i) {
            const float v = decode_ref(b.format, get_code(b.format, codes, static_cast<int64_t>(i)));
            ASSERT_TRUE(v == b.lo || v == b.hi) << v;
            away[i] = v > x;
            mismatches += away[i] != away_expected(philox_word(seed, stream, first + i), k);
          }
          const std::string what = std::string(isa_name(isa)) + " " + std::string(traits(b.format).name) +
                                   " delta " + std::to_string(k) + "/4 seed " + std::to_string(seed) +
                                   " stream " + std::to_string(stream);
          EXPECT_EQ(mismatches, 0u) << what << ": decisions that are not the Philox word's";
          if (k == 2) expect_independent_neighbours(away, what);
        }
      }
    }
  }
  set_active_isa(saved);
}

// An e4m3 or e2m1 MX tensor whose every element is halfway between two element codes after the
// power-of-two block scale (1.0625 = 1 + 2^-4: e4m3's step at 1 is 2^-3; 1.25: e2m1's step at
// 1 is 0.5): each element's decision is word r*cols + c's top bit.
struct HalfwayMx {
  Format element;
  float x, down, up;  // the value and the two codes it lies between, in block-scaled units
};
const HalfwayMx kHalfway[] = {{Format::e4m3, 1.0625f, 1.0f, 1.125f}, {Format::e2m1, 1.25f, 1.0f, 1.5f}};

std::vector<bool> mx_decisions(const QuantizedTensor& q, const HalfwayMx& h) {
  std::vector<float> out(static_cast<size_t>(q.numel()));
  dequantize_ref(q, out.data());
  std::vector<bool> away(out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_TRUE(out[i] == h.down || out[i] == h.up) << out[i];
    away[i] = out[i] > h.x;
  }
  return away;
}

TEST(StochasticRounding, MxBlocksUseThePhiloxWordOfEachElement) {
  const int64_t rows = 8, cols = 1024;  // element (r, c) draws word r * cols + c
  const Isa saved = active_isa();
  for (const HalfwayMx& h : kHalfway) {
    QuantDesc desc = QuantDesc::mx(h.element);
    desc.rounding = Rounding::stochastic;
    const std::vector<float> x(static_cast<size_t>(rows * cols), h.x);
    for (const RandomStream rng : {RandomStream{5, 0}, RandomStream{5, 2}, RandomStream{6, 0}}) {
      const QuantizedTensor ref = quantize_ref(desc, x.data(), rows, cols, rng);
      const std::vector<bool> away = mx_decisions(ref, h);
      size_t mismatches = 0;
      for (size_t i = 0; i < away.size(); ++i)
        mismatches += away[i] != away_expected(philox_word(rng.seed, rng.stream, i), 2);
      const std::string what = desc.to_string() + " seed " + std::to_string(rng.seed) + " stream " +
                               std::to_string(rng.stream);
      EXPECT_EQ(mismatches, 0u) << "quantize_ref " << what;
      expect_independent_neighbours(away, "quantize_ref " + what);
      for (Isa isa : supported_isas()) {
        set_active_isa(isa);
        const QuantizedTensor fast = quantize(desc, x.data(), rows, cols, rng);
        set_active_isa(saved);
        EXPECT_EQ(fast.codes, ref.codes) << isa_name(isa) << " " << what;
        expect_independent_neighbours(mx_decisions(fast, h), std::string(isa_name(isa)) + " " + what);
      }
    }
  }
}

// Error feedback rounds v = x + e with the same words: its first step (e = 0) makes the
// decisions above; the second step's error is +-half a step everywhere, and a fresh stream
// decides again independently.
TEST(StochasticRounding, ErrorFeedbackUsesThePhiloxWordOfEachElement) {
  const HalfwayMx& h = kHalfway[0];
  QuantDesc desc = QuantDesc::mx(h.element);
  desc.rounding = Rounding::stochastic;
  const int64_t rows = 4, cols = 1024;
  const std::vector<float> x(static_cast<size_t>(rows * cols), h.x);
  ErrorFeedbackQuantizer ef(desc, rows, cols);
  std::vector<float> served(x.size());
  ef.step(x, served, RandomStream{9, 4});
  std::vector<bool> away(x.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(served[i] == h.down || served[i] == h.up) << served[i];
    away[i] = served[i] > h.x;
    mismatches += away[i] != away_expected(philox_word(9, 4, i), 2);
  }
  EXPECT_EQ(mismatches, 0u);
  expect_independent_neighbours(away, "error feedback, first step");
}

}  // namespace
}  // namespace concord::numerics
