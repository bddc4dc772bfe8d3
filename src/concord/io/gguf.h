// GGUF (v3): a strict reader (mmap, every field validated as it is read) and an atomic writer.
//
// The format (ggml-org/ggml docs/gguf.md), all little-endian:
//   "GGUF" magic, uint32 version (3; 2 is read as well), uint64 tensor_count, uint64 kv_count,
//   kv_count × { string key, uint32 value_type, value }, tensor_count × { string name,
//   uint32 n_dims, uint64 dims[n_dims] (ne0 = innermost, contiguous dimension first),
//   uint32 ggml_type, uint64 offset }, padding to `general.alignment` (default 32), data.
//   A string is uint64 length + bytes (no terminator); an array is uint32 element type,
//   uint64 count, elements.
// Tensor dims are kept in GGUF order (ne0 first); an HF (out, in) matrix is dims {in, out}.
//
// What the reader rejects (InputError "[gguf] <path>: <problem>", one line): bad magic, a
// version other than 2 or 3, counts or string lengths that cannot fit in the rest of the file
// (checked before anything is allocated), keys that are empty, duplicated or not UTF-8, unknown
// value types, nested arrays, `general.alignment` that is not a power of two uint32, tensor
// names duplicated or of 64 bytes or more (ggml's GGML_MAX_NAME counts the terminator), a bool
// byte other than 0/1, n_dims outside 1..4, a zero or negative dimension or an
// element count that overflows, a row (ne0) that is not a whole number of blocks, an unknown
// ggml type, offsets that are not aligned, tensors past the end of the file or overlapping.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace concord::io {

enum class GgufType : uint32_t {
  uint8 = 0, int8 = 1, uint16 = 2, int16 = 3, uint32 = 4, int32 = 5, float32 = 6, boolean = 7,
  string = 8, array = 9, uint64 = 10, int64 = 11, float64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// A metadata value: a scalar, or an array of scalars (nested arrays are rejected).
struct GgufValue {
  GgufType type = GgufType::uint32;
  GgufType array_type = GgufType::uint32;  // element type when type == array
  std::vector<int64_t> ints;               // integer and bool elements (uint64: the bit pattern)
  std::vector<double> floats;              // float32 / float64 elements
  std::vector<std::string> strings;        // string elements

  bool is_array() const { return type == GgufType::array; }
  GgufType element_type() const { return is_array() ? array_type : type; }
  size_t size() const;  // element count (1 for a scalar)

  static GgufValue of_uint32(uint32_t v);
  static GgufValue of_int32(int32_t v);
  static GgufValue of_uint64(uint64_t v);
  static GgufValue of_float32(float v);
  static GgufValue of_bool(bool v);
  static GgufValue of_string(std::string v);
  static GgufValue of_strings(std::vector<std::string> v);               // array of string
  static GgufValue of_ints(GgufType element, std::vector<int64_t> v);     // array of integers
  static GgufValue of_floats(GgufType element, std::vector<double> v);    // array of floats
};

using GgufMetadata = std::vector<std::pair<std::string, GgufValue>>;  // in file order

// ggml tensor types. The reader knows the block layout of every type below so it can validate
// any file; dequantization (gguf_tensor_to_floats) supports f32, f16, bf16, the legacy quants
// q4_0, q4_1, q5_0, q5_1, q8_0, the k-quants q2_k, q3_k, q4_k, q5_k, q6_k, q8_k, and mxfp4.
enum class GgmlType : uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q8_1 = 9, q2_k = 10,
  q3_k = 11, q4_k = 12, q5_k = 13, q6_k = 14, q8_k = 15, iq2_xxs = 16, iq2_xs = 17,
  iq3_xxs = 18, iq1_s = 19, iq4_nl = 20, iq3_s = 21, iq2_s = 22, iq4_xs = 23, i8 = 24,
  i16 = 25, i32 = 26, i64 = 27, f64 = 28, iq1_m = 29, bf16 = 30, tq1_0 = 34, tq2_0 = 35,
  mxfp4 = 39, nvfp4 = 40, q1_0 = 41,
};
struct GgmlTypeTraits {
  std::string_view name;  // as ggml spells it: "F32", "Q8_0", "MXFP4", ...
  int64_t block_size;     // elements per block (1 for plain types)
  int64_t type_size;      // bytes per block
};
// nullopt for a type number ggml does not define.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t type);
std::optional<GgmlType> ggml_type_from_name(std::string_view name);  // case-insensitive
// Bytes of a tensor of `dims` (ne0 first) and `type`; nullopt for an unknown type, no dims, a
// dimension below 1, an element count over INT64_MAX, a byte count over 64 bits, or an ne0 that
// is not a whole number of blocks. (Addition to the lead's API.)
std::optional<uint64_t> gguf_tensor_byte_size(GgmlType type, std::span<const int64_t> dims);

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ne0 first
  GgmlType type = GgmlType::f32;
  uint64_t offset = 0;               // relative to the data section
  std::span<const uint8_t> bytes;    // the tensor's bytes inside the file (valid while it is)
  int64_t numel() const;
};

