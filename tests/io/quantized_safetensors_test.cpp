// concord's quantized-tensor layout: what append_quantized_tensors writes is what
// quantized_entries / load_quantized read back, bit for bit, for every preset format.
#include "concord/io/quantized_safetensors.h"

#include <gtest/gtest.h>

#include <random>

#include "concord/numerics/check.h"

namespace concord::io {
namespace {

TEST(QuantizedSafetensors, RoundTripEveryPreset) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<int64_t> shape{2, 16, 64};  // 32 x 64 as a matrix
  std::vector<float> x(2 * 16 * 64);
  for (float& v : x) v = normal(rng);
  for (const char* name : {"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e2m3", "mxfp6-e3m2", "mxfp4", "nvfp4",
                           "nvfp4-2d", "fp8-tensor", "bf16", "fp16", "e4m3", "e2m1", "int8", "int4"}) {
    SCOPED_TRACE(name);
    const auto desc = numerics::QuantDesc::from_name(name);
    ASSERT_TRUE(desc);
    const auto q = numerics::quantize(*desc, x.data(), 32, 64);
    std::vector<TensorToWrite> tensors;
    const auto meta = append_quantized_tensors("w", q, Dtype::BF16, shape, tensors);
    const auto f = SafetensorsFile::from_bytes(serialize_safetensors(tensors, {meta}), "q");
    const auto entries = quantized_entries(f);
    ASSERT_EQ(entries.size(), 1u);
    EXPECT_EQ(entries[0].name, "w");
    EXPECT_EQ(entries[0].desc, *desc);
    EXPECT_EQ(entries[0].original_dtype, Dtype::BF16);
    EXPECT_EQ(entries[0].shape, shape);
    const auto back = load_quantized(f, entries[0]);
    EXPECT_EQ(back.codes, q.codes);
    EXPECT_EQ(back.scales, q.scales);
    EXPECT_EQ(back.tensor_scale, q.tensor_scale);
    const TensorInfo& codes = f.get("w");
    EXPECT_EQ(codes.dtype, quant_codes_dtype(desc->element));
    if (numerics::traits(desc->element).bits == 4) {
      EXPECT_EQ(codes.shape, (std::vector<int64_t>{2, 16, 32}));
    } else {
      EXPECT_EQ(codes.shape, shape);
    }
    if (desc->is_mx()) {
      EXPECT_EQ(f.get("w.scales").dtype, Dtype::F8_E8M0);
      EXPECT_EQ(f.get("w.scales").shape, (std::vector<int64_t>{2, 16, 2}));
    }
    if (desc->is_nvfp4()) {
      EXPECT_EQ(f.get("w.scales").dtype, Dtype::F8_E4M3);
    }
    EXPECT_EQ(f.find("w.tensor_scale") != nullptr, desc->is_nvfp4() || desc->is_per_tensor());
  }
}

TEST(QuantizedSafetensors, OddColumnsRejectedForFourBitFormats) {
  EXPECT_THROW(quant_codes_shape(numerics::Format::e2m1, {4, 5}, "w"), InputError);
  EXPECT_EQ(quant_codes_shape(numerics::Format::e2m1, {4, 6}, "w"), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(quant_codes_shape(numerics::Format::e4m3, {}, "s"), (std::vector<int64_t>{1}));
}

TEST(QuantizedSafetensors, InconsistentCompanionsAreInputErrors) {
  std::vector<float> x(64, 1.0f);
  const auto q = numerics::quantize(*numerics::QuantDesc::from_name("mxfp8-e4m3"), x.data(), 2, 32);
  std::vector<TensorToWrite> tensors;
  auto meta = append_quantized_tensors("w", q, Dtype::F32, {2, 32}, tensors);
  // Drop the scales.
  std::vector<TensorToWrite> no_scales{tensors[0]};
  const auto f1 = SafetensorsFile::from_bytes(serialize_safetensors(no_scales, {meta}), "q1");
  EXPECT_THROW(load_quantized(f1, quantized_entries(f1).at(0)), InputError);
  // Metadata claims a different shape.
  meta.second = R"({"format":"element=e4m3;block=1x32;scale=e8m0;rule=floor;axis=1","dtype":"F32","shape":[4,32]})";
  const auto f2 = SafetensorsFile::from_bytes(serialize_safetensors(tensors, {meta}), "q2");
  EXPECT_THROW(load_quantized(f2, quantized_entries(f2).at(0)), InputError);
  // Metadata that is not JSON / not a format.
  meta.second = "not json";
  const auto f3 = SafetensorsFile::from_bytes(serialize_safetensors(tensors, {meta}), "q3");
  EXPECT_THROW(quantized_entries(f3), InputError);
  meta.second = R"({"format":"element=zz","dtype":"F32","shape":[2,32]})";
  const auto f4 = SafetensorsFile::from_bytes(serialize_safetensors(tensors, {meta}), "q4");
  EXPECT_THROW(quantized_entries(f4), InputError);
}

}  // namespace
}  // namespace concord::io
