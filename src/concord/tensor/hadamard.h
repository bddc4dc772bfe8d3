// The random Hadamard transform (16-point), as in NVIDIA's NVFP4 training recipe: applied to
// both weight-gradient operands along their reduction dimension before 4-bit quantization, it
// spreads outliers over 16 elements, and since it is orthogonal dYᵀ·X is unchanged in exact
// arithmetic: (Q dY)ᵀ(Q X) = dYᵀ QᵀQ X = dYᵀX.
//
// Each group g of 16 consecutive elements along the chosen axis becomes (1/4)·H16·diag(s)·g,
// H16 the Sylvester Hadamard matrix (H[i][j] = (-1)^popcount(i & j)) and s ∈ {±1}^16 the same
// signs for every group of the tensor, drawn from Philox (numerics/philox.h) keyed by seed:
// s_i = -1 when bit i of RandomStream{seed, kHadamardStream}.word(0) is set. Trailing elements
// (count % 16) are left unchanged, which keeps the whole map orthogonal. The inverse is
// diag(s)·H16/4. Computed in fp32 by four butterfly stages and an exact scaling by 1/4, so the
// result differs from the exact transform by a few ulps (not bitwise reversible).
#pragma once

#include <array>
#include <cstdint>

namespace concord::tensor {

inline constexpr uint32_t kHadamardStream = 0x48414430u;  // "HAD0"

// x is rows x cols, row-major, transformed in place. axis 0: groups of 16 rows (per column);
// axis 1: groups of 16 columns (per row).
void hadamard16(float* x, int64_t rows, int64_t cols, int axis, uint64_t seed);
void hadamard16_inverse(float* x, int64_t rows, int64_t cols, int axis, uint64_t seed);

// The 16 signs s (+1 or -1) for a seed.
std::array<float, 16> hadamard16_signs(uint64_t seed);

}  // namespace concord::tensor
