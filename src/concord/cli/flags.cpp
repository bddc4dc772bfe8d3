// Strict parsing of numeric flags against their domains (flags.h).
#include "concord/cli/flags.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/io/utf8.h"
#include "concord/numerics/check.h"

namespace concord::cli {

std::string IntegerDomain::text() const {
  if (max == std::numeric_limits<int64_t>::max()) return fmt::format("integer >= {}", min);
  // An int32 flag's own limit, written as a reader recognises it.
  const std::string high = max == std::numeric_limits<int32_t>::max() ? "2^31 - 1" : fmt::format("{}", max);
  return fmt::format("integer in [{}, {}]", min, high);
}

bool RealDomain::contains(double v) const {
  if (!std::isfinite(v)) return false;
  if (min_open ? !(v > min) : !(v >= min)) return false;
  if (max_open ? !(v < max) : !(v <= max)) return false;
  return true;
}

std::string RealDomain::text() const {
  const bool has_min = std::isfinite(min), has_max = std::isfinite(max);
  if (has_min && has_max)
    return fmt::format("number in {}{:g}, {:g}{}", min_open ? "(" : "[", min, max, max_open ? ")" : "]");
  if (has_min) return fmt::format("number {} {:g}", min_open ? ">" : ">=", min);
  if (has_max) return fmt::format("number {} {:g}", max_open ? "<" : "<=", max);
  return "finite number";
}

namespace flags_detail {
namespace {

[[noreturn]] void reject(const std::string& flag, const std::string& text, const std::string& article,
                         const std::string& domain, const std::string& why = "") {
  throw CLI::ValidationError(flag, fmt::format("'{}' is not {} {}{}", text, article, domain, why));
}

// [-]digits, decimal (no '+', spaces, hex or octal), into an int64 or a uint64.
template <class T>
bool parse_decimal(const std::string& text, T& value) {
  if (text.empty()) return false;
  const size_t digits = text[0] == '-' ? 1 : 0;
  if (digits == text.size()) return false;
  for (size_t i = digits; i < text.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return false;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() && ptr == text.data() + text.size();
}

}  // namespace

int64_t parse_integer(const std::string& flag, const std::string& text, const IntegerDomain& domain) {
  int64_t v = 0;
  if (!parse_decimal(text, v) || v < domain.min || v > domain.max) reject(flag, text, "an", domain.text());
  return v;
}

uint64_t parse_seed(const std::string& flag, const std::string& text) {
  uint64_t v = 0;
  if (!parse_decimal(text, v)) reject(flag, text, "an", "integer in [0, 2^64 - 1]");
  return v;
}

double parse_real(const std::string& flag, const std::string& text, const RealDomain& domain,
                  bool as_float) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) reject(flag, text, "a", domain.text());
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !domain.contains(v)) reject(flag, text, "a", domain.text());
  if (as_float && !domain.contains(static_cast<double>(static_cast<float>(v))))
    reject(flag, text, "a", domain.text(), " that a 32-bit float can hold");
  return v;
}

std::string with_domain(const std::string& help, const std::string& domain) {
  return fmt::format("{} [{}]", help, domain);
}

}  // namespace flags_detail

void check_text_values(CLI::App& app) {
  const CLI::Validator text(
      [](std::string& value) {
        if (value.empty()) return std::string("an empty value (give one, or leave the option out)");
        if (const size_t bad = io::invalid_utf8_offset(value); bad != std::string::npos)
          return fmt::format("not valid UTF-8 (byte {}); option values are UTF-8 text", bad);
        return std::string();
      },
      "", "TEXT");
  for (CLI::Option* option : app.get_options([](CLI::Option* o) { return o->get_type_size() != 0; }))
    option->check(text);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) check_text_values(*sub);
}

