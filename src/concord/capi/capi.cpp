// C ABI over numerics (see capi.h): argument checks, exceptions turned into status + message.
#include "concord/capi/capi.h"

#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concord/io/gguf.h"
#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/numerics/philox.h"
#include "concord/numerics/scalar.h"
#include "concord/serve/text.h"

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

concord::io::GgmlType ggml_type_arg(uint32_t type) {
  require(concord::io::ggml_type_traits(type).has_value(),
          "ggml type " + std::to_string(type) + " is not one of ggml's types");
  return static_cast<concord::io::GgmlType>(type);
}

concord::io::GgufType gguf_type_arg(const std::string& name) {
  for (uint32_t t = 0; t <= static_cast<uint32_t>(concord::io::GgufType::float64); ++t) {
    const auto type = static_cast<concord::io::GgufType>(t);
    if (concord::io::gguf_type_name(type) == name) return type;
  }
  throw concord::InputError("unknown GGUF value type '" + name + "'");
}

// One metadata value from {"type", "value"[, "element_type"]}.
concord::io::GgufValue gguf_value_arg(const nlohmann::json& entry) {
  using concord::io::GgufType;
  concord::io::GgufValue v;
  v.type = gguf_type_arg(entry.at("type").get<std::string>());
  const bool array = v.type == GgufType::array;
  if (array) v.array_type = gguf_type_arg(entry.at("element_type").get<std::string>());
  const nlohmann::json values = array ? entry.at("value") : nlohmann::json::array({entry.at("value")});
  for (const nlohmann::json& x : values) {
    switch (v.element_type()) {
      case GgufType::string: v.strings.push_back(x.get<std::string>()); break;
      case GgufType::float32:
      case GgufType::float64: v.floats.push_back(x.get<double>()); break;
      case GgufType::boolean: v.ints.push_back(x.get<bool>() ? 1 : 0); break;
      default:  // integers; uint64 keeps its bit pattern
        v.ints.push_back(x.is_number_unsigned() ? static_cast<int64_t>(x.get<uint64_t>())
                                                : x.get<int64_t>());
        break;
    }
  }
  return v;
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

int32_t concord_ggml_type_traits(uint32_t type, int64_t* block_size_out, int64_t* type_size_out,
                                 char* name_buf, size_t cap) {
  return guarded("ggml_type_traits", [&] {
    const auto traits = concord::io::ggml_type_traits(type);
    require(traits.has_value(), "ggml type " + std::to_string(type) + " is unknown");
    if (block_size_out != nullptr) *block_size_out = traits->block_size;
    if (type_size_out != nullptr) *type_size_out = traits->type_size;
    if (name_buf != nullptr) {
      require(cap > traits->name.size(), "name buffer too small");
      std::memcpy(name_buf, traits->name.data(), traits->name.size());
      name_buf[traits->name.size()] = '\0';
    }
  });
}

int32_t concord_gguf_encode(uint32_t type, const float* x, size_t n, uint8_t* out, size_t cap,
                            size_t* out_len) {
  return guarded("gguf_encode", [&] {
    require_pointer(x, n, "x");
    const std::vector<uint8_t> bytes = concord::io::encode_gguf_tensor(ggml_type_arg(type), {x, n});
    require(bytes.size() <= cap, "output buffer holds " + std::to_string(cap) + " bytes, " +
                                     std::to_string(bytes.size()) + " needed");
    require_pointer(out, bytes.size(), "out");
    if (!bytes.empty()) std::memcpy(out, bytes.data(), bytes.size());
    if (out_len != nullptr) *out_len = bytes.size();
  });
}

int32_t concord_gguf_decode(uint32_t type, const uint8_t* bytes, size_t nbytes, float* out,
                            size_t n) {
  return guarded("gguf_decode", [&] {
    require(n > 0, "n must be positive");
    require_pointer(bytes, nbytes, "bytes");
    require_pointer(out, n, "out");
    concord::io::GgufTensorInfo t;
    t.name = "capi";
    t.type = ggml_type_arg(type);
    t.dims = {static_cast<int64_t>(n)};
    t.bytes = {bytes, nbytes};
    const std::vector<float> values = concord::io::gguf_tensor_to_floats(t);
    std::memcpy(out, values.data(), n * sizeof(float));
  });
}

int32_t concord_gguf_write(const char* path, const char* spec, const uint8_t* data,
                           size_t data_len, uint32_t alignment) {
  return guarded("gguf_write", [&] {
    require(path != nullptr && spec != nullptr, "path or spec is NULL");
    require_pointer(data, data_len, "data");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(spec);
    } catch (const nlohmann::json::exception& e) {
      throw concord::InputError(std::string("spec is not JSON: ") + e.what());
    }
    try {
      concord::io::GgufMetadata metadata;
      for (const nlohmann::json& entry : j.at("metadata")) {
        metadata.emplace_back(entry.at("key").get<std::string>(), gguf_value_arg(entry));
      }
      std::vector<concord::io::GgufTensorToWrite> tensors;
      size_t offset = 0;
      for (const nlohmann::json& entry : j.at("tensors")) {
        concord::io::GgufTensorToWrite t;
        t.name = entry.at("name").get<std::string>();
        t.type = ggml_type_arg(entry.at("type").get<uint32_t>());
        t.dims = entry.at("dims").get<std::vector<int64_t>>();
        const auto nbytes = entry.at("nbytes").get<size_t>();
        require(nbytes <= data_len - offset, "tensor bytes run past data_len");
        t.bytes = {data + offset, nbytes};
        offset += nbytes;
        tensors.push_back(std::move(t));
      }
      require(offset == data_len, "data_len does not match the tensors' nbytes");
      concord::io::write_gguf(path, metadata, tensors, alignment);
    } catch (const nlohmann::json::exception& e) {
      throw concord::InputError(std::string("bad spec: ") + e.what());
    }
  });
}

