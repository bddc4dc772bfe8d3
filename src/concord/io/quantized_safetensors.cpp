// concord's quantized-tensor layout in safetensors (see quantized_safetensors.h).
#include "concord/io/quantized_safetensors.h"

#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/numerics/check.h"

namespace concord::io {

using numerics::Format;
using numerics::QuantDesc;
using numerics::QuantizedTensor;

namespace {

bool has_block_scales(const QuantDesc& desc) { return desc.is_mx() || desc.is_nvfp4(); }

// A metadata entry is a few hundred bytes; the bound keeps a hostile one from building a huge
// JSON tree.
constexpr size_t kMaxQuantMetadataBytes = 1 << 20;

}  // namespace

std::string quant_scales_name(const std::string& tensor) { return tensor + ".scales"; }
std::string quant_tensor_scale_name(const std::string& tensor) { return tensor + ".tensor_scale"; }
std::string quant_metadata_key(const std::string& tensor) { return kQuantMetadataPrefix + tensor; }

MatrixView matrix_view(const std::vector<int64_t>& shape) {
  MatrixView v;
  if (shape.empty()) return v;
  v.cols = shape.back();
  for (size_t i = 0; i + 1 < shape.size(); ++i) v.rows *= shape[i];
  return v;
}

Dtype quant_codes_dtype(Format element) {
  switch (element) {
    case Format::f32: return Dtype::F32;
    case Format::bf16: return Dtype::BF16;
    case Format::fp16: return Dtype::F16;
    case Format::e4m3: return Dtype::F8_E4M3;
    case Format::e5m2: return Dtype::F8_E5M2;
    case Format::e8m0: return Dtype::F8_E8M0;
    case Format::ue4m3: return Dtype::F8_E4M3;  // the positive half of e4m3, same bits
    case Format::int8: return Dtype::I8;
    case Format::e2m3:
    case Format::e3m2:
    case Format::e2m1:
    case Format::int4: return Dtype::U8;
  }
  return Dtype::U8;
}

std::vector<int64_t> quant_codes_shape(Format element, const std::vector<int64_t>& shape,
                                       const std::string& tensor) {
  std::vector<int64_t> out = shape.empty() ? std::vector<int64_t>{1} : shape;
  if (numerics::traits(element).bits == 4) {
    if (out.back() % 2 != 0) {
      throw InputError(fmt::format(
          "[quant] tensor '{}' has shape {} with an odd last dim; {} packs two codes per byte "
          "along the last dim, so it must be even (use --skip to keep this tensor)",
          tensor, shape_text(shape), numerics::traits(element).name));
    }
    out.back() /= 2;
  }
  return out;
}

std::vector<int64_t> quant_scales_shape(const QuantizedTensor& q, const std::vector<int64_t>& shape) {
  const numerics::BlockShape block = numerics::effective_block(q.desc);
  if (block.rows == 1 && shape.size() >= 1) {
    std::vector<int64_t> out(shape.begin(), shape.end() - 1);
    out.push_back(q.block_grid_cols());
    return out;
  }
  return {q.block_grid_rows(), q.block_grid_cols()};
}

Dtype quant_scales_dtype(const QuantDesc& desc) {
  return desc.is_nvfp4() ? Dtype::F8_E4M3 : Dtype::F8_E8M0;
}

bool quant_has_tensor_scale(const QuantDesc& desc) {
  return desc.is_nvfp4() || desc.is_per_tensor();
}

std::string quant_metadata_value(const QuantizedEntry& entry) {
  nlohmann::ordered_json j = {{"format", entry.desc.to_string()},
                              {"dtype", dtype_name(entry.original_dtype)},
                              {"shape", entry.shape}};
  return j.dump();
}

std::pair<std::string, std::string> append_quantized_tensors(const std::string& name,
                                                             const QuantizedTensor& q,
                                                             Dtype original_dtype,
                                                             const std::vector<int64_t>& shape,
                                                             std::vector<TensorToWrite>& out) {
  out.push_back({name, quant_codes_dtype(q.desc.element),
                 quant_codes_shape(q.desc.element, shape, name), q.codes});
  if (has_block_scales(q.desc)) {
    out.push_back({quant_scales_name(name), quant_scales_dtype(q.desc),
                   quant_scales_shape(q, shape), q.scales});
  }
  if (quant_has_tensor_scale(q.desc)) {
    const auto* p = reinterpret_cast<const uint8_t*>(&q.tensor_scale);
    out.push_back({quant_tensor_scale_name(name), Dtype::F32, {1}, {p, sizeof(float)}});
  }
  return {quant_metadata_key(name), quant_metadata_value({name, q.desc, original_dtype, shape})};
}

std::vector<QuantizedEntry> quantized_entries(const SafetensorsFile& file) {
  std::vector<QuantizedEntry> out;
  for (const auto& [key, value] : file.metadata()) {
    if (key.rfind(kQuantMetadataPrefix, 0) != 0) continue;
    QuantizedEntry e;
    e.name = key.substr(kQuantMetadataPrefix.size());
    const std::string where =
        "[safetensors] " + file.path() + ": metadata '" + key + "' ";
    if (value.size() > kMaxQuantMetadataBytes) throw InputError(where + "is too long");
    const auto j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("format") || !j["format"].is_string() ||
        !j.contains("dtype") || !j["dtype"].is_string() || !j.contains("shape") ||
        !j["shape"].is_array()) {
      throw InputError(where + "is not {\"format\", \"dtype\", \"shape\"} JSON (written by "
                       "another tool? re-run concord quant)");
    }
    const auto desc = QuantDesc::parse(j["format"].get<std::string>());
    if (!desc) {
      throw InputError(where + "has an unreadable format '" + j["format"].get<std::string>() + "'");
    }
    e.desc = *desc;
    const auto dtype = dtype_from_name(j["dtype"].get<std::string>());
    if (!dtype) throw InputError(where + "names an unknown dtype");
    e.original_dtype = *dtype;
    for (const auto& d : j["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        throw InputError(where + "has a shape entry that is not a non-negative integer");
      }
      e.shape.push_back(d.get<int64_t>());
    }
    out.push_back(std::move(e));
  }
  return out;
}

