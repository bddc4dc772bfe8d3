// numerics/exp.h: the vector exp against libm's std::exp (float), bit for bit, and its table
// against 2^(i/32) computed independently. The exhaustive check over all 2^32 floats is
// exp_exhaustive_test.cpp (label slow).
#include "concord/numerics/exp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "concord/numerics/convert.h"

namespace {

using concord::numerics::exp_shifted;
namespace detail = concord::numerics::detail;

// Each entry is the double nearest 2^(i/32): no neighbour is nearer to the long-double value.
TEST(Exp, TableHoldsPow2RoundedToNearest) {
  const double* t = detail::exp_table_values();
  for (int i = 0; i < 32; ++i) {
    const long double v = std::exp2l(static_cast<long double>(i) / 32.0L);
    const long double err = std::fabs(static_cast<long double>(t[i]) - v);
    const double up = std::nextafter(t[i], 2.0), down = std::nextafter(t[i], 0.0);
    EXPECT_LT(err, std::fabs(static_cast<long double>(up) - v)) << "entry " << i;
    EXPECT_LT(err, std::fabs(static_cast<long double>(down) - v)) << "entry " << i;
  }
}

// Every 251st bit pattern of the 2^32 (all signs, exponents and mantissa regions: ~17M inputs,
// NaNs and infinities among them), through the vector path directly. The result is a double
// rounded to float, so most slips in the double evaluation change no float: a non-fused
// k rounding changes none of the 2^32, a non-fused r two (exp_exhaustive_test finds them).
TEST(Exp, VectorPathEqualsLibmOnEvery251stFloat) {
  if (!detail::exp_avx2_fma_supported()) GTEST_SKIP() << "no AVX2 + FMA on this CPU";
  std::vector<float> in;
  for (uint64_t u = 7; u <= 0xffffffffull; u += 251) in.push_back(std::bit_cast<float>(static_cast<uint32_t>(u)));
  // A float whose exp depends on r's single rounding: r = x·N/ln2 − k rounded twice (a multiply,
  // then a subtraction, instead of glibc's fma) changes it — one of the two such inputs of 2^32.
  in.push_back(std::bit_cast<float>(0xc27c65d9u));
  std::vector<float> want(in), got(in);
  detail::exp_shifted_libm(want.data(), static_cast<int64_t>(want.size()), 0.0f);
  detail::exp_shifted_avx2_fma(got.data(), static_cast<int64_t>(got.size()), 0.0f);
  int64_t diffs = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i])) {
      if (++diffs <= 5)
        ADD_FAILURE() << "exp(" << std::hexfloat << in[i] << ") = " << got[i] << ", libm " << want[i];
    }
  }
  EXPECT_EQ(diffs, 0);
}

// The softmax's use: scores minus their max (a float subtraction first), lengths around the
// eight-lane step (the tail takes std::exp), through the dispatcher.
TEST(Exp, ShiftedEqualsStdExpOfTheFloatDifference) {
  std::mt19937 gen(11);
  std::normal_distribution<float> score(0.0f, 6.0f);
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 64, 1000, 1003}) {
    std::vector<float> p(static_cast<size_t>(n));
    for (float& v : p) v = score(gen);
    if (n > 3) p[3] = -1e30f;  // far below: exp is 0 (libm's underflow path)
    const float shift = n > 0 ? *std::max_element(p.begin(), p.end()) : 0.0f;
    std::vector<float> want(p);
    for (float& v : want) v = std::exp(v - shift);
    exp_shifted(p.data(), n, shift);
    for (int64_t j = 0; j < n; ++j)
      ASSERT_EQ(std::bit_cast<uint32_t>(p[j]), std::bit_cast<uint32_t>(want[j])) << "n=" << n << " j=" << j;
  }
}

TEST(Exp, PathFollowsTheIsaAndTheCpu) {
  using concord::numerics::Isa;
  const Isa before = concord::numerics::active_isa();
  concord::numerics::set_active_isa(Isa::generic);
  EXPECT_EQ(std::string(concord::numerics::exp_path()), "libm");
  concord::numerics::set_active_isa(before);
  const std::string path = concord::numerics::exp_path();
  std::printf("exp path on this machine: %s\n", path.c_str());
  if (!detail::exp_avx2_fma_supported() || before == Isa::generic) {
    EXPECT_EQ(path, "libm");
  }
}

}  // namespace
