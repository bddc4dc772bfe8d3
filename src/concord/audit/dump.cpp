// Logit dumps (dump.h): a strict .npy reader and writer written from the NumPy format's
// definition, the rows.json sidecar, and the safetensors container through io/safetensors.
//
// The NumPy format (numpy.lib.format): the magic "\x93NUMPY", a major and a minor version byte,
// the header length (uint16 little-endian in 1.0, uint32 in 2.0 and 3.0), then the header: a
// Python dict literal {'descr': ..., 'fortran_order': ..., 'shape': (...)} padded with spaces and
// ended by '\n' so that the data starts on an aligned offset (64 bytes since NumPy 1.14, 16
// before; the reader accepts any multiple of 16), then the raw array bytes.
#include "concord/audit/dump.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/io/atomic_file.h"
#include "concord/io/reader_support.h"
#include "concord/io/safetensors.h"
#include "concord/numerics/check.h"
#include "concord/numerics/scalar.h"

namespace concord::audit {

static_assert(std::endian::native == std::endian::little,
              "logit dumps are little-endian and read in place");

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr std::string_view kFormatKey = "concord.format";
constexpr std::string_view kFormatValue = "logit-dump/1";
constexpr std::string_view kTasksKey = "concord.tasks";
constexpr std::string_view kLabelsKey = "concord.labels";
constexpr std::string_view kSidecarSuffix = ".rows.json";
constexpr std::string_view kNpyMagic = "\x93NUMPY";
constexpr size_t kNpyWriteAlign = 64;  // what numpy.save writes
constexpr size_t kNpyReadAlign = 16;   // what every NumPy version has written

// The row fields, in the order of dump.h; the first five are integers, the last two names.
enum class Field { sequence, position, prompt_length, token, next, task, label };
constexpr std::array<std::string_view, 7> kFieldNames = {
    "sequence", "position", "prompt_length", "token", "next", "task", "label"};
constexpr std::string_view field_name(Field f) { return kFieldNames[static_cast<size_t>(f)]; }

// A problem found while parsing; the caller adds "[audit] <path>: ".
struct DumpProblem {
  std::string what;
};

[[noreturn]] void throw_problem(std::string what) { throw DumpProblem{std::move(what)}; }

// ---- row fields ------------------------------------------------------------------------------

// Checks one integer row field against its range; `names` is the size of the task/label list.
void check_row_value(Field field, int64_t row, int64_t value, int64_t vocab, int64_t names) {
  int64_t lo = 0, hi = INT32_MAX;
  std::string hint;
  switch (field) {
    case Field::sequence: hi = INT64_MAX; break;
    case Field::position:
    case Field::prompt_length: break;
    case Field::token:
    case Field::next:
      lo = -1, hi = vocab - 1;
      hint = fmt::format(" (vocabulary {}; -1: none)", vocab);
      break;
    case Field::task:
    case Field::label:
      lo = -1, hi = names - 1;
      hint = fmt::format(" (an index into the {} names of metadata \"concord.{}s\"; -1: none)",
                         names, field_name(field));
      break;
  }
  if (value < lo || value > hi) {
    throw_problem(fmt::format("row {}: {} {} is outside [{}, {}]{}", row, field_name(field), value,
                              lo, hi, hint));
  }
}

void set_row_value(RowInfo& info, Field field, int64_t value) {
  switch (field) {
    case Field::sequence: info.sequence = value; break;
    case Field::position: info.position = static_cast<int32_t>(value); break;
    case Field::prompt_length: info.prompt_length = static_cast<int32_t>(value); break;
    case Field::token: info.token = static_cast<int32_t>(value); break;
    case Field::next: info.next = static_cast<int32_t>(value); break;
    case Field::task:
    case Field::label: break;  // names, set by the caller
  }
}

void check_vocab(int64_t vocab) {
  if (vocab < 1 || vocab > INT32_MAX) {
    throw_problem(fmt::format("vocabulary size {} is outside [1, 2^31 - 1]", vocab));
  }
}

std::vector<RowInfo> default_rows(int64_t rows) {
  std::vector<RowInfo> infos(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) infos[static_cast<size_t>(r)].sequence = r;
  return infos;
}

// ---- JSON with duplicate keys and deep nesting rejected while parsing ------------------------

json parse_strict_json(std::string_view text, int max_depth, std::string_view what) {
  return io::parse_json_strict(text, max_depth, [&](io::JsonProblem problem, int depth,
                                                    const std::string& detail) {
    switch (problem) {
      case io::JsonProblem::too_deep:
        throw_problem(fmt::format("{} nests containers {} deep (at most {})", what, depth + 1,
                                  max_depth + 1));
      case io::JsonProblem::duplicate_key:
        throw_problem(fmt::format("{} has the key '{}' twice", what, io::printable(detail)));
      case io::JsonProblem::invalid:
        // nlohmann rejects ill-formed UTF-8 in strings; its message may quote raw bytes.
        throw_problem(fmt::format("{} is not valid JSON ({})", what, io::printable(detail)));
    }
  });
}

// A JSON integer as int64, or nullopt (floats, "1.0", values beyond int64).
std::optional<int64_t> json_int64(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

std::string json_excerpt(const json& v) {
  return io::printable(v.dump(-1, ' ', false, json::error_handler_t::replace));
}

// ---- the rows.json sidecar of a .npy dump ----------------------------------------------------

std::vector<RowInfo> parse_sidecar(std::string_view text, int64_t rows, int64_t vocab) {
  const json doc = parse_strict_json(text, 1, "the sidecar");
  if (!doc.is_object()) {
    throw_problem(fmt::format("the sidecar is a JSON {}, expected an object of row arrays",
                              doc.type_name()));
  }
  std::vector<RowInfo> infos = default_rows(rows);
  for (const auto& [key, values] : doc.items()) {
    const auto* known = std::find(kFieldNames.begin(), kFieldNames.end(), key);
    if (known == kFieldNames.end()) {
      throw_problem(fmt::format("unknown key '{}' (known: sequence, position, prompt_length, "
                                "token, next, task, label)",
                                io::printable(key)));
    }
    const auto field = static_cast<Field>(known - kFieldNames.begin());
    if (!values.is_array()) {
      throw_problem(fmt::format("\"{}\" is a JSON {}, expected an array of {} entries", key,
                                values.type_name(), rows));
    }
    if (static_cast<int64_t>(values.size()) != rows) {
      throw_problem(fmt::format("\"{}\" holds {} entries but the logits have {} rows", key,
                                values.size(), rows));
    }
    for (int64_t r = 0; r < rows; ++r) {
      const json& v = values[static_cast<size_t>(r)];
      RowInfo& info = infos[static_cast<size_t>(r)];
      if (field == Field::task || field == Field::label) {
        if (!v.is_string()) {
          throw_problem(fmt::format("row {}: {} {} is not a string", r, key, json_excerpt(v)));
        }
        (field == Field::task ? info.task : info.label) = v.get<std::string>();
        continue;
      }
      const auto value = json_int64(v);
      if (!value) {
        throw_problem(fmt::format("row {}: {} {} is not an integer", r, key, json_excerpt(v)));
      }
      check_row_value(field, r, *value, vocab, 0);
      set_row_value(info, field, *value);
    }
  }
  return infos;
}

// ---- the .npy header -------------------------------------------------------------------------

// A value of the header's dict: only what a logit array's header can hold.
struct PyValue {
  enum class Kind { string, boolean, tuple, other } kind = Kind::other;
  std::string text;            // string; for other, the literal as written
  bool flag = false;           // boolean
  std::vector<int64_t> items;  // tuple of non-negative integers
};

// A strict parser for the Python literals NumPy writes in a header: a dict of quoted keys to
// strings, True/False and tuples of non-negative decimal integers.
class NpyHeaderParser {
 public:
  explicit NpyHeaderParser(std::string_view text) : text_(text) {}

  std::map<std::string, PyValue> parse() {
    skip_space();
    expect('{', "the header to start with '{'");
    std::map<std::string, PyValue> dict;
    while (true) {
      skip_space();
      if (consume('}')) break;
      if (peek() != '\'' && peek() != '"') fail("expected a quoted key or '}'");
      std::string key = parse_string();
      skip_space();
      expect(':', "':' after a key");
      skip_space();
      PyValue value = parse_value();
      if (!dict.emplace(key, std::move(value)).second) {
        fail(fmt::format("the key '{}' appears twice", io::printable(key)));
      }
      skip_space();
      if (consume(',')) continue;
      expect('}', "',' or '}' after a value");
      break;
    }
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the dictionary");
    return dict;
  }

 private:
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool consume(char c) {
    if (peek() != c || pos_ >= text_.size()) return false;
    ++pos_;
    return true;
  }
  void expect(char c, std::string_view what) {
    if (!consume(c)) fail(fmt::format("expected {}", what));
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }
  [[noreturn]] void fail(std::string_view what) const {
    throw_problem(fmt::format("malformed .npy header at byte {}: {} (header: {})", pos_, what,
                              io::printable(text_)));
  }

  std::string parse_string() {
    const char quote = text_[pos_++];
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\') fail("escape sequences are not supported in header strings");
      if (text_[pos_] == '\n') fail("a string runs past the end of its line");
      ++pos_;
    }
    if (pos_ >= text_.size()) fail("unterminated string");
    ++pos_;
    return std::string(text_.substr(start, pos_ - 1 - start));
  }

  int64_t parse_integer() {
    const size_t start = pos_;
    if (peek() == '-') fail("a shape dimension is negative");
    int64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const int digit = text_[pos_] - '0';
      if (value > (INT64_MAX - digit) / 10) fail("a shape dimension does not fit in 63 bits");
      value = value * 10 + digit;
      ++pos_;
    }
    if (pos_ == start) fail("expected a non-negative integer");
    if (text_[start] == '0' && pos_ - start > 1) fail("an integer has a leading zero");
    return value;
  }