// Whether `path` is to be read as GGUF: it starts with the "GGUF" magic, or its name ends in
// ".gguf" (any case). A damaged GGUF file (bad magic, truncated) is then reported by the GGUF
// reader, naming the format the user gave, and never as a bad file of another format.
bool is_gguf_path(const std::filesystem::path& path);

class GgufFile {
 public:
  static GgufFile open(const std::filesystem::path& path);
  static GgufFile from_bytes(std::vector<uint8_t> image, std::string label);

  const std::string& path() const { return label_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  const GgufMetadata& metadata() const { return metadata_; }
  const GgufValue* find_value(std::string_view key) const;
  // Typed lookups; throw InputError naming the file and key when absent or of another type
  // (any integer type converts to int64 when it fits; float32/float64 to double).
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }  // in file order
  const GgufTensorInfo* find(std::string_view name) const;
  const GgufTensorInfo& get(std::string_view name) const;
  // Drops the pages holding `bytes` (a view into this file, e.g. a tensor's bytes once a loader
  // has copied or converted them) from the process's memory: a mapped file reads them again
  // from disk if they are touched later, so the views stay valid. Keeps a loader's peak resident
  // set near one copy of the weights instead of two. No-op for an in-memory image (from_bytes).
  void release_pages(std::span<const uint8_t> bytes) const;

 private:
  GgufFile() = default;
  void parse();

  std::string label_;
  std::shared_ptr<const void> storage_;
  bool mapped_ = false;  // storage_ is a read-only private mapping of the file
  std::span<const uint8_t> image_;
  uint32_t version_ = 3;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  GgufMetadata metadata_;
  std::vector<GgufTensorInfo> tensors_;
};

// The values of a tensor of a type gguf_type_converts_to_floats accepts, as fp32 (numel floats,
// ne0 fastest), computed as ggml's dequantize_row_* does (fp16 scales widened exactly, the same
// fp32 operations in the same order), so bit-identical to the PyPI gguf package's
// gguf.quants.dequantize, NaN payloads included; InputError naming the tensor for other types
// or a byte count that does not match dims and type.
std::vector<float> gguf_tensor_to_floats(const GgufTensorInfo& tensor);
// Whether gguf_tensor_to_floats converts `type`, and the list of those types for messages
// ("F32, F16, BF16, Q4_0, ... and MXFP4").
bool gguf_type_converts_to_floats(GgmlType type);
std::string_view gguf_float_type_list();
// Encodes fp32 values (ne0 fastest; numel a multiple of the block size) as `type`: f32, f16,
// bf16 (round to nearest even), q4_0 / q4_1 (quantize_row_q4_0_ref / _q4_1_ref: d = max/-8,
// q = min(15, trunc(x/d + 8.5)); d = (max-min)/15, m = min, q = min(15, trunc((x-min)/d + 0.5));
// d and m as f16), q8_0 (ggml's rule: d = amax/127 as f16, q = round(x/d)) or
// mxfp4 (GGUF's block layout: e8m0 scale byte, then 16 bytes holding element j in the low
// nibble and element j+16 in the high nibble of byte j; scale and codes as ggml's quantizer
// chooses them).
std::vector<uint8_t> encode_gguf_tensor(GgmlType type, std::span<const float> values);
// The 2-bit code (0..3: -1, 0, +1, 2 times d) of element e (0..255) of a TQ2_0 block {u8 qs[64];
// f16 d}, in ggml's layout: element 128h + 32l + m is bits 2l of qs[32h + m].
inline int tq2_0_code(const uint8_t* block, int e) {
  return (block[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

struct GgufTensorToWrite {
  std::string name;
  std::vector<int64_t> dims;  // ne0 first
  GgmlType type = GgmlType::f32;
  std::span<const uint8_t> bytes;  // must stay alive until the write returns
};
// Writes a v3 file atomically (temp + rename), tensors in the given order, each aligned to
// `alignment` (general.alignment is appended to the metadata when it is not 32 and absent; when
// present it must equal `alignment`). The bytes equal the PyPI gguf package's GGUFWriter output
// for the same content. Throws InputError on duplicate names or keys, or a byte count that does
// not match dims and type, or anything else the reader would reject (docs/gguf.md).
void write_gguf(const std::filesystem::path& path, const GgufMetadata& metadata,
                const std::vector<GgufTensorToWrite>& tensors, uint32_t alignment = 32);
std::vector<uint8_t> serialize_gguf(const GgufMetadata& metadata,
                                    const std::vector<GgufTensorToWrite>& tensors,
                                    uint32_t alignment = 32);

}  // namespace concord::io
