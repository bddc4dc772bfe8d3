// exp over many floats with the bits of the C library's expf, eight at a time.
//
// Attention's softmax takes one exp per (query, key, head): 35M of them in a 512-token SmolLM2
// prefill, where libm's scalar expf was 11% of the time on one thread. The contract
// (model/ops_attention_kernel.h) says std::exp in float, and the training forward, the engine and
// the reference all compute that; a faster exp that changed one bit would move every fingerprint.
// So the vector path computes glibc's expf exactly: the algorithm of glibc 2.28+ (sysdeps/ieee754/
// flt-32/e_expf.c, from ARM's optimized-routines), as its x86-64 build for CPUs with FMA and AVX2
// (`__expf_fma`, which glibc's ifunc picks on those CPUs) evaluates it:
//   xd = double(x); kd = fma(N/ln2, xd, 0x1.8p52) (round to an integer k, N = 32);
//   r = fma(N/ln2, xd, -(kd - 0x1.8p52));  s = 2^(k/N) from a 32-entry table and k's high bits;
//   y = fma(fma(C0, r, C1), r·r, fma(C2, r, 1)) · s;  result float(y), round to nearest.
// Inputs with |x| >= 88 (and NaN, ±Inf) take libm's own expf, lane by lane. tests/numerics/
// exp_test.cpp checks the vector path against std::exp on all 2^32 floats (label slow) and on a
// sample in the default run; the first call also compares it with std::exp on ~200k values and
// keeps libm's scalar expf if any differs (another C library, another algorithm): the results are
// std::exp's bits either way, only the speed depends on the path.
#pragma once

#include <cstdint>

namespace concord::numerics {

// p[j] = std::exp(p[j] - shift) for 0 <= j < n (the subtraction in float), bit for bit.
void exp_shifted(float* p, int64_t n, float shift);

// The path exp_shifted takes on this machine: "avx2-fma" (eight lanes, glibc's expf algorithm)
// or "libm" (std::exp per element: no AVX2+FMA, CONCORD_ISA=generic, or the first-call check
// found a difference).
const char* exp_path();

namespace detail {
void exp_shifted_libm(float* p, int64_t n, float shift);
// The vector path itself (tests); only on a CPU with AVX2 and FMA.
bool exp_avx2_fma_supported();
void exp_shifted_avx2_fma(float* p, int64_t n, float shift);
// The 32-entry table: 2^(i/32) rounded to the nearest double (tests check it).
const double* exp_table_values();
}  // namespace detail

}  // namespace concord::numerics
