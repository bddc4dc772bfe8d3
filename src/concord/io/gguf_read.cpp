// The GGUF reader: maps the file and validates every field as it is read (see gguf.h).
//
// Hostile input: every count and length is checked against the bytes left in the file before
// anything is allocated (a count of n elements needs at least n times the element's smallest
// encoding), so a small file cannot make the reader allocate more than a small multiple of its
// own size; tensor extents use overflow-checked arithmetic.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <limits>
#include <numeric>
#include <unordered_set>

#include <fmt/format.h>

#include "concord/io/gguf.h"
#include "concord/io/reader_support.h"
#include "concord/numerics/check.h"

namespace concord::io {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint64_t kDefaultAlignment = 32;
constexpr size_t kMaxNameBytes = 63;  // ggml's GGML_MAX_NAME (64) counts the terminator
constexpr uint32_t kMaxDims = 4;      // GGML_MAX_DIMS
// Smallest encodings, for the count checks: a KV is a key (8-byte length + at least 1 byte), a
// type and a 1-byte value; a tensor info is a name length, n_dims, one dim, type and offset.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

// A problem found while parsing; parse() prefixes "[gguf] <path>: ".
struct Problem {
  std::string what;
};

bool is_known_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::float64); }

// Bytes of one element of a scalar type (strings: the smallest, an empty one).
uint64_t min_element_bytes(GgufType t) {
  switch (t) {
    case GgufType::uint8:
    case GgufType::int8:
    case GgufType::boolean: return 1;
    case GgufType::uint16:
    case GgufType::int16: return 2;
    case GgufType::uint32:
    case GgufType::int32:
    case GgufType::float32: return 4;
    default: return 8;  // uint64, int64, float64, string (its length)
  }
}

bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::uint8:
    case GgufType::int8:
    case GgufType::uint16:
    case GgufType::int16:
    case GgufType::uint32:
    case GgufType::int32:
    case GgufType::uint64:
    case GgufType::int64: return true;
    default: return false;
  }
}

class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> image) : image_(image) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return image_.size() - pos_; }

  std::span<const uint8_t> take(uint64_t n, std::string_view what) {
    if (n > remaining()) {
      throw Problem{fmt::format("{} at byte {} needs {} bytes but the file ends {} bytes later "
                                "(truncated?)",
                                what, pos_, n, remaining())};
    }
    const auto out = image_.subspan(pos_, n);
    pos_ += n;
    return out;
  }
  template <typename T>
  T read(std::string_view what) {
    const auto bytes = take(sizeof(T), what);
    T v{};
    std::memcpy(&v, bytes.data(), sizeof(T));  // GGUF is little-endian, as concord's targets
    return v;
  }
  uint32_t u32(std::string_view what) { return read<uint32_t>(what); }
  uint64_t u64(std::string_view what) { return read<uint64_t>(what); }

  std::string_view string(std::string_view what) {
    const uint64_t at = pos_;
    const uint64_t length = u64(what);
    if (length > remaining()) {
      throw Problem{fmt::format("{} at byte {} claims {} bytes but the file ends {} bytes later "
                                "(corrupt or truncated)",
                                what, at, length, remaining())};
    }
    const auto bytes = take(length, what);
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
  }

 private:
  std::span<const uint8_t> image_;
  uint64_t pos_ = 0;
};

