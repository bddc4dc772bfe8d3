// Error feedback: the carried error stays within half a quantum under RNE, and the served copy
// realizes the master's cumulative drift (what round-to-nearest export loses).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "concord/numerics/check.h"
#include "concord/numerics/error_feedback.h"
#include "concord/numerics/scalar.h"

namespace concord::numerics {
namespace {

// Spacing of the format's grid at |v| (the quantum RNE rounds to).
double quantum_at(Format f, float v) {
  const uint32_t code = encode_ref(f, std::fabs(v), Rounding::rtz);
  const float lo = decode_ref(f, code);
  const float hi = decode_ref(f, code + 1);
  return static_cast<double>(hi) - lo;
}

TEST(ErrorFeedback, CarriedErrorWithinHalfAQuantum) {
  for (Format f : {Format::bf16, Format::e4m3, Format::e5m2, Format::fp16}) {
    std::mt19937 gen(1);
    std::normal_distribution<float> normal;
    const int64_t n = 512;
    ErrorFeedbackQuantizer ef(QuantDesc::elementwise(f), 1, n);
    std::vector<float> x(n), carried(n);
    for (int step = 0; step < 50; ++step) {
      for (int64_t i = 0; i < n; ++i) x[i] = normal(gen);
      for (int64_t i = 0; i < n; ++i) carried[i] = x[i] + ef.error()[i];
      ef.step(x);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_LE(std::fabs(ef.error()[i]), 0.5 * quantum_at(f, carried[i]))
            << traits(f).name << " step " << step << " i " << i;
      }
    }
  }
}

TEST(ErrorFeedback, ServedCopyRealizesSmallUpdatesThatRneLoses) {
  // A master weight drifts up by 1e-4 per step from 1.0; a bf16 ulp there is 2^-7 ~ 78 steps.
  // For the first 30 steps RNE export never moves (the master stays below the midpoint), so
  // the served copy's cumulative shortfall grows ~ t^2. Error feedback telescopes:
  // sum(served) = sum(master) - e_T, so its cumulative shortfall is at most half an ulp.
  const int steps = 30;
  const float delta = 1e-4f;
  ErrorFeedbackQuantizer ef(QuantDesc::elementwise(Format::bf16), 1, 1);
  float master = 1.0f;
  std::vector<float> served(1);
  double rne_shortfall = 0, ef_shortfall = 0;
  int rne_moves = 0;
  for (int s = 0; s < steps; ++s) {
    master += delta;
    const float rne = decode_ref(Format::bf16, encode_ref(Format::bf16, master));
    rne_moves += rne != 1.0f;
    ef.step(std::span<const float>(&master, 1), served);
    rne_shortfall += static_cast<double>(master) - rne;
    ef_shortfall += static_cast<double>(master) - served[0];
  }
  const double ulp = std::ldexp(1.0, -7);
  EXPECT_EQ(rne_moves, 0);
  EXPECT_GT(rne_shortfall, 5 * ulp);
  EXPECT_LE(std::fabs(ef_shortfall), 0.5 * ulp);
}

TEST(ErrorFeedback, WorksWithBlockFormatsAndRejectsWrongSizes) {
  ErrorFeedbackQuantizer ef(QuantDesc::mx(Format::e2m1), 2, 64);
  std::vector<float> x(128, 0.01f), served(128);
  x[0] = 1.0f;  // block amax 1 -> quantum near 0.01 is 2^-2 * 2^-? : 0.01 rounds to 0
  double total = 0;
  for (int s = 0; s < 100; ++s) {
    ef.step(x, served);
    total += served[1];
  }
  // 100 steps of 0.01 = 1.0 in total: the served copy delivers it despite the coarse grid.
  EXPECT_NEAR(total, 1.0, 0.5);
  std::vector<float> wrong(3);
  EXPECT_THROW(ef.step(wrong), InputError);
}

}  // namespace
}  // namespace concord::numerics
