// AVX2 + FMA + F16C kernels of quant_gemm (only this file gets those flags). One ymm lane per
// output row (8 of a group's 16 at a time): the integer block dots are exact (maddubs on
// nibbles with int16 sums that cannot overflow, or abs/sign maddubs + madd for q8), then the
// contract's float ops lane by lane: scale = d_w·d_a, acc = fma(scale, P, acc), q4_1 fma(m_w, s_a).
// Two kernels: half_kernel for up to 4 activation rows (decode, speculative verification), which
// unpacks each block's codes as it goes and streams the weight once; unpacked_kernel for more
// (prefill), which reads the group's codes unpacked once per call into a scratch (below).
// How the int16 sums of maddubs products are added matters to g++: written as _mm256_add_epi16 it
// reassociates each block's chain of eight into a tree that spills a dozen ymm per block. The
// prefill kernel adds with an opaque vpaddw (add16_chain: latency 1); half_kernel with the
// saturating vpaddsw (g++ leaves it alone; the bounds keep every sum inside int16, so it equals a
// wrapping add bit for bit; latency 2). Figures: bench/README.md, "Against the int8 peak".
#include <immintrin.h>

#include <cfloat>
#include <cstring>
#include <algorithm>
#include <limits>
#include <vector>

#include "concord/tensor/quant_gemm.h"