// Appends one element of scalar type t to v.
void read_element(Cursor& in, GgufType t, GgufValue& v, const std::string& who) {
  switch (t) {
    case GgufType::uint8: v.ints.push_back(in.read<uint8_t>(who)); break;
    case GgufType::int8: v.ints.push_back(in.read<int8_t>(who)); break;
    case GgufType::uint16: v.ints.push_back(in.read<uint16_t>(who)); break;
    case GgufType::int16: v.ints.push_back(in.read<int16_t>(who)); break;
    case GgufType::uint32: v.ints.push_back(in.read<uint32_t>(who)); break;
    case GgufType::int32: v.ints.push_back(in.read<int32_t>(who)); break;
    case GgufType::uint64: v.ints.push_back(static_cast<int64_t>(in.read<uint64_t>(who))); break;
    case GgufType::int64: v.ints.push_back(in.read<int64_t>(who)); break;
    case GgufType::float32: v.floats.push_back(in.read<float>(who)); break;
    case GgufType::float64: v.floats.push_back(in.read<double>(who)); break;
    case GgufType::boolean: {
      const uint64_t at = in.pos();
      const auto b = in.read<uint8_t>(who);
      if (b > 1) throw Problem{fmt::format("{}: bool at byte {} is {}, not 0 or 1", who, at, b)};
      v.ints.push_back(b);
      break;
    }
    case GgufType::string: v.strings.emplace_back(in.string(who + ": string")); break;
    case GgufType::array: CONCORD_CHECK(false, "read_element called for an array");
  }
}

GgufValue read_value(Cursor& in, const std::string& who) {
  GgufValue v;
  const uint64_t type_at = in.pos();
  const uint32_t type = in.u32(who + ": value type");
  if (!is_known_value_type(type)) {
    throw Problem{fmt::format("{}: unknown value type {} at byte {} (GGUF types are 0..12)", who,
                              type, type_at)};
  }
  v.type = static_cast<GgufType>(type);
  if (v.type != GgufType::array) {
    read_element(in, v.type, v, who);
    return v;
  }
  const uint64_t element_at = in.pos();
  const uint32_t element = in.u32(who + ": array element type");
  if (element == static_cast<uint32_t>(GgufType::array)) {
    throw Problem{fmt::format("{}: nested array at byte {} (concord reads arrays of scalars and "
                              "strings only)",
                              who, element_at)};
  }
  if (!is_known_value_type(element)) {
    throw Problem{fmt::format("{}: unknown array element type {} at byte {} (GGUF types are "
                              "0..12)",
                              who, element, element_at)};
  }
  v.array_type = static_cast<GgufType>(element);
  const uint64_t count_at = in.pos();
  const uint64_t count = in.u64(who + ": array length");
  if (count > in.remaining() / min_element_bytes(v.array_type)) {
    throw Problem{fmt::format("{}: array of {} {} at byte {} cannot fit in the {} bytes left in "
                              "the file (corrupt or truncated)",
                              who, count, gguf_type_name(v.array_type), count_at,
                              in.remaining())};
  }
  const auto n = static_cast<size_t>(count);
  if (v.array_type == GgufType::string) {
    v.strings.reserve(n);
  } else if (v.array_type == GgufType::float32 || v.array_type == GgufType::float64) {
    v.floats.reserve(n);
  } else {
    v.ints.reserve(n);
  }
  for (size_t i = 0; i < n; ++i) read_element(in, v.array_type, v, who);
  return v;
}

std::string quote_name(std::string_view name) { return fmt::format("'{}'", printable(name)); }

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::uint8: return "uint8";
    case GgufType::int8: return "int8";
    case GgufType::uint16: return "uint16";
    case GgufType::int16: return "int16";
    case GgufType::uint32: return "uint32";
    case GgufType::int32: return "int32";
    case GgufType::float32: return "float32";
    case GgufType::boolean: return "bool";
    case GgufType::string: return "string";
    case GgufType::array: return "array";
    case GgufType::uint64: return "uint64";
    case GgufType::int64: return "int64";
    case GgufType::float64: return "float64";
  }
  return "unknown";
}

size_t GgufValue::size() const {
  if (!is_array()) return 1;
  return ints.size() + floats.size() + strings.size();  // only one of them is filled
}

namespace {

GgufValue integer_scalar(GgufType type, int64_t v) {
  GgufValue out;
  out.type = type;
  out.ints.push_back(v);
  return out;
}

}  // namespace

