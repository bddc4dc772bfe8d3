// Helpers every strict file reader in io needs: a read-only mapping of a file, a UTF-8 check,
// and a way to quote bytes from a hostile file on one line of an error message.
//
// Header-only; the safetensors, GGUF and logit-dump readers share them.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/io/utf8.h"
#include "concord/numerics/check.h"

namespace concord::io {

// Maps `path` read-only; the mapping lives as long as the returned pointer (null for an empty
// file). `layer` names the reader in errors: "[<layer>] <path>: cannot open (...)".
inline std::shared_ptr<const void> map_file_readonly(const std::filesystem::path& path,
                                                     std::string_view layer, size_t& size) {
  const std::string label = fmt::format("[{}] {}: ", layer, path.string());
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(label + "cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(label + "not a regular file");
  }
  size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return {};
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    throw InputError(label + "cannot map the file (" + std::strerror(map_errno) + ")");
  }
  return std::shared_ptr<const void>(p, [size](const void* q) {
    ::munmap(const_cast<void*>(q), size);
  });
}

// The bytes a reader validates and its views point into, kept alive by `storage` (a mapping of
// the file, or an owned in-memory image).
struct FileImage {
  std::shared_ptr<const void> storage;
  std::span<const uint8_t> bytes;
};
inline FileImage map_file_image(const std::filesystem::path& path, std::string_view layer) {
  size_t size = 0;
  FileImage f;
  f.storage = map_file_readonly(path, layer, size);
  f.bytes = {static_cast<const uint8_t*>(f.storage.get()), size};
  return f;
}
inline FileImage owned_file_image(std::vector<uint8_t> image) {
  auto owned = std::make_shared<const std::vector<uint8_t>>(std::move(image));
  return {owned, {owned->data(), owned->size()}};
}

// Offset of the first byte that breaks UTF-8 (overlong forms, surrogates and code points
// above U+10FFFF included), or nullopt when the text is valid (io/utf8.h).
inline std::optional<size_t> first_invalid_utf8(std::span<const uint8_t> s) {
  const size_t at = invalid_utf8_offset({reinterpret_cast<const char*>(s.data()), s.size()});
  return at == std::string_view::npos ? std::nullopt : std::optional<size_t>(at);
}

// Text from a file made safe to print on one line: control bytes as \xNN, cut at 80 bytes.
inline std::string printable(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 80)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out += c;
    }
  }
  if (text.size() > 80) out += "...";
  return out;
}

// What parse_json_strict found wrong with a JSON text.
enum class JsonProblem : uint8_t {
  too_deep,       // a container nested deeper than allowed; depth = its 0-based depth
  duplicate_key,  // detail = the key (raw; quote it with printable)
  invalid,        // not JSON, or ill-formed UTF-8 in a string; detail = nlohmann's message
};

// Parses `text`, rejecting, while it parses (so a hostile file cannot build a deep tree),
// containers deeper than max_depth (the top-level value has depth 0) and an object with the
// same key twice. Each problem goes to fail(JsonProblem, int depth, const std::string& detail),
// which must throw (the caller's own error type and wording).
template <class Fail>
nlohmann::json parse_json_strict(std::string_view text, int max_depth, Fail fail) {
  using json = nlohmann::json;
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth > max_depth) fail(JsonProblem::too_deep, depth, std::string());
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!open_objects.empty() && !open_objects.back().insert(key).second)
          fail(JsonProblem::duplicate_key, depth, key);
        break;
      }
      default: break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    fail(JsonProblem::invalid, 0, std::string(e.what()));
  }
  return json();  // not reached: fail throws
}

}  // namespace concord::io
