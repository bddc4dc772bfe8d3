// Export rules (train/export.h) on values exactly halfway between two bf16 codes: `sr` draws its
// bits per (seed, step, parameter) — two parameters with the same values, or one parameter at
// two steps, round independently (each decision a fair coin: agreements over n elements are
// Binomial(n, 1/2); the bound is 6 standard deviations, a false failure below 2e-9 per count,
// and the seeds are fixed) — and the same key gives the same bits; `rne` rounds ties to even.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "concord/numerics/format.h"
#include "concord/train/export.h"

namespace concord::train {
namespace {

constexpr int64_t kRows = 64, kCols = 128;
constexpr float kHalfway = 1.0f + 0x1p-8f;  // bf16's step at 1 is 2^-7

std::vector<bool> decisions(ExportRule& rule, int param, uint64_t step) {
  const std::vector<float> master(static_cast<size_t>(kRows * kCols), kHalfway);
  std::vector<float> served(master.size());
  rule.apply(param, master, served, kRows, kCols, step);
  std::vector<bool> up(served.size());
  for (size_t i = 0; i < served.size(); ++i) {
    EXPECT_TRUE(served[i] == 1.0f || served[i] == 1.0f + 0x1p-7f) << served[i];
    up[i] = served[i] > kHalfway;
  }
  return up;
}

void expect_independent(const std::vector<bool>& a, const std::vector<bool>& b, const std::string& what) {
  size_t agree = 0;
  for (size_t i = 0; i < a.size(); ++i) agree += a[i] == b[i];
  const double n = static_cast<double>(a.size());
  EXPECT_LE(std::fabs(static_cast<double>(agree) - n / 2), 6 * std::sqrt(n) / 2)
      << what << ": " << agree << " of " << a.size() << " decisions agree (independent: about half)";
}

TEST(ExportRule, SrBitsAreIndependentAcrossParametersAndSteps) {
  const auto rule = make_export_rule("sr", numerics::Format::bf16, 5);
  const std::vector<bool> p0 = decisions(*rule, 0, 3);
  size_t ups = 0;
  for (bool u : p0) ups += u;
  const double n = static_cast<double>(p0.size());
  EXPECT_LE(std::fabs(static_cast<double>(ups) - n / 2), 6 * std::sqrt(n) / 2) << ups << " rounded up";
  expect_independent(p0, decisions(*rule, 1, 3), "parameters 0 and 1 at step 3");
  expect_independent(p0, decisions(*rule, 7, 3), "parameters 0 and 7 at step 3");
  expect_independent(p0, decisions(*rule, 0, 4), "parameter 0 at steps 3 and 4");
  expect_independent(p0, decisions(*rule, 0, 0), "parameter 0 at steps 3 and 0");
  const std::vector<bool> shifted(p0.begin() + 1, p0.end()), head(p0.begin(), p0.end() - 1);
  expect_independent(head, shifted, "neighbouring elements");
  // The same key gives the same bits (a resumed run exports what the uninterrupted one did);
  // another seed, other bits.
  EXPECT_EQ(decisions(*make_export_rule("sr", numerics::Format::bf16, 5), 0, 3), p0);
  expect_independent(p0, decisions(*make_export_rule("sr", numerics::Format::bf16, 6), 0, 3), "seeds 5 and 6");
}

TEST(ExportRule, RneRoundsTiesToEven) {
  const auto rule = make_export_rule("rne", numerics::Format::bf16, 5);
  // 1 + 2^-8 lies between 1 (even) and 1 + 2^-7; 1 + 3 * 2^-8 between 1 + 2^-7 and 1 + 2^-6 (even).
  const std::vector<float> master = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-9f};
  std::vector<float> served(master.size());
  rule->apply(0, master, served, 2, 2, 0);
  EXPECT_EQ(served, (std::vector<float>{1.0f, 1.0f + 0x1p-6f, -(1.0f + 0x1p-6f), 1.0f}));
}

}  // namespace
}  // namespace concord::train