namespace concord::tensor::detail {
namespace {

inline int32_t load_i32(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

inline int32_t hsum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// The int16 sum of maddubs products (see the top of the file): saturating when several activation
// rows share the registers; one row (decode) keeps vpaddw, whose reassociated tree shortens the
// dependency chain and has registers to spare.
template <int R>
inline __m256i add16(__m256i a, __m256i b) {
  if constexpr (R == 1) {
    return _mm256_add_epi16(a, b);
  } else {
    return _mm256_adds_epi16(a, b);
  }
}

// a + b in int16 lanes (vpaddw), opaque to g++: it keeps a chain of these a chain. Written as
// _mm256_add_epi16, g++ rebuilds each block's chain of eight products as a tree and runs out of
// registers; the saturating vpaddsw it leaves alone has twice the latency (2 cycles, measured).
inline __m256i add16_chain(__m256i a, __m256i b) {
  asm("vpaddw %1, %0, %0" : "+x"(a) : "x"(b));
  return a;
}

// Output lanes [8h, 8h + 8) of group g (rows of W), activation rows m0 .. m0 + R - 1.
template <BlockQuant T, int R>
void half_kernel(const QuantWeight& w, int64_t g, const QuantActs& a, int64_t m0, int h, float* y,
                 int64_t ldy, int lanes) {
  const int64_t nb = w.blocks_per_row();
  const uint8_t* base = w.group(g);
  const uint8_t* dptr = base + quant_d_offset(T, nb) + h * 16;
  const uint8_t* mptr = base + quant_m_offset(T, nb) + h * 16;
  const size_t cb = quant_codes_bytes(T);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const int8_t* qa[R];
  __m256 acc[R];
  for (int r = 0; r < R; ++r) {
    qa[r] = a.q + (m0 + r) * a.K;
    acc[r] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* codes = base + static_cast<size_t>(b) * cb + h * 32;
    if constexpr (R == 1) {  // decode streams the weight once: fetch the next group meanwhile
      if (h == 0) {
        const uint8_t* ahead = base + static_cast<size_t>(b) * cb + w.group_bytes();
        for (size_t off = 0; off < cb; off += 64) _mm_prefetch(reinterpret_cast<const char*>(ahead + off), _MM_HINT_T0);
        if (b % 2 == 0) {
          _mm_prefetch(reinterpret_cast<const char*>(dptr + b * 32 + w.group_bytes()), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(mptr + b * 32 + w.group_bytes()), _MM_HINT_T0);
        }
      }
    }
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dptr + b * 32)));
    __m256i dot[R];
    if constexpr (T == BlockQuant::q8_0) {
      for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
      for (int t = 0; t < 8; ++t) {
        const __m256i v = _mm256_xor_si256(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + t * 64)), flip);
        const __m256i av = _mm256_abs_epi8(v);
        for (int r = 0; r < R; ++r) {
          const __m256i ab = _mm256_set1_epi32(load_i32(qa[r] + b * 32 + 4 * t));
          const __m256i p = _mm256_maddubs_epi16(av, _mm256_sign_epi8(ab, v));  // |p| <= 32512
          dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(p, ones16));
        }
      }
    } else if constexpr (T == BlockQuant::b1) {
      // Mask c's 32 bits of lanes 8h..8h+7 expanded to bytes 0/1 (byte 4j + k: row j, element
      // 4c + k); maddubs against the 4 activations, int16 sums <= 8 * 2 * 127: no overflow.
      const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2,
                                              3, 3, 3, 3, 3, 3, 3, 3);
      const __m256i select = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
      const __m256i one8 = _mm256_set1_epi8(1);
      __m256i d16[R];
      for (int r = 0; r < R; ++r) d16[r] = _mm256_setzero_si256();
      for (int c = 0; c < 8; ++c) {
        uint32_t m;
        std::memcpy(&m, base + static_cast<size_t>(b) * cb + c * 8 + h * 4, 4);
        __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(m)), spread);
        v = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, select), select), one8);
        for (int r = 0; r < R; ++r)
          d16[r] = add16<R>(d16[r], _mm256_maddubs_epi16(v, _mm256_set1_epi32(load_i32(qa[r] + b * 32 + 4 * c))));
      }
      for (int r = 0; r < R; ++r)
        dot[r] = _mm256_sub_epi32(_mm256_slli_epi32(_mm256_madd_epi16(d16[r], ones16), 1),
                                  _mm256_set1_epi32(a.sum[(m0 + r) * nb + b]));
    } else {
      __m256i d16[R];
      for (int r = 0; r < R; ++r) d16[r] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + c * 64));
        const __m256i lo = _mm256_and_si256(v, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        for (int r = 0; r < R; ++r) {
          const int8_t* q = qa[r] + b * 32 + 8 * c;
          // int16 lanes: 8 maddubs of <= 2·15·127 each, |sum| <= 30480: no overflow.
          d16[r] = add16<R>(d16[r], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_i32(q))));
          d16[r] = add16<R>(d16[r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_i32(q + 4))));
        }
      }
      for (int r = 0; r < R; ++r) {
        dot[r] = _mm256_madd_epi16(d16[r], ones16);
        if constexpr (T == BlockQuant::q4_0) {
          dot[r] = _mm256_sub_epi32(dot[r], _mm256_set1_epi32(8 * a.sum[(m0 + r) * nb + b]));
        }
      }
    }
    __m256 mw = _mm256_setzero_ps();
    if constexpr (T == BlockQuant::q4_1) {
      mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mptr + b * 32)));
    }
    for (int r = 0; r < R; ++r) {
      const int64_t ab = (m0 + r) * nb + b;
      const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(a.d[ab]));
      acc[r] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot[r]), acc[r]);
      if constexpr (T == BlockQuant::q4_1) {
        acc[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.s[ab]), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    float* out = y + (m0 + r) * ldy + g * kQuantGroupRows + h * 8;
    if (lanes == 8) {
      _mm256_storeu_ps(out, acc[r]);
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, acc[r]);
      std::memcpy(out, tmp, sizeof(float) * static_cast<size_t>(lanes));
    }
  }
}

// ---- Many rows (prefill, batched decode above max_rows): the group's codes unpacked once ----
//
// half_kernel unpacks each block's nibbles (and, shift, and: 12 instructions per block and half)
// again for every row tile — at M = 512 and 3 rows a tile, 170 times per group. Here the group's
// codes are unpacked once per call into a thread-local scratch of byte vectors, in the order the
// products read them, and every row tile then loads them ready: per product instruction there
// remain the activation broadcast, the int16 add and the per-block epilogue. The scratch of a
// group is 512 bytes per block (1024 for q8_0): 18-48 KiB at SmolLM2's K = 576-1536, in L1/L2.
//
// Scratch layout, per block b and half h (lanes = rows 8h..8h+7 of the group), 8 vectors of 32
// bytes, vector t holding elements 4t..4t+3 of each lane's row: q4 nibbles 0..15, b1 bytes 0/1;
// q8_0 two vectors per t, |q| then q (the sign maddubs applies to the activation).
template <BlockQuant T>
constexpr size_t unpacked_half_bytes() {  // one block, one half: 8 vectors (q8_0: 16) of 32 bytes
  return T == BlockQuant::q8_0 ? 512 : 256;
}