  PyValue parse_value() {
    PyValue v;
    const char c = peek();
    if (c == '\'' || c == '"') {
      v.kind = PyValue::Kind::string;
      v.text = parse_string();
    } else if (c == '(') {
      ++pos_;
      v.kind = PyValue::Kind::tuple;
      skip_space();
      while (!consume(')')) {
        v.items.push_back(parse_integer());
        skip_space();
        if (consume(',')) {
          skip_space();
          continue;
        }
        expect(')', "',' or ')' in a tuple");
        break;
      }
    } else if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) {
      const size_t start = pos_;
      while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) ||
                                     text_[pos_] == '_')) {
        ++pos_;
      }
      v.text = std::string(text_.substr(start, pos_ - start));
      if (v.text == "True" || v.text == "False") {
        v.kind = PyValue::Kind::boolean;
        v.flag = v.text == "True";
      }
    } else if (c >= '0' && c <= '9') {
      const int64_t n = parse_integer();
      v.text = std::to_string(n);
    } else if (c == '[') {
      fail("a list value (a structured dtype has a list 'descr'); logits are a plain '<f4' or "
           "'<f8' array");
    } else {
      fail("unsupported value (a logit array's header holds strings, True/False and tuples)");
    }
    return v;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

struct NpyLayout {
  io::Dtype dtype = io::Dtype::F32;
  int64_t rows = 0, vocab = 0;
  size_t data_offset = 0;
};

