// SIMD fast paths (convert.h, block.h quantize/dequantize) against the scalar reference, bit
// for bit, on every ISA this CPU supports: exhaustive decode, every tie/subnormal/overflow/
// special input, millions of random fp32 patterns, stochastic rounding with the same Philox
// stream, block quantization over shapes, scale rules and special blocks, thread counts.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/numerics/convert.h"
#include "concord/numerics/scalar.h"

namespace concord::numerics {

// gtest names the ISA in failure messages instead of printing its byte.
void PrintTo(Isa isa, std::ostream* os);
void PrintTo(Isa isa, std::ostream* os) { *os << isa_name(isa); }

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Sanitizer builds run ~16x slower: check fewer random inputs there.
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kRandomScale = 16;
#else
constexpr size_t kRandomScale = 1;
#endif

const std::vector<Format> kFastFormats = {Format::bf16, Format::fp16, Format::e4m3,
                                          Format::e5m2, Format::e2m3, Format::e3m2,
                                          Format::e2m1, Format::ue4m3};
const std::vector<Format> kAllFormats = {Format::bf16, Format::fp16, Format::e4m3, Format::e5m2,
                                         Format::e2m3, Format::e3m2, Format::e2m1, Format::e8m0,
                                         Format::ue4m3, Format::int8, Format::int4,
                                         Format::f32};
const Rounding kRoundings[] = {Rounding::rne, Rounding::rtz, Rounding::stochastic};
const Overflow kOverflows[] = {Overflow::saturate, Overflow::ieee};

// Runs each test once per ISA; the ones this CPU lacks are skipped with a message.
class Simd : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    saved_ = active_isa();
    if (!isa_supported(GetParam())) {
      GTEST_SKIP() << "this CPU has no " << isa_name(GetParam())
                   << ": its kernels (same source as the other ISAs) cannot run here";
    }
    set_active_isa(GetParam());
  }
  void TearDown() override { set_active_isa(saved_); }
  Isa saved_ = Isa::generic;
};

std::string describe(Format f, Rounding r, Overflow o) {
  return std::string(traits(f).name) + "/" + std::string(rounding_name(r)) + "/" +
         std::string(overflow_name(o));
}

// Encodes xs with encode_array and with encode_ref; returns how many codes differ (and
// reports the first few).
size_t compare_encode(Format f, Rounding r, Overflow o, const std::vector<float>& xs,
                      RandomStream rng, uint64_t first_index) {
  std::vector<uint8_t> codes(code_bytes(f, static_cast<int64_t>(xs.size())));
  encode_array(f, r, o, xs.data(), codes.data(), xs.size(), rng, first_index);
  size_t mismatches = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const uint32_t random = r == Rounding::stochastic ? rng.word(first_index + i) : 0u;
    const uint32_t want = encode_ref(f, xs[i], r, o, random);
    const uint32_t got = get_code(f, codes, static_cast<int64_t>(i));
    if (want != got && ++mismatches <= 5) {
      ADD_FAILURE() << describe(f, r, o) << " x=0x" << std::hex << f32_bits(xs[i])
                    << " (" << xs[i] << ") random=0x" << random << ": fast 0x" << got
                    << ", reference 0x" << want;
    }
  }
  return mismatches;
}

// Every value of interest for format f: each code's value, every midpoint between adjacent
// codes and +-1 fp32 ulp around it, every power of two over fp32's range (all fp32 subnormal
// powers included) with its neighbours, values around max and the overflow threshold, +-0,
// +-Inf, NaNs with payloads; each with both signs.
std::vector<float> special_inputs(Format f) {
  std::vector<double> values;
  const FormatTraits& t = traits(f);
  if (t.bits <= 16 && !t.is_integer()) {
    std::vector<double> grid;
    for (uint32_t code = 0; code < t.code_count(); ++code) {
      const float v = decode_ref(f, code);
      if (std::isfinite(v) && v >= 0.0f) grid.push_back(v);
    }
    std::sort(grid.begin(), grid.end());
    grid.erase(std::unique(grid.begin(), grid.end()), grid.end());
    for (size_t i = 0; i < grid.size(); ++i) {
      values.push_back(grid[i]);
      if (i + 1 < grid.size()) values.push_back((grid[i] + grid[i + 1]) / 2);  // exact in fp32
    }
    // Beyond max: the next step up (the overflow threshold is its midpoint with max).
    const double step = grid.back() - grid[grid.size() - 2];
    values.push_back(grid.back() + step / 2);
    values.push_back(grid.back() + step);
    values.push_back(grid.back() * 2);
  }
  for (int e = -149; e <= 127; ++e) values.push_back(std::ldexp(1.0, e));
  values.push_back(std::numeric_limits<float>::max());
  values.push_back(std::numeric_limits<float>::denorm_min() * 3);
  values.push_back(0x7FFFFF * static_cast<double>(std::numeric_limits<float>::denorm_min()));
  std::vector<float> out;
  for (double v : values) {
    const auto x = static_cast<float>(v);
    for (float y : {x, std::nextafter(x, 0.0f), std::nextafter(x, kInf)}) {
      out.push_back(y);
      out.push_back(-y);
    }
  }
  for (uint32_t bits : {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
                        0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FA12345u, 0xFFFFFFFFu,
                        0x7FFFFFFFu, 0x7FBFFFFFu}) {
    out.push_back(f32_from_bits(bits));
  }
  return out;
}

