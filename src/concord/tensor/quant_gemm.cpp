// Quantized-weight GEMM: packing of ggml blocks, exact dequantization, the generic (reference)
// kernels, the ISA choice and the OpenMP driver. SIMD kernels: quant_gemm_avx2.cpp, _avx512.cpp.
#include "concord/tensor/quant_gemm.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "concord/numerics/check.h"
#include "concord/numerics/convert.h"

namespace concord::tensor {
namespace detail {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant · 2^-24, exact in fp32
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return sign != 0 ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t f32_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 (and Inf): Inf
  if (a >= 0x38800000u) {  // >= 2^-14: normal fp16; RNE at bit 13, a carry moves the exponent
    const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
  }
  // Subnormal fp16 or zero: round(|f| / 2^-24) to nearest even (0x400 is the smallest normal).
  const uint32_t e = a >> 23;
  if (e < 102) return static_cast<uint16_t>(sign);  // |f| < 2^-25 (fp32 subnormals included)
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;  // |f| = m · 2^(e-150)
  const uint32_t shift = 126 - e;                  // 14 .. 24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u) != 0)) ++q;
  return static_cast<uint16_t>(sign | q);
}

namespace {

// Code of element i (0..31) of row j (0..15) in a packed block's codes: q4 nibble 0..15, q8 the
// signed code.
int packed_code(int code_bits, const uint8_t* codes, int j, int i) {
  if (code_bits == 1) {  // b1: mask i / 4, bit 4j + i % 4; the code is the sign bit (0 or 1)
    const int bit = 4 * j + i % 4;
    return (codes[(i / 4) * 8 + bit / 8] >> (bit % 8)) & 1;
  }
  if (code_bits == 8) {
    return static_cast<int8_t>(codes[(i / 4) * 64 + j * 4 + i % 4] ^ 0x80u);
  }
  const int chunk = i / 8, r = i % 8;
  const uint8_t byte = codes[chunk * 64 + j * 4 + r % 4];
  return r < 4 ? byte & 0x0f : byte >> 4;
}

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// The contract's activation quantizer, plainly.
void quantize_row_generic(const float* x, int64_t K, int8_t* q, float* d, float* s,
                          int32_t* sum) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const float* xb = x + b * 32;
    int8_t* qb = q + b * 32;
    float amax = 0.0f;
    bool finite = true;
    for (int i = 0; i < 32; ++i) {
      finite = finite && std::isfinite(xb[i]);
      amax = std::max(amax, std::fabs(xb[i]));
    }
    const float d32 = amax / 127.0f;
    if (!finite || d32 < FLT_MIN) {
      const float v = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      std::fill_n(qb, 32, int8_t{0});
      d[b] = v;
      s[b] = v;
      sum[b] = 0;
      continue;
    }
    const float inv = 127.0f / amax;  // ggml's x86 quantize_row_q8_0/q8_1: 127/amax, not 1/d
    int32_t total = 0;
    for (int i = 0; i < 32; ++i) {
      const float r = std::nearbyint(xb[i] * inv);
      const int v = static_cast<int>(std::clamp(r, -127.0f, 127.0f));
      qb[i] = static_cast<int8_t>(v);
      total += v;
    }
    d[b] = f16_to_f32(f32_to_f16(d32));
    sum[b] = total;
    s[b] = f16_to_f32(f32_to_f16(d32 * static_cast<float>(total)));
  }
}

