// quant_gemm: every ISA path equals the generic path bit for bit (random shapes, strides, edge
// blocks), batch and thread-count invariance, an independent fp64 reference (own ggml block
// decoding, own activation quantizer) within the fp32 accumulation bound, exact dequantization,
// and the input errors.
#include "concord/tensor/quant_gemm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "concord/numerics/check.h"
#include "concord/numerics/convert.h"

namespace concord::tensor {
namespace {

constexpr BlockQuant kTypes[] = {BlockQuant::q4_0, BlockQuant::q4_1, BlockQuant::q8_0};

// ---- the test's own ggml block decoding (from the block definitions, in fp64) ----
double half_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -24);
  } else if (exp == 31) {
    v = mant == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(1.0 + mant / 1024.0, exp - 15);
  }
  return sign ? -v : v;
}

size_t block_bytes(BlockQuant t) { return t == BlockQuant::q4_0 ? 18 : t == BlockQuant::q4_1 ? 20 : 34; }

struct RefBlock {
  double d = 0, m = 0;
  int code[32] = {};  // q8: signed code; q4: nibble 0..15
};

RefBlock decode_block(BlockQuant t, const uint8_t* p) {
  RefBlock b;
  b.d = half_value(static_cast<uint16_t>(p[0] | p[1] << 8));
  if (t == BlockQuant::q8_0) {
    for (int i = 0; i < 32; ++i) b.code[i] = static_cast<int8_t>(p[2 + i]);
    return b;
  }
  const uint8_t* qs = p + 2;
  if (t == BlockQuant::q4_1) {
    b.m = half_value(static_cast<uint16_t>(p[2] | p[3] << 8));
    qs = p + 4;
  }
  for (int j = 0; j < 16; ++j) {
    b.code[j] = qs[j] & 0x0f;
    b.code[j + 16] = qs[j] >> 4;
  }
  return b;
}

// Dequantized value in fp64 (exact: d·q and d·q + m fit in 53 bits for fp16 d and m).
double ref_value(BlockQuant t, const RefBlock& b, int i) {
  switch (t) {
    case BlockQuant::q4_0: return b.d * (b.code[i] - 8);
    case BlockQuant::q4_1: return b.d * b.code[i] + b.m;
    default: return b.d * b.code[i];
  }
}

// ---- the test's own activation quantizer (the contract's definition, written out) ----
float round_half_even(float v) {
  const float f = std::floor(v), diff = v - f;
  if (diff > 0.5f) return f + 1.0f;
  if (diff < 0.5f) return f;
  return std::fmod(f, 2.0f) == 0.0f ? f : f + 1.0f;
}

struct RefActBlock {
  float d = 0;
  int q[32] = {};
  int sum = 0;
};

RefActBlock quantize_block(const float* x) {
  RefActBlock a;
  float amax = 0;
  for (int i = 0; i < 32; ++i) {
    if (!std::isfinite(x[i])) {
      a.d = std::numeric_limits<float>::quiet_NaN();
      return a;
    }
    amax = std::fabs(x[i]) > amax ? std::fabs(x[i]) : amax;
  }
  const float d = amax / 127.0f;
  if (d < FLT_MIN) return a;
  a.d = d;
  const float inv = 1.0f / d;
  for (int i = 0; i < 32; ++i) {
    float r = round_half_even(x[i] * inv);
    r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
    a.q[i] = static_cast<int>(r);
    a.sum += a.q[i];
  }
  return a;
}

// y_ref[m][n] in fp64 and the accumulation error bound: with n_t fp32 terms per output (one per
// block, two for q4_1), the fp32 result has |y - Σ exact| <= (n_t + 2)·2^-24·Σ|term| (one
// rounding of d_w·d_a or d_a·S_a per term, one per fma; γ_{n_t+2} rounded up), plus 2^-149 per
// operation for underflow.
struct RefResult {
  std::vector<double> y, bound;
};

