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
}
#undef CONCORD_ROWS

// ---- Skinny kernels (gemm_packed, M <= 8) -----------------------------------------------------
// R rows x P panels: 2·R·P ymm accumulators (at most 8 for the shapes the driver asks for), one
// broadcast of op(A) per row and step, the panels' two vectors per step loaded once and applied
// to every row. Each accumulator sees its steps in order, one fma each.

template <int R, int P>
void skinny_f32_rp(int64_t kc, const float* a, int64_t a_rs, int64_t a_ks, const float* b,
                   int64_t ps, float* c, int64_t ldc, bool load_c) {
  __m256 acc[R][2 * P];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < 2 * P; ++v) {
      acc[r][v] = load_c ? _mm256_loadu_ps(c + r * ldc + 8 * v) : _mm256_setzero_ps();
    }
  }
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    __m256 av[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) av[r] = _mm256_broadcast_ss(a + r * a_rs + k * a_ks);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const float* bp = b + p * ps + k * kNR;
      const __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        acc[r][2 * p] = _mm256_fmadd_ps(av[r], b0, acc[r][2 * p]);
        acc[r][2 * p + 1] = _mm256_fmadd_ps(av[r], b1, acc[r][2 * p + 1]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < 2 * P; ++v) _mm256_storeu_ps(c + r * ldc + 8 * v, acc[r][v]);
  }
}

// bf16 pairs: step 2q from the low halves (<< 16), then step 2q+1 from the high halves (mask).
template <int R, int P>
void skinny_bf16_rp(int64_t kc, const float* a, int64_t a_rs, int64_t a_ks, const uint32_t* b,
                    int64_t ps, float* c, int64_t ldc, bool load_c) {
  __m256 acc[R][2 * P];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < 2 * P; ++v) {
      acc[r][v] = load_c ? _mm256_loadu_ps(c + r * ldc + 8 * v) : _mm256_setzero_ps();
    }
  }
  const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t pairs = kc / 2;
  for (int64_t q = 0; q < pairs; ++q) {
    const float* ak = a + 2 * q * a_ks;
    __m256 av[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) av[r] = _mm256_broadcast_ss(ak + r * a_rs);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const auto* bp = reinterpret_cast<const __m256i*>(b + p * ps + q * kNR);
      const __m256 b0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_load_si256(bp), 16));
      const __m256 b1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_load_si256(bp + 1), 16));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        acc[r][2 * p] = _mm256_fmadd_ps(av[r], b0, acc[r][2 * p]);
        acc[r][2 * p + 1] = _mm256_fmadd_ps(av[r], b1, acc[r][2 * p + 1]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) av[r] = _mm256_broadcast_ss(ak + a_ks + r * a_rs);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const auto* bp = reinterpret_cast<const __m256i*>(b + p * ps + q * kNR);
      const __m256 b0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_load_si256(bp), hi_mask));
      const __m256 b1 =
          _mm256_castsi256_ps(_mm256_and_si256(_mm256_load_si256(bp + 1), hi_mask));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        acc[r][2 * p] = _mm256_fmadd_ps(av[r], b0, acc[r][2 * p]);
        acc[r][2 * p + 1] = _mm256_fmadd_ps(av[r], b1, acc[r][2 * p + 1]);
      }
    }
  }
  if (kc % 2 != 0) {  // the last, unpaired step: low halves only
    const float* ak = a + 2 * pairs * a_ks;
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      const auto* bp = reinterpret_cast<const __m256i*>(b + p * ps + pairs * kNR);
      const __m256 b0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_load_si256(bp), 16));
      const __m256 b1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_load_si256(bp + 1), 16));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 ar = _mm256_broadcast_ss(ak + r * a_rs);
        acc[r][2 * p] = _mm256_fmadd_ps(ar, b0, acc[r][2 * p]);
        acc[r][2 * p + 1] = _mm256_fmadd_ps(ar, b1, acc[r][2 * p + 1]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < 2 * P; ++v) _mm256_storeu_ps(c + r * ldc + 8 * v, acc[r][v]);
  }
}

static_assert(kSkinnyRows == 4 && kSkinnyPanels == 4, "the dispatch tables are 4 x 4");

template <class BWord>
using SkinnyRp = void (*)(int64_t, const float*, int64_t, int64_t, const BWord*, int64_t, float*,
                          int64_t, bool);

template <template <int, int> class Fn, class BWord>
constexpr SkinnyRp<BWord> kTable[4][4] = {
    {Fn<1, 1>::f, Fn<1, 2>::f, Fn<1, 3>::f, Fn<1, 4>::f},
    {Fn<2, 1>::f, Fn<2, 2>::f, Fn<2, 3>::f, Fn<2, 4>::f},
    {Fn<3, 1>::f, Fn<3, 2>::f, Fn<3, 3>::f, Fn<3, 4>::f},
    {Fn<4, 1>::f, Fn<4, 2>::f, Fn<4, 3>::f, Fn<4, 4>::f},
};
template <int R, int P>
struct F32Fn {
  static constexpr SkinnyRp<float> f = skinny_f32_rp<R, P>;
};
template <int R, int P>
struct Bf16Fn {
  static constexpr SkinnyRp<uint32_t> f = skinny_bf16_rp<R, P>;
};

void avx2_skinny_f32(int rows, int panels, int64_t kc, const float* a, int64_t a_rs,
                     int64_t a_ks, const float* b, int64_t panel_stride, float* c, int64_t ldc,
                     bool load_c) {
  kTable<F32Fn, float>[rows - 1][panels - 1](kc, a, a_rs, a_ks, b, panel_stride, c, ldc, load_c);
}

void avx2_skinny_bf16(int rows, int panels, int64_t kc, const float* a, int64_t a_rs,
                      int64_t a_ks, const uint32_t* b, int64_t panel_stride, float* c,
                      int64_t ldc, bool load_c) {
  kTable<Bf16Fn, uint32_t>[rows - 1][panels - 1](kc, a, a_rs, a_ks, b, panel_stride, c, ldc,
                                                 load_c);
}

}  // namespace

MicroKernels avx2_kernels() {
  return {avx2_f32, avx2_bf16, avx2_skinny_f32, avx2_skinny_bf16, {nullptr, nullptr}};
}

}  // namespace concord::tensor::detail
