// The bars of an inline SVG plot (audit/svg.h) for tests: width and height of every <rect> drawn
// in the first series colour (the background and legend rects have other fills). A plain scan,
// not <regex>: g++ 12's std::regex trips -Wmaybe-uninitialized in the sanitizer build.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace concord::test {

inline double svg_attribute(std::string_view element, std::string_view name) {
  const std::string key = " " + std::string(name) + "=\"";
  const size_t at = element.find(key);
  if (at == std::string_view::npos) return -1;
  return std::stod(std::string(element.substr(at + key.size())));
}

inline std::vector<std::pair<double, double>> svg_bars(std::string_view svg) {
  std::vector<std::pair<double, double>> bars;
  for (size_t at = svg.find("<rect "); at != std::string_view::npos; at = svg.find("<rect ", at + 1)) {
    const std::string_view element = svg.substr(at, svg.find('>', at) - at);
    if (element.find("fill=\"#4e79a7\"") == std::string_view::npos) continue;
    bars.emplace_back(svg_attribute(element, "width"), svg_attribute(element, "height"));
  }
  return bars;
}

}  // namespace concord::test