// The contract's accumulation, plainly: one output at a time, blocks in order.
void group_generic(const QuantWeight& w, int64_t g, const QuantActs& a, int64_t m0, int64_t rows,
                   float* y, int64_t ldy, int valid) {
  const BlockQuant t = w.type();
  const BlockQuantTraits& traits = block_quant_traits(t);
  const int64_t nb = w.blocks_per_row();
  const uint8_t* base = w.group(g);
  const uint8_t* dptr = base + quant_d_offset(t, nb);
  const uint8_t* mptr = base + quant_m_offset(t, nb);
  const size_t cb = quant_codes_bytes(t);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t m = m0 + r;
    const int8_t* qa = a.q + m * a.K;
    for (int j = 0; j < valid; ++j) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* codes = base + static_cast<size_t>(b) * cb;
        int32_t dot = 0;
        for (int i = 0; i < 32; ++i) {
          const int raw = packed_code(traits.code_bits, codes, j, i);
          const int code = traits.code_bits == 1 ? 2 * raw - 1 : raw - traits.code_offset;
          dot += code * qa[b * 32 + i];
        }
        const float dw = f16_to_f32(load_u16(dptr + (b * 16 + j) * 2));
        const float scale = dw * a.d[m * nb + b];
        acc = std::fma(scale, static_cast<float>(dot), acc);
        if (traits.has_min) {
          const float mw = f16_to_f32(load_u16(mptr + (b * 16 + j) * 2));
          acc = std::fma(mw, a.s[m * nb + b], acc);
        }
      }
      y[m * ldy + g * kQuantGroupRows + j] = acc;
    }
  }
}

}  // namespace

QuantKernels quant_generic_kernels() { return {quantize_row_generic, group_generic, 1, 1}; }

}  // namespace detail

namespace {

// Work (multiply-adds) below which the OpenMP fork costs more than it saves: a passive-wait
// fork/join is ~8 us, a 576x576 q4_1 decode GEMV ~6-15 us on one thread, so decode forks for the
// FFN (1536x576) and the LM head but not for the attention projections.
constexpr int64_t kParallelMinMacs = int64_t{1} << 19;

std::string shape_text(int64_t rows, int64_t cols) {
  return std::to_string(rows) + "x" + std::to_string(cols);
}

const detail::QuantKernels& kernels_of(QuantIsa isa) {
  static const detail::QuantKernels generic = detail::quant_generic_kernels();
  static const detail::QuantKernels avx2 =
      quant_isa_supported(QuantIsa::avx2) ? detail::quant_avx2_kernels() : generic;
  static const detail::QuantKernels avx512 =
      quant_isa_supported(QuantIsa::avx512) ? detail::quant_avx512_kernels() : generic;
  switch (isa) {
    case QuantIsa::avx512: return avx512;
    case QuantIsa::avx2: return avx2;
    case QuantIsa::generic: break;
  }
  return generic;
}

// Grow-only per-thread staging for the quantized activations.
struct ActStorage {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int32_t> sum;
};

}  // namespace

namespace {

// One row per BlockQuant, in enum order (ggml.h's type ids; block layouts from ggml-common.h).
constexpr BlockQuantTraits kBlockQuantTraits[kBlockQuants] = {
    {BlockQuant::q4_0, "q4_0", 2, 18, 2, 4, 8, false, 256},
    {BlockQuant::q4_1, "q4_1", 3, 20, 4, 4, 0, true, 256},
    {BlockQuant::q8_0, "q8_0", 8, 34, 2, 8, 0, false, 512},
    {BlockQuant::b1, "b1", kNotAGgmlType, 6, 2, 1, 0, false, 64},
};

constexpr bool traits_consistent() {
  for (int i = 0; i < kBlockQuants; ++i) {
    const BlockQuantTraits& t = kBlockQuantTraits[i];
    if (static_cast<int>(t.type) != i) return false;
    if (t.ggml_block_bytes != t.ggml_codes_offset + static_cast<size_t>(32 * t.code_bits / 8)) return false;
    if (t.ggml_codes_offset != (t.has_min ? 4u : 2u)) return false;
    if (t.packed_codes_bytes != static_cast<size_t>(kQuantGroupRows * 32 * t.code_bits / 8)) return false;
  }
  return true;
}
static_assert(traits_consistent(), "block-quant traits: enum order, ggml block sizes, packed sizes");

}  // namespace

const BlockQuantTraits& block_quant_traits(BlockQuant type) {
  const auto i = static_cast<size_t>(type);
  CONCORD_CHECK(i < static_cast<size_t>(kBlockQuants), "unknown BlockQuant " + std::to_string(i));
  return kBlockQuantTraits[i];
}

const BlockQuantTraits* block_quant_of_ggml(uint32_t ggml_type) {
  if (ggml_type == kNotAGgmlType) return nullptr;
  for (const BlockQuantTraits& t : kBlockQuantTraits)
    if (t.ggml_type == ggml_type) return &t;
  return nullptr;
}

