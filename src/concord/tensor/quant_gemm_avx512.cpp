// AVX-512 (F/BW/VL) + VNNI kernels of quant_gemm (only this file gets those flags; called only
// when the CPU has avx512vnni). One zmm lane per output row, a whole 16-row group at once:
// vpdpbusd(u8 weight codes, s8 activations) gives the block dot exactly (q8 codes are stored
// as q + 128, so 128·S_a is subtracted; q4_0's -8 offset is 8·S_a), then the contract's float ops.
#include <immintrin.h>

#include <cstring>

#include "concord/tensor/quant_gemm.h"

namespace concord::tensor::detail {

void quantize_row_avx2(const float* x, int64_t K, int8_t* q, float* d, float* s, int32_t* sum);

namespace {

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Decode prefetch distance: one group (16 rows x K) ahead; 1, 2 and 4 measured alike here.
constexpr size_t kPrefetchGroups = 1;

// All 16 rows of group g against activation rows m0 .. m0 + R - 1.
template <BlockQuant T, int R>
void group_kernel(const QuantWeight& w, int64_t g, const QuantActs& a, int64_t m0, float* y,
                  int64_t ldy, int valid) {
  const int64_t nb = w.blocks_per_row();
  const uint8_t* base = w.group(g);
  const uint8_t* dptr = base + quant_d_offset(T, nb);
  const uint8_t* mptr = base + quant_m_offset(T, nb);
  const size_t cb = quant_codes_bytes(T);
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const int8_t* qa[R];
  __m512 acc[R];
  for (int r = 0; r < R; ++r) {
    qa[r] = a.q + (m0 + r) * a.K;
    acc[r] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* codes = base + static_cast<size_t>(b) * cb;
    if constexpr (R == 1) {  // decode streams the weight once: fetch kPrefetchGroups groups ahead
      const uint8_t* ahead = codes + kPrefetchGroups * w.group_bytes();
      for (size_t off = 0; off < cb; off += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + off), _MM_HINT_T0);
      if (b % 2 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(dptr + b * 32 + kPrefetchGroups * w.group_bytes()), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(mptr + b * 32 + kPrefetchGroups * w.group_bytes()), _MM_HINT_T0);
      }
    }
    const __m512 dw =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dptr + b * 32)));
    __m512i wv[8];
    if constexpr (T == BlockQuant::q8_0) {
      for (int t = 0; t < 8; ++t) wv[t] = _mm512_loadu_si512(codes + t * 64);
    } else if constexpr (T == BlockQuant::b1) {  // mask t -> bytes 0/1: lane j's 4 bytes are row j's elements 4t..4t+3
      for (int t = 0; t < 8; ++t) {
        uint64_t m;
        std::memcpy(&m, codes + t * 8, 8);
        wv[t] = _mm512_maskz_mov_epi8(m, _mm512_set1_epi8(1));
      }
    } else {
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512(codes + c * 64);
        wv[2 * c] = _mm512_and_si512(v, low4);
        wv[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      }
    }
    __m512 mw = _mm512_setzero_ps();
    if constexpr (T == BlockQuant::q4_1) {
      mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mptr + b * 32)));
    }
    for (int r = 0; r < R; ++r) {
      const int8_t* q = qa[r] + b * 32;
      const int64_t ab = (m0 + r) * nb + b;
      __m512i dot = _mm512_setzero_si512();
      for (int t = 0; t < 8; ++t) {
        dot = _mm512_dpbusd_epi32(dot, wv[t], _mm512_set1_epi32(load_i32(q + 4 * t)));
      }
      if constexpr (T == BlockQuant::q8_0) {
        dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(128 * a.sum[ab]));
      } else if constexpr (T == BlockQuant::q4_0) {
        dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(8 * a.sum[ab]));
      } else if constexpr (T == BlockQuant::b1) {  // P = 2 * (sum where set) - S_a
        dot = _mm512_sub_epi32(_mm512_slli_epi32(dot, 1), _mm512_set1_epi32(a.sum[ab]));
      }
      const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(a.d[ab]));
      acc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), acc[r]);
      if constexpr (T == BlockQuant::q4_1) {
        acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(a.s[ab]), acc[r]);
      }
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1u);
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(y + (m0 + r) * ldy + g * kQuantGroupRows, mask, acc[r]);
  }
}

template <BlockQuant T>
void group_rows(const QuantWeight& w, int64_t g, const QuantActs& a, int64_t m0, int64_t rows,
                float* y, int64_t ldy, int valid) {
  switch (rows) {
    case 1: group_kernel<T, 1>(w, g, a, m0, y, ldy, valid); break;
    case 2: group_kernel<T, 2>(w, g, a, m0, y, ldy, valid); break;
    case 3: group_kernel<T, 3>(w, g, a, m0, y, ldy, valid); break;
    case 4: group_kernel<T, 4>(w, g, a, m0, y, ldy, valid); break;
    case 5: group_kernel<T, 5>(w, g, a, m0, y, ldy, valid); break;
    case 6: group_kernel<T, 6>(w, g, a, m0, y, ldy, valid); break;
    case 7: group_kernel<T, 7>(w, g, a, m0, y, ldy, valid); break;
    default: group_kernel<T, 8>(w, g, a, m0, y, ldy, valid); break;
  }
}

void group_avx512(const QuantWeight& w, int64_t g, const QuantActs& a, int64_t m0, int64_t rows,
                  float* y, int64_t ldy, int valid) {
  switch (w.type()) {
    case BlockQuant::q4_0: group_rows<BlockQuant::q4_0>(w, g, a, m0, rows, y, ldy, valid); break;
    case BlockQuant::q4_1: group_rows<BlockQuant::q4_1>(w, g, a, m0, rows, y, ldy, valid); break;
    case BlockQuant::q8_0: group_rows<BlockQuant::q8_0>(w, g, a, m0, rows, y, ldy, valid); break;
    case BlockQuant::b1: group_rows<BlockQuant::b1>(w, g, a, m0, rows, y, ldy, valid); break;
  }
}

}  // namespace

// Row tile 4: measured best of 2..8 at M = 512 here (8 ran at half the speed of 4).
QuantKernels quant_avx512_kernels() { return {quantize_row_avx2, group_avx512, 4, 8}; }

}  // namespace concord::tensor::detail