template <BlockQuant T>
void unpack_group(const QuantWeight& w, int64_t g, uint8_t* u) {
  const int64_t nb = w.blocks_per_row();
  const uint8_t* base = w.group(g);
  const size_t cb = quant_codes_bytes(T);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* codes = base + static_cast<size_t>(b) * cb;
    for (int h = 0; h < 2; ++h) {
      auto* out = reinterpret_cast<__m256i*>(u + (static_cast<size_t>(b) * 2 + h) * unpacked_half_bytes<T>());
      if constexpr (T == BlockQuant::q8_0) {
        for (int t = 0; t < 8; ++t) {
          const __m256i v = _mm256_xor_si256(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + t * 64 + h * 32)), flip);
          _mm256_store_si256(out + 2 * t, _mm256_abs_epi8(v));
          _mm256_store_si256(out + 2 * t + 1, v);
        }
      } else if constexpr (T == BlockQuant::b1) {
        const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
                                                2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        const __m256i select = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
        const __m256i one8 = _mm256_set1_epi8(1);
        for (int t = 0; t < 8; ++t) {
          uint32_t m;
          std::memcpy(&m, codes + t * 8 + h * 4, 4);
          const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(m)), spread);
          _mm256_store_si256(out + t, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, select), select), one8));
        }
      } else {
        for (int c = 0; c < 4; ++c) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + c * 64 + h * 32));
          _mm256_store_si256(out + 2 * c, _mm256_and_si256(v, low4));
          _mm256_store_si256(out + 2 * c + 1, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
        }
      }
    }
  }
}

