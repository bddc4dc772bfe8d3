// JSON files people write, and typed access naming the key (json_file.h).
#include "concord/io/json_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "concord/io/reader_support.h"
#include "concord/numerics/check.h"

namespace concord::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kMaxDepth = 64;

// nlohmann's message on one line, without its "[json.exception.parse_error.101] " prefix (it
// keeps "at line L, column C" and the text last read).
std::string parse_message(std::string message) {
  if (message.starts_with("[json.exception.")) {
    const size_t end = message.find("] ");
    if (end != std::string::npos) message.erase(0, end + 2);
  }
  std::string out;
  for (const char c : message.substr(0, 240)) {
    const auto u = static_cast<unsigned char>(c);
    out += u < 0x20 || u == 0x7F ? fmt::format("\\x{:02x}", u) : std::string(1, c);
  }
  return message.size() > 240 ? out + "..." : out;
}

}  // namespace

json read_json_file(const fs::path& path, std::string_view layer, std::string_view what) {
  const std::string label = fmt::format("[{}] {}: ", layer, path.string());
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) throw InputError(label + fmt::format("cannot open {}: no such file", what));
  if (fs::is_directory(status))
    throw InputError(label + fmt::format("cannot open {}: it is a directory (give the JSON file itself)", what));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(label + fmt::format("cannot open {} ({})", what, std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InputError(label + fmt::format("cannot read {}", what));
  return parse_json_strict(text.str(), kMaxDepth, [&](JsonProblem problem, int depth, const std::string& detail) {
    switch (problem) {
      case JsonProblem::too_deep:
        throw InputError(label + fmt::format("{} nests deeper than {} levels (at depth {})", what, kMaxDepth, depth));
      case JsonProblem::duplicate_key:
        throw InputError(label + fmt::format("key '{}' appears twice in one object (keep one)", printable(detail)));
      case JsonProblem::invalid:
        break;
    }
    throw InputError(label + fmt::format("not valid JSON ({})", parse_message(detail)));
  });
}

std::string_view json_type_phrase(const json& v) {
  switch (v.type()) {
    case json::value_t::string: return "a string";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "a list";
    case json::value_t::boolean: return "true/false";
    case json::value_t::null: return "null";
    default: return "not a JSON value";
  }
}

JsonValue::JsonValue(const nlohmann::json& value, std::string layer, std::string source, std::string key)
    : value_(&value), layer_(std::move(layer)), source_(std::move(source)), key_(std::move(key)) {}

JsonValue JsonValue::operator[](std::string_view name) const {
  object();
  const auto it = value_->find(name);
  const std::string key = key_.empty() ? std::string(name) : fmt::format("{}.{}", key_, name);
  if (it == value_->end()) throw InputError(fmt::format("[{}] {}: missing key '{}'", layer_, source_, key));
  return JsonValue(*it, layer_, source_, key);
}

bool JsonValue::contains(std::string_view name) const { return value_->is_object() && value_->contains(name); }

JsonValue JsonValue::element(size_t i) const {
  list();
  if (i >= value_->size()) fail(fmt::format("has no element {}", i));
  return JsonValue((*value_)[i], layer_, source_, fmt::format("{}[{}]", key_, i));
}

size_t JsonValue::size() const { return value_->size(); }

void JsonValue::fail(std::string_view what) const {
  if (key_.empty()) throw InputError(fmt::format("[{}] {}: {}", layer_, source_, what));
  throw InputError(fmt::format("[{}] {}: '{}' {}", layer_, source_, key_, what));
}

void JsonValue::fail_unknown(std::string_view known) const {
  throw InputError(fmt::format("[{}] {}: unknown key '{}' ({})", layer_, source_, key_, known));
}

std::string JsonValue::string() const {
  if (!value_->is_string()) fail(fmt::format("must be a string, got {}", json_type_phrase(*value_)));
  return value_->get<std::string>();
}

std::string JsonValue::nonempty_string() const {
  std::string s = string();
  if (s.empty()) fail("must not be empty");
  return s;
}

bool JsonValue::boolean() const {
  if (!value_->is_boolean()) fail(fmt::format("must be true or false, got {}", json_type_phrase(*value_)));
  return value_->get<bool>();
}

double JsonValue::number() const {
  if (!value_->is_number()) fail(fmt::format("must be a number, got {}", json_type_phrase(*value_)));
  const double x = value_->get<double>();
  if (!std::isfinite(x)) fail(fmt::format("must be finite, got {}", x));
  return x;
}

double JsonValue::number_at_least(double min) const {
  const double x = number();
  if (!(x >= min)) fail(fmt::format("must be >= {}, got {}", min, x));
  return x;
}

double JsonValue::positive_number() const {
  const double x = number();
  if (!(x > 0)) fail(fmt::format("must be > 0, got {}", x));
  return x;
}

double JsonValue::number_in(double lo, double hi) const {
  const double x = number();
  if (!(x >= lo && x <= hi)) fail(fmt::format("must lie in [{}, {}], got {}", lo, hi, x));
  return x;
}

int64_t JsonValue::integer(int64_t min) const {
  if (value_->is_number_unsigned() && value_->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail("is too large");
  if (!value_->is_number_integer())
    fail(fmt::format("must be an integer >= {}, got {}", min,
                     value_->is_number() ? value_->dump() : std::string(json_type_phrase(*value_))));
  const int64_t v = value_->get<int64_t>();
  if (v < min) fail(fmt::format("must be an integer >= {}, got {}", min, v));
  return v;
}

int64_t JsonValue::any_integer() const {
  if (value_->is_number_unsigned() && value_->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail("is too large");
  if (!value_->is_number_integer())
    fail(fmt::format("must be an integer, got {}",
                     value_->is_number() ? value_->dump() : std::string(json_type_phrase(*value_))));
  return value_->get<int64_t>();
}

const JsonValue& JsonValue::object() const {
  if (!value_->is_object()) fail(fmt::format("must be an object, got {}", json_type_phrase(*value_)));
  return *this;
}

const JsonValue& JsonValue::list() const {
  if (!value_->is_array()) fail(fmt::format("must be a list, got {}", json_type_phrase(*value_)));
  return *this;
}

}  // namespace concord::io