uint64_t read_le(std::span<const uint8_t> bytes) {
  uint64_t v = 0;
  for (size_t i = bytes.size(); i-- > 0;) v = (v << 8) | bytes[i];
  return v;
}

NpyLayout parse_npy(std::span<const uint8_t> image) {
  const size_t size = image.size();
  if (size < 8 || std::memcmp(image.data(), kNpyMagic.data(), kNpyMagic.size()) != 0) {
    throw_problem("not a .npy file (it does not start with the magic \"\\x93NUMPY\")");
  }
  const int major = image[6], minor = image[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    throw_problem(fmt::format("unsupported .npy format version {}.{} (concord reads 1.0, 2.0 "
                              "and 3.0)",
                              major, minor));
  }
  const size_t length_bytes = major == 1 ? 2 : 4;
  if (size < 8 + length_bytes) {
    throw_problem(fmt::format("the file ends inside the header length ({} bytes)", size));
  }
  const uint64_t header_length = read_le(image.subspan(8, length_bytes));
  const uint64_t data_offset = 8 + length_bytes + header_length;
  if (data_offset > size) {
    throw_problem(fmt::format("the header ({} bytes) runs past the end of the file ({} bytes) "
                              "(file truncated?)",
                              header_length, size));
  }
  if (data_offset % kNpyReadAlign != 0) {
    throw_problem(fmt::format("the data starts at byte {}, not a multiple of {} (the NumPy format "
                              "pads the header to align the data)",
                              data_offset, kNpyReadAlign));
  }
  const auto header_bytes = image.subspan(8 + length_bytes, header_length);
  for (size_t i = 0; i < header_bytes.size(); ++i) {
    if (header_bytes[i] >= 0x80) {
      // Latin-1 (1.0, 2.0) or UTF-8 (3.0) only matters inside strings a logit header never has.
      throw_problem(fmt::format("the header holds a non-ASCII byte 0x{:02x} at byte {}",
                                header_bytes[i], i));
    }
  }
  const std::string_view header(reinterpret_cast<const char*>(header_bytes.data()),
                                header_bytes.size());
  if (header.empty() || header.back() != '\n') {
    throw_problem("the header does not end with '\\n' (the NumPy format ends it with a newline)");
  }
  const std::map<std::string, PyValue> dict = NpyHeaderParser(header).parse();
  for (const char* key : {"descr", "fortran_order", "shape"}) {
    if (!dict.contains(key)) {
      throw_problem(fmt::format("the header has no '{}' (header: {})", key, io::printable(header)));
    }
  }
  if (dict.size() != 3) {
    for (const auto& [key, value] : dict) {
      if (key != "descr" && key != "fortran_order" && key != "shape") {
        throw_problem(fmt::format("the header has the unknown key '{}' (a .npy header holds "
                                  "exactly 'descr', 'fortran_order' and 'shape')",
                                  io::printable(key)));
      }
    }
  }
  NpyLayout layout;
  const PyValue& descr = dict.at("descr");
  if (descr.kind == PyValue::Kind::string && descr.text == "<f4") {
    layout.dtype = io::Dtype::F32;
  } else if (descr.kind == PyValue::Kind::string && descr.text == "<f8") {
    layout.dtype = io::Dtype::F64;
  } else {
    throw_problem(fmt::format("dtype {} is not supported for logits (save them as '<f4' or "
                              "'<f8', e.g. numpy.float32)",
                              descr.kind == PyValue::Kind::string
                                  ? fmt::format("'{}'", io::printable(descr.text))
                                  : io::printable(descr.text)));
  }
  const PyValue& order = dict.at("fortran_order");
  if (order.kind != PyValue::Kind::boolean) {
    throw_problem(fmt::format("'fortran_order' is {}, expected True or False",
                              io::printable(order.text)));
  }
  if (order.flag) {
    throw_problem("the logits are in Fortran (column-major) order; save a C-order array "
                  "(numpy.ascontiguousarray)");
  }
  const PyValue& shape = dict.at("shape");
  if (shape.kind != PyValue::Kind::tuple) {
    throw_problem(fmt::format("'shape' is {}, expected a tuple", io::printable(shape.text)));
  }
  if (shape.items.size() != 2) {
    throw_problem(fmt::format("the logits have shape {}; a logit dump is 2-D (positions, vocab)",
                              io::shape_text(shape.items)));
  }
  layout.rows = shape.items[0];
  layout.vocab = shape.items[1];
  check_vocab(layout.vocab);
  const auto bytes = io::tensor_byte_size(layout.dtype, shape.items);
  if (!bytes) {
    throw_problem(fmt::format("shape {} overflows 64 bits", io::shape_text(shape.items)));
  }
  if (*bytes != size - data_offset) {
    throw_problem(fmt::format("the data holds {} bytes but shape {} of '{}' needs {}{}",
                              size - data_offset, io::shape_text(shape.items), descr.text, *bytes,
                              *bytes > size - data_offset ? " (file truncated?)" : ""));
  }
  layout.data_offset = static_cast<size_t>(data_offset);
  return layout;
}