// Output lanes [0, 8H) of group g (H = 2: both halves, so each activation broadcast feeds two
// products; H = 1: the first 8 rows only) for activation rows m0 .. m0 + R - 1, codes from the
// scratch: the same integer dots and float operations as half_kernel, lane by lane.
template <BlockQuant T, int R, int H>
void unpacked_kernel(const QuantWeight& w, int64_t g, const uint8_t* u, const QuantActs& a, int64_t m0,
                     float* y, int64_t ldy, int valid) {
  const int64_t nb = w.blocks_per_row();
  const uint8_t* base = w.group(g);
  const uint8_t* dptr = base + quant_d_offset(T, nb);
  const uint8_t* mptr = base + quant_m_offset(T, nb);
  const __m256i ones16 = _mm256_set1_epi16(1);
  const int8_t* qa[R];
  __m256 acc[R][H];
  for (int r = 0; r < R; ++r) {
    qa[r] = a.q + (m0 + r) * a.K;
    for (int h = 0; h < H; ++h) acc[r][h] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    const auto* ub = reinterpret_cast<const __m256i*>(u + static_cast<size_t>(b) * 2 * unpacked_half_bytes<T>());
    constexpr int kHalfVectors = static_cast<int>(unpacked_half_bytes<T>() / 32);
    __m256i dot[R][H];
    if constexpr (T == BlockQuant::q8_0) {
      for (int r = 0; r < R; ++r)
        for (int h = 0; h < H; ++h) dot[r][h] = _mm256_setzero_si256();
      for (int t = 0; t < 8; ++t) {
        __m256i av[H], v[H];
        for (int h = 0; h < H; ++h) {
          av[h] = _mm256_load_si256(ub + h * kHalfVectors + 2 * t);
          v[h] = _mm256_load_si256(ub + h * kHalfVectors + 2 * t + 1);
        }
        for (int r = 0; r < R; ++r) {
          const __m256i ab = _mm256_set1_epi32(load_i32(qa[r] + b * 32 + 4 * t));
          for (int h = 0; h < H; ++h) {
            const __m256i p = _mm256_maddubs_epi16(av[h], _mm256_sign_epi8(ab, v[h]));  // |p| <= 32512
            dot[r][h] = _mm256_add_epi32(dot[r][h], _mm256_madd_epi16(p, ones16));
          }
        }
      }
    } else {
      // int16 lanes: 8 maddubs of <= 2·15·127 (b1: 2·127) each, |sum| <= 30480: no overflow.
      __m256i d16[R][H];
      for (int r = 0; r < R; ++r)
        for (int h = 0; h < H; ++h) d16[r][h] = _mm256_setzero_si256();
      for (int t = 0; t < 8; ++t) {
        __m256i v[H];
        for (int h = 0; h < H; ++h) v[h] = _mm256_load_si256(ub + h * kHalfVectors + t);
        for (int r = 0; r < R; ++r) {
          const __m256i ab = _mm256_set1_epi32(load_i32(qa[r] + b * 32 + 4 * t));
          for (int h = 0; h < H; ++h) {
            d16[r][h] = add16_chain(d16[r][h], _mm256_maddubs_epi16(v[h], ab));
          }
        }
      }
      for (int r = 0; r < R; ++r) {
        for (int h = 0; h < H; ++h) {
          dot[r][h] = _mm256_madd_epi16(d16[r][h], ones16);
          if constexpr (T == BlockQuant::q4_0) {
            dot[r][h] = _mm256_sub_epi32(dot[r][h], _mm256_set1_epi32(8 * a.sum[(m0 + r) * nb + b]));
          } else if constexpr (T == BlockQuant::b1) {
            dot[r][h] = _mm256_sub_epi32(_mm256_slli_epi32(dot[r][h], 1), _mm256_set1_epi32(a.sum[(m0 + r) * nb + b]));
          }
        }
      }
    }
    // Half by half, so that only one half's scales are live beside the accumulators (both halves'
    // at once spilled the accumulators at 2 rows).
    for (int h = 0; h < H; ++h) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dptr + b * 32 + h * 16)));
      __m256 mw = _mm256_setzero_ps();
      if constexpr (T == BlockQuant::q4_1) {
        mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mptr + b * 32 + h * 16)));
      }
      for (int r = 0; r < R; ++r) {
        const int64_t ab = (m0 + r) * nb + b;
        const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(a.d[ab]));
        acc[r][h] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot[r][h]), acc[r][h]);
        if constexpr (T == BlockQuant::q4_1) {
          acc[r][h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a.s[ab]), acc[r][h]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int h = 0; h < H; ++h) {
      float* out = y + (m0 + r) * ldy + g * kQuantGroupRows + h * 8;
      const int lanes = std::min(8, valid - 8 * h);
      if (lanes == 8) {
        _mm256_storeu_ps(out, acc[r][h]);
      } else {
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, acc[r][h]);
        std::memcpy(out, tmp, sizeof(float) * static_cast<size_t>(lanes));
      }
    }
  }
}

// Rows per tile of the unpacked path, both halves at once (measured: see quant_avx2_kernels).
constexpr int kUnpackedTile = 2;

template <BlockQuant T, int H>
void unpacked_rows(const QuantWeight& w, int64_t g, const uint8_t* u, const QuantActs& a, int64_t m0,
                   int64_t rows, float* y, int64_t ldy, int valid) {
  for (int64_t r0 = m0; r0 < m0 + rows; r0 += kUnpackedTile) {
    switch (std::min<int64_t>(kUnpackedTile, m0 + rows - r0)) {
      case 1: unpacked_kernel<T, 1, H>(w, g, u, a, r0, y, ldy, valid); break;
      case 2: unpacked_kernel<T, 2, H>(w, g, u, a, r0, y, ldy, valid); break;
      case 3: unpacked_kernel<T, 3, H>(w, g, u, a, r0, y, ldy, valid); break;
      default: unpacked_kernel<T, kUnpackedTile, H>(w, g, u, a, r0, y, ldy, valid); break;
    }
  }
}

template <BlockQuant T>
void group_many_rows(const QuantWeight& w, int64_t g, const QuantActs& a, int64_t m0, int64_t rows,
                     float* y, int64_t ldy, int valid) {
  thread_local std::vector<uint8_t, AlignedAllocator<uint8_t>> scratch;
  const size_t need = static_cast<size_t>(w.blocks_per_row()) * 2 * unpacked_half_bytes<T>();
  if (scratch.size() < need) scratch.resize(need);
  uint8_t* u = scratch.data();
  unpack_group<T>(w, g, u);
  if (valid > 8) {
    unpacked_rows<T, 2>(w, g, u, a, m0, rows, y, ldy, valid);
  } else {
    unpacked_rows<T, 1>(w, g, u, a, m0, rows, y, ldy, valid);
  }
}