// fp32 patterns: half uniform over all 2^32 bit patterns, half with exponents near the
// format's range (where the rounding decisions are).
std::vector<float> random_inputs(Format f, size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  const FormatTraits& t = traits(f);
  const int low = std::max(-149, t.emin - t.mantissa_bits - 3), high = std::min(127, t.emax + 2);
  std::uniform_int_distribution<int> exponent(low, high);
  std::vector<float> xs(n);
  for (size_t i = 0; i < n; ++i) {
    const auto bits = static_cast<uint32_t>(gen());
    if (i % 2 == 0) {
      xs[i] = f32_from_bits(bits);
    } else {
      const int e = exponent(gen);
      const float mantissa = 1.0f + static_cast<float>(bits & 0x7FFFFFu) * 0x1p-23f;
      const float v = std::ldexp(mantissa, e);
      xs[i] = (bits >> 31) ? -v : v;
    }
  }
  return xs;
}

std::vector<uint8_t> all_codes_packed(Format f) {
  const FormatTraits& t = traits(f);
  // 6-bit and 4-bit formats: also codes with stray high bits in the byte (must be ignored).
  const uint32_t count = t.bits == 16 ? 65536u : 256u;
  std::vector<uint8_t> codes(t.bits == 16 ? 2 * count : count);
  for (uint32_t c = 0; c < count; ++c) {
    if (t.bits == 16) {
      codes[2 * c] = static_cast<uint8_t>(c);
      codes[2 * c + 1] = static_cast<uint8_t>(c >> 8);
    } else {
      codes[c] = static_cast<uint8_t>(c);
    }
  }
  return codes;
}

TEST_P(Simd, ActiveIsaIsTheOneSet) { EXPECT_EQ(active_isa_name(), isa_name(GetParam())); }

TEST_P(Simd, DecodeEveryCodeOfEveryFormat) {
  size_t checked = 0;
  for (Format f : kAllFormats) {
    if (f == Format::f32) continue;
    const FormatTraits& t = traits(f);
    const std::vector<uint8_t> codes = all_codes_packed(f);
    // For 4-bit formats each byte holds two codes: 256 bytes cover every pair.
    const size_t n = t.bits == 16 ? 65536 : t.bits == 4 ? 512 : 256;
    std::vector<float> out(n);
    decode_array(f, codes.data(), out.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t code = get_code(f, codes, static_cast<int64_t>(i));
      ASSERT_EQ(f32_bits(out[i]), f32_bits(decode_ref(f, code)))
          << t.name << " code 0x" << std::hex << code;
      ++checked;
    }
    // Unaligned lengths exercise the partial-vector tail.
    for (size_t len : {size_t{1}, size_t{3}, size_t{17}, size_t{33}}) {
      std::vector<float> part(len);
      decode_array(f, codes.data() + (t.bits == 16 ? 2 : 1), part.data(), len);
      for (size_t i = 0; i < len; ++i) {
        const std::span<const uint8_t> shifted(codes.data() + (t.bits == 16 ? 2 : 1),
                                               codes.size() - (t.bits == 16 ? 2 : 1));
        ASSERT_EQ(f32_bits(part[i]),
                  f32_bits(decode_ref(f, get_code(f, shifted, static_cast<int64_t>(i)))));
      }
    }
  }
  EXPECT_GT(checked, 2 * 65536u);
}

TEST_P(Simd, EncodeEveryTieSubnormalAndSpecial) {
  const RandomStream rng{0x1234'5678'9ABCull, 7};
  size_t checked = 0;
  for (Format f : kAllFormats) {
    const std::vector<float> xs = special_inputs(f);
    for (Rounding r : kRoundings) {
      for (Overflow o : kOverflows) {
        for (uint64_t first : {uint64_t{0}, uint64_t{3}, (uint64_t{1} << 32) - 5}) {
          EXPECT_EQ(compare_encode(f, r, o, xs, rng, first), 0u) << describe(f, r, o);
          checked += xs.size();
        }
      }
    }
  }
  std::printf("  %zu special inputs checked\n", checked);
}

