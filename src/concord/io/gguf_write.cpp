// The GGUF writer: v3, little-endian, laid out as the PyPI gguf package's GGUFWriter lays it out
// (metadata in the given order, tensor infos, zero padding to the alignment, then each tensor's
// bytes zero-padded to the alignment, the last one included), written atomically.
#include <cmath>
#include <limits>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "concord/io/atomic_file.h"
#include "concord/io/gguf.h"
#include "concord/io/reader_support.h"
#include "concord/numerics/check.h"

namespace concord::io {
namespace {

constexpr uint32_t kVersion = 3;
constexpr uint32_t kDefaultAlignment = 32;
constexpr size_t kMaxNameBytes = 63;  // as the reader: ggml's GGML_MAX_NAME minus the terminator

class Bytes {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void put_string(std::string_view s) {
    put<uint64_t>(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
  void pad_to(uint64_t alignment) {
    out_.resize((out_.size() + alignment - 1) / alignment * alignment, 0);
  }
  std::vector<uint8_t>& data() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

// Range of an integer element type, as int64 (uint64 holds its bit pattern: any value fits).
bool integer_fits(GgufType t, int64_t v) {
  switch (t) {
    case GgufType::uint8: return v >= 0 && v <= UINT8_MAX;
    case GgufType::int8: return v >= INT8_MIN && v <= INT8_MAX;
    case GgufType::uint16: return v >= 0 && v <= UINT16_MAX;
    case GgufType::int16: return v >= INT16_MIN && v <= INT16_MAX;
    case GgufType::uint32: return v >= 0 && v <= UINT32_MAX;
    case GgufType::int32: return v >= INT32_MIN && v <= INT32_MAX;
    case GgufType::boolean: return v == 0 || v == 1;
    case GgufType::uint64:
    case GgufType::int64: return true;
    default: return false;
  }
}

void put_element(Bytes& out, GgufType t, const GgufValue& v, size_t i) {
  switch (t) {
    case GgufType::uint8: out.put(static_cast<uint8_t>(v.ints[i])); break;
    case GgufType::int8: out.put(static_cast<int8_t>(v.ints[i])); break;
    case GgufType::uint16: out.put(static_cast<uint16_t>(v.ints[i])); break;
    case GgufType::int16: out.put(static_cast<int16_t>(v.ints[i])); break;
    case GgufType::uint32: out.put(static_cast<uint32_t>(v.ints[i])); break;
    case GgufType::int32: out.put(static_cast<int32_t>(v.ints[i])); break;
    case GgufType::boolean: out.put(static_cast<uint8_t>(v.ints[i])); break;
    case GgufType::uint64: out.put(static_cast<uint64_t>(v.ints[i])); break;
    case GgufType::int64: out.put(v.ints[i]); break;
    case GgufType::float32: out.put(static_cast<float>(v.floats[i])); break;
    case GgufType::float64: out.put(v.floats[i]); break;
    case GgufType::string: out.put_string(v.strings[i]); break;
    case GgufType::array: CONCORD_CHECK(false, "put_element called for an array");
  }
}

// Throws unless v's vectors hold exactly its elements, each in range for its type.
void check_value(const std::string& where, const std::string& key, const GgufValue& v) {
  const GgufType t = v.element_type();
  const std::string who = where + "metadata '" + printable(key) + "'";
  if (t == GgufType::array || static_cast<uint32_t>(t) > static_cast<uint32_t>(GgufType::float64)) {
    throw InputError(who + ": nested arrays and unknown types cannot be written");
  }
  const bool floating = t == GgufType::float32 || t == GgufType::float64;
  const bool text = t == GgufType::string;
  const size_t n = floating ? v.floats.size() : text ? v.strings.size() : v.ints.size();
  const size_t others = floating ? v.ints.size() + v.strings.size()
                        : text   ? v.ints.size() + v.floats.size()
                                 : v.floats.size() + v.strings.size();
  if (others != 0 || (!v.is_array() && n != 1)) {
    throw InputError(fmt::format("{}: a {} {} must hold {} {} value(s) and nothing else", who,
                                 v.is_array() ? "array of" : "scalar", gguf_type_name(t),
                                 v.is_array() ? "its" : "one", gguf_type_name(t)));
  }
  if (floating || text) return;
  for (int64_t x : v.ints) {
    if (!integer_fits(t, x)) {
      throw InputError(fmt::format("{}: {} is out of range for {}", who, x, gguf_type_name(t)));
    }
  }
}

// The header (magic through the padding before the data section) and each tensor's offset.
std::vector<uint8_t> build_header(const GgufMetadata& metadata,
                                  const std::vector<GgufTensorToWrite>& tensors,
                                  uint32_t alignment, const std::string& where) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw InputError(fmt::format("{}alignment {} is not a power of two", where, alignment));
  }
  GgufMetadata kvs = metadata;
  bool has_alignment_key = false;
  std::unordered_set<std::string_view> keys;
  for (const auto& [key, value] : kvs) {
    if (key.empty()) throw InputError(where + "a metadata key is empty");
    if (first_invalid_utf8({reinterpret_cast<const uint8_t*>(key.data()), key.size()})) {
      throw InputError(where + "metadata key '" + printable(key) + "' is not valid UTF-8");
    }
    if (!keys.insert(key).second) {
      throw InputError(where + "metadata key '" + printable(key) + "' appears twice");
    }
    check_value(where, key, value);
    if (key == "general.alignment") {
      if (value.type != GgufType::uint32 || value.ints[0] != alignment) {
        throw InputError(fmt::format("{}general.alignment in the metadata must be the uint32 {} "
                                     "the file is written with",
                                     where, alignment));
      }
      has_alignment_key = true;
    }
  }
  if (!has_alignment_key && alignment != kDefaultAlignment) {
    kvs.emplace_back("general.alignment", GgufValue::of_uint32(alignment));
  }

