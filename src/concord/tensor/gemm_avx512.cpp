// AVX-512 microkernels of the GEMM: a 12 x 32 tile — two kMR-row A panels against two kNR-column
// B panels of the layout every kernel reads — in 24 zmm accumulators, one zmm of B per panel and
// step, A broadcast from memory. Compiled with -mavx512f; called only after
// gemm_isa_supported(GemmIsa::avx512). Each accumulator lane is one C element and sees the steps
// k = 0 .. kc-1 in order, one _mm512_fmadd_ps (one rounding, exactly std::fma) each: the 6 x 16
// kernels' sequence for that element, so the bits are theirs.
#include <immintrin.h>

#include "concord/tensor/gemm.h"

namespace concord::tensor::detail {
namespace {

static_assert(kWideMR == 2 * kMR && kWideNR == 2 * kNR && kNR == 16,
              "the AVX-512 kernels are written for 12 x 32 tiles of 6 x 16 panels");

// Rows 0..5 come from the first A panel, 6..11 from the second (a + a2).
#define CONCORD_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define CONCORD_A(r, k) ((r) < kMR ? a + (k) * kMR + (r) : a2 + (k) * kMR + ((r) - kMR))

#define CONCORD_DECL(r) __m512 c##r##0, c##r##1;
#define CONCORD_LOAD(r)                            \
  c##r##0 = _mm512_loadu_ps(c + (r) * ldc);        \
  c##r##1 = _mm512_loadu_ps(c + (r) * ldc + kNR);
#define CONCORD_ZERO(r)          \
  c##r##0 = _mm512_setzero_ps(); \
  c##r##1 = _mm512_setzero_ps();
// The 24 accumulators, from C (load_c) or zero.
#define CONCORD_INIT_C              \
  CONCORD_ROWS(CONCORD_DECL)        \
  if (load_c) {                     \
    CONCORD_ROWS(CONCORD_LOAD)      \
  } else {                          \
    CONCORD_ROWS(CONCORD_ZERO)      \
  }
#define CONCORD_STORE(r)                           \
  _mm512_storeu_ps(c + (r) * ldc, c##r##0);        \
  _mm512_storeu_ps(c + (r) * ldc + kNR, c##r##1);

void avx512_f32_wide(int64_t kc, const float* a, int64_t a_stride, const float* b,
                     int64_t b_stride, float* c, int64_t ldc, bool load_c) {
  const float* a2 = a + a_stride;
  const float* b2 = b + b_stride;
  CONCORD_INIT_C
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_load_ps(b + k * kNR), b1 = _mm512_load_ps(b2 + k * kNR);
#define CONCORD_STEP(r)                                   \
  {                                                       \
    const __m512 ar = _mm512_set1_ps(*CONCORD_A(r, k));   \
    c##r##0 = _mm512_fmadd_ps(ar, b0, c##r##0);           \
    c##r##1 = _mm512_fmadd_ps(ar, b1, c##r##1);           \
  }
    CONCORD_ROWS(CONCORD_STEP)
#undef CONCORD_STEP
  }
  CONCORD_ROWS(CONCORD_STORE)
}

// B in bf16 pairs (word q of a column = bf16 of step 2q | bf16 of step 2q + 1 << 16): << 16
// widens the low half, & 0xFFFF0000 the high one — both exact. Step 2q before step 2q + 1.
void avx512_bf16_wide(int64_t kc, const float* a, int64_t a_stride, const uint32_t* b,
                      int64_t b_stride, float* c, int64_t ldc, bool load_c) {
  const float* a2 = a + a_stride;
  const uint32_t* b2 = b + b_stride;
  CONCORD_INIT_C
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t pairs = kc / 2;
  for (int64_t q = 0; q < pairs; ++q) {
    const __m512i w0 = _mm512_load_si512(b + q * kNR), w1 = _mm512_load_si512(b2 + q * kNR);
    {
      const __m512 b0 = _mm512_castsi512_ps(_mm512_slli_epi32(w0, 16));
      const __m512 b1 = _mm512_castsi512_ps(_mm512_slli_epi32(w1, 16));
#define CONCORD_STEP(r)                                     \
  {                                                         \
    const __m512 ar = _mm512_set1_ps(*CONCORD_A(r, 2 * q)); \
    c##r##0 = _mm512_fmadd_ps(ar, b0, c##r##0);             \
    c##r##1 = _mm512_fmadd_ps(ar, b1, c##r##1);             \
  }
      CONCORD_ROWS(CONCORD_STEP)
#undef CONCORD_STEP
    }
    {
      const __m512 b0 = _mm512_castsi512_ps(_mm512_and_si512(w0, hi_mask));
      const __m512 b1 = _mm512_castsi512_ps(_mm512_and_si512(w1, hi_mask));
#define CONCORD_STEP(r)                                         \
  {                                                             \
    const __m512 ar = _mm512_set1_ps(*CONCORD_A(r, 2 * q + 1)); \
    c##r##0 = _mm512_fmadd_ps(ar, b0, c##r##0);                 \
    c##r##1 = _mm512_fmadd_ps(ar, b1, c##r##1);                 \
  }
      CONCORD_ROWS(CONCORD_STEP)
#undef CONCORD_STEP
    }
  }
  if (kc % 2 != 0) {  // the last, unpaired step: low halves only
    const __m512 b0 =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_load_si512(b + pairs * kNR), 16));
    const __m512 b1 =
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_load_si512(b2 + pairs * kNR), 16));
#define CONCORD_STEP(r)                                         \
  {                                                             \
    const __m512 ar = _mm512_set1_ps(*CONCORD_A(r, 2 * pairs)); \
    c##r##0 = _mm512_fmadd_ps(ar, b0, c##r##0);                 \
    c##r##1 = _mm512_fmadd_ps(ar, b1, c##r##1);                 \
  }
    CONCORD_ROWS(CONCORD_STEP)
#undef CONCORD_STEP
  }
  CONCORD_ROWS(CONCORD_STORE)
}

#undef CONCORD_INIT_C
#undef CONCORD_DECL
#undef CONCORD_LOAD
#undef CONCORD_ZERO
#undef CONCORD_STORE
#undef CONCORD_A
#undef CONCORD_ROWS

}  // namespace

WideKernels avx512_wide_kernels() { return {avx512_f32_wide, avx512_bf16_wide}; }

}  // namespace concord::tensor::detail
