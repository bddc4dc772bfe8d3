// Name lookups of names.h.
#include "names.h"

#include "concord/numerics/check.h"

namespace concord::python {
namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

[[noreturn]] void unknown(const char* op, const char* what, const std::string& name,
                          const std::string& accepted) {
  throw InputError(std::string("[") + op + "] unknown " + what + " '" + name + "' (use one of: " +
                   accepted + ")");
}

}  // namespace

std::vector<std::string> format_names() {
  std::vector<std::string> names;
  for (const auto& t : numerics::kFormatTable) names.emplace_back(t.name);
  return names;
}

std::vector<std::string> block_format_list() {
  return {"mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e2m3", "mxfp6-e3m2", "mxfp4",
          "nvfp4",      "nvfp4-2d",   "fp8-tensor"};
}

numerics::Format format_named(const std::string& name, const char* op) {
  if (auto f = numerics::format_from_name(name)) return *f;
  unknown(op, "format", name, joined(format_names()));
}

numerics::Rounding rounding_named(const std::string& name, const char* op) {
  if (auto r = numerics::rounding_from_name(name)) return *r;
  unknown(op, "rounding", name, "rne, rtz, sr");
}

numerics::Overflow overflow_named(const std::string& name, const char* op) {
  if (auto o = numerics::overflow_from_name(name)) return *o;
  unknown(op, "overflow", name, "saturate, ieee");
}

numerics::ScaleRule scale_rule_named(const std::string& name, const char* op) {
  if (auto r = numerics::scale_rule_from_name(name)) return *r;
  unknown(op, "scale rule", name, "floor, ceil, even, rceil");
}

numerics::QuantDesc desc_named(const std::string& text, const char* op) {
  if (auto d = numerics::QuantDesc::from_name(text)) return *d;
  if (auto d = numerics::QuantDesc::parse(text)) return *d;
  unknown(op, "quantization descriptor", text,
          joined(block_format_list()) + ", an element format name, or the canonical text "
          "element=...;block=RxC;scale=...;rule=...;axis=...;rounding=...;overflow=...");
}

}  // namespace concord::python