namespace {
size_t packed_group_bytes(BlockQuant type, int64_t cols) {
  const BlockQuantTraits& traits = block_quant_traits(type);
  const auto nb = static_cast<size_t>(cols / 32);
  const size_t raw = traits.packed_codes_bytes * nb + 32 * nb * (traits.has_min ? 2 : 1);
  return (raw + 63) / 64 * 64;
}
}  // namespace

QuantWeight QuantWeight::unloaded(BlockQuant type, int64_t rows, int64_t cols) {
  QuantWeight w;
  w.type_ = type;
  w.rows_ = rows;
  w.cols_ = cols;
  w.group_bytes_ = packed_group_bytes(type, cols);
  return w;
}

size_t packed_quant_bytes(BlockQuant type, int64_t rows, int64_t cols) {
  const int64_t groups = (rows + kQuantGroupRows - 1) / kQuantGroupRows;
  return packed_group_bytes(type, cols) * static_cast<size_t>(groups);
}

QuantWeight pack_quant_weight(BlockQuant type, int64_t rows, int64_t cols,
                              std::span<const uint8_t> ggml_rows) {
  const std::string what = std::string(block_quant_name(type)) + " weight " + shape_text(rows, cols);
  if (rows < 0 || cols <= 0 || cols % 32 != 0) {
    throw InputError("[quant_gemm] " + what +
                     ": rows must be >= 0 and columns a positive multiple of 32 (ggml blocks "
                     "run along the row; store this tensor in another type)");
  }
  const int64_t nb = cols / 32;
  const size_t block = ggml_block_bytes(type);
  const size_t expected = static_cast<size_t>(rows) * static_cast<size_t>(nb) * block;
  if (ggml_rows.size() != expected) {
    throw InputError("[quant_gemm] " + what + ": got " + std::to_string(ggml_rows.size()) +
                     " bytes, the blocks need " + std::to_string(expected) +
                     " (the tensor data is truncated or its type/shape is wrong)");
  }
  QuantWeight w = QuantWeight::unloaded(type, rows, cols);
  const BlockQuantTraits& traits = block_quant_traits(type);
  const size_t cb = traits.packed_codes_bytes;
  w.data_.assign(packed_quant_bytes(type, rows, cols), 0);  // padding rows: d = m = 0
  // Groups in parallel: a group's bytes are its own (rows of one group share bytes: b1's masks).
  const int64_t groups = w.groups();
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 16))
  for (int64_t g = 0; g < groups; ++g)
  for (int64_t n = g * kQuantGroupRows; n < std::min(rows, (g + 1) * kQuantGroupRows); ++n) {
    const int j = static_cast<int>(n % kQuantGroupRows);
    uint8_t* base = w.data_.data() + static_cast<size_t>(g) * w.group_bytes_;
    uint8_t* dptr = base + detail::quant_d_offset(type, nb);
    uint8_t* mptr = base + detail::quant_m_offset(type, nb);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* src = ggml_rows.data() + (static_cast<size_t>(n) * nb + b) * block;
      uint8_t* codes = base + static_cast<size_t>(b) * cb;
      std::memcpy(dptr + (b * 16 + j) * 2, src, 2);
      const uint8_t* qs = src + traits.ggml_codes_offset;
      if (traits.code_bits == 8) {
        for (int i = 0; i < 32; ++i) codes[(i / 4) * 64 + j * 4 + i % 4] = qs[i] ^ 0x80u;
        continue;
      }
      if (traits.code_bits == 1) {
        for (int i = 0; i < 32; ++i) {
          const int bit = 4 * j + i % 4;
          if ((qs[i / 8] >> (i % 8)) & 1) codes[(i / 4) * 8 + bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
        }
        continue;
      }
      if (traits.has_min) std::memcpy(mptr + (b * 16 + j) * 2, src + 2, 2);
      auto nibble = [&](int i) { return i < 16 ? qs[i] & 0x0f : qs[i - 16] >> 4; };
      // Chunk c, lane j, byte k: element 8c + k low, 8c + 4 + k high.
      for (int c = 0; c < 4; ++c) {
        for (int k = 0; k < 4; ++k) {
          codes[c * 64 + j * 4 + k] =
              static_cast<uint8_t>(nibble(8 * c + k) | nibble(8 * c + 4 + k) << 4);
        }
      }
    }
  }
  return w;
}

