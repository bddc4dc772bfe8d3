// C ABI over numerics (see capi.h): argument checks, exceptions turned into status + message.
#include "concord/capi/capi.h"

#include <cstring>
#include <exception>
#include <string>

#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/numerics/philox.h"
#include "concord/numerics/scalar.h"

namespace {

namespace num = concord::numerics;

thread_local std::string g_last_error;

// Runs body; any exception becomes status 1 with its message kept for concord_last_error().
template <typename Body>
int32_t guarded(const char* operation, Body&& body) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    g_last_error = std::string("[") + operation + "] " + e.what();
  } catch (...) {
    g_last_error = std::string("[") + operation + "] unknown exception";
  }
  return 1;
}

void require(bool condition, const std::string& message) {
  if (!condition) throw concord::InputError(message);
}

num::Format format_arg(int32_t id) {
  require(id >= 0 && id < num::kFormatCount,
          "format id " + std::to_string(id) + " is out of range (0.." +
              std::to_string(num::kFormatCount - 1) + ")");
  return static_cast<num::Format>(id);
}

num::Rounding rounding_arg(int32_t id) {
  require(id >= 0 && id <= 2, "rounding id " + std::to_string(id) + " is not 0 (rne), 1 (rtz) or 2 (sr)");
  return static_cast<num::Rounding>(id);
}

num::Overflow overflow_arg(int32_t id) {
  require(id == 0 || id == 1, "overflow id " + std::to_string(id) + " is not 0 (saturate) or 1 (ieee)");
  return static_cast<num::Overflow>(id);
}

num::ScaleRule scale_rule_arg(int32_t id) {
  require(id >= 0 && id <= 3, "scale rule id " + std::to_string(id) + " is not 0..3");
  return static_cast<num::ScaleRule>(id);
}

num::QuantDesc desc_arg(const char* text) {
  require(text != nullptr, "descriptor is NULL");
  auto desc = num::QuantDesc::parse(text);
  require(desc.has_value(), std::string("cannot parse descriptor '") + text + "'");
  return *desc;
}

void require_pointer(const void* p, size_t n, const char* name) {
  require(n == 0 || p != nullptr, std::string(name) + " is NULL");
}

}  // namespace