GgufValue GgufValue::of_uint32(uint32_t v) { return integer_scalar(GgufType::uint32, v); }
GgufValue GgufValue::of_int32(int32_t v) { return integer_scalar(GgufType::int32, v); }
GgufValue GgufValue::of_uint64(uint64_t v) {
  return integer_scalar(GgufType::uint64, static_cast<int64_t>(v));  // the bit pattern
}
GgufValue GgufValue::of_bool(bool v) { return integer_scalar(GgufType::boolean, v ? 1 : 0); }
GgufValue GgufValue::of_float32(float v) {
  GgufValue out;
  out.type = GgufType::float32;
  out.floats.push_back(v);
  return out;
}
GgufValue GgufValue::of_string(std::string v) {
  GgufValue out;
  out.type = GgufType::string;
  out.strings.push_back(std::move(v));
  return out;
}
GgufValue GgufValue::of_strings(std::vector<std::string> v) {
  GgufValue out;
  out.type = GgufType::array;
  out.array_type = GgufType::string;
  out.strings = std::move(v);
  return out;
}
GgufValue GgufValue::of_ints(GgufType element, std::vector<int64_t> v) {
  CONCORD_CHECK(is_integer(element) || element == GgufType::boolean,
                "GgufValue::of_ints needs an integer or bool element type");
  GgufValue out;
  out.type = GgufType::array;
  out.array_type = element;
  out.ints = std::move(v);
  return out;
}
GgufValue GgufValue::of_floats(GgufType element, std::vector<double> v) {
  CONCORD_CHECK(element == GgufType::float32 || element == GgufType::float64,
                "GgufValue::of_floats needs float32 or float64");
  GgufValue out;
  out.type = GgufType::array;
  out.array_type = element;
  out.floats = std::move(v);
  return out;
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

bool is_gguf_path(const std::filesystem::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".gguf") return true;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::equal(magic, magic + 4, "GGUF");
}

GgufFile GgufFile::open(const std::filesystem::path& path) {
  GgufFile f;
  f.label_ = path.string();
  FileImage image = map_file_image(path, "gguf");
  f.storage_ = std::move(image.storage);
  f.image_ = image.bytes;
  f.mapped_ = true;
  f.parse();
  return f;
}

