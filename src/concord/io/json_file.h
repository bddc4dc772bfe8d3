// JSON files that people write (training and RL configs, precision policies, contracts): one
// reader that names the file for every problem (missing, a directory, unreadable, invalid JSON
// with its line and column, a key twice), and typed access that names the dotted key path of a
// value of the wrong type or outside its domain:
//   [train] cfg.json: 'data.corpus' must be a string, got a number
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace concord::io {

// Reads and parses `path` (duplicate keys rejected, nesting at most 64 deep). InputError
// "[layer] path: ..." when the file is missing, a directory, unreadable or not valid JSON.
// `what` names the file's role in the messages ("the training config").
nlohmann::json read_json_file(const std::filesystem::path& path, std::string_view layer,
                              std::string_view what);

// "a string", "an integer", "a number", "an object", "a list", "true/false", "null".
std::string_view json_type_phrase(const nlohmann::json& v);

// One value of a parsed JSON document and where it sits, for readers that check every value:
// `layer` and `source` start every message ("[train] cfg.json: "), `key` is the dotted path of
// the value ("data.corpus"; empty for the document itself). The value must outlive this.
class JsonValue {
 public:
  JsonValue(const nlohmann::json& value, std::string layer, std::string source, std::string key = {});

  const nlohmann::json& json() const { return *value_; }
  const std::string& key() const { return key_; }
  const std::string& layer() const { return layer_; }
  const std::string& source() const { return source_; }

  // The member `name` of this object (key "<key>.<name>"); contains() first when it may be absent.
  JsonValue operator[](std::string_view name) const;
  bool contains(std::string_view name) const;
  // Element i of this list (key "<key>[i]").
  JsonValue element(size_t i) const;
  size_t size() const;

  // The value as a type; InputError "'key' must be <type>, got <type of the value>".
  std::string string() const;
  std::string nonempty_string() const;
  bool boolean() const;
  double number() const;                       // finite
  double number_at_least(double min) const;    // finite, >= min
  double positive_number() const;              // finite, > 0
  double number_in(double lo, double hi) const;  // finite, in [lo, hi]
  int64_t integer(int64_t min = 0) const;      // an integer >= min
  int64_t any_integer() const;                 // any integer (the caller checks its range)
  const JsonValue& object() const;             // must be an object
  const JsonValue& list() const;               // must be a list

  // fn(name, JsonValue) for every member of this object (InputError unless an object).
  template <class Fn>
  void each_member(Fn fn) const {
    object();
    for (const auto& [name, value] : value_->items()) fn(name, (*this)[name]);
  }

  // InputError "[layer] source: 'key' <what>" (the document itself: "[layer] source: <what>").
  [[noreturn]] void fail(std::string_view what) const;
  // InputError "[layer] source: unknown key 'key' (<known>)".
  [[noreturn]] void fail_unknown(std::string_view known) const;

 private:
  const nlohmann::json* value_;
  std::string layer_, source_, key_;
};

}  // namespace concord::io
