// The safetensors writer: the reference library's tensor order and header layout, written
// atomically (see safetensors.h).
#include <algorithm>
#include <cstring>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/io/atomic_file.h"
#include "concord/io/safetensors.h"
#include "concord/numerics/check.h"

namespace concord::io {
namespace {

// The header bytes (padded with spaces to a multiple of 8), with `tensors` put in file order.
std::string prepare_header(std::vector<TensorToWrite>& tensors,
                           const std::map<std::string, std::string>& metadata,
                           const std::string& where) {
  std::set<std::string_view> names;
  for (const TensorToWrite& t : tensors) {
    if (t.name == "__metadata__") {
      throw InputError(where + "'__metadata__' is reserved and cannot name a tensor");
    }
    if (!names.insert(t.name).second) {
      throw InputError(where + "two tensors are named '" + t.name + "'");
    }
    const auto bytes = tensor_byte_size(t.dtype, t.shape);
    if (!bytes || *bytes != t.bytes.size()) {
      throw InputError(fmt::format("{}tensor '{}': shape {} of {} does not match its {} bytes",
                                   where, t.name, shape_text(t.shape), dtype_name(t.dtype),
                                   t.bytes.size()));
    }
  }
  // The reference library: dtype descending (its enum order), then name ascending.
  std::sort(tensors.begin(), tensors.end(), [](const TensorToWrite& a, const TensorToWrite& b) {
    if (a.dtype != b.dtype) return a.dtype > b.dtype;
    return a.name < b.name;
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception&) {
    throw InputError(where + "a tensor name or metadata string is not valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

std::array<uint8_t, 8> length_bytes(uint64_t n) {
  std::array<uint8_t, 8> out{};
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  return out;
}

}  // namespace

void write_safetensors(const std::filesystem::path& path, std::vector<TensorToWrite> tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string header =
      prepare_header(tensors, metadata, "[safetensors] writing " + path.string() + ": ");
  AtomicWriter out(path);
  const auto n = length_bytes(header.size());
  out.write(n.data(), n.size());
  out.write(header.data(), header.size());
  for (const TensorToWrite& t : tensors) out.write(t.bytes.data(), t.bytes.size());
  out.commit();
}

std::vector<uint8_t> serialize_safetensors(std::vector<TensorToWrite> tensors,
                                           const std::map<std::string, std::string>& metadata) {
  const std::string header = prepare_header(tensors, metadata, "[safetensors] serializing: ");
  size_t total = 8 + header.size();
  for (const TensorToWrite& t : tensors) total += t.bytes.size();
  // Sized once and filled with memcpy (GCC 12 warns falsely on chained vector::insert).
  std::vector<uint8_t> out(total);
  const auto n = length_bytes(header.size());
  std::memcpy(out.data(), n.data(), n.size());
  std::memcpy(out.data() + 8, header.data(), header.size());
  size_t at = 8 + header.size();
  for (const TensorToWrite& t : tensors) {
    if (!t.bytes.empty()) std::memcpy(out.data() + at, t.bytes.data(), t.bytes.size());
    at += t.bytes.size();
  }
  return out;
}

}  // namespace concord::io