// The .npy header numpy.save writes for a C-order (rows, vocab) float32 array, version 1.0.
std::string npy_header(int64_t rows, int64_t vocab) {
  std::string dict =
      fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}", rows, vocab);
  const size_t unpadded = kNpyMagic.size() + 2 + 2 + dict.size() + 1;
  dict.append((kNpyWriteAlign - unpadded % kNpyWriteAlign) % kNpyWriteAlign, ' ');
  dict += '\n';
  CONCORD_CHECK(dict.size() <= UINT16_MAX, "a 2-D header fits version 1.0");
  std::string out(kNpyMagic);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(dict.size() & 0xFF);
  out += static_cast<char>(dict.size() >> 8);
  return out + dict;
}

// ---- the safetensors container ---------------------------------------------------------------

std::vector<std::string> parse_name_list(const std::map<std::string, std::string>& metadata,
                                         std::string_view key) {
  const auto it = metadata.find(std::string(key));
  if (it == metadata.end()) return {};
  const std::string what = fmt::format("metadata \"{}\"", key);
  const json list = parse_strict_json(it->second, 0, what);
  if (!list.is_array()) {
    throw_problem(fmt::format("{} is a JSON {}, expected an array of strings", what,
                              list.type_name()));
  }
  std::vector<std::string> names;
  for (const json& name : list) {
    if (!name.is_string()) {
      throw_problem(fmt::format("{} holds {}, expected strings", what, json_excerpt(name)));
    }
    names.push_back(name.get<std::string>());
  }
  return names;
}