RefResult reference(BlockQuant t, int64_t N, int64_t K, const std::vector<uint8_t>& wbytes,
                    const std::vector<float>& x, int64_t M, int64_t ldx) {
  const int64_t nb = K / 32;
  RefResult r;
  r.y.assign(static_cast<size_t>(M * N), 0.0);
  r.bound.assign(static_cast<size_t>(M * N), 0.0);
  std::vector<RefActBlock> acts(static_cast<size_t>(M * nb));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b) acts[m * nb + b] = quantize_block(&x[m * ldx + b * 32]);
  }
  const double terms = static_cast<double>(t == BlockQuant::q4_1 ? 2 * nb : nb);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t b = 0; b < nb; ++b) {
      const RefBlock wb = decode_block(t, &wbytes[(n * nb + b) * block_bytes(t)]);
      for (int64_t m = 0; m < M; ++m) {
        const RefActBlock& a = acts[m * nb + b];
        double dot = 0, sum = 0;
        for (int i = 0; i < 32; ++i) {
          dot += ref_value(t, wb, i) * (static_cast<double>(a.d) * a.q[i]);
        }
        double idot = 0;
        for (int i = 0; i < 32; ++i) idot += (wb.code[i] - (t == BlockQuant::q4_0 ? 8 : 0)) * a.q[i];
        sum = std::fabs(wb.d * a.d * idot);
        if (t == BlockQuant::q4_1) sum += std::fabs(wb.m * a.d * a.sum);
        r.y[m * N + n] += dot;
        r.bound[m * N + n] += sum;
      }
    }
  }
  for (double& b : r.bound) b = (terms + 2) * 0x1p-24 * b + 3 * terms * 0x1p-149;
  return r;
}

// ---- data ----
uint16_t half_bits(float f) {  // normal-range conversion by truncation is enough for test data
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const int exp = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
  if (exp <= 0) return static_cast<uint16_t>((u >> 16) & 0x8000);
  return static_cast<uint16_t>(((u >> 16) & 0x8000) | exp << 10 | ((u >> 13) & 0x3ff));
}

// Random ggml rows; with edges, some blocks get d = 0, subnormal or negative fp16 scales,
// the largest fp16 scale, and all-max / all-min codes.
std::vector<uint8_t> random_weight(BlockQuant t, int64_t N, int64_t K, uint32_t seed, bool edges) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> byte(0, 255), pick(0, 15);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const size_t bb = block_bytes(t);
  std::vector<uint8_t> out(static_cast<size_t>(N * (K / 32)) * bb);
  for (size_t off = 0; off < out.size(); off += bb) {
    uint8_t* p = &out[off];
    for (size_t i = 0; i < bb; ++i) p[i] = static_cast<uint8_t>(byte(gen));
    uint16_t d = half_bits(normal(gen)), m = half_bits(normal(gen));
    const int kind = edges ? pick(gen) : 15;
    if (kind == 0) d = 0;
    if (kind == 1) d = 0x0001;   // smallest subnormal
    if (kind == 2) d = 0x83ff;   // negative, largest subnormal
    if (kind == 3) d = 0x7bff;   // 65504
    if (kind == 4) m = 0x8001;
    const size_t qs = t == BlockQuant::q4_1 ? 4 : 2;
    if (kind == 5) std::memset(p + qs, t == BlockQuant::q8_0 ? 0x80 : 0xff, bb - qs);  // -128 / 15
    if (kind == 6) std::memset(p + qs, t == BlockQuant::q8_0 ? 0x7f : 0x00, bb - qs);  // 127 / 0
    p[0] = static_cast<uint8_t>(d);
    p[1] = static_cast<uint8_t>(d >> 8);
    if (t == BlockQuant::q4_1) {
      p[2] = static_cast<uint8_t>(m);
      p[3] = static_cast<uint8_t>(m >> 8);
    }
  }
  return out;
}

// Activations (M x ldx); with edges, some blocks are all zero, tiny (quantize to zero), hold
// exact .5 ties (amax 127: d_a = 1), or one large value.
std::vector<float> random_acts(int64_t M, int64_t K, int64_t ldx, uint32_t seed, bool edges) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 9);
  std::vector<float> x(static_cast<size_t>(M * ldx), 12345.0f);  // stride padding: never read
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < K / 32; ++b) {
      float* xb = &x[m * ldx + b * 32];
      const int kind = edges ? pick(gen) : 9;
      for (int i = 0; i < 32; ++i) {
        float v = normal(gen);
        if (kind == 0) v = 0.0f;
        if (kind == 1) v *= 1e-38f;
        if (kind == 2) v = i == 0 ? 127.0f : static_cast<float>(i % 7) - 3.5f;
        if (kind == 3 && i == 5) v = -3e4f;
        xb[i] = v;
      }
    }
  }
  return x;
}

std::vector<QuantIsa> supported_isas() {
  std::vector<QuantIsa> out;
  for (QuantIsa i : {QuantIsa::generic, QuantIsa::avx2, QuantIsa::avx512}) {
    if (quant_isa_supported(i)) out.push_back(i);
  }
  return out;
}

constexpr uint32_t kSentinel = 0x7fc0dead;  // a NaN pattern the kernels never write

