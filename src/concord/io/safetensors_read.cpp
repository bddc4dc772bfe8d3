// The safetensors reader: maps the file and validates every header field (see safetensors.h).
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/io/reader_support.h"
#include "concord/io/safetensors.h"
#include "concord/numerics/check.h"

namespace concord::io {
namespace {

using json = nlohmann::json;

// The reference library's limit on N.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Deepest container a valid header holds: top object (0) > tensor entry or metadata (1) >
// shape / data_offsets array (2).
constexpr int kMaxJsonDepth = 2;

// Thrown from inside the JSON parser callback; turned into a one-line InputError.
struct HeaderProblem {
  std::string what;
};

// Parses the header, rejecting duplicate keys and nesting deeper than kMaxJsonDepth while it
// parses (so a hostile header cannot build a deep tree).
json parse_header_json(std::string_view text) {
  return parse_json_strict(text, kMaxJsonDepth, [](JsonProblem problem, int depth,
                                                   const std::string& detail) {
    switch (problem) {
      case JsonProblem::too_deep:
        throw HeaderProblem{fmt::format(
            "header nests containers {} deep; a safetensors header has at most {} "
            "(top object, tensor entry, shape array)",
            depth + 1, kMaxJsonDepth + 1)};
      case JsonProblem::duplicate_key:
        throw HeaderProblem{"duplicate key '" + printable(detail) + "' in the header"};
      case JsonProblem::invalid:
        // nlohmann's messages may quote raw header bytes: keep them on one line.
        throw HeaderProblem{"header is not valid JSON (" + printable(detail) + ")"};
    }
  });
}

// A JSON value that must be an integer in [0, limit].
std::optional<uint64_t> as_unsigned(const json& v, uint64_t limit) {
  if (!v.is_number_unsigned()) {
    // nlohmann stores non-negative literals as unsigned; "-1", "1.0", "1e3" are not.
    if (v.is_number_integer() && v.get<int64_t>() >= 0) {
      const auto u = static_cast<uint64_t>(v.get<int64_t>());
      return u <= limit ? std::optional(u) : std::nullopt;
    }
    return std::nullopt;
  }
  const uint64_t u = v.get<uint64_t>();
  return u <= limit ? std::optional(u) : std::nullopt;
}

std::string json_excerpt(const json& v) {
  return printable(v.dump(-1, ' ', false, json::error_handler_t::replace));
}

TensorInfo parse_tensor_entry(const std::string& name, const json& entry, uint64_t buffer_size) {
  const std::string who = "tensor '" + printable(name) + "'";
  if (!entry.is_object()) {
    throw HeaderProblem{who + ": entry is " + std::string(entry.type_name()) +
                        ", expected an object with dtype, shape and data_offsets"};
  }
  TensorInfo t;
  t.name = name;

  const auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) {
    throw HeaderProblem{who + ": missing \"dtype\" string"};
  }
  const auto parsed_dtype = dtype_from_name(dtype->get_ref<const std::string&>());
  if (!parsed_dtype) {
    throw HeaderProblem{who + ": unknown dtype '" + printable(dtype->get_ref<const std::string&>()) +
                        "' (known: " + dtype_names() + ")"};
  }
  t.dtype = *parsed_dtype;

  const auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) {
    throw HeaderProblem{who + ": missing \"shape\" array"};
  }
  for (const json& dim : *shape) {
    const auto d = as_unsigned(dim, static_cast<uint64_t>(INT64_MAX));
    if (!d) {
      throw HeaderProblem{who + ": shape " + json_excerpt(*shape) +
                          " must hold non-negative integers below 2^63"};
    }
    t.shape.push_back(static_cast<int64_t>(*d));
  }

  const auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2) {
    throw HeaderProblem{who + ": missing \"data_offsets\" [begin, end]"};
  }
  const auto begin = as_unsigned((*offsets)[0], UINT64_MAX);
  const auto end = as_unsigned((*offsets)[1], UINT64_MAX);
  if (!begin || !end) {
    throw HeaderProblem{who + ": data_offsets " + json_excerpt(*offsets) +
                        " must be two non-negative integers"};
  }
  if (*begin > *end) {
    throw HeaderProblem{fmt::format("{}: data_offsets [{}, {}] has begin > end", who, *begin, *end)};
  }
  if (*end > buffer_size) {
    throw HeaderProblem{fmt::format(
        "{}: data_offsets end {} is past the end of the data buffer ({} bytes) (file truncated?)",
        who, *end, buffer_size)};
  }
  t.begin = *begin;
  t.end = *end;

  const auto bytes = tensor_byte_size(t.dtype, t.shape);
  if (!bytes) {
    throw HeaderProblem{fmt::format("{}: shape {} of {} has no valid byte size (the element count "
                                    "overflows 64 bits, or {} elements do not fill whole bytes)",
                                    who, shape_text(t.shape), dtype_name(t.dtype),
                                    dtype_name(t.dtype))};
  }
  if (*bytes != t.end - t.begin) {
    throw HeaderProblem{fmt::format("{}: shape {} of {} needs {} bytes but data_offsets [{}, {}] "
                                    "span {}",
                                    who, shape_text(t.shape), dtype_name(t.dtype), *bytes, t.begin,
                                    t.end, t.end - t.begin)};
  }
  return t;
}