TEST_P(Simd, EncodeMillionsOfRandomPatterns) {
  const RandomStream rng{42, 3};
  size_t checked = 0;
  uint32_t seed = 1;
  for (Format f : kFastFormats) {
    for (Rounding r : kRoundings) {
      // RNE is the default everywhere: it gets the most inputs.
      const size_t n = (r == Rounding::rne ? 1'500'000 : 500'000) / kRandomScale;
      const std::vector<float> xs = random_inputs(f, n, seed++);
      for (Overflow o : kOverflows) {
        EXPECT_EQ(compare_encode(f, r, o, xs, rng, 1), 0u) << describe(f, r, o);
        checked += n;
      }
    }
  }
  std::printf("  %zu random inputs checked\n", checked);
}

TEST_P(Simd, StochasticRoundingUsesTheElementIndexForAnyOffsetAndLength) {
  const RandomStream rng{99, 1};
  const std::vector<float> xs = random_inputs(Format::bf16, 300, 5);
  for (Format f : {Format::bf16, Format::e4m3, Format::e2m1}) {
    for (uint64_t first = 0; first < 9; ++first) {
      for (size_t len : {size_t{1}, size_t{2}, size_t{5}, size_t{31}, size_t{64}, size_t{67},
                         size_t{300}}) {
        const std::vector<float> part(xs.begin(), xs.begin() + static_cast<int64_t>(len));
        EXPECT_EQ(compare_encode(f, Rounding::stochastic, Overflow::saturate, part, rng, first),
                  0u);
      }
    }
  }
}

// ---- block quantization ----

// Gaussian values with a different magnitude per row, plus special blocks.
std::vector<float> block_input(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(r % 40) - 20);
    for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(r * cols + c)] = normal(gen) * scale;
  }
  if (rows * cols >= 4 * 32 * 4) {
    // Row 1: a NaN block, an Inf block, an all-zero block, an fp32-subnormal-amax block.
    auto at = [&](int64_t r, int64_t c) -> float& { return x[static_cast<size_t>(r * cols + c)]; };
    at(1, 3) = kNaN;
    at(1, 40) = -kInf;
    for (int64_t c = 64; c < 96; ++c) at(1, c) = 0.0f;
    for (int64_t c = 96; c < 128; ++c) at(1, c) = std::ldexp(normal(gen), -135);
    at(2, 5) = 3.0e38f;
  }
  return x;
}

bool same_float(float a, float b) {
  // NaN * NaN keeps either operand's payload depending on operand order, which the compiler
  // chooses; every NaN counts as the same value, every other result must match bit for bit.
  return f32_bits(a) == f32_bits(b) || (std::isnan(a) && std::isnan(b));
}

void expect_same_quantization(const QuantDesc& desc, const std::vector<float>& x, int64_t rows,
                              int64_t cols, RandomStream rng) {
  const std::string what = desc.to_string() + " " + std::to_string(rows) + "x" +
                           std::to_string(cols);
  const QuantizedTensor want = quantize_ref(desc, x.data(), rows, cols, rng);
  const QuantizedTensor got = quantize(desc, x.data(), rows, cols, rng);
  ASSERT_EQ(got.codes, want.codes) << what;
  ASSERT_EQ(got.scales, want.scales) << what;
  ASSERT_EQ(f32_bits(got.tensor_scale), f32_bits(want.tensor_scale)) << what;
  std::vector<float> out_ref(x.size()), out_fast(x.size());
  dequantize_ref(want, out_ref.data());
  dequantize(want, out_fast.data());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(same_float(out_fast[i], out_ref[i]))
        << what << " element " << i << ": fast " << out_fast[i] << ", reference " << out_ref[i];
  }
}

std::vector<QuantDesc> block_descriptors() {
  std::vector<QuantDesc> descs;
  for (Format e : {Format::e4m3, Format::e5m2, Format::e2m3, Format::e3m2, Format::e2m1}) {
    for (ScaleRule rule : {ScaleRule::floor, ScaleRule::ceil, ScaleRule::even, ScaleRule::rceil}) {
      QuantDesc d = QuantDesc::mx(e, rule);
      descs.push_back(d);
      d.rounding = Rounding::stochastic;
      descs.push_back(d);
    }
  }
  QuantDesc column = QuantDesc::mx(Format::e4m3);
  column.axis = 0;
  descs.push_back(column);
  QuantDesc ieee = QuantDesc::mx(Format::e5m2);
  ieee.overflow = Overflow::ieee;
  descs.push_back(ieee);
  for (BlockShape b : {BlockShape{1, 16}, BlockShape{16, 16}}) {
    QuantDesc d = QuantDesc::nvfp4(b);
    descs.push_back(d);
    d.rounding = Rounding::stochastic;
    descs.push_back(d);
  }
  descs.push_back(QuantDesc::per_tensor(Format::e4m3));
  descs.push_back(QuantDesc::per_tensor(Format::e5m2));
  descs.push_back(QuantDesc::elementwise(Format::bf16, Rounding::stochastic));
  descs.push_back(QuantDesc::elementwise(Format::e2m1));
  descs.push_back(QuantDesc::elementwise(Format::int8));  // reference fallback
  return descs;
}