std::vector<float> run(const QuantWeight& w, const std::vector<float>& x, int64_t M, int64_t ldx,
                       int64_t ldy, QuantIsa isa) {
  std::vector<float> y(static_cast<size_t>(M * ldy), std::bit_cast<float>(kSentinel));
  quant_gemm(w, x.data(), M, ldx, y.data(), ldy, isa);
  return y;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * 4) == 0; }

TEST(QuantGemm, DequantizeRowsIsExact) {
  for (BlockQuant t : kTypes) {
    const int64_t N = 37, K = 96;
    const auto bytes = random_weight(t, N, K, 7, true);
    const QuantWeight w = pack_quant_weight(t, N, K, bytes);
    EXPECT_EQ(w.type(), t);
    EXPECT_EQ(w.rows(), N);
    EXPECT_EQ(w.cols(), K);
    std::vector<float> out(static_cast<size_t>(N * K));
    dequantize_rows(w, 0, N, out.data());
    std::vector<float> part(static_cast<size_t>(5 * K));
    dequantize_rows(w, 15, 5, part.data());
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t b = 0; b < K / 32; ++b) {
        const RefBlock rb = decode_block(t, &bytes[(n * (K / 32) + b) * block_bytes(t)]);
        for (int i = 0; i < 32; ++i) {
          const float want = static_cast<float>(ref_value(t, rb, i));
          const float got = out[n * K + b * 32 + i];
          ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
              << block_quant_name(t) << " row " << n << " block " << b << " element " << i;
          if (n >= 15 && n < 20) {
            ASSERT_EQ(part[(n - 15) * K + b * 32 + i], got);
          }
        }
      }
    }
  }
}

TEST(QuantGemm, EveryIsaEqualsGenericBitForBit) {
  std::mt19937 gen(2026);
  const auto isas = supported_isas();
  std::printf("paths on this CPU:");
  for (QuantIsa i : isas) std::printf(" %s", quant_isa_name(i));
  std::printf("\n");
  const int64_t Ks[] = {32, 64, 96, 576};
  const int64_t Ns[] = {1, 7, 15, 16, 17, 33, 45};
  int cases = 0;
  for (BlockQuant t : kTypes) {
    for (int64_t K : Ks) {
      for (int64_t N : Ns) {
        const int64_t M = 1 + static_cast<int64_t>(gen() % 37);
        const int64_t ldx = K + 3, ldy = N + 5;
        const auto wb = random_weight(t, N, K, static_cast<uint32_t>(gen()), true);
        const QuantWeight w = pack_quant_weight(t, N, K, wb);
        const auto x = random_acts(M, K, ldx, static_cast<uint32_t>(gen()), true);
        const auto want = run(w, x, M, ldx, ldy, QuantIsa::generic);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t j = N; j < ldy; ++j) {
            ASSERT_EQ(std::bit_cast<uint32_t>(want[m * ldy + j]), kSentinel) << "wrote past N";
          }
        }
        for (QuantIsa isa : isas) {
          const auto got = run(w, x, M, ldx, ldy, isa);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < ldy; ++n) {
              ASSERT_EQ(std::bit_cast<uint32_t>(got[m * ldy + n]),
                        std::bit_cast<uint32_t>(want[m * ldy + n]))
                  << quant_isa_name(isa) << " " << block_quant_name(t) << " M=" << M << " N=" << N
                  << " K=" << K << " at (" << m << ", " << n << ")";
            }
          }
        }
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 3 * 4 * 7);
}

TEST(QuantGemm, MatchesIndependentFp64Reference) {
  std::mt19937 gen(11);
  for (BlockQuant t : kTypes) {
    for (int64_t K : {32, 192, 576}) {
      const int64_t N = 21, M = 9, ldx = K + 1;
      const auto wb = random_weight(t, N, K, static_cast<uint32_t>(gen()), true);
      const QuantWeight w = pack_quant_weight(t, N, K, wb);
      const auto x = random_acts(M, K, ldx, static_cast<uint32_t>(gen()), true);
      const RefResult ref = reference(t, N, K, wb, x, M, ldx);
      for (QuantIsa isa : supported_isas()) {
        const auto y = run(w, x, M, ldx, N, isa);
        for (int64_t i = 0; i < M * N; ++i) {
          ASSERT_LE(std::fabs(y[i] - ref.y[i]), ref.bound[i])
              << quant_isa_name(isa) << " " << block_quant_name(t) << " K=" << K << " output "
              << i << ": " << y[i] << " vs fp64 " << ref.y[i];
        }
      }
    }
  }
}

