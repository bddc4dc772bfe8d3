// Name <-> enum lookups for formats, rounding modes and overflow policies.
#include <string>

#include "concord/numerics/format.h"
#include "concord/numerics/rounding.h"

namespace concord::numerics {

std::optional<Format> format_from_name(std::string_view name) {
  for (const FormatTraits& t : kFormatTable) {
    if (t.name == name) return t.format;
  }
  return std::nullopt;
}

std::string_view rounding_name(Rounding r) {
  switch (r) {
    case Rounding::rne: return "rne";
    case Rounding::rtz: return "rtz";
    case Rounding::stochastic: return "sr";
  }
  return "?";
}

std::string_view overflow_name(Overflow o) {
  return o == Overflow::saturate ? "saturate" : "ieee";
}

std::optional<Rounding> rounding_from_name(std::string_view name) {
  if (name == "rne") return Rounding::rne;
  if (name == "rtz") return Rounding::rtz;
  if (name == "sr" || name == "stochastic") return Rounding::stochastic;
  return std::nullopt;
}

std::optional<Overflow> overflow_from_name(std::string_view name) {
  if (name == "saturate") return Overflow::saturate;
  if (name == "ieee") return Overflow::ieee;
  return std::nullopt;
}

}  // namespace concord::numerics
