// QuantDesc presets, names and the canonical text form stored in file metadata.
#include "concord/numerics/quant_desc.h"

#include <charconv>
#include <map>
#include <string>

namespace concord::numerics {

std::string_view scale_rule_name(ScaleRule r) {
  switch (r) {
    case ScaleRule::floor: return "floor";
    case ScaleRule::ceil: return "ceil";
    case ScaleRule::even: return "even";
    case ScaleRule::rceil: return "rceil";
  }
  return "?";
}

std::optional<ScaleRule> scale_rule_from_name(std::string_view name) {
  for (ScaleRule r : {ScaleRule::floor, ScaleRule::ceil, ScaleRule::even, ScaleRule::rceil}) {
    if (scale_rule_name(r) == name) return r;
  }
  return std::nullopt;
}

std::string_view block_format_names() {
  return "mxfp8-e4m3, mxfp8-e5m2, mxfp6-e2m3, mxfp6-e3m2, mxfp4, nvfp4, nvfp4-2d, fp8-tensor";
}

QuantDesc QuantDesc::elementwise(Format f, Rounding r, Overflow o) {
  QuantDesc d;
  d.element = f;
  d.block = {0, 0};
  d.scale = Format::f32;
  d.rounding = r;
  d.overflow = o;
  d.has_scale = false;
  return d;
}

QuantDesc QuantDesc::per_tensor(Format f) {
  QuantDesc d;
  d.element = f;
  d.block = {0, 0};
  d.scale = Format::f32;
  return d;
}

QuantDesc QuantDesc::mx(Format element, ScaleRule rule) {
  QuantDesc d;
  d.element = element;
  d.block = {1, 32};
  d.scale = Format::e8m0;
  d.scale_rule = rule;
  return d;
}

QuantDesc QuantDesc::nvfp4(BlockShape block) {
  QuantDesc d;
  d.element = Format::e2m1;
  d.block = block;
  d.scale = Format::ue4m3;
  return d;
}

std::optional<QuantDesc> QuantDesc::from_name(std::string_view name) {
  if (name == "mxfp8-e4m3" || name == "mxfp8") return mx(Format::e4m3);
  if (name == "mxfp8-e5m2") return mx(Format::e5m2);
  if (name == "mxfp6-e2m3" || name == "mxfp6") return mx(Format::e2m3);
  if (name == "mxfp6-e3m2") return mx(Format::e3m2);
  if (name == "mxfp4") return mx(Format::e2m1);
  if (name == "nvfp4") return nvfp4({1, 16});
  if (name == "nvfp4-2d") return nvfp4({16, 16});
  if (name == "fp8-tensor") return per_tensor(Format::e4m3);
  if (auto f = format_from_name(name)) return elementwise(*f);
  return std::nullopt;
}

std::string QuantDesc::to_string() const {
  std::string s = "element=" + std::string(traits(element).name);
  if (has_scale) {
    s += ";block=" + std::to_string(block.rows) + "x" + std::to_string(block.cols);
    s += ";scale=" + std::string(traits(scale).name);
    if (is_mx()) s += ";rule=" + std::string(scale_rule_name(scale_rule));
    s += ";axis=" + std::to_string(axis);
  }
  s += ";rounding=" + std::string(rounding_name(rounding));
  s += ";overflow=" + std::string(overflow_name(overflow));
  return s;
}

std::optional<QuantDesc> QuantDesc::parse(std::string_view text) {
  std::map<std::string, std::string, std::less<>> kv;
  while (!text.empty()) {
    const size_t end = text.find(';');
    const std::string_view item = text.substr(0, end);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    kv.emplace(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
  }
  auto parse_int = [](std::string_view v, int& out) {
    const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
    return ec == std::errc() && p == v.data() + v.size();
  };
  QuantDesc d;
  const auto element = kv.find("element");
  if (element == kv.end()) return std::nullopt;
  auto f = format_from_name(element->second);
  if (!f) return std::nullopt;
  d.element = *f;
  d.has_scale = kv.contains("scale");
  if (d.has_scale) {
    auto sf = format_from_name(kv["scale"]);
    if (!sf) return std::nullopt;
    d.scale = *sf;
    const std::string& block = kv["block"];
    const size_t x = block.find('x');
    if (x == std::string::npos || !parse_int(std::string_view(block).substr(0, x), d.block.rows) ||
        !parse_int(std::string_view(block).substr(x + 1), d.block.cols)) {
      return std::nullopt;
    }
    if (kv.contains("rule")) {
      auto rule = scale_rule_from_name(kv["rule"]);
      if (!rule) return std::nullopt;
      d.scale_rule = *rule;
    }
    if (kv.contains("axis") && !parse_int(kv["axis"], d.axis)) return std::nullopt;
  } else {
    d.block = {0, 0};
    d.scale = Format::f32;
  }
  if (kv.contains("rounding")) {
    auto r = rounding_from_name(kv["rounding"]);
    if (!r) return std::nullopt;
    d.rounding = *r;
  }
  if (kv.contains("overflow")) {
    auto o = overflow_from_name(kv["overflow"]);
    if (!o) return std::nullopt;
    d.overflow = *o;
  }
  return d;
}

}  // namespace concord::numerics
