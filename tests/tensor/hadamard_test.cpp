// The 16-point random Hadamard transform against a plain fp64 matrix-vector reference written
// here: orthogonality, inverse, both axes, seeds, and dYᵀX preserved.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "concord/numerics/check.h"
#include "concord/tensor/gemm.h"
#include "concord/tensor/hadamard.h"

namespace concord::tensor {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

// Sylvester H16 entry: (-1)^popcount(i & j).
double h16(int i, int j) { return (__builtin_popcount(static_cast<unsigned>(i & j)) & 1) ? -1.0 : 1.0; }

// The fp64 reference: each full group g along `axis` becomes (1/4)·H16·diag(s)·g.
std::vector<double> reference(const std::vector<float>& x, int64_t rows, int64_t cols, int axis,
                              uint64_t seed) {
  const std::array<float, 16> s = hadamard16_signs(seed);
  std::vector<double> y(x.begin(), x.end());
  const int64_t lines = axis == 0 ? cols : rows, length = axis == 0 ? rows : cols;
  for (int64_t line = 0; line < lines; ++line) {
    for (int64_t g = 0; g + 16 <= length; g += 16) {
      auto at = [&](int64_t t) { return axis == 0 ? (g + t) * cols + line : line * cols + g + t; };
      for (int i = 0; i < 16; ++i) {
        double sum = 0.0;
        for (int j = 0; j < 16; ++j) sum += h16(i, j) * s[static_cast<size_t>(j)] * x[at(j)];
        y[at(i)] = sum / 4.0;
      }
    }
  }
  return y;
}

TEST(HadamardTest, MatchesFp64ReferenceOnBothAxesWithTrailingElements) {
  for (int axis : {0, 1}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{16, 16}, {35, 50}, {48, 7}, {5, 80}}) {
      std::vector<float> x = random_values(static_cast<size_t>(rows * cols), 3);
      const std::vector<double> want = reference(x, rows, cols, axis, 42);
      hadamard16(x.data(), rows, cols, axis, 42);
      for (size_t i = 0; i < x.size(); ++i) {
        // Four fp32 butterfly stages: a few ulps of the group's magnitude.
        ASSERT_NEAR(x[i], want[i], 1e-5 * (1.0 + std::fabs(want[i])))
            << "axis " << axis << " shape " << rows << "x" << cols << " at " << i;
      }
    }
  }
}

TEST(HadamardTest, TransformMatrixIsOrthogonal) {
  // Column j of the 16x16 map = the transform of unit vector e_j (axis 1, one row per vector).
  std::vector<float> m(16 * 16, 0.0f);
  for (int j = 0; j < 16; ++j) m[j * 16 + j] = 1.0f;
  hadamard16(m.data(), 16, 16, 1, 7);  // row j now holds Q·e_j
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      double dot = 0.0;
      for (int k = 0; k < 16; ++k) dot += static_cast<double>(m[i * 16 + k]) * m[j * 16 + k];
      EXPECT_EQ(dot, i == j ? 1.0 : 0.0) << i << "," << j;  // entries are ±1/4: exact
    }
  }
}

TEST(HadamardTest, InverseUndoesForward) {
  for (int axis : {0, 1}) {
    const int64_t rows = 64, cols = 40;
    const std::vector<float> x = random_values(static_cast<size_t>(rows * cols), 11);
    std::vector<float> y = x;
    hadamard16(y.data(), rows, cols, axis, 99);
    EXPECT_NE(y, x);
    hadamard16_inverse(y.data(), rows, cols, axis, 99);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_NEAR(y[i], x[i], 4e-7 * 16) << "axis " << axis << " at " << i;  // a few ulps of |x|≲4
    }
  }
}

TEST(HadamardTest, SignsDependOnSeed) {
  const auto a = hadamard16_signs(1), b = hadamard16_signs(2);
  EXPECT_EQ(a, hadamard16_signs(1));
  EXPECT_NE(a, b);
  int negatives = 0;
  for (float s : a) {
    EXPECT_TRUE(s == 1.0f || s == -1.0f);
    negatives += s < 0;
  }
  EXPECT_GT(negatives, 0);
  EXPECT_LT(negatives, 16);  // fixed seed: not all one sign
  std::vector<float> x = random_values(32, 5), y = x;
  hadamard16(x.data(), 2, 16, 1, 1);
  hadamard16(y.data(), 2, 16, 1, 2);
  EXPECT_NE(x, y);
}

TEST(HadamardTest, WeightGradientProductIsPreserved) {
  // dW = dYᵀ·X with dY (T, N), X (T, K); both transformed along T (axis 0) with one seed.
  const int64_t T = 100, N = 24, K = 19;  // T % 16 = 4 trailing rows left unchanged
  std::vector<float> dy = random_values(T * N, 21), x = random_values(T * K, 22);
  std::vector<float> plain(N * K), rotated(N * K);
  gemm(Trans::yes, Trans::no, N, K, T, dy.data(), N, x.data(), K, plain.data(), K);
  hadamard16(dy.data(), T, N, 0, 5);
  hadamard16(x.data(), T, K, 0, 5);
  gemm(Trans::yes, Trans::no, N, K, T, dy.data(), N, x.data(), K, rotated.data(), K);
  for (size_t i = 0; i < plain.size(); ++i) {
    // fp32 error of two length-100 sums of O(1) terms plus the transforms' rounding.
    ASSERT_NEAR(rotated[i], plain[i], 1e-4) << i;
  }
  // A different seed for one operand breaks the identity (the check can fail).
  std::vector<float> x2 = random_values(T * K, 22);
  hadamard16(x2.data(), T, K, 0, 6);
  gemm(Trans::yes, Trans::no, N, K, T, dy.data(), N, x2.data(), K, rotated.data(), K);
  double max_diff = 0.0;
  for (size_t i = 0; i < plain.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::fabs(rotated[i] - plain[i])));
  }
  EXPECT_GT(max_diff, 1.0);
}

TEST(HadamardTest, RejectsBadAxis) {
  std::vector<float> x(16);
  EXPECT_THROW(hadamard16(x.data(), 1, 16, 2, 0), InputError);
  EXPECT_THROW(hadamard16_inverse(x.data(), 1, 16, -1, 0), InputError);
}

}  // namespace
}  // namespace concord::tensor