TEST(QuantGemm, RowsIndependentOfBatchAndThreads) {
  const int64_t N = 301, K = 576, M = 13;
  for (BlockQuant t : kTypes) {
    const auto wb = random_weight(t, N, K, 5, false);
    const QuantWeight w = pack_quant_weight(t, N, K, wb);
    const auto x = random_acts(M, K, K, 6, true);
    for (QuantIsa isa : supported_isas()) {
      const int saved = omp_get_max_threads();
      omp_set_num_threads(2);
      const auto all2 = run(w, x, M, K, N, isa);
      omp_set_num_threads(1);
      const auto all1 = run(w, x, M, K, N, isa);
      omp_set_num_threads(saved);
      EXPECT_TRUE(same_bits(all1.data(), all2.data(), all1.size())) << quant_isa_name(isa);
      for (int64_t m = 0; m < M; ++m) {  // row m alone, and rows m.. as a smaller batch
        std::vector<float> alone(static_cast<size_t>(N));
        quant_gemm(w, &x[m * K], 1, K, alone.data(), N, isa);
        ASSERT_TRUE(same_bits(alone.data(), &all2[m * N], N))
            << quant_isa_name(isa) << " " << block_quant_name(t) << " row " << m;
        std::vector<float> tail(static_cast<size_t>((M - m) * N));
        quant_gemm(w, &x[m * K], M - m, K, tail.data(), N, isa);
        ASSERT_TRUE(same_bits(tail.data(), &all2[m * N], tail.size())) << "batch from row " << m;
      }
    }
  }
}

TEST(QuantGemm, NonFiniteActivationPoisonsOnlyItsRow) {
  const int64_t N = 20, K = 64;
  const auto wb = random_weight(BlockQuant::q4_1, N, K, 9, false);
  const QuantWeight w = pack_quant_weight(BlockQuant::q4_1, N, K, wb);
  auto x = random_acts(3, K, K, 10, false);
  x[K + 40] = std::numeric_limits<float>::infinity();
  for (QuantIsa isa : supported_isas()) {
    const auto y = run(w, x, 3, K, N, isa);
    for (int64_t n = 0; n < N; ++n) {
      EXPECT_TRUE(std::isfinite(y[n]));
      EXPECT_TRUE(std::isnan(y[N + n])) << quant_isa_name(isa);
      EXPECT_TRUE(std::isfinite(y[2 * N + n]));
    }
  }
}

TEST(QuantGemm, IsaFollowsNumericsDispatcher) {
  const numerics::Isa saved = numerics::active_isa();
  numerics::set_active_isa(numerics::Isa::generic);
  EXPECT_EQ(quant_isa(), QuantIsa::generic);
  if (numerics::isa_supported(numerics::Isa::avx2)) {
    numerics::set_active_isa(numerics::Isa::avx2);
    EXPECT_EQ(quant_isa(), QuantIsa::avx2);
  }
  if (numerics::isa_supported(numerics::Isa::avx512)) {
    numerics::set_active_isa(numerics::Isa::avx512);
    EXPECT_EQ(quant_isa(), quant_isa_supported(QuantIsa::avx512) ? QuantIsa::avx512 : QuantIsa::avx2);
  }
  numerics::set_active_isa(saved);
}

TEST(QuantGemm, BadInputsNameTheProblem) {
  const std::vector<uint8_t> bytes(2 * 2 * 18);
  EXPECT_NO_THROW(pack_quant_weight(BlockQuant::q4_0, 2, 64, bytes));
  try {
    pack_quant_weight(BlockQuant::q4_0, 2, 64, std::span(bytes).first(bytes.size() - 1));
    FAIL() << "truncated blocks accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  std::vector<uint8_t> longer(bytes);
  longer.push_back(0);
  EXPECT_THROW(pack_quant_weight(BlockQuant::q4_0, 2, 64, longer), InputError);
  EXPECT_THROW(pack_quant_weight(BlockQuant::q4_0, 2, 48, bytes), InputError);
  EXPECT_THROW(pack_quant_weight(BlockQuant::q8_0, 2, 64, bytes), InputError);
  const QuantWeight w = pack_quant_weight(BlockQuant::q4_0, 2, 64, bytes);
  std::vector<float> x(64), y(2);
  EXPECT_THROW(quant_gemm(w, x.data(), 1, 32, y.data(), 2), InputError);
  EXPECT_THROW(quant_gemm(w, x.data(), 1, 64, y.data(), 1), InputError);
  EXPECT_THROW(dequantize_rows(w, 1, 2, x.data()), InputError);
}

}  // namespace
}  // namespace concord::tensor
