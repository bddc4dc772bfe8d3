// How concord stores a block-quantized tensor in safetensors, and how it reads one back.
//
// A tensor "W" (original shape S = [..., cols], viewed as rows x cols with rows = the product
// of the leading dims) quantized with QuantDesc d becomes:
//   "W"               the element codes. Native dtype where the spec has the exact format:
//                     e4m3 -> F8_E4M3, e5m2 -> F8_E5M2, e8m0 -> F8_E8M0, ue4m3 -> F8_E4M3
//                     (same bits, sign 0), bf16 -> BF16, fp16 -> F16, int8 -> I8, f32 -> F32;
//                     shape S. Otherwise U8: e2m3 / e3m2 one code per byte (low 6 bits),
//                     shape S; e2m1 / int4 two codes per byte (element 2k in the low nibble),
//                     shape S with the last dim halved (cols must be even).
//   "W.scales"        block scales, one byte each: F8_E8M0 (MX) or F8_E4M3 (NVFP4's ue4m3).
//                     Shape: S's leading dims + [ceil(cols / block_cols)] for 1-row blocks;
//                     [ceil(rows / block_rows), ceil(cols / block_cols)] for 2-D blocks.
//   "W.tensor_scale"  F32 [1], the fp32 decode multiplier (NVFP4: 1/S_enc; fp8-tensor: 1/S).
//   __metadata__["concord.quant.W"] = {"format": d.to_string(), "dtype": <original dtype>,
//                                      "shape": S}   (a JSON object, stored as a string)
// Dequantized value = element * block scale * tensor scale (numerics/block.h).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "concord/io/safetensors.h"
#include "concord/numerics/block.h"

namespace concord::io {

inline const std::string kQuantMetadataPrefix = "concord.quant.";

std::string quant_scales_name(const std::string& tensor);        // "W.scales"
std::string quant_tensor_scale_name(const std::string& tensor);  // "W.tensor_scale"
std::string quant_metadata_key(const std::string& tensor);       // "concord.quant.W"

// rows x cols view of a shape: cols = last dim (1 for a 0-d tensor), rows = the rest.
struct MatrixView {
  int64_t rows = 1;
  int64_t cols = 1;
};
MatrixView matrix_view(const std::vector<int64_t>& shape);

// The dtype and shape the codes of `element` are stored with; throws InputError (naming
// `tensor`) when the shape cannot hold them (odd cols for a 4-bit format).
Dtype quant_codes_dtype(numerics::Format element);
std::vector<int64_t> quant_codes_shape(numerics::Format element, const std::vector<int64_t>& shape,
                                       const std::string& tensor);
std::vector<int64_t> quant_scales_shape(const numerics::QuantizedTensor& q,
                                        const std::vector<int64_t>& shape);
Dtype quant_scales_dtype(const numerics::QuantDesc& desc);
bool quant_has_tensor_scale(const numerics::QuantDesc& desc);

// What the metadata says about one quantized tensor.
struct QuantizedEntry {
  std::string name;
  numerics::QuantDesc desc;
  Dtype original_dtype = Dtype::F32;
  std::vector<int64_t> shape;  // original shape
};

std::string quant_metadata_value(const QuantizedEntry& entry);

// Appends the tensors (codes, scales, tensor scale) that store `q` as tensor `name` to `out`;
// they view q's buffers, which must outlive the write. Returns the metadata entry to add.
std::pair<std::string, std::string> append_quantized_tensors(
    const std::string& name, const numerics::QuantizedTensor& q, Dtype original_dtype,
    const std::vector<int64_t>& shape, std::vector<TensorToWrite>& out);

// Every concord-quantized tensor of `file`, in metadata order. Throws InputError naming the
// file when an entry is malformed.
std::vector<QuantizedEntry> quantized_entries(const SafetensorsFile& file);
// Rebuilds the QuantizedTensor of `entry` from the file, checking every companion tensor's
// dtype and shape. Throws InputError naming the file and the tensor.
numerics::QuantizedTensor load_quantized(const SafetensorsFile& file, const QuantizedEntry& entry);

}  // namespace concord::io