void dequantize_rows(const QuantWeight& w, int64_t first, int64_t count, float* out) {
  if (first < 0 || count < 0 || first + count > w.rows()) {
    throw InputError("[dequantize_rows] rows [" + std::to_string(first) + ", " +
                     std::to_string(first + count) + ") are outside the " +
                     shape_text(w.rows(), w.cols()) + " weight");
  }
  CONCORD_CHECK(w.loaded() || count == 0, "dequantize_rows on a weight whose blocks are not loaded");
  const BlockQuant t = w.type();
  const BlockQuantTraits& traits = block_quant_traits(t);
  const int64_t nb = w.blocks_per_row(), K = w.cols();
  const size_t cb = traits.packed_codes_bytes;
  for (int64_t r = 0; r < count; ++r) {
    const int64_t n = first + r;
    const uint8_t* base = w.group(n / kQuantGroupRows);
    const int j = static_cast<int>(n % kQuantGroupRows);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* codes = base + static_cast<size_t>(b) * cb;
      uint16_t bits;
      std::memcpy(&bits, base + detail::quant_d_offset(t, nb) + (b * 16 + j) * 2, 2);
      const float d = detail::f16_to_f32(bits);
      float m = 0.0f;
      if (traits.has_min) {
        std::memcpy(&bits, base + detail::quant_m_offset(t, nb) + (b * 16 + j) * 2, 2);
        m = detail::f16_to_f32(bits);
      }
      for (int i = 0; i < 32; ++i) {
        const int code = detail::packed_code(traits.code_bits, codes, j, i);
        // d·(code − offset) is one rounding; with a minimum, d·code is exact and fma rounds once.
        out[r * K + b * 32 + i] = traits.code_bits == 1 ? (code != 0 ? d : -d)
                                  : traits.has_min     ? std::fma(d, static_cast<float>(code), m)
                                                       : d * static_cast<float>(code - traits.code_offset);
      }
    }
  }
}

std::vector<uint8_t> binary_blocks(std::span<const float> values, int64_t rows, int64_t cols) {
  if (rows < 0 || cols <= 0 || cols % 32 != 0 || values.size() != static_cast<size_t>(rows * cols))
    throw InputError("[quant_gemm] binary weight " + shape_text(rows, cols) + " with " +
                     std::to_string(values.size()) + " values: columns must be a positive multiple of 32");
  const int64_t nb = cols / 32;
  std::vector<uint8_t> out(static_cast<size_t>(rows * nb) * 6, 0);
  // Rows in parallel; the first bad row (lowest index) is the one reported.
  int64_t bad_row = rows, bad_col = 0;
#pragma omp parallel for schedule(static) if (rows * cols >= (int64_t{1} << 16))
  for (int64_t n = 0; n < rows; ++n) {
    const float* row = values.data() + n * cols;
    const float a = std::fabs(row[0]);
    int64_t bad = -1;
    for (int64_t k = 0; k < cols && bad < 0; ++k)
      if (std::fabs(row[k]) != a || !std::isfinite(row[k])) bad = k;
    if (bad >= 0) {
#pragma omp critical(binary_blocks_bad)
      if (n < bad_row) bad_row = n, bad_col = bad;
      continue;
    }
    const uint16_t d = detail::f32_to_f16(a);
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* block = out.data() + static_cast<size_t>(n * nb + b) * 6;
      std::memcpy(block, &d, 2);
      for (int i = 0; i < 32; ++i)
        if (!std::signbit(row[b * 32 + i]) || row[b * 32 + i] == 0.0f)
          block[2 + i / 8] = static_cast<uint8_t>(block[2 + i / 8] | (1u << (i % 8)));
    }
  }
  if (bad_row < rows) {
    const float v = values[static_cast<size_t>(bad_row * cols + bad_col)], a = std::fabs(values[static_cast<size_t>(bad_row * cols)]);
    throw InputError("[quant_gemm] binary weight " + shape_text(rows, cols) + ": row " + std::to_string(bad_row) +
                     " holds " + std::to_string(v) + " besides +-" + std::to_string(a) +
                     " (not the +-alpha of a binary-weight model)");
  }
  return out;
}