  std::unordered_set<std::string_view> names;
  for (const GgufTensorToWrite& t : tensors) {
    const std::string who = where + "tensor '" + printable(t.name) + "'";
    if (t.name.size() > kMaxNameBytes) {
      throw InputError(fmt::format("{}: name is {} bytes; ggml allows at most {}", who,
                                   t.name.size(), kMaxNameBytes));
    }
    if (!names.insert(t.name).second) throw InputError(who + ": two tensors have this name");
    if (t.dims.empty() || t.dims.size() > 4) {
      throw InputError(fmt::format("{}: {} dimensions; GGUF tensors have 1 to 4", who,
                                   t.dims.size()));
    }
    const auto bytes = gguf_tensor_byte_size(t.type, t.dims);
    if (!bytes || *bytes != t.bytes.size()) {
      const auto traits = ggml_type_traits(static_cast<uint32_t>(t.type));
      throw InputError(fmt::format("{}: dims [{}] of {} do not match its {} bytes", who,
                                   fmt::join(t.dims, ", "), traits ? traits->name : "?",
                                   t.bytes.size()));
    }
  }

  Bytes out;
  out.put<uint32_t>(0x46554747);  // "GGUF"
  out.put<uint32_t>(kVersion);
  out.put<uint64_t>(tensors.size());
  out.put<uint64_t>(kvs.size());
  for (const auto& [key, value] : kvs) {
    out.put_string(key);
    out.put(static_cast<uint32_t>(value.type));
    if (value.is_array()) {
      out.put(static_cast<uint32_t>(value.array_type));
      out.put<uint64_t>(value.size());
    }
    for (size_t i = 0; i < value.size(); ++i) put_element(out, value.element_type(), value, i);
  }
  uint64_t offset = 0;
  for (const GgufTensorToWrite& t : tensors) {
    out.put_string(t.name);
    out.put(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) out.put(static_cast<uint64_t>(d));
    out.put(static_cast<uint32_t>(t.type));
    out.put(offset);
    offset += (t.bytes.size() + alignment - 1) / alignment * alignment;
  }
  out.pad_to(alignment);
  return std::move(out.data());
}

size_t padding_after(size_t n, uint32_t alignment) { return (alignment - n % alignment) % alignment; }

}  // namespace

void write_gguf(const std::filesystem::path& path, const GgufMetadata& metadata,
                const std::vector<GgufTensorToWrite>& tensors, uint32_t alignment) {
  const std::vector<uint8_t> header =
      build_header(metadata, tensors, alignment, "[gguf] writing " + path.string() + ": ");
  const std::vector<uint8_t> zeros(alignment, 0);
  AtomicWriter out(path);
  out.write(header.data(), header.size());
  for (const GgufTensorToWrite& t : tensors) {
    out.write(t.bytes.data(), t.bytes.size());
    out.write(zeros.data(), padding_after(t.bytes.size(), alignment));
  }
  out.commit();
}

std::vector<uint8_t> serialize_gguf(const GgufMetadata& metadata,
                                    const std::vector<GgufTensorToWrite>& tensors,
                                    uint32_t alignment) {
  std::vector<uint8_t> image = build_header(metadata, tensors, alignment, "[gguf] writing: ");
  for (const GgufTensorToWrite& t : tensors) {
    image.insert(image.end(), t.bytes.begin(), t.bytes.end());
    image.resize(image.size() + padding_after(t.bytes.size(), alignment), 0);
  }
  return image;
}

}  // namespace concord::io