std::vector<int64_t> integer_values(const io::TensorInfo& t) {
  std::vector<int64_t> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (t.dtype == io::Dtype::I32) {
      int32_t v = 0;
      std::memcpy(&v, t.bytes.data() + 4 * i, 4);
      out[i] = v;
    } else {
      std::memcpy(&out[i], t.bytes.data() + 8 * i, 8);
    }
  }
  return out;
}

}  // namespace

// ---- LogitDump -------------------------------------------------------------------------------

struct LogitDump::Impl {
  std::string path;
  std::shared_ptr<const void> storage;  // the mapping (or image) the logits point into
  std::span<const uint8_t> logits;      // (rows, vocab) of dtype, little-endian
  io::Dtype dtype = io::Dtype::F32;
  int64_t rows = 0, vocab = 0;
  std::vector<RowInfo> infos;

  void load_npy(io::FileImage image, const std::optional<std::string>& sidecar) {
    const NpyLayout layout = parse_npy(image.bytes);
    storage = std::move(image.storage);
    dtype = layout.dtype;
    rows = layout.rows;
    vocab = layout.vocab;
    logits = image.bytes.subspan(layout.data_offset);
    if (!sidecar) {
      infos = default_rows(rows);
      return;
    }
    try {
      infos = parse_sidecar(*sidecar, rows, vocab);
    } catch (const DumpProblem& p) {
      throw InputError(fmt::format("[audit] {}{}: {}", path, kSidecarSuffix, p.what));
    }
  }

