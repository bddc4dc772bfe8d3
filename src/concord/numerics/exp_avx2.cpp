// exp_shifted's vector path (exp.h), AVX2 + FMA (only this file gets those flags): glibc's expf,
// as its __expf_fma evaluates it, four doubles a vector, eight floats an iteration.
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "concord/numerics/exp.h"

namespace concord::numerics::detail {
namespace {

// 2^(i/32), i = 0..31, each rounded to the nearest double (tests/numerics/exp_test.cpp checks every
// entry against a long-double 2^(i/32)); glibc's table stores bits(2^(i/32)) - (i << 47), so that
// adding k << 47 (k's high bits into the exponent) gives 2^(k/32).
constexpr double kPow2[32] = {
    0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0, 0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0, 0x1.3dea64c123422p+0, 0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0, 0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0, 0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0, 0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0};

struct Table {
  alignas(32) int64_t t[32];
  constexpr Table() : t{} {
    for (int i = 0; i < 32; ++i) t[i] = std::bit_cast<int64_t>(kPow2[i]) - (int64_t{i} << 47);
  }
};
constexpr Table kTable;

// glibc's constants (e_exp2f_data.c): N/ln2 with N = 32, the rounding shift 1.5·2^52, and the
// cubic's coefficients scaled by 1/N^3, 1/N^2, 1/N.
constexpr double kInvLn2N = 0x1.71547652b82fep+0 * 32;
constexpr double kShift = 0x1.8p+52;
constexpr double kC0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32;
constexpr double kC1 = 0x1.ebfce50fac4f3p-3 / 32 / 32;
constexpr double kC2 = 0x1.62e42ff0c52d6p-1 / 32;

// The main path for four inputs whose |x| < 88 (other lanes: any value, replaced afterwards).
inline __m256d exp4(__m256d xd) {
  const __m256d inv_ln2n = _mm256_set1_pd(kInvLn2N), shift = _mm256_set1_pd(kShift);
  __m256d kd = _mm256_fmadd_pd(inv_ln2n, xd, shift);  // glibc: fma (contracted z + SHIFT)
  const __m256i ki = _mm256_castpd_si256(kd);
  kd = _mm256_sub_pd(kd, shift);
  const __m256d r = _mm256_fmsub_pd(inv_ln2n, xd, kd);  // glibc: fma (contracted z - kd)
  __m256i t = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(kTable.t),
                                     _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
  t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
  const __m256d s = _mm256_castsi256_pd(t);
  const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(kC0), r, _mm256_set1_pd(kC1));
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(kC2), r, _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(z, r2, y);
  return _mm256_mul_pd(y, s);
}

}  // namespace

const double* exp_table_values() { return kPow2; }

bool exp_avx2_fma_supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

void exp_shifted_avx2_fma(float* p, int64_t n, float shift) {
  const __m256 vshift = _mm256_set1_ps(shift);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), below_88 = _mm256_set1_epi32(0x42afffff);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(p + j), vshift);
    // glibc's test: (bits >> 20 & 0x7ff) >= top12(88.0f), i.e. |bits| >= 0x42b00000 (NaN, Inf too)
    const __m256i special = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(x), abs_mask), below_88);
    const __m128 lo = _mm256_cvtpd_ps(exp4(_mm256_cvtps_pd(_mm256_castps256_ps128(x))));
    const __m128 hi = _mm256_cvtpd_ps(exp4(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));
    _mm256_storeu_ps(p + j, _mm256_set_m128(hi, lo));
    if (!_mm256_testz_si256(special, special)) {
      alignas(32) float xs[8];
      _mm256_store_ps(xs, x);
      const int mask = _mm256_movemask_ps(_mm256_castsi256_ps(special));
      for (int l = 0; l < 8; ++l)
        if ((mask >> l) & 1) p[j + l] = std::exp(xs[l]);
    }
  }
  for (; j < n; ++j) p[j] = std::exp(p[j] - shift);
}

}  // namespace concord::numerics::detail
