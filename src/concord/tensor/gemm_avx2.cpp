// AVX2 + FMA microkernels of the GEMM (6 x 16 tile: 12 ymm accumulators, 2 vectors of packed B,
// one broadcast of packed A per row). Compiled with -mavx2 -mfma; called only after
// gemm_isa_supported(GemmIsa::avx2). _mm256_fmadd_ps rounds once, exactly like std::fma.
#include <immintrin.h>

#include "concord/tensor/gemm.h"

namespace concord::tensor::detail {
namespace {

static_assert(kMR == 6 && kNR == 16, "the AVX2 kernels are written for 6 x 16 tiles");

#define CONCORD_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

void avx2_f32(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool load_c) {
#define CONCORD_DECL(r) __m256 c##r##0, c##r##1;
  CONCORD_ROWS(CONCORD_DECL)
#undef CONCORD_DECL
  if (load_c) {
#define CONCORD_LOAD(r)                          \
  c##r##0 = _mm256_loadu_ps(c + (r) * ldc);      \
  c##r##1 = _mm256_loadu_ps(c + (r) * ldc + 8);
    CONCORD_ROWS(CONCORD_LOAD)
#undef CONCORD_LOAD
  } else {
#define CONCORD_ZERO(r)          \
  c##r##0 = _mm256_setzero_ps(); \
  c##r##1 = _mm256_setzero_ps();
    CONCORD_ROWS(CONCORD_ZERO)
#undef CONCORD_ZERO
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#define CONCORD_STEP(r)                                  \
  {                                                      \
    const __m256 ar = _mm256_broadcast_ss(a + (r));      \
    c##r##0 = _mm256_fmadd_ps(ar, b0, c##r##0);          \
    c##r##1 = _mm256_fmadd_ps(ar, b1, c##r##1);          \
  }
    CONCORD_ROWS(CONCORD_STEP)
#undef CONCORD_STEP
    a += kMR;
    b += kNR;
  }
#define CONCORD_STORE(r)                       \
  _mm256_storeu_ps(c + (r) * ldc, c##r##0);    \
  _mm256_storeu_ps(c + (r) * ldc + 8, c##r##1);
  CONCORD_ROWS(CONCORD_STORE)
#undef CONCORD_STORE
}

// B in bf16 pairs: a 32-bit word holds steps (2p, 2p+1); << 16 widens the low one, >> 16 << 16
// the high one — both exact. A is fp32 (widened when packed). Per accumulator,
// step 2p is applied before step 2p+1.
void avx2_bf16(int64_t kc, const float* a, const uint32_t* b, float* c, int64_t ldc,
               bool load_c) {
#define CONCORD_DECL(r) __m256 c##r##0, c##r##1;
  CONCORD_ROWS(CONCORD_DECL)
#undef CONCORD_DECL
  if (load_c) {
#define CONCORD_LOAD(r)                          \
  c##r##0 = _mm256_loadu_ps(c + (r) * ldc);      \
  c##r##1 = _mm256_loadu_ps(c + (r) * ldc + 8);
    CONCORD_ROWS(CONCORD_LOAD)
#undef CONCORD_LOAD
  } else {
#define CONCORD_ZERO(r)          \
  c##r##0 = _mm256_setzero_ps(); \
  c##r##1 = _mm256_setzero_ps();
    CONCORD_ROWS(CONCORD_ZERO)
#undef CONCORD_ZERO
  }
  const int64_t pairs = kc / 2;
#pragma GCC unroll 2
  for (int64_t p = 0; p < pairs; ++p) {
    // Twelve accumulators leave four registers: widen the low halves, run step 2p, then
    // re-read the words (the barrier stops the compiler from keeping them live, which would
    // spill accumulators) and widen the high halves by shifting the low ones out.
    const __m256 blo0 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(b)), 16));
    const __m256 blo1 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(b + 8)), 16));
#define CONCORD_STEP(r)                                                        \
  {                                                                            \
    const __m256 alo = _mm256_broadcast_ss(a + (r));                           \
    c##r##0 = _mm256_fmadd_ps(alo, blo0, c##r##0);                             \
    c##r##1 = _mm256_fmadd_ps(alo, blo1, c##r##1);                             \
  }
    CONCORD_ROWS(CONCORD_STEP)
#undef CONCORD_STEP
    __asm__ volatile("" ::: "memory");
    const __m256 bhi0 = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_srli_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(b)), 16), 16));
    const __m256 bhi1 = _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_srli_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(b + 8)), 16), 16));
#define CONCORD_STEP(r)                                                        \
  {                                                                            \
    const __m256 ahi = _mm256_broadcast_ss(a + kMR + (r));                     \
    c##r##0 = _mm256_fmadd_ps(ahi, bhi0, c##r##0);                             \
    c##r##1 = _mm256_fmadd_ps(ahi, bhi1, c##r##1);                             \
  }
    CONCORD_ROWS(CONCORD_STEP)
#undef CONCORD_STEP
    a += 2 * kMR;
    b += kNR;
  }
  if (kc % 2 != 0) {  // the last, unpaired step: low halves only
    const __m256i bw0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i bw1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + 8));
    const __m256 blo0 = _mm256_castsi256_ps(_mm256_slli_epi32(bw0, 16));
    const __m256 blo1 = _mm256_castsi256_ps(_mm256_slli_epi32(bw1, 16));
#define CONCORD_STEP(r)                                                        \
  {                                                                            \
    const __m256 alo = _mm256_broadcast_ss(a + (r));                           \
    c##r##0 = _mm256_fmadd_ps(alo, blo0, c##r##0);                             \
    c##r##1 = _mm256_fmadd_ps(alo, blo1, c##r##1);                             \
  }
    CONCORD_ROWS(CONCORD_STEP)
#undef CONCORD_STEP
  }
#define CONCORD_STORE(r)                       \
  _mm256_storeu_ps(c + (r) * ldc, c##r##0);    \
  _mm256_storeu_ps(c + (r) * ldc + 8, c##r##1);
  CONCORD_ROWS(CONCORD_STORE)
#undef CONCORD_STORE
#undef CONCORD_ROWS
}

}  // namespace

MicroKernels avx2_kernels() { return {avx2_f32, avx2_bf16}; }

}  // namespace concord::tensor::detail