CLI::Option* add_integer_list_flag(CLI::App* cmd, const std::string& name, std::vector<int32_t>& out,
                                   IntegerDomain domain, const std::string& help) {
  const IntegerDomain d = flags_detail::clamp_to<int32_t>(domain);
  return cmd
      ->add_option_function<std::vector<std::string>>(
          name, [&out, name, d](const std::vector<std::string>& texts) {
            out.clear();
            for (const std::string& text : texts)
              out.push_back(static_cast<int32_t>(flags_detail::parse_integer(name, text, d)));
          },
          flags_detail::with_domain(help, "comma-separated, each an " + d.text()))
      ->type_name("INT,...")
      ->delimiter(',');
}

CLI::Option* add_real_list_flag(CLI::App* cmd, const std::string& name, std::vector<double>& out, RealDomain domain,
                                const std::string& help) {
  return cmd
      ->add_option_function<std::vector<std::string>>(
          name, [&out, name, domain](const std::vector<std::string>& texts) {
            out.clear();
            for (const std::string& text : texts) out.push_back(flags_detail::parse_real(name, text, domain, false));
          },
          flags_detail::with_domain(help, "comma-separated, each " + domain.text()))
      ->type_name("FLOAT,...")
      ->delimiter(',');
}

int64_t parse_size(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const double scale = unit.empty() || unit == "B" ? 1.0
                       : unit == "KiB"            ? 1024.0
                       : unit == "MiB"            ? 1048576.0
                       : unit == "GiB"            ? 1073741824.0
                                                  : -1.0;
  if (used == 0 || scale < 0 || !(value > 0) || value * scale > 9e18 || value * scale < 1)
    throw CLI::ValidationError(flag, fmt::format("'{}' is not a size (bytes, or a number with KiB, MiB or GiB)", text));
  return static_cast<int64_t>(value * scale);
}

// The tokens per expert of each MoE application in a `--router-stats` file: application -> counts.
std::map<int64_t, std::vector<double>> read_router_loads(const std::string& path, const char* flag) {
  nlohmann::json stats;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open ({})", path, flag));
  try {
    stats = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: not router statistics JSON ({})", path, e.what()));
  }
  std::map<int64_t, std::vector<double>> loads;
  try {
    for (const auto& layer : stats.at("layers")) {
      std::vector<double> w;
      for (const auto& v : layer.at("tokens_per_expert")) w.push_back(v.get<double>());
      loads[layer.at("application").get<int64_t>()] = std::move(w);
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: expected {{\"layers\": [{{\"application\", \"tokens_per_expert\"}}]}} as "
                                 "--router-stats writes ({})", path, e.what()));
  }
  return loads;
}

MemoryCap parse_memory_cap(const std::string& flag, const std::string& text) {
  MemoryCap cap;
  if (!text.empty() && text.back() == '%') {
    const std::string number = text.substr(0, text.size() - 1);
    size_t used = 0;
    double pct = 0;
    try {
      pct = std::stod(number, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != number.size() || !(pct > 0 && pct <= 100))
      throw CLI::ValidationError(flag, fmt::format("'{}' is not a percentage in (0, 100]", text));
    cap.share = pct / 100.0;
    return cap;
  }
  cap.bytes = parse_size(flag, text);
  return cap;
}

SlowRank parse_slow_rank(const std::string& layer, const std::string& text, int64_t ranks) {
  SlowRank out;
  const size_t colon = text.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    size_t used = 0;
    out.rank = std::stoll(text.substr(0, colon), &used);
    if (used != colon) throw std::invalid_argument("rank");
    const std::string f = text.substr(colon + 1);
    out.factor = std::stod(f, &used);
    if (used != f.size()) throw std::invalid_argument("factor");
  } catch (const std::exception&) {
    throw InputError(fmt::format("[{}] --slow-rank '{}': expected RANK:FACTOR, e.g. 1:2.5", layer, text));
  }
  if (out.rank < 0 || out.rank >= ranks || !(out.factor >= 1.0))
    throw InputError(fmt::format("[{}] --slow-rank {}: the rank must lie in [0, {}) and the factor be >= 1", layer, text,
                                 ranks));
  return out;
}

}  // namespace concord::cli