// Tensors sorted by offset must tile the buffer exactly: no overlap, no gap, nothing after.
void check_buffer_coverage(const std::vector<TensorInfo>& tensors, uint64_t buffer_size) {
  uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : tensors) {
    if (t.begin < covered) {
      throw HeaderProblem{fmt::format("tensors '{}' [{}, {}) and '{}' [{}, {}) overlap",
                                      printable(previous->name), previous->begin, previous->end,
                                      printable(t.name), t.begin, t.end)};
    }
    if (t.begin > covered) {
      throw HeaderProblem{fmt::format(
          "bytes [{}, {}) of the data buffer belong to no tensor (the format requires the "
          "buffer to be fully covered)",
          covered, t.begin)};
    }
    covered = t.end;
    previous = &t;
  }
  if (covered != buffer_size) {
    throw HeaderProblem{fmt::format(
        "bytes [{}, {}) at the end of the data buffer belong to no tensor (trailing data; the "
        "format requires the buffer to be fully covered)",
        covered, buffer_size)};
  }
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  SafetensorsFile f;
  f.label_ = path.string();
  FileImage image = map_file_image(path, "safetensors");
  f.storage_ = std::move(image.storage);
  f.image_ = image.bytes;
  f.parse();
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<uint8_t> bytes, std::string label) {
  SafetensorsFile f;
  f.label_ = std::move(label);
  FileImage image = owned_file_image(std::move(bytes));
  f.storage_ = std::move(image.storage);
  f.image_ = image.bytes;
  f.parse();
  return f;
}

void SafetensorsFile::parse() {
  const std::string where = "[safetensors] " + label_ + ": ";
  if (image_.size() < 8) {
    throw InputError(where + fmt::format("file is {} bytes, shorter than the 8-byte header length "
                                         "(truncated, or not a safetensors file)",
                                         image_.size()));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | image_[static_cast<size_t>(i)];
  if (n > kMaxHeaderBytes) {
    throw InputError(where + fmt::format("header length {} exceeds the {}-byte limit (corrupt, or "
                                         "not a safetensors file)",
                                         n, kMaxHeaderBytes));
  }
  if (n > image_.size() - 8) {
    throw InputError(where + fmt::format("header length {} runs past the end of the file ({} "
                                         "bytes) (file truncated?)",
                                         n, image_.size()));
  }
  header_size_ = n;
  const auto header = image_.subspan(8, n);
  const uint64_t buffer_size = image_.size() - 8 - n;
  try {
    if (auto bad = first_invalid_utf8(header)) {
      throw HeaderProblem{fmt::format("header is not valid UTF-8 (byte {} of the header)", *bad)};
    }
    const json root = parse_header_json(
        std::string_view(reinterpret_cast<const char*>(header.data()), header.size()));
    if (!root.is_object()) {
      throw HeaderProblem{"header is a JSON " + std::string(root.type_name()) +
                          ", not an object"};
    }
    for (const auto& [key, value] : root.items()) {
      if (key == "__metadata__") {
        if (!value.is_object()) {
          throw HeaderProblem{"__metadata__ is " + std::string(value.type_name()) +
                              ", expected an object of strings"};
        }
        for (const auto& [mkey, mvalue] : value.items()) {
          if (!mvalue.is_string()) {
            throw HeaderProblem{"__metadata__ value of '" + printable(mkey) + "' is " +
                                std::string(mvalue.type_name()) + "; metadata values must be strings"};
          }
          metadata_.emplace(mkey, mvalue.get<std::string>());
        }
        continue;
      }
      tensors_.push_back(parse_tensor_entry(key, value, buffer_size));
    }
    std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    check_buffer_coverage(tensors_, buffer_size);
  } catch (const HeaderProblem& p) {
    throw InputError(where + p.what);
  }
  const auto buffer = image_.subspan(8 + n);
  for (TensorInfo& t : tensors_) t.bytes = buffer.subspan(t.begin, t.end - t.begin);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  for (const TensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const TensorInfo& SafetensorsFile::get(std::string_view name) const {
  if (const TensorInfo* t = find(name)) return *t;
  throw InputError("[safetensors] " + label_ + ": no tensor named '" + printable(name) +
                   "' (concord inspect lists the names)");
}

}  // namespace concord::io