template <BlockQuant T>
void group_rows(const QuantWeight& w, int64_t g, const QuantActs& a, int64_t m0, int64_t rows,
                float* y, int64_t ldy, int valid) {
  if (rows > 4) {
    group_many_rows<T>(w, g, a, m0, rows, y, ldy, valid);
    return;
  }
  for (int h = 0; h < 2 && valid > 8 * h; ++h) {
    const int lanes = valid - 8 * h < 8 ? valid - 8 * h : 8;
    switch (rows) {
      case 1: half_kernel<T, 1>(w, g, a, m0, h, y, ldy, lanes); break;
      case 2: half_kernel<T, 2>(w, g, a, m0, h, y, ldy, lanes); break;
      case 3: half_kernel<T, 3>(w, g, a, m0, h, y, ldy, lanes); break;
      default: half_kernel<T, 4>(w, g, a, m0, h, y, ldy, lanes); break;
    }
  }
}

void group_avx2(const QuantWeight& w, int64_t g, const QuantActs& a, int64_t m0, int64_t rows,
                float* y, int64_t ldy, int valid) {
  switch (w.type()) {
    case BlockQuant::q4_0: group_rows<BlockQuant::q4_0>(w, g, a, m0, rows, y, ldy, valid); break;
    case BlockQuant::q4_1: group_rows<BlockQuant::q4_1>(w, g, a, m0, rows, y, ldy, valid); break;
    case BlockQuant::q8_0: group_rows<BlockQuant::q8_0>(w, g, a, m0, rows, y, ldy, valid); break;
    case BlockQuant::b1: group_rows<BlockQuant::b1>(w, g, a, m0, rows, y, ldy, valid); break;
  }
}

// fp32 -> fp16 (F16C, imm 0: round to nearest even whatever MXCSR says; overflow -> Inf) -> fp32.
inline float round_to_f16(float v) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(v), 0)));
}

}  // namespace

// The contract's activation quantizer: max, divide, multiply and the fp16 rounding are IEEE ops
// (the same bits as the generic loop), cvtps rounds to nearest even as nearbyint does.
void quantize_row_avx2(const float* x, int64_t K, int8_t* q, float* d, float* s, int32_t* sum) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  const __m256i lim = _mm256_set1_epi32(127), neg_lim = _mm256_set1_epi32(-127);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* xb = x + b * 32;
    __m256 v[4];
    __m256i nonfinite = _mm256_setzero_si256();
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      const __m256i e = _mm256_and_si256(_mm256_castps_si256(v[i]), exp_mask);
      nonfinite = _mm256_or_si256(nonfinite, _mm256_cmpeq_epi32(e, exp_mask));
      amax = _mm256_max_ps(amax, _mm256_and_ps(v[i], abs_mask));
    }
    const bool finite = _mm256_testz_si256(nonfinite, nonfinite) != 0;
    const float amax_s = hmax8(amax);
    const float d32 = amax_s / 127.0f;
    if (!finite || d32 < FLT_MIN) {
      const float z = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      std::memset(q + b * 32, 0, 32);
      d[b] = z;
      s[b] = z;
      sum[b] = 0;
      continue;
    }
    const __m256 inv = _mm256_set1_ps(127.0f / amax_s);
    __m256i qi[4];
    for (int i = 0; i < 4; ++i) {
      qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
      qi[i] = _mm256_min_epi32(_mm256_max_epi32(qi[i], neg_lim), lim);
    }
    const __m256i total = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + b * 32), _mm256_permutevar8x32_epi32(p, order));
    const int32_t t = hsum8(total);
    d[b] = round_to_f16(d32);
    sum[b] = t;
    s[b] = round_to_f16(d32 * static_cast<float>(t));
  }
}

// Up to 4 rows in one half_kernel call (the weight streams once); above, one call per group with
// every row (row_tile "all"): group_many_rows unpacks the group once and tiles the rows itself.
QuantKernels quant_avx2_kernels() { return {quantize_row_avx2, group_avx2, kAllRows, 4}; }

}  // namespace concord::tensor::detail