  void load_safetensors(io::SafetensorsFile file) {
    const io::TensorInfo* t = file.find("logits");
    if (t == nullptr) throw_problem("no tensor \"logits\" (a logit dump holds logits (P, V))");
    if (t->dtype != io::Dtype::F32 && t->dtype != io::Dtype::F64 &&
        t->dtype != io::Dtype::BF16 && t->dtype != io::Dtype::F16) {
      throw_problem(fmt::format("tensor \"logits\" has dtype {}; logits are F32, F64, BF16 or F16",
                                io::dtype_name(t->dtype)));
    }
    if (t->shape.size() != 2) {
      throw_problem(fmt::format("tensor \"logits\" has shape {}; a logit dump is 2-D "
                                "(positions, vocab)",
                                io::shape_text(t->shape)));
    }
    dtype = t->dtype;
    rows = t->shape[0];
    vocab = t->shape[1];
    check_vocab(vocab);
    logits = t->bytes;
    const auto& metadata = file.metadata();
    if (const auto format = metadata.find(std::string(kFormatKey));
        format != metadata.end() && format->second != kFormatValue) {
      throw_problem(fmt::format("metadata \"{}\" is '{}'; concord reads '{}'", kFormatKey,
                                io::printable(format->second), kFormatValue));
    }
    const std::vector<std::string> tasks = parse_name_list(metadata, kTasksKey);
    const std::vector<std::string> labels = parse_name_list(metadata, kLabelsKey);
    infos = default_rows(rows);
    for (const io::TensorInfo& field_tensor : file.tensors()) {
      if (field_tensor.name == "logits") continue;
      const auto* known = std::find(kFieldNames.begin(), kFieldNames.end(), field_tensor.name);
      if (known == kFieldNames.end()) {
        throw_problem(fmt::format("unknown tensor '{}' (a logit dump holds \"logits\" and the row "
                                  "fields sequence, position, prompt_length, token, next, task, "
                                  "label)",
                                  io::printable(field_tensor.name)));
      }
      const auto field = static_cast<Field>(known - kFieldNames.begin());
      if (field_tensor.dtype != io::Dtype::I32 && field_tensor.dtype != io::Dtype::I64) {
        throw_problem(fmt::format("tensor \"{}\" has dtype {}; row fields are I32 or I64",
                                  field_tensor.name, io::dtype_name(field_tensor.dtype)));
      }
      if (field_tensor.shape.size() != 1 || field_tensor.shape[0] != rows) {
        throw_problem(fmt::format("tensor \"{}\" has shape {}; row fields have shape [{}] (one "
                                  "per row of the logits)",
                                  field_tensor.name, io::shape_text(field_tensor.shape), rows));
      }
      const std::vector<std::string>* names =
          field == Field::task ? &tasks : field == Field::label ? &labels : nullptr;
      const std::vector<int64_t> values = integer_values(field_tensor);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t v = values[static_cast<size_t>(r)];
        check_row_value(field, r, v, vocab,
                        names ? static_cast<int64_t>(names->size()) : 0);
        RowInfo& info = infos[static_cast<size_t>(r)];
        if (names != nullptr) {
          if (v >= 0) (field == Field::task ? info.task : info.label) = (*names)[static_cast<size_t>(v)];
        } else {
          set_row_value(info, field, v);
        }
      }
    }
    storage = std::make_shared<io::SafetensorsFile>(std::move(file));
  }
};

namespace {

enum class Container { npy, safetensors };

Container container_of(const std::string& path, std::string_view doing) {
  const std::string extension = fs::path(path).extension().string();
  if (extension == ".npy") return Container::npy;
  if (extension == ".safetensors") return Container::safetensors;
  throw InputError(fmt::format("[audit] {}: cannot {} a logit dump with extension '{}' (use "
                               ".npy or .safetensors)",
                               path, doing, io::printable(extension)));
}

}  // namespace

LogitDump LogitDump::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  const Container container = container_of(path, "read");
  try {
    if (container == Container::safetensors) {
      impl->load_safetensors(io::SafetensorsFile::open(path));
    } else {
      io::FileImage image = io::map_file_image(path, "audit");
      const std::string sidecar_path = path + std::string(kSidecarSuffix);
      std::optional<std::string> sidecar;
      std::error_code status;  // a sidecar we cannot even stat is reported by the open below
      if (fs::exists(sidecar_path, status) || status) {
        const io::FileImage text = io::map_file_image(sidecar_path, "audit");
        sidecar.emplace(reinterpret_cast<const char*>(text.bytes.data()), text.bytes.size());
      }
      impl->load_npy(std::move(image), sidecar);
    }
  } catch (const DumpProblem& p) {
    throw InputError("[audit] " + path + ": " + p.what);
  }
  return LogitDump(std::move(impl));
}

LogitDump LogitDump::from_bytes(std::vector<uint8_t> image, const std::string& label,
                                std::optional<std::string> sidecar) {
  auto impl = std::make_unique<Impl>();
  impl->path = label;
  const Container container = container_of(label, "read");
  try {
    if (container == Container::safetensors) {
      impl->load_safetensors(io::SafetensorsFile::from_bytes(std::move(image), label));
    } else {
      impl->load_npy(io::owned_file_image(std::move(image)), sidecar);
    }
  } catch (const DumpProblem& p) {
    throw InputError("[audit] " + label + ": " + p.what);
  }
  return LogitDump(std::move(impl));
}