int32_t concord_render_chat(const char* chat_template, const char* system, const char* user,
                            int32_t enable_thinking, char* out, size_t cap, size_t* out_len) {
  return guarded("render_chat", [&] {
    require(chat_template != nullptr && user != nullptr, "chat_template and user must not be NULL");
    concord::serve::ChatOptions options;
    if (system != nullptr) options.system = std::string(system);
    options.enable_thinking = enable_thinking != 0;
    const std::string text = concord::serve::render_chat(chat_template, user, options);
    require(text.size() < cap, "output buffer holds " + std::to_string(cap) + " bytes, " +
                                   std::to_string(text.size() + 1) + " needed");
    require_pointer(out, text.size() + 1, "out");
    std::memcpy(out, text.c_str(), text.size() + 1);
    if (out_len != nullptr) *out_len = text.size();
  });
}

int32_t concord_render_chat_messages(const char* chat_template, const char* messages_json,
                                     int32_t enable_thinking, char* out, size_t cap,
                                     size_t* out_len) {
  return guarded("render_chat_messages", [&] {
    require(chat_template != nullptr && messages_json != nullptr,
            "chat_template and messages_json must not be NULL");
    std::vector<concord::serve::ChatMessage> messages;
    try {
      for (const nlohmann::json& m : nlohmann::json::parse(messages_json))
        messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
    } catch (const nlohmann::json::exception& e) {
      throw concord::InputError(std::string("messages_json is not an array of {role, content}: ") + e.what());
    }
    concord::serve::ChatOptions options;
    options.enable_thinking = enable_thinking != 0;
    const std::string text = concord::serve::render_chat(chat_template, messages, options);
    require(text.size() < cap, "output buffer holds " + std::to_string(cap) + " bytes, " +
                                   std::to_string(text.size() + 1) + " needed");
    require_pointer(out, text.size() + 1, "out");
    std::memcpy(out, text.c_str(), text.size() + 1);
    if (out_len != nullptr) *out_len = text.size();
  });
}

}  // extern "C"