void GgufFile::release_pages(std::span<const uint8_t> bytes) const {
  if (!mapped_ || bytes.empty()) return;
  CONCORD_CHECK(bytes.data() >= image_.data() && bytes.data() + bytes.size() <= image_.data() + image_.size(),
                "release_pages: bytes outside the file");
  // Whole pages covering the range; neighbours' pages re-read from the file if needed.
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(bytes.data()) & ~(page - 1);
  const auto end = reinterpret_cast<uintptr_t>(bytes.data() + bytes.size());
  ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

GgufFile GgufFile::from_bytes(std::vector<uint8_t> bytes, std::string label) {
  GgufFile f;
  f.label_ = std::move(label);
  FileImage image = owned_file_image(std::move(bytes));
  f.storage_ = std::move(image.storage);
  f.image_ = image.bytes;
  f.parse();
  return f;
}

void GgufFile::parse() {
  try {
    Cursor in(image_);
    const uint32_t magic = in.u32("magic");
    if (magic != kMagic) {
      throw Problem{fmt::format("bad magic {:02x} {:02x} {:02x} {:02x}, expected \"GGUF\" (not a "
                                "GGUF file)",
                                image_[0], image_[1], image_[2], image_[3])};
    }
    version_ = in.u32("version");
    if (version_ != 2 && version_ != 3) {
      throw Problem{fmt::format("GGUF version {} is not supported (concord reads versions 2 and 3)",
                                version_)};
    }
    const uint64_t tensor_count = in.u64("tensor count");
    const uint64_t kv_count = in.u64("metadata count");
    if (tensor_count > in.remaining() / kMinTensorInfoBytes) {
      throw Problem{fmt::format("tensor count {} cannot fit in the {} bytes left in the file "
                                "(corrupt or truncated)",
                                tensor_count, in.remaining())};
    }
    if (kv_count > in.remaining() / kMinKvBytes) {
      throw Problem{fmt::format("metadata count {} cannot fit in the {} bytes left in the file "
                                "(corrupt or truncated)",
                                kv_count, in.remaining())};
    }

    std::unordered_set<std::string_view> keys;
    for (uint64_t i = 0; i < kv_count; ++i) {
      const uint64_t key_at = in.pos();
      const std::string_view key = in.string(fmt::format("metadata key {}", i));
      if (key.empty()) throw Problem{fmt::format("metadata key {} at byte {} is empty", i, key_at)};
      if (const auto bad = first_invalid_utf8(
              {reinterpret_cast<const uint8_t*>(key.data()), key.size()})) {
        throw Problem{fmt::format("metadata key {} at byte {} is not valid UTF-8 (byte {} of the "
                                  "key)",
                                  i, key_at, *bad)};
      }
      if (!keys.insert(key).second) {
        throw Problem{fmt::format("metadata key {} appears twice (again at byte {})", quote_name(key),
                                  key_at)};
      }
      metadata_.emplace_back(std::string(key), read_value(in, "metadata " + quote_name(key)));
    }

    if (const GgufValue* a = find_value("general.alignment")) {
      if (a->type != GgufType::uint32) {
        throw Problem{"general.alignment is " + std::string(gguf_type_name(a->type)) +
                      ", expected uint32"};
      }
      const auto value = static_cast<uint64_t>(a->ints[0]);
      if (value == 0 || (value & (value - 1)) != 0) {
        throw Problem{fmt::format("general.alignment {} is not a power of two", value)};
      }
      alignment_ = value;
    } else {
      alignment_ = kDefaultAlignment;
    }

    std::unordered_set<std::string_view> names;
    for (uint64_t i = 0; i < tensor_count; ++i) {
      const uint64_t name_at = in.pos();
      const std::string_view name = in.string(fmt::format("tensor {} name", i));
      const std::string who = "tensor " + quote_name(name);
      if (name.size() > kMaxNameBytes) {
        throw Problem{fmt::format("tensor {} name at byte {} is {} bytes; ggml allows at most {}",
                                  i, name_at, name.size(), kMaxNameBytes)};
      }
      if (!names.insert(name).second) {
        throw Problem{fmt::format("{} appears twice (again at byte {})", who, name_at)};
      }
      GgufTensorInfo t;
      t.name = std::string(name);
      const uint32_t n_dims = in.u32(who + ": n_dims");
      if (n_dims < 1 || n_dims > kMaxDims) {
        throw Problem{fmt::format("{} has {} dimensions; GGUF tensors have 1 to {}", who, n_dims,
                                  kMaxDims)};
      }
      uint64_t numel = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        const uint64_t dim = in.u64(who + ": dimension");
        if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          throw Problem{fmt::format("{}: dimension {} is {} (dimensions must be 1 to 2^63-1)", who,
                                    d, static_cast<int64_t>(dim))};
        }
        if (__builtin_mul_overflow(numel, dim, &numel) ||
            numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          throw Problem{who + ": the element count overflows int64"};
        }
        t.dims.push_back(static_cast<int64_t>(dim));
      }
      const uint32_t type = in.u32(who + ": type");
      const auto traits = ggml_type_traits(type);
      if (!traits) {
        throw Problem{fmt::format("{} has unknown ggml type {} (see docs/gguf.md for the types "
                                  "concord knows)",
                                  who, type)};
      }
      t.type = static_cast<GgmlType>(type);
      if (t.dims[0] % traits->block_size != 0) {
        throw Problem{fmt::format("{}: row length ne0 = {} is not a multiple of the {}-element {} "
                                  "block",
                                  who, t.dims[0], traits->block_size, traits->name)};
      }
      t.offset = in.u64(who + ": offset");
      if (t.offset % alignment_ != 0) {
        throw Problem{fmt::format("{}: offset {} is not a multiple of the alignment {}", who,
                                  t.offset, alignment_)};
      }
      tensors_.push_back(std::move(t));
    }

    // The data section starts at the next multiple of the alignment.
    const uint64_t header_end = in.pos();
    data_offset_ = (header_end + alignment_ - 1) / alignment_ * alignment_;
    const uint64_t data_size = image_.size() > data_offset_ ? image_.size() - data_offset_ : 0;
    for (GgufTensorInfo& t : tensors_) {
      const auto bytes = gguf_tensor_byte_size(t.type, t.dims);
      if (!bytes) throw Problem{"tensor " + quote_name(t.name) + ": the byte count overflows 64 bits"};
      if (t.offset > data_size || *bytes > data_size - t.offset) {
        throw Problem{fmt::format("tensor {}: bytes [{}, {}) of the data section run past its "
                                  "end ({} bytes from file offset {}) (truncated?)",
                                  quote_name(t.name), t.offset,
                                  t.offset > UINT64_MAX - *bytes ? UINT64_MAX : t.offset + *bytes,
                                  data_size, data_offset_)};
      }
      t.bytes = image_.subspan(data_offset_ + t.offset, *bytes);
    }
    std::vector<size_t> order(tensors_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
    for (size_t i = 1; i < order.size(); ++i) {
      const GgufTensorInfo& a = tensors_[order[i - 1]];
      const GgufTensorInfo& b = tensors_[order[i]];
      if (a.offset + a.bytes.size() > b.offset) {
        throw Problem{fmt::format("tensors {} [{}, {}) and {} [{}, {}) overlap", quote_name(a.name),
                                  a.offset, a.offset + a.bytes.size(), quote_name(b.name), b.offset,
                                  b.offset + b.bytes.size())};
      }
    }
  } catch (const Problem& p) {
    throw InputError("[gguf] " + label_ + ": " + p.what);
  }
}