LogitDump::LogitDump(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LogitDump::LogitDump(LogitDump&&) noexcept = default;
LogitDump& LogitDump::operator=(LogitDump&&) noexcept = default;
LogitDump::~LogitDump() = default;

const std::string& LogitDump::path() const { return impl_->path; }
int64_t LogitDump::rows() const { return impl_->rows; }
int64_t LogitDump::vocab() const { return impl_->vocab; }
std::string_view LogitDump::dtype() const { return io::dtype_name(impl_->dtype); }
bool LogitDump::is_f64() const { return impl_->dtype == io::Dtype::F64; }

const RowInfo& LogitDump::info(int64_t row) const {
  CONCORD_CHECK(row >= 0 && row < impl_->rows, "row index inside the dump");
  return impl_->infos[static_cast<size_t>(row)];
}

namespace {

// Row `row` of a dump's logits converted to T: F32/BF16/F16 exactly, F64 → float to nearest.
template <typename T>
void convert_row(const LogitDump::Impl& d, int64_t row, std::span<T> out) {
  CONCORD_CHECK(row >= 0 && row < d.rows, "row index inside the dump");
  CONCORD_CHECK(static_cast<int64_t>(out.size()) == d.vocab, "output spans the vocabulary");
  const size_t n = out.size();
  const size_t item = static_cast<size_t>(io::dtype_traits(d.dtype).bits / 8);
  const uint8_t* p = d.logits.data() + static_cast<size_t>(row) * n * item;
  switch (d.dtype) {
    case io::Dtype::F32:
      for (size_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, p + 4 * i, 4);  // the data may sit at any offset of the mapping
        out[i] = static_cast<T>(v);
      }
      break;
    case io::Dtype::F64:
      for (size_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, p + 8 * i, 8);
        out[i] = static_cast<T>(v);
      }
      break;
    case io::Dtype::BF16:
    case io::Dtype::F16: {
      const auto format =
          d.dtype == io::Dtype::F16 ? numerics::Format::fp16 : numerics::Format::bf16;
      for (size_t i = 0; i < n; ++i) {
        const uint32_t code = p[2 * i] | (static_cast<uint32_t>(p[2 * i + 1]) << 8);
        out[i] = static_cast<T>(numerics::decode_ref(format, code));
      }
      break;
    }
    default: CONCORD_CHECK(false, "logit dtype validated on open");
  }
}

}  // namespace

void LogitDump::row(int64_t row, std::span<double> out) const { convert_row(*impl_, row, out); }
void LogitDump::row(int64_t row, std::span<float> out) const { convert_row(*impl_, row, out); }

// ---- LogitDumpWriter -------------------------------------------------------------------------

LogitDumpWriter::LogitDumpWriter(int64_t vocab) : vocab_(vocab) {
  if (vocab < 1 || vocab > INT32_MAX) {
    throw InputError(fmt::format("[audit] logit dump: vocabulary size {} is outside [1, 2^31 - 1]",
                                 vocab));
  }
}

void LogitDumpWriter::add(const RowInfo& info, std::span<const float> logits) {
  const int64_t row = rows();
  if (static_cast<int64_t>(logits.size()) != vocab_) {
    throw InputError(fmt::format("[audit] logit dump: row {} has {} logits; the dump's vocabulary "
                                 "is {}",
                                 row, logits.size(), vocab_));
  }
  try {
    check_row_value(Field::sequence, row, info.sequence, vocab_, 0);
    check_row_value(Field::position, row, info.position, vocab_, 0);
    check_row_value(Field::prompt_length, row, info.prompt_length, vocab_, 0);
    check_row_value(Field::token, row, info.token, vocab_, 0);
    check_row_value(Field::next, row, info.next, vocab_, 0);
    for (const std::string* name : {&info.task, &info.label}) {
      const auto bad = io::first_invalid_utf8(
          {reinterpret_cast<const uint8_t*>(name->data()), name->size()});
      if (bad) {
        throw_problem(fmt::format("row {}: {} '{}' is not UTF-8 (byte {})", row,
                                  name == &info.task ? "task" : "label", io::printable(*name),
                                  *bad));
      }
    }
  } catch (const DumpProblem& p) {
    throw InputError("[audit] logit dump: " + p.what);
  }
  logits_.insert(logits_.end(), logits.begin(), logits.end());
  infos_.push_back(info);
}