TEST_P(Simd, BlockQuantizeMatchesTheReference) {
  const RandomStream rng{2024, 11};
  size_t cases = 0;
  // 300 and 557 columns: whole groups of blocks through the fused row kernel, then a tail
  // (557 is odd: rows starting at an odd element keep 4-bit codes off the fused path).
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {1, 31}, {3, 32}, {17, 33},
                            {33, 47}, {5, 300}, {7, 557}, {64, 4096}}) {
    const std::vector<float> x = block_input(rows, cols, static_cast<uint32_t>(rows * cols));
    for (const QuantDesc& desc : block_descriptors()) {
      expect_same_quantization(desc, x, rows, cols, rng);
      ++cases;
    }
  }
  std::printf("  %zu (descriptor, shape) cases checked\n", cases);
}

TEST_P(Simd, BlockSpecialsAllZeroAllNaNAndSubnormal) {
  const RandomStream rng{1, 1};
  const std::vector<std::vector<float>> inputs = {
      std::vector<float>(64, 0.0f), std::vector<float>(64, kNaN), std::vector<float>(64, kInf),
      std::vector<float>(64, std::numeric_limits<float>::denorm_min()),
      std::vector<float>(64, -std::numeric_limits<float>::max())};
  for (const auto& x : inputs) {
    for (const QuantDesc& desc : block_descriptors()) expect_same_quantization(desc, x, 2, 32, rng);
  }
}

TEST_P(Simd, Nvfp4SixteenBySixteenTransposeIdentity) {
  const int64_t rows = 48, cols = 80;
  const std::vector<float> w = block_input(rows, cols, 77);
  std::vector<float> wt(w.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) wt[static_cast<size_t>(c * rows + r)] = w[static_cast<size_t>(r * cols + c)];
  }
  const QuantDesc desc = QuantDesc::nvfp4({16, 16});
  std::vector<float> dw(w.size()), dwt(w.size());
  fake_quantize(desc, w.data(), dw.data(), rows, cols);
  fake_quantize(desc, wt.data(), dwt.data(), cols, rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_TRUE(same_float(dw[static_cast<size_t>(r * cols + c)], dwt[static_cast<size_t>(c * rows + r)]));
    }
  }
  expect_same_quantization(desc, w, rows, cols, {});
  expect_same_quantization(desc, wt, cols, rows, {});
}

TEST_P(Simd, ResultsDoNotDependOnTheThreadCount) {
  const int saved = omp_get_max_threads();
  const RandomStream rng{5, 5};
  const std::vector<float> x = block_input(256, 4096 + 7, 3);  // large enough to go parallel
  const auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<uint8_t> bytes(x.size() * 2);
    encode_array(Format::bf16, Rounding::stochastic, Overflow::saturate, x.data(), bytes.data(),
                 x.size(), rng, 1);
    for (const QuantDesc& d : {QuantDesc::mx(Format::e2m1), QuantDesc::nvfp4({16, 16}),
                               QuantDesc::per_tensor(Format::e4m3)}) {
      QuantDesc sr = d;
      sr.rounding = Rounding::stochastic;
      const QuantizedTensor q = quantize(sr, x.data(), 256, 4096 + 7, rng);
      bytes.insert(bytes.end(), q.codes.begin(), q.codes.end());
      bytes.insert(bytes.end(), q.scales.begin(), q.scales.end());
    }
    return bytes;
  };
  const std::vector<uint8_t> one = run(1), two = run(2), three = run(3);
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
  EXPECT_EQ(one, three);
  // And equal to the reference.
  QuantDesc sr = QuantDesc::mx(Format::e2m1);
  sr.rounding = Rounding::stochastic;
  EXPECT_EQ(quantize(sr, x.data(), 256, 4096 + 7, rng).codes,
            quantize_ref(sr, x.data(), 256, 4096 + 7, rng).codes);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, Simd,
                         ::testing::Values(Isa::generic, Isa::avx2, Isa::avx512, Isa::wide16),
                         [](const ::testing::TestParamInfo<Isa>& param_info) {
                           return std::string(isa_name(param_info.param));
                         });

TEST(SimdDispatch, UnsupportedIsaIsAnInputError) {
  if (isa_supported(Isa::avx512)) GTEST_SKIP() << "every ISA is supported on this CPU";
  EXPECT_THROW(set_active_isa(Isa::avx512), InputError);
}

}  // namespace
}  // namespace concord::numerics
