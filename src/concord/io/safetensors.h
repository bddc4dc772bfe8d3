// safetensors: a strict reader (mmap, every header field validated) and an atomic writer.
//
// The format (huggingface/safetensors): 8 bytes little-endian N, N bytes of UTF-8 JSON, then the
// data buffer. The JSON object maps each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end]} (offsets relative to the buffer start) and may hold "__metadata__", a
// string -> string map. Real checkpoints come in this format; concord reads hostile files
// without crashing and without allocating more than the file's own size.
//
// What the reader rejects (each with a one-line InputError "[safetensors] <path>: <problem>"):
//   a file under 8 bytes; a header length over 100,000,000 bytes (the reference library's
//   limit) or past the end of the file; a header that is not UTF-8, not JSON, not an object,
//   nested deeper than a header can be, or has a duplicate key anywhere; a tensor entry that is
//   not an object or lacks dtype/shape/data_offsets; an unknown dtype; a shape entry that is
//   not a non-negative integer below 2^63; a shape whose element or bit count overflows 64
//   bits; data_offsets that are not two non-negative integers, have begin > end or end past
//   the buffer; a byte span that differs from numel * dtype size (sub-byte dtypes must fill
//   whole bytes); overlapping tensors; bytes of the buffer that belong to no tensor (the
//   reference library rejects such files too, so concord does as well); "__metadata__" that is
//   not an object of strings. Unknown keys inside a tensor entry are ignored, as the reference
//   library does.
//
// The writer orders tensors as the reference library does (dtype descending in its Dtype enum
// order, then name), writes compact JSON with "__metadata__" first, pads the header with
// spaces to a multiple of 8 bytes, and writes through io/atomic_file (temp + rename).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace concord::io {

// Every dtype of the safetensors specification (safetensors 0.8), in the order of the
// reference library's Dtype enum: the writer sorts by it, so keep the order.
enum class Dtype : uint8_t {
  BOOL,
  F4,       // OCP E2M1, two per byte
  F6_E2M3,  // OCP E2M3, packed 6 bits (4 elements in 3 bytes)
  F6_E3M2,  // OCP E3M2, packed 6 bits
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,  // OCP E4M3 "FN"
  F8_E8M0,  // OCP E8M0 scale
  F8_E4M3FNUZ,
  F8_E5M2FNUZ,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  C64,
  F64,
  I64,
  U64,
};
inline constexpr int kDtypeCount = 22;

struct DtypeTraits {
  Dtype dtype;
  std::string_view name;  // as written in the header
  int bits;               // per element
  bool is_floating;       // a real floating-point type (C64 is not)
};

inline constexpr std::array<DtypeTraits, kDtypeCount> kDtypeTable = {{
    {Dtype::BOOL, "BOOL", 8, false},
    {Dtype::F4, "F4", 4, true},
    {Dtype::F6_E2M3, "F6_E2M3", 6, true},
    {Dtype::F6_E3M2, "F6_E3M2", 6, true},
    {Dtype::U8, "U8", 8, false},
    {Dtype::I8, "I8", 8, false},
    {Dtype::F8_E5M2, "F8_E5M2", 8, true},
    {Dtype::F8_E4M3, "F8_E4M3", 8, true},
    {Dtype::F8_E8M0, "F8_E8M0", 8, true},
    {Dtype::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8, true},
    {Dtype::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8, true},
    {Dtype::I16, "I16", 16, false},
    {Dtype::U16, "U16", 16, false},
    {Dtype::F16, "F16", 16, true},
    {Dtype::BF16, "BF16", 16, true},
    {Dtype::I32, "I32", 32, false},
    {Dtype::U32, "U32", 32, false},
    {Dtype::F32, "F32", 32, true},
    {Dtype::C64, "C64", 64, false},
    {Dtype::F64, "F64", 64, true},
    {Dtype::I64, "I64", 64, false},
    {Dtype::U64, "U64", 64, false},
}};

constexpr const DtypeTraits& dtype_traits(Dtype d) { return kDtypeTable[static_cast<int>(d)]; }
constexpr std::string_view dtype_name(Dtype d) { return dtype_traits(d).name; }
std::optional<Dtype> dtype_from_name(std::string_view name);
// "BOOL, F4, ..." for error messages.
std::string dtype_names();

// Bytes of a tensor of `shape` and `dtype`; nullopt when the element or bit count overflows
// 64 bits or a sub-byte dtype does not fill whole bytes.
std::optional<uint64_t> tensor_byte_size(Dtype dtype, std::span<const int64_t> shape);
// "[2, 3]"
std::string shape_text(std::span<const int64_t> shape);

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the start of the data buffer
  uint64_t end = 0;
  std::span<const uint8_t> bytes;  // the tensor's bytes inside the file (valid while the file is)

  int64_t numel() const;
};

// An open, fully validated safetensors file. Tensor bytes are views into a read-only mapping
// of the file, shared by copies of this object.
class SafetensorsFile {
 public:
  // Maps `path` and validates it; throws InputError naming the file and the problem.
  static SafetensorsFile open(const std::filesystem::path& path);
  // Validates an in-memory image; `label` stands for the path in error messages.
  static SafetensorsFile from_bytes(std::vector<uint8_t> image, std::string label);

  const std::string& path() const { return label_; }
  // In data-buffer order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(std::string_view name) const;
  // Throws InputError when there is no such tensor.
  const TensorInfo& get(std::string_view name) const;

  uint64_t file_size() const { return image_.size(); }
  uint64_t header_size() const { return header_size_; }        // N
  uint64_t data_offset() const { return 8 + header_size_; }    // where the buffer starts

 private:
  SafetensorsFile() = default;
  void parse();

  std::string label_;
  std::shared_ptr<const void> storage_;  // keeps the mapping (or the owned image) alive
  std::span<const uint8_t> image_;
  uint64_t header_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The values of an F32, F16 or BF16 tensor as fp32 (exact for all three); throws InputError
// naming the tensor for any other dtype.
std::vector<float> tensor_to_floats(const TensorInfo& tensor);

// One tensor to write; `bytes` must stay alive until write_safetensors returns.
struct TensorToWrite {
  std::string name;
  Dtype dtype = Dtype::F32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};

// Writes `path` atomically. Throws InputError on a duplicate or reserved name, a byte count
// that does not match shape and dtype, or an I/O failure.
void write_safetensors(const std::filesystem::path& path, std::vector<TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata = {});
// The same file as bytes (tests, and callers that want the image).
std::vector<uint8_t> serialize_safetensors(std::vector<TensorToWrite> tensors,
                                           const std::map<std::string, std::string>& metadata = {});

}  // namespace concord::io