namespace {

// Distinct non-empty names in order of first appearance, and each row's index (-1: none).
std::pair<std::vector<std::string>, std::vector<int32_t>> index_names(
    const std::vector<RowInfo>& infos, std::string RowInfo::*member) {
  std::vector<std::string> names;
  std::map<std::string, int32_t> index;
  std::vector<int32_t> rows;
  for (const RowInfo& info : infos) {
    const std::string& name = info.*member;
    if (name.empty()) {
      rows.push_back(-1);
      continue;
    }
    const auto [it, added] = index.emplace(name, static_cast<int32_t>(names.size()));
    if (added) names.push_back(name);
    rows.push_back(it->second);
  }
  return {names, rows};
}

template <typename T>
std::span<const uint8_t> bytes_of(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

}  // namespace

void LogitDumpWriter::write(const std::string& path) const {
  const Container container = container_of(path, "write");
  const int64_t n = rows();
  if (container == Container::npy) {
    json sidecar = json::object();
    auto column = [&](auto member) {
      json values = json::array();
      for (const RowInfo& info : infos_) values.push_back(info.*member);
      return values;
    };
    sidecar["sequence"] = column(&RowInfo::sequence);
    sidecar["position"] = column(&RowInfo::position);
    sidecar["prompt_length"] = column(&RowInfo::prompt_length);
    sidecar["token"] = column(&RowInfo::token);
    sidecar["next"] = column(&RowInfo::next);
    sidecar["task"] = column(&RowInfo::task);
    sidecar["label"] = column(&RowInfo::label);
    io::write_file_atomic(path + std::string(kSidecarSuffix), sidecar.dump() + "\n");
    const std::string header = npy_header(n, vocab_);
    io::AtomicWriter out(path);
    out.write(header.data(), header.size());
    const auto data = bytes_of(logits_);
    out.write(data.data(), data.size());
    out.commit();
    return;
  }
  auto column32 = [&](int32_t RowInfo::*member) {
    std::vector<int32_t> values;
    for (const RowInfo& info : infos_) values.push_back(info.*member);
    return values;
  };
  std::vector<int64_t> sequence;
  for (const RowInfo& info : infos_) sequence.push_back(info.sequence);
  const std::vector<int32_t> position = column32(&RowInfo::position);
  const std::vector<int32_t> prompt_length = column32(&RowInfo::prompt_length);
  const std::vector<int32_t> token = column32(&RowInfo::token);
  const std::vector<int32_t> next = column32(&RowInfo::next);
  const auto [tasks, task] = index_names(infos_, &RowInfo::task);
  const auto [labels, label] = index_names(infos_, &RowInfo::label);
  std::vector<io::TensorToWrite> tensors = {
      {"logits", io::Dtype::F32, {n, vocab_}, bytes_of(logits_)},
      {"sequence", io::Dtype::I64, {n}, bytes_of(sequence)},
      {"position", io::Dtype::I32, {n}, bytes_of(position)},
      {"prompt_length", io::Dtype::I32, {n}, bytes_of(prompt_length)},
      {"token", io::Dtype::I32, {n}, bytes_of(token)},
      {"next", io::Dtype::I32, {n}, bytes_of(next)},
      {"task", io::Dtype::I32, {n}, bytes_of(task)},
      {"label", io::Dtype::I32, {n}, bytes_of(label)},
  };
  const std::map<std::string, std::string> metadata = {
      {std::string(kFormatKey), std::string(kFormatValue)},
      {std::string(kTasksKey), json(tasks).dump()},
      {std::string(kLabelsKey), json(labels).dump()},
  };
  io::write_safetensors(path, std::move(tensors), metadata);
}

}  // namespace concord::audit
