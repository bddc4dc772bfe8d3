// safetensors dtypes: names, byte sizes of shapes, and conversion of floating tensors to fp32.
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "concord/io/safetensors.h"
#include "concord/numerics/check.h"
#include "concord/numerics/scalar.h"

namespace concord::io {

std::optional<Dtype> dtype_from_name(std::string_view name) {
  for (const DtypeTraits& t : kDtypeTable) {
    if (t.name == name) return t.dtype;
  }
  return std::nullopt;
}

std::string dtype_names() {
  std::string out;
  for (const DtypeTraits& t : kDtypeTable) {
    if (!out.empty()) out += ", ";
    out += t.name;
  }
  return out;
}

std::optional<uint64_t> tensor_byte_size(Dtype dtype, std::span<const int64_t> shape) {
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
      return std::nullopt;
    }
  }
  uint64_t bits = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_traits(dtype).bits), &bits)) {
    return std::nullopt;
  }
  if (bits % 8 != 0) return std::nullopt;  // sub-byte dtypes must fill whole bytes
  return bits / 8;
}

std::string shape_text(std::span<const int64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated on read: cannot overflow
  return n;
}

std::vector<float> tensor_to_floats(const TensorInfo& tensor) {
  const size_t n = static_cast<size_t>(tensor.numel());
  std::vector<float> out(n);
  const uint8_t* p = tensor.bytes.data();
  switch (tensor.dtype) {
    case Dtype::F32:
      if (n > 0) std::memcpy(out.data(), p, n * sizeof(float));
      break;
    case Dtype::F16:
    case Dtype::BF16: {
      const auto format =
          tensor.dtype == Dtype::F16 ? numerics::Format::fp16 : numerics::Format::bf16;
      for (size_t i = 0; i < n; ++i) {
        const uint32_t code = p[2 * i] | (static_cast<uint32_t>(p[2 * i + 1]) << 8);
        out[i] = numerics::decode_ref(format, code);
      }
      break;
    }
    default:
      throw InputError(fmt::format("[safetensors] tensor '{}' has dtype {}; only F32, F16 and "
                                   "BF16 tensors convert to fp32",
                                   tensor.name, dtype_name(tensor.dtype)));
  }
  return out;
}

}  // namespace concord::io