const char* quant_isa_name(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::generic: return "generic";
    case QuantIsa::avx2: return "avx2";
    case QuantIsa::avx512: return "avx512";
  }
  return "?";
}

bool quant_isa_supported(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::generic: return true;
    case QuantIsa::avx2: return numerics::isa_supported(numerics::Isa::avx2);
    case QuantIsa::avx512:
      __builtin_cpu_init();
      return numerics::isa_supported(numerics::Isa::avx512) &&
             __builtin_cpu_supports("avx512vnni") && numerics::isa_supported(numerics::Isa::avx2);
  }
  return false;
}

QuantIsa quant_isa() {
  switch (numerics::active_isa()) {
    case numerics::Isa::avx512:
      return quant_isa_supported(QuantIsa::avx512) ? QuantIsa::avx512 : QuantIsa::avx2;
    case numerics::Isa::avx2:
    case numerics::Isa::wide16: return QuantIsa::avx2;
    case numerics::Isa::generic: break;
  }
  return QuantIsa::generic;
}

void quant_gemm(const QuantWeight& w, const float* x, int64_t M, int64_t ldx, float* y,
                int64_t ldy) {
  quant_gemm(w, x, M, ldx, y, ldy, quant_isa());
}

void quant_gemm(const QuantWeight& w, const float* x, int64_t M, int64_t ldx, float* y,
                int64_t ldy, QuantIsa isa) {
  const int64_t N = w.rows(), K = w.cols();
  if (!quant_isa_supported(isa)) {
    throw InputError(std::string("[quant_gemm] this CPU cannot run the ") + quant_isa_name(isa) +
                     " kernels (use generic or avx2, or leave the choice to quant_isa())");
  }
  if (M < 0 || ldx < K || ldy < N) {
    throw InputError("[quant_gemm] M=" + std::to_string(M) + " ldx=" + std::to_string(ldx) +
                     " ldy=" + std::to_string(ldy) + " for a " + shape_text(N, K) +
                     " weight: M must be >= 0, ldx >= K and ldy >= N");
  }
  if (M == 0 || N == 0) return;
  CONCORD_CHECK(w.loaded(), "quant_gemm on a weight whose blocks are not loaded (an expert paged out)");
  const detail::QuantKernels& kern = kernels_of(isa);
  const int64_t nb = K / 32;

  thread_local ActStorage store;
  store.q.resize(static_cast<size_t>(M * K));
  store.d.resize(static_cast<size_t>(M * nb));
  store.s.resize(static_cast<size_t>(M * nb));
  store.sum.resize(static_cast<size_t>(M * nb));
  ActStorage& st = store;
  const bool parallel = M * N * K >= kParallelMinMacs && omp_get_max_threads() > 1;
  // Quantizing a row is ~1 ns per value: below 64k values a parallel region's wake-up (tens of
  // microseconds under the passive wait) costs more than it saves — a speculative verification's
  // 1 + γ rows paid that on every GEMM.
#pragma omp parallel for schedule(static) if (parallel && M * K >= (int64_t{1} << 16))
  for (int64_t m = 0; m < M; ++m) {
    kern.quantize_row(x + m * ldx, K, st.q.data() + m * K, st.d.data() + m * nb,
                      st.s.data() + m * nb, st.sum.data() + m * nb);
  }
  const detail::QuantActs acts{K, nb, st.q.data(), st.d.data(), st.s.data(), st.sum.data()};
  const int64_t groups = w.groups();
  const int64_t tile = M <= kern.max_rows ? M : kern.row_tile;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t g = 0; g < groups; ++g) {
    const int valid = static_cast<int>(std::min<int64_t>(kQuantGroupRows, N - g * kQuantGroupRows));
    for (int64_t m0 = 0; m0 < M; m0 += tile) {
      kern.group(w, g, acts, m0, std::min(tile, M - m0), y, ldy, valid);
    }
  }
}

}  // namespace concord::tensor