extern "C" {

uint32_t concord_capi_version(void) { return 1; }

const char* concord_last_error(void) { return g_last_error.c_str(); }

int32_t concord_format_bits(int32_t format) {
  if (format < 0 || format >= num::kFormatCount) return 0;
  return num::traits(static_cast<num::Format>(format)).bits;
}

const char* concord_format_name(int32_t format) {
  if (format < 0 || format >= num::kFormatCount) return nullptr;
  // The table's names are string literals, hence NUL-terminated.
  return num::traits(static_cast<num::Format>(format)).name.data();
}

int32_t concord_encode_ref(int32_t format, int32_t rounding, int32_t overflow, const float* x,
                           size_t n, uint64_t seed, uint32_t stream, uint64_t first_index,
                           uint32_t* codes_out) {
  return guarded("encode_ref", [&] {
    const num::Format f = format_arg(format);
    const num::Rounding r = rounding_arg(rounding);
    const num::Overflow o = overflow_arg(overflow);
    require_pointer(x, n, "x");
    require_pointer(codes_out, n, "codes_out");
    const num::RandomStream rng{seed, stream};
    for (size_t i = 0; i < n; ++i) {
      const uint32_t word = r == num::Rounding::stochastic ? rng.word(first_index + i) : 0u;
      codes_out[i] = num::encode_ref(f, x[i], r, o, word);
    }
  });
}

int32_t concord_encode_ref_words(int32_t format, int32_t rounding, int32_t overflow,
                                 const float* x, const uint32_t* words, size_t n,
                                 uint32_t* codes_out) {
  return guarded("encode_ref_words", [&] {
    const num::Format f = format_arg(format);
    const num::Rounding r = rounding_arg(rounding);
    const num::Overflow o = overflow_arg(overflow);
    require_pointer(x, n, "x");
    require_pointer(codes_out, n, "codes_out");
    require(r != num::Rounding::stochastic || words != nullptr || n == 0,
            "stochastic rounding needs a words array");
    for (size_t i = 0; i < n; ++i) {
      codes_out[i] = num::encode_ref(f, x[i], r, o, words != nullptr ? words[i] : 0u);
    }
  });
}

int32_t concord_decode_ref(int32_t format, const uint32_t* codes, size_t n, float* out) {
  return guarded("decode_ref", [&] {
    const num::Format f = format_arg(format);
    require_pointer(codes, n, "codes");
    require_pointer(out, n, "out");
    for (size_t i = 0; i < n; ++i) out[i] = num::decode_ref(f, codes[i]);
  });
}

int32_t concord_philox_words(uint64_t seed, uint32_t stream, uint64_t first_index, size_t n,
                             uint32_t* words_out) {
  return guarded("philox_words", [&] {
    require_pointer(words_out, n, "words_out");
    const num::RandomStream rng{seed, stream};
    for (size_t i = 0; i < n; ++i) words_out[i] = rng.word(first_index + i);
  });
}

int32_t concord_mx_scale_code(const float* amax, size_t n, int32_t element, int32_t rule,
                              uint8_t* codes_out, int32_t* exponents_out) {
  return guarded("mx_scale_code", [&] {
    const num::Format f = format_arg(element);
    const num::ScaleRule sr = scale_rule_arg(rule);
    require_pointer(amax, n, "amax");
    for (size_t i = 0; i < n; ++i) {
      if (codes_out != nullptr) codes_out[i] = num::mx_scale_code(amax[i], f, sr);
      if (exponents_out != nullptr) exponents_out[i] = num::mx_scale_exponent(amax[i], f, sr);
    }
  });
}

int32_t concord_nvfp4_global_encode_scale(float tensor_amax, float* out) {
  return guarded("nvfp4_global_encode_scale", [&] {
    require_pointer(out, 1, "out");
    *out = num::nvfp4_global_encode_scale(tensor_amax);
  });
}

int32_t concord_nvfp4_block_scale_code(const float* block_amax, size_t n,
                                       float global_encode_scale, uint8_t* codes_out) {
  return guarded("nvfp4_block_scale_code", [&] {
    require_pointer(block_amax, n, "block_amax");
    require_pointer(codes_out, n, "codes_out");
    for (size_t i = 0; i < n; ++i) {
      codes_out[i] = num::nvfp4_block_scale_code(block_amax[i], global_encode_scale);
    }
  });
}

int32_t concord_quant_desc_from_name(const char* name, char* buf, size_t cap) {
  return guarded("quant_desc_from_name", [&] {
    require(name != nullptr, "name is NULL");
    const auto desc = num::QuantDesc::from_name(name);
    require(desc.has_value(), std::string("unknown quantization name '") + name + "'");
    const std::string text = desc->to_string();
    require(buf != nullptr && cap > text.size(),
            "buffer too small: need " + std::to_string(text.size() + 1) + " bytes");
    std::memcpy(buf, text.c_str(), text.size() + 1);
  });
}

int32_t concord_quantized_sizes(const char* desc, int64_t rows, int64_t cols,
                                size_t* code_bytes_out, size_t* scale_count_out) {
  return guarded("quantized_sizes", [&] {
    num::QuantizedTensor q;
    q.desc = desc_arg(desc);
    num::validate(q.desc, rows, cols);
    q.rows = rows;
    q.cols = cols;
    if (code_bytes_out != nullptr) *code_bytes_out = num::code_bytes(q.desc.element, rows * cols);
    if (scale_count_out != nullptr) {
      *scale_count_out = static_cast<size_t>(q.block_grid_rows() * q.block_grid_cols());
    }
  });
}

int32_t concord_quantize(const char* desc, const float* x, int64_t rows, int64_t cols,
                         uint64_t seed, uint32_t stream, int32_t fast, uint32_t* codes_out,
                         uint8_t* packed_out, uint8_t* scales_out, float* tensor_scale_out) {
  return guarded(fast != 0 ? "quantize" : "quantize_ref", [&] {
    const num::QuantDesc d = desc_arg(desc);
    require(rows >= 0 && cols >= 0, "negative shape");
    require_pointer(x, static_cast<size_t>(rows * cols), "x");
    const num::RandomStream rng{seed, stream};
    const num::QuantizedTensor q =
        fast != 0 ? num::quantize(d, x, rows, cols, rng) : num::quantize_ref(d, x, rows, cols, rng);
    const int64_t n = q.numel();
    if (codes_out != nullptr) {
      for (int64_t i = 0; i < n; ++i) codes_out[i] = num::get_code(d.element, q.codes, i);
    }
    if (packed_out != nullptr && !q.codes.empty()) {
      std::memcpy(packed_out, q.codes.data(), q.codes.size());
    }
    if (scales_out != nullptr && !q.scales.empty()) {
      std::memcpy(scales_out, q.scales.data(), q.scales.size());
    }
    if (tensor_scale_out != nullptr) *tensor_scale_out = q.tensor_scale;
  });
}

int32_t concord_dequantize(const char* desc, int64_t rows, int64_t cols, const uint8_t* packed,
                           const uint8_t* scales, float tensor_scale, int32_t fast, float* out) {
  return guarded(fast != 0 ? "dequantize" : "dequantize_ref", [&] {
    num::QuantizedTensor q;
    q.desc = desc_arg(desc);
    num::validate(q.desc, rows, cols);
    q.rows = rows;
    q.cols = cols;
    q.tensor_scale = tensor_scale;
    const size_t code_bytes = num::code_bytes(q.desc.element, rows * cols);
    const auto scale_count = static_cast<size_t>(q.block_grid_rows() * q.block_grid_cols());
    require_pointer(packed, code_bytes, "packed");
    require_pointer(scales, scale_count, "scales");
    require_pointer(out, static_cast<size_t>(rows * cols), "out");
    q.codes.assign(packed, packed + code_bytes);
    q.scales.assign(scales, scales + scale_count);
    if (fast != 0) {
      num::dequantize(q, out);
    } else {
      num::dequantize_ref(q, out);
    }
  });
}

}  // extern "C"