QuantizedTensor load_quantized(const SafetensorsFile& file, const QuantizedEntry& entry) {
  const std::string where = "[safetensors] " + file.path() + ": quantized tensor '" + entry.name + "' ";
  auto expect = [&](const std::string& name, Dtype dtype,
                    const std::vector<int64_t>& shape) -> const TensorInfo& {
    const TensorInfo* t = file.find(name);
    if (t == nullptr) throw InputError(where + "has no companion tensor '" + name + "'");
    if (t->dtype != dtype || t->shape != shape) {
      throw InputError(fmt::format("{}: '{}' is {} {}, expected {} {}", where, name,
                                   dtype_name(t->dtype), shape_text(t->shape), dtype_name(dtype),
                                   shape_text(shape)));
    }
    return *t;
  };
  if (!tensor_byte_size(Dtype::F32, entry.shape)) {
    throw InputError(where + "has a shape whose element count overflows");
  }
  const MatrixView view = matrix_view(entry.shape);
  numerics::validate(entry.desc, view.rows, view.cols);
  QuantizedTensor q;
  q.desc = entry.desc;
  q.rows = view.rows;
  q.cols = view.cols;
  const TensorInfo& codes = expect(entry.name, quant_codes_dtype(entry.desc.element),
                                   quant_codes_shape(entry.desc.element, entry.shape, entry.name));
  q.codes.assign(codes.bytes.begin(), codes.bytes.end());
  if (q.codes.size() != numerics::code_bytes(entry.desc.element, q.numel())) {
    throw InputError(where + "has a code buffer that does not match its shape");
  }
  if (has_block_scales(entry.desc)) {
    const TensorInfo& scales = expect(quant_scales_name(entry.name), quant_scales_dtype(entry.desc),
                                      quant_scales_shape(q, entry.shape));
    q.scales.assign(scales.bytes.begin(), scales.bytes.end());
    if (static_cast<int64_t>(q.scales.size()) != q.block_grid_rows() * q.block_grid_cols()) {
      throw InputError(where + "has a scale grid that does not match its shape");
    }
  }
  if (quant_has_tensor_scale(entry.desc)) {
    const TensorInfo& s = expect(quant_tensor_scale_name(entry.name), Dtype::F32, {1});
    std::memcpy(&q.tensor_scale, s.bytes.data(), sizeof(float));
  }
  return q;
}

}  // namespace concord::io
