// The 16-point random Hadamard transform (see hadamard.h): fast Walsh–Hadamard butterflies over
// groups of 16 rows (vectorised across columns) or 16 consecutive columns.
#include "concord/tensor/hadamard.h"

#include <algorithm>
#include <string>

#include "concord/numerics/check.h"
#include "concord/numerics/philox.h"

namespace concord::tensor {
namespace {

constexpr int kGroup = 16;

// In-place unnormalised Walsh–Hadamard transform of 16 vectors of n floats (v[i] + t*stride),
// natural (Sylvester) order, then the exact scaling by 1/4.
void butterflies(float* v, int64_t index_stride, int64_t n, int64_t elem_stride) {
  for (int h = 1; h < kGroup; h *= 2) {
    for (int i = 0; i < kGroup; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        float* p = v + j * index_stride;
        float* q = v + (j + h) * index_stride;
        for (int64_t t = 0; t < n; ++t) {
          const float a = p[t * elem_stride], b = q[t * elem_stride];
          p[t * elem_stride] = a + b;
          q[t * elem_stride] = a - b;
        }
      }
    }
  }
  for (int i = 0; i < kGroup; ++i) {
    float* p = v + i * index_stride;
    for (int64_t t = 0; t < n; ++t) p[t * elem_stride] *= 0.25f;
  }
}

void apply_signs(float* v, int64_t index_stride, int64_t n, int64_t elem_stride,
                 const std::array<float, 16>& s) {
  for (int i = 0; i < kGroup; ++i) {
    float* p = v + i * index_stride;
    for (int64_t t = 0; t < n; ++t) p[t * elem_stride] *= s[static_cast<size_t>(i)];
  }
}

void transform(float* x, int64_t rows, int64_t cols, int axis, uint64_t seed, bool inverse) {
  const char* op = inverse ? "hadamard16_inverse" : "hadamard16";
  if (rows < 0 || cols < 0) throw InputError(std::string("[") + op + "] negative shape");
  if (axis != 0 && axis != 1) {
    throw InputError(std::string("[") + op + "] axis " + std::to_string(axis) +
                     " (use 0: groups of 16 rows, or 1: groups of 16 columns)");
  }
  const std::array<float, 16> s = hadamard16_signs(seed);
  if (axis == 0) {
    // A group is 16 rows; each column is one 16-vector, so the butterflies run across columns.
    const int64_t groups = rows / kGroup;
    constexpr int64_t kColumnTile = 256;
    const int64_t col_tiles = (cols + kColumnTile - 1) / kColumnTile;
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 18))
    for (int64_t task = 0; task < groups * col_tiles; ++task) {
      const int64_t g = task / col_tiles, c0 = (task % col_tiles) * kColumnTile;
      const int64_t n = std::min(kColumnTile, cols - c0);
      float* v = x + g * kGroup * cols + c0;
      if (!inverse) apply_signs(v, cols, n, 1, s);
      butterflies(v, cols, n, 1);
      if (inverse) apply_signs(v, cols, n, 1, s);
    }
  } else {
    // A group is 16 consecutive columns of one row: element stride 16 runs over the groups.
    const int64_t groups = cols / kGroup;
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 18))
    for (int64_t r = 0; r < rows; ++r) {
      float* v = x + r * cols;
      if (!inverse) apply_signs(v, 1, groups, kGroup, s);
      butterflies(v, 1, groups, kGroup);
      if (inverse) apply_signs(v, 1, groups, kGroup, s);
    }
  }
}

}  // namespace

std::array<float, 16> hadamard16_signs(uint64_t seed) {
  const uint32_t bits = numerics::RandomStream{seed, kHadamardStream}.word(0);
  std::array<float, 16> s{};
  for (int i = 0; i < kGroup; ++i) s[static_cast<size_t>(i)] = ((bits >> i) & 1u) ? -1.0f : 1.0f;
  return s;
}

void hadamard16(float* x, int64_t rows, int64_t cols, int axis, uint64_t seed) {
  transform(x, rows, cols, axis, seed, false);
}

void hadamard16_inverse(float* x, int64_t rows, int64_t cols, int axis, uint64_t seed) {
  transform(x, rows, cols, axis, seed, true);
}

}  // namespace concord::tensor
