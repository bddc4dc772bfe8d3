// The device codec (src/concord/cuda/codec.h) compiled for the CPU, against the numerics layer's
// reference: every code of every format decoded; encode under every rounding and overflow rule on
// named edge values, on every code's neighbours and midpoints (the ties), on random bit patterns
// and on a strided sweep of all 2^32 fp32 inputs; the Philox stream word for word; the four MX
// scale rules, the NVFP4 scales and the per-tensor scale on edge and swept amaxes. The GPU runs
// exactly this arithmetic (tools/gpu_check.sh then checks what nvcc made of it on the device).
// Exhaustive RNE over all 2^32 inputs for the formats the GPU slice serves: codec_exhaustive_test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "concord/cuda/check_cases.h"
#include "concord/cuda/codec.h"
#include "concord/numerics/block.h"
#include "concord/numerics/philox.h"
#include "concord/numerics/scalar.h"

namespace concord::cuda {
namespace {

namespace nm = concord::numerics;

TEST(DeviceCodec, FormatIdsAndTraitsMatchTheNumericsTable) {
  for (Elem f : kElems) {
    const nm::FormatTraits& t = nm::traits(to_numerics(f));
    const ElemSpec s = spec_of(f);
    SCOPED_TRACE(std::string(t.name));
    EXPECT_EQ(s.bits, t.bits);
    EXPECT_EQ(s.ebits, t.exponent_bits);
    EXPECT_EQ(s.mbits, t.mantissa_bits);
    EXPECT_EQ(s.bias, t.bias);
    EXPECT_EQ(s.is_signed, t.is_signed);
    EXPECT_EQ(s.emax(), t.emax);
    EXPECT_EQ(s.emin(), t.emin);
    EXPECT_EQ(static_cast<double>(elem_max(f)), t.max_finite);
    EXPECT_EQ(s.max_code(false), nm::max_finite_code(t.format, false));
    if (t.has_nan()) {
      EXPECT_EQ(s.nan_code(true), nm::nan_code(t.format, true));
    }
  }
  EXPECT_EQ(static_cast<int>(Round::sr), static_cast<int>(nm::Rounding::stochastic));
  EXPECT_EQ(static_cast<int>(Over::ieee), static_cast<int>(nm::Overflow::ieee));
  EXPECT_EQ(static_cast<int>(MxRule::rceil), static_cast<int>(nm::ScaleRule::rceil));
}

TEST(DeviceCodec, DecodesEveryCodeOfEveryFormatAsTheReference) {
  for (Elem f : kElems) {
    const nm::Format nf = to_numerics(f);
    for (uint32_t code = 0; code < (1u << spec_of(f).bits); ++code) {
      const float got = decode(f, code), want = nm::decode_ref(nf, code);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << nm::traits(nf).name << " code " << code;
        ASSERT_EQ(std::signbit(got), std::signbit(want)) << nm::traits(nf).name << " code " << code;
      } else {
        ASSERT_EQ(bits_of(got), bits_of(want)) << nm::traits(nf).name << " code " << code;
      }
    }
  }
}

// Every (rounding, overflow, random word) combination on one input; returns the first mismatch.
::testing::AssertionResult encodes_as_reference(Elem f, float x, uint32_t random) {
  const nm::Format nf = to_numerics(f);
  for (Round r : {Round::rne, Round::rtz, Round::sr}) {
    for (Over o : {Over::saturate, Over::ieee}) {
      const uint32_t got = encode(f, x, r, o, random);
      const uint32_t want = nm::encode_ref(nf, x, static_cast<nm::Rounding>(r),
                                           static_cast<nm::Overflow>(o), random);
      if (got != want) {
        return ::testing::AssertionFailure()
               << nm::traits(nf).name << " x=" << x << " (bits 0x" << std::hex << bits_of(x)
               << ") rounding " << static_cast<int>(r) << " overflow " << static_cast<int>(o)
               << " random 0x" << random << ": got 0x" << got << ", reference 0x" << want;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(DeviceCodec, EncodesEdgeValuesCodeNeighboursAndTiesAsTheReference) {
  const uint32_t randoms[] = {0u, 1u, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFEu, 0xFFFFFFFFu, 0x9E3779B9u};
  for (Elem f : kElems) {
    for (float x : edge_inputs(f)) {
      for (uint32_t random : randoms) ASSERT_TRUE(encodes_as_reference(f, x, random));
    }
  }
}

TEST(DeviceCodec, EncodesRandomBitPatternsAndASweepOfTheFp32LineAsTheReference) {
  std::mt19937 gen(20261207);
  for (Elem f : kElems) {
    for (int i = 0; i < 200000; ++i) {
      ASSERT_TRUE(encodes_as_reference(f, float_of(gen()), gen()));
    }
    // Every 4099th fp32 bit pattern (a prime stride: all low bits vary), over the whole line.
    for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4099) {
      ASSERT_TRUE(encodes_as_reference(f, float_of(static_cast<uint32_t>(b)), static_cast<uint32_t>(b * 2654435761u)));
    }
  }
}

TEST(DeviceCodec, PhiloxGivesTheNumericsStreamWordForWord) {
  const uint64_t seeds[] = {0u, 1u, 42u, 0xDEADBEEFCAFEF00Dull, ~uint64_t{0}};
  const uint32_t streams[] = {0u, 1u, 7u, 0xFFFFFFFFu};
  const uint64_t indices[] = {0u, 1u, 2u, 3u, 1000u, 0xFFFFFFFFull, 0x100000000ull, 0x123456789ABCull, ~uint64_t{0} >> 2};
  for (uint64_t seed : seeds) {
    for (uint32_t stream : streams) {
      const nm::RandomStream rng{seed, stream};
      for (uint64_t block : indices) {
        const Words4 got = philox_block(seed, stream, block);
        const nm::PhiloxBlock want = rng.block(block);
        for (int k = 0; k < 4; ++k) {
          ASSERT_EQ(got.w[k], want[static_cast<size_t>(k)]) << seed << " " << stream << " " << block;
          ASSERT_EQ(got.w[k], rng.word(block * 4 + static_cast<uint64_t>(k)));
        }
      }
    }
  }
}

TEST(DeviceCodec, MxScaleCodesAndMultipliersMatchTheReferenceUnderEveryRule) {
  std::vector<float> amaxes = edge_amaxes();
  std::mt19937 gen(7);
  for (int i = 0; i < 100000; ++i) amaxes.push_back(std::fabs(float_of(gen())));
  for (Elem f : kMxElems) {
    for (MxRule rule : {MxRule::floor, MxRule::ceil, MxRule::even, MxRule::rceil}) {
      for (float amax : amaxes) {
        const uint8_t want = nm::mx_scale_code(amax, to_numerics(f), static_cast<nm::ScaleRule>(rule));
        ASSERT_EQ(mx_scale_code(amax, f, rule), want)
            << nm::traits(to_numerics(f)).name << " rule " << static_cast<int>(rule) << " amax " << amax;
      }
    }
  }
  for (int code = 0; code < 255; ++code) {
    ASSERT_EQ(mx_multiplier(static_cast<uint8_t>(code)), std::ldexp(1.0f, 127 - code)) << code;
  }
  EXPECT_TRUE(std::isnan(mx_multiplier(0xFF)));
  for (int code = 0; code < 256; ++code) {  // the dequantizer's side: the scale's value, bit for bit
    ASSERT_EQ(bits_of(e8m0_value(static_cast<uint8_t>(code))),
              bits_of(nm::decode_ref(nm::Format::e8m0, static_cast<uint32_t>(code))))
        << code;
  }
}

TEST(DeviceCodec, Nvfp4AndPerTensorScalesMatchTheReference) {
  std::vector<float> amaxes = edge_amaxes();
  std::mt19937 gen(11);
  for (int i = 0; i < 100000; ++i) amaxes.push_back(std::fabs(float_of(gen())));
  for (float tensor_amax : amaxes) {
    const float global = nvfp4_global_encode(tensor_amax);
    ASSERT_EQ(bits_of(global), bits_of(nm::nvfp4_global_encode_scale(tensor_amax))) << tensor_amax;
  }
  // Block amaxes against a few global scales, including the saturating and NaN ones.
  const float globals[] = {1.0f, 2688.0f, 0.5f, 1e-30f, 3.4e38f, 7.7e-5f};
  for (float global : globals) {
    const float tensor_scale = 1.0f / global;
    for (float amax : amaxes) {
      const uint8_t code = nvfp4_scale_code(amax, global);
      ASSERT_EQ(code, nm::nvfp4_block_scale_code(amax, global)) << amax << " " << global;
      const float want = std::fmin(1.0f / (nm::decode_ref(nm::Format::ue4m3, code) * tensor_scale),
                                   std::numeric_limits<float>::max());
      ASSERT_EQ(bits_of(nvfp4_multiplier(code, tensor_scale)), bits_of(want)) << amax << " " << global;
    }
  }
  // Per-tensor FP8: the reference quantizer's stored 1/S, one tensor per amax.
  for (Elem f : {Elem::e4m3, Elem::e5m2}) {
    for (float amax : amaxes) {
      const float x[2] = {amax, -0.5f * amax};
      const nm::QuantizedTensor q = nm::quantize_ref(nm::QuantDesc::per_tensor(to_numerics(f)), x, 1, 2);
      ASSERT_EQ(bits_of(1.0f / per_tensor_encode(amax, f)), bits_of(q.tensor_scale)) << amax;
    }
  }
}

TEST(DeviceCodec, AbsBitsOrderAsTheNanPropagatingAmax) {
  std::mt19937 gen(3);
  for (int trial = 0; trial < 2000; ++trial) {
    float x[8];
    uint32_t m = 0;
    for (float& v : x) {
      v = float_of(gen());
      m = std::max(m, abs_bits(v));
    }
    const float want = nm::amax_ref(x, 8);
    if (std::isnan(want)) {
      ASSERT_TRUE(is_nan_bits(m));
    } else {
      ASSERT_EQ(m, bits_of(want));
    }
  }
}

}  // namespace
}  // namespace concord::cuda
