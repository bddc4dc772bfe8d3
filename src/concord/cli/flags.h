// Numeric flags with a domain. Each is parsed strictly (integers: decimal digits with an optional
// '-'; reals: a finite number; no trailing text) and checked against its domain when parsed: a
// value outside it is a CLI::ValidationError naming the flag and the domain, which main.cpp
// prints as one line, exit 2. The domain is written into the flag's help. A flag that was not
// given leaves its std::optional empty: no value of the domain doubles as "not given".
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>

namespace concord::cli {

// Step counts stay below 10^8: checkpoint folders are named with 8 digits (train/checkpoint.h),
// and the train and RL configs reject more.
inline constexpr int64_t kMaxSteps = 99'999'999;

// The integers in [min, max].
struct IntegerDomain {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
  std::string text() const;  // "integer >= 1", "integer in [1, 4096]"
};
inline IntegerDomain at_least(int64_t min) { return {min, std::numeric_limits<int64_t>::max()}; }
inline IntegerDomain between(int64_t min, int64_t max) { return {min, max}; }

// The finite reals between min and max, each end open or closed; an infinite end is no bound.
struct RealDomain {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false, max_open = false;
  bool contains(double v) const;
  std::string text() const;  // "number > 0", "number in (0, 1]"
};
inline RealDomain positive() { return {0, std::numeric_limits<double>::infinity(), true, false}; }
inline RealDomain non_negative() { return {0, std::numeric_limits<double>::infinity(), false, false}; }
inline RealDomain real_at_least(double min) { return {min, std::numeric_limits<double>::infinity(), false, false}; }
inline RealDomain real_in(double min, double max, bool min_open, bool max_open) {
  return {min, max, min_open, max_open};
}

namespace flags_detail {
// Each throws CLI::ValidationError(flag, "'TEXT' is not <domain>") for text outside the domain.
int64_t parse_integer(const std::string& flag, const std::string& text, const IntegerDomain& domain);
uint64_t parse_seed(const std::string& flag, const std::string& text);
double parse_real(const std::string& flag, const std::string& text, const RealDomain& domain,
                  bool as_float);
std::string with_domain(const std::string& help, const std::string& domain);

template <class T>
IntegerDomain clamp_to(IntegerDomain d) {
  static_assert(std::is_signed_v<T> || sizeof(T) < sizeof(int64_t), "use add_seed_flag for uint64_t");
  d.min = std::max<int64_t>(d.min, static_cast<int64_t>(std::numeric_limits<T>::min()));
  d.max = std::min<int64_t>(d.max, static_cast<int64_t>(std::numeric_limits<T>::max()));
  return d;
}
template <class T> struct Target { using type = T; };
template <class T> struct Target<std::optional<T>> { using type = T; };
}  // namespace flags_detail

// An integer flag into `out` (an integer type, or std::optional of one: empty when not given).
template <class Out>
CLI::Option* add_integer_flag(CLI::App* cmd, const std::string& name, Out& out, IntegerDomain domain,
                              const std::string& help) {
  using T = typename flags_detail::Target<Out>::type;
  const IntegerDomain d = flags_detail::clamp_to<T>(domain);
  return cmd
      ->add_option_function<std::string>(
          name, [&out, name, d](const std::string& text) {
            out = static_cast<T>(flags_detail::parse_integer(name, text, d));
          },
          flags_detail::with_domain(help, d.text()))
      ->type_name("INT");
}

// A seed: any integer in [0, 2^64 - 1], into a uint64_t or std::optional<uint64_t>.
template <class Out>
CLI::Option* add_seed_flag(CLI::App* cmd, const std::string& name, Out& out, const std::string& help) {
  return cmd
      ->add_option_function<std::string>(
          name, [&out, name](const std::string& text) { out = flags_detail::parse_seed(name, text); },
          flags_detail::with_domain(help, "integer in [0, 2^64 - 1]"))
      ->type_name("UINT");
}

// A real flag into a float or double (or std::optional of one); a float flag also rejects
// values that a 32-bit float cannot hold inside the domain (1e39, or 1e-50 for "> 0").
template <class Out>
CLI::Option* add_real_flag(CLI::App* cmd, const std::string& name, Out& out, RealDomain domain,
                           const std::string& help) {
  using T = typename flags_detail::Target<Out>::type;
  static_assert(std::is_floating_point_v<T>);
  return cmd
      ->add_option_function<std::string>(
          name, [&out, name, domain](const std::string& text) {
            out = static_cast<T>(flags_detail::parse_real(name, text, domain, std::is_same_v<T, float>));
          },
          flags_detail::with_domain(help, domain.text()))
      ->type_name("FLOAT");
}

// Every option that takes a value, in `app` and its subcommands, refuses an empty one (the
// commands read an empty string as "not given": `--out ""` would write to the default folder)
// and one that is not UTF-8 (values end up in JSON files and reports; a prompt must be text).
// Call after every option is added.
void check_text_values(CLI::App& app);

// A size in bytes: "600000000", "512MiB", "1.5GiB", "64KiB" (> 0), checked when parsed.
int64_t parse_size(const std::string& flag, const std::string& text);
inline CLI::Option* add_size_flag(CLI::App* cmd, const std::string& name, std::optional<int64_t>& out,
                                  const std::string& help) {
  return cmd
      ->add_option_function<std::string>(
          name, [&out, name](const std::string& text) { out = parse_size(name, text); },
          help + " [bytes, or a number with KiB, MiB or GiB]")
      ->type_name("SIZE");
}

// The tokens per expert of each MoE application in a `concord generate --router-stats` file:
// application -> counts. InputError naming the file (and `flag`) when it cannot be read or parsed.
std::map<int64_t, std::vector<double>> read_router_loads(const std::string& path, const char* flag);

// A memory cap: a size (parse_size) or a percentage of a whole ("25%": share 0.25, in (0, 100]%).
struct MemoryCap {
  int64_t bytes = 0;  // > 0: a size
  double share = 0;   // else: a share of the whole
};
MemoryCap parse_memory_cap(const std::string& flag, const std::string& text);
inline CLI::Option* add_memory_cap_flag(CLI::App* cmd, const std::string& name, std::optional<MemoryCap>& out,
                                        const std::string& help) {
  return cmd
      ->add_option_function<std::string>(
          name, [&out, name](const std::string& text) { out = parse_memory_cap(name, text); },
          help + " [bytes, a number with KiB, MiB or GiB, or a percentage such as 25%]")
      ->type_name("SIZE|PCT%");
}

// A comma-separated list of integers, each in `domain` (replaces the default when given).
CLI::Option* add_integer_list_flag(CLI::App* cmd, const std::string& name, std::vector<int32_t>& out,
                                   IntegerDomain domain, const std::string& help);

// --slow-rank RANK:FACTOR (expert parallelism: that rank computes FACTOR times slower): RANK in
// [0, ranks), FACTOR >= 1. InputError "[layer] --slow-rank ..." otherwise.
struct SlowRank {
  int64_t rank = -1;
  double factor = 1.0;
};
SlowRank parse_slow_rank(const std::string& layer, const std::string& text, int64_t ranks);

// A comma-separated list of reals (doubles), each in `domain`.
CLI::Option* add_real_list_flag(CLI::App* cmd, const std::string& name, std::vector<double>& out, RealDomain domain,
                                const std::string& help);

}  // namespace concord::cli