const GgufValue* GgufFile::find_value(std::string_view key) const {
  for (const auto& [k, v] : metadata_) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

const GgufValue& require_value(const GgufFile& f, std::string_view key) {
  if (const GgufValue* v = f.find_value(key)) return *v;
  throw InputError("[gguf] " + f.path() + ": no metadata key " + quote_name(key));
}

[[noreturn]] void wrong_type(const GgufFile& f, std::string_view key, const GgufValue& v,
                             std::string_view expected) {
  const std::string actual =
      v.is_array() ? fmt::format("an array of {}", gguf_type_name(v.array_type))
                   : std::string(gguf_type_name(v.type));
  throw InputError(fmt::format("[gguf] {}: metadata {} is {}, expected {}", f.path(), quote_name(key),
                               actual, expected));
}

}  // namespace

int64_t GgufFile::get_int(std::string_view key) const {
  const GgufValue& v = require_value(*this, key);
  if (!is_integer(v.type)) wrong_type(*this, key, v, "an integer");
  if (v.type == GgufType::uint64 && v.ints[0] < 0) {
    throw InputError(fmt::format("[gguf] {}: metadata {} = {} does not fit in int64", label_,
                                 quote_name(key), static_cast<uint64_t>(v.ints[0])));
  }
  return v.ints[0];
}

double GgufFile::get_float(std::string_view key) const {
  const GgufValue& v = require_value(*this, key);
  if (v.type != GgufType::float32 && v.type != GgufType::float64) {
    wrong_type(*this, key, v, "float32 or float64");
  }
  return v.floats[0];
}

const std::string& GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = require_value(*this, key);
  if (v.type != GgufType::string) wrong_type(*this, key, v, "a string");
  return v.strings[0];
}

const GgufTensorInfo* GgufFile::find(std::string_view name) const {
  for (const GgufTensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const GgufTensorInfo& GgufFile::get(std::string_view name) const {
  if (const GgufTensorInfo* t = find(name)) return *t;
  throw InputError("[gguf] " + label_ + ": no tensor named " + quote_name(name) +
                   " (concord inspect lists the names)");
}

}  // namespace concord::io
