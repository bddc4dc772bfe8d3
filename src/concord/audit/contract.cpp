// Slices of compared rows, per-slice statistics, and contracts: fit, JSON, check (contract.h).
#include "concord/audit/contract.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "concord/io/atomic_file.h"
#include "concord/io/json_file.h"
#include "concord/numerics/check.h"

namespace concord::audit {
namespace {

using nlohmann::json;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Slack of the per-row guarantee checks in measure(). row_divergence computes osc, |Δ log p|,
// TV and KL in double with relative errors far below 1e-9 (bounds.h); the absolute 1e-12 covers
// statistics that are zero up to rounding (TV and KL of nearly equal rows, where a bound of
// osc ≈ 0 leaves no relative room). A row counts as a violation only beyond this slack:
//   |Δ log p| ≤ osc·(1+1e-9) + 1e-12      (max over the vocabulary, and at the row's token)
//   TV ≤ tanh(osc/4) + 1e-12,  |p_A(y) − p_B(y)| ≤ tanh(osc/4) + 1e-12
//   KL, reverse KL ≤ kl_bound(osc)·(1+1e-9) + 1e-12
//   a greedy flip is always flagged by the predictor (flip ⇒ flip_possible)
constexpr double kRelativeSlack = 1e-9;
constexpr double kAbsoluteSlack = 1e-12;

constexpr std::string_view kContractFormat = "concord-contract/1";
constexpr std::string_view kMeasurementFormat = "concord-measurement/1";

void validate_edges(const std::vector<int32_t>& edges, const char* name) {
  for (size_t i = 0; i < edges.size(); ++i) {
    if (edges[i] <= 0 || (i > 0 && edges[i] <= edges[i - 1])) {
      throw InputError(fmt::format(
          "[audit] slice options: {} must be strictly increasing positive integers (got {})", name,
          fmt::join(edges, ", ")));
    }
  }
}

void validate_options(const SliceOptions& options) {
  validate_edges(options.prompt_length_edges, "prompt_length_edges");
  validate_edges(options.position_edges, "position_edges");
  if (!std::isfinite(options.decided_margin) || options.decided_margin < 0) {
    throw InputError(
        fmt::format("[audit] slice options: decided_margin must be a finite number >= 0 (got {})",
                    options.decided_margin));
  }
  const auto& bins = options.margin_bins;
  for (size_t i = 0; i < bins.size(); ++i) {
    if (!std::isfinite(bins[i]) || bins[i] <= 0 || (i > 0 && bins[i] <= bins[i - 1])) {
      throw InputError(fmt::format(
          "[audit] slice options: margin_bins must be strictly increasing finite positive "
          "numbers (got {})",
          fmt::join(bins, ", ")));
    }
  }
}

// Bin i of edges e covers [e[i-1], e[i]); bin 0 starts at 0 and the last one is open.
size_t bin_of(int32_t value, const std::vector<int32_t>& edges) {
  return static_cast<size_t>(std::upper_bound(edges.begin(), edges.end(), value) - edges.begin());
}

size_t margin_bin_of(double margin, const std::vector<double>& bins) {
  return static_cast<size_t>(std::upper_bound(bins.begin(), bins.end(), margin) - bins.begin());
}

std::string range_slice(std::string_view dimension, const std::vector<int32_t>& edges, size_t bin) {
  const int32_t lo = bin == 0 ? 0 : edges[bin - 1];
  if (bin == edges.size()) return fmt::format("{}:[{},inf)", dimension, lo);
  return fmt::format("{}:[{},{})", dimension, lo, edges[bin]);
}

bool is_decided(const RowDivergence& div, const SliceOptions& options) {
  return div.margin_ref > options.decided_margin;  // +inf (V = 1) is decided
}

void validate_row(const RowInfo& info, const RowDivergence& div) {
  auto fail = [&](const std::string& what) {
    throw InputError(fmt::format("[audit] row of sequence {} at position {}: {}", info.sequence,
                                 info.position, what));
  };
  if (info.position < 0) fail("negative position");
  if (info.prompt_length < 0) fail(fmt::format("negative prompt length {}", info.prompt_length));
  if (!std::isfinite(div.osc) || div.osc < 0)
    fail(fmt::format("osc {} is not a finite number >= 0", div.osc));
  if (std::isnan(div.margin_ref) || div.margin_ref < 0) {
    fail(fmt::format("reference margin {} is not a number >= 0", div.margin_ref));
  }
}

bool within_relative(double value, double bound) {
  return value <= bound * (1 + kRelativeSlack) + kAbsoluteSlack;  // NaN fails
}

// True when a guarantee of bounds.h fails for this row (slack: see kRelativeSlack).
bool row_violates_bounds(const RowDivergence& div) {
  const double eps = div.osc;
  const double tv_max = tv_bound(eps) + kAbsoluteSlack;
  bool ok = within_relative(div.max_abs_dlogp, logp_bound(eps)) && div.tv <= tv_max &&
            within_relative(div.kl, kl_bound(eps)) &&
            within_relative(div.kl_reverse, kl_bound(eps)) && (!div.flip || div.flip_possible);
  if (div.token >= 0) {
    ok = ok && within_relative(std::abs(div.dlogp_token), logp_bound(eps)) &&
         std::abs(div.dp_token) <= tv_max;
  }
  return !ok;
}

// Everything one slice accumulates, in row order.
struct SliceAccumulator {
  std::vector<double> osc;
  double linf_max = 0, dlogp_max = 0, tv_sum = 0, tv_max = 0, kl_sum = 0, kl_max = 0;
  int64_t flips = 0, predicted = 0, missed = 0, violations = 0;
  std::vector<MarginBin> bins;

  void add(const RowDivergence& div, size_t margin_bin, bool violates) {
    osc.push_back(div.osc);
    linf_max = std::max(linf_max, div.linf);
    dlogp_max = std::max(dlogp_max, div.max_abs_dlogp);
    tv_sum += div.tv;
    tv_max = std::max(tv_max, div.tv);
    kl_sum += div.kl;
    kl_max = std::max(kl_max, div.kl);
    flips += div.flip ? 1 : 0;
    predicted += div.flip_possible ? 1 : 0;
    missed += div.flip && !div.flip_possible ? 1 : 0;
    violations += violates ? 1 : 0;
    MarginBin& bin = bins[margin_bin];
    ++bin.rows;
    bin.flips += div.flip ? 1 : 0;
    bin.predicted += div.flip_possible ? 1 : 0;
  }

  SliceStats finish(std::string name) {
    SliceStats s;
    s.slice = std::move(name);
    s.rows = static_cast<int64_t>(osc.size());
    std::sort(osc.begin(), osc.end());
    s.osc_sorted = std::move(osc);
    s.osc_p50 = s.osc_quantile(0.5);
    s.osc_p90 = s.osc_quantile(0.9);
    s.osc_p99 = s.osc_quantile(0.99);
    s.osc_max = s.osc_sorted.back();
    s.linf_max = linf_max;
    s.max_abs_dlogp = dlogp_max;
    const auto n = static_cast<double>(s.rows);
    s.tv_mean = tv_sum / n;
    s.tv_max = tv_max;
    s.kl_mean = kl_sum / n;
    s.kl_max = kl_max;
    s.flips = flips;
    s.predicted_flips = predicted;
    s.missed_flips = missed;
    s.bound_violations = violations;
    s.by_margin = std::move(bins);
    return s;
  }
};

std::vector<MarginBin> empty_margin_bins(const std::vector<double>& upper_edges) {
  std::vector<MarginBin> bins(upper_edges.size() + 1);
  for (size_t i = 0; i < bins.size(); ++i) {
    bins[i].lo = i == 0 ? 0.0 : upper_edges[i - 1];
    bins[i].hi = i == upper_edges.size() ? kInf : upper_edges[i];
  }
  return bins;
}

// JSON has no infinity: the open last margin bin's upper edge is written as null.
json finite_or_null(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

std::string quantile_label(double q) { return fmt::format("osc p{:.6g}", q * 100); }

// ---- contract JSON validation ----

[[noreturn]] void contract_error(const std::string& source, const std::string& what) {
  throw InputError(fmt::format("[audit] {}: {}", source, what));
}

void require_keys_known(const json& j, const std::set<std::string>& known, const std::string& where,
                        const std::string& source) {
  for (const auto& item : j.items()) {
    if (known.count(item.key()) == 0) {
      contract_error(source, fmt::format("unknown key '{}' in {} (known: {})", item.key(), where,
                                         fmt::join(known, ", ")));
    }
  }
}

const json& require(const json& j, const char* key, const std::string& where,
                    const std::string& source) {
  if (!j.contains(key)) contract_error(source, fmt::format("missing key '{}' in {}", key, where));
  return j.at(key);
}

std::string require_string(const json& j, const char* key, const std::string& where,
                           const std::string& source) {
  const json& v = require(j, key, where, source);
  if (!v.is_string())
    contract_error(source, fmt::format("'{}' in {} must be a string", key, where));
  return v.get<std::string>();
}

double require_budget(const json& j, const char* key, const std::string& where,
                      const std::string& source) {
  const json& v = require(j, key, where, source);
  if (!v.is_number())
    contract_error(source, fmt::format("'{}' in {} must be a number", key, where));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < 0) {
    contract_error(source,
                   fmt::format("'{}' in {} must be a finite number >= 0 (got {})", key, where, x));
  }
  return x;
}

// "[lo,hi)" with lo < hi, lo an integer ≥ 0, hi an integer or "inf".
bool valid_range(std::string_view text) {
  if (text.size() < 5 || text.front() != '[' || text.back() != ')') return false;
  const size_t comma = text.find(',');
  if (comma == std::string_view::npos) return false;
  auto parse = [](std::string_view digits, int64_t& out) {
    if (digits.empty() || digits.size() > 10) return false;
    out = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
      out = out * 10 + (c - '0');
    }
    return out <= std::numeric_limits<int32_t>::max();
  };
  int64_t lo = 0, hi = 0;
  if (!parse(text.substr(1, comma - 1), lo)) return false;
  const std::string_view upper = text.substr(comma + 1, text.size() - comma - 2);
  if (upper == "inf") return true;
  return parse(upper, hi) && lo < hi;
}

bool valid_slice_name(std::string_view name) {
  if (name == "all" || name == "margin:undecided" || name == "margin:decided") return true;
  for (std::string_view prefix : {"task:", "label:"}) {
    if (name.substr(0, prefix.size()) == prefix) return name.size() > prefix.size();
  }
  for (std::string_view prefix : {"prompt_len:", "position:"}) {
    if (name.substr(0, prefix.size()) == prefix) return valid_range(name.substr(prefix.size()));
  }
  return false;
}

}  // namespace

double SliceStats::osc_quantile(double q) const {
  if (!(q > 0 && q <= 1)) {
    throw InputError(fmt::format("[audit] quantile must be in (0, 1] (got {})", q));
  }
  if (osc_sorted.empty()) return 0;
  // Nearest rank: sorted[ceil(q·n) − 1]. q·n can land one ulp above an integer (0.07·100 =
  // 7.000000000000001); the relative nudge keeps such products on the integer.
  const auto n = static_cast<double>(osc_sorted.size());
  const double rank = std::ceil(q * n * (1 - 1e-12));
  const auto k =
      std::clamp<int64_t>(static_cast<int64_t>(rank), 1, static_cast<int64_t>(osc_sorted.size()));
  return osc_sorted[static_cast<size_t>(k - 1)];
}

const SliceStats* Measurement::find(std::string_view slice) const {
  for (const SliceStats& s : slices) {
    if (s.slice == slice) return &s;
  }
  return nullptr;
}

json Measurement::to_json() const {
  json out_slices = json::array();
  for (const SliceStats& s : slices) {
    json bins = json::array();
    for (const MarginBin& b : s.by_margin) {
      bins.push_back({{"lo", b.lo},
                      {"hi", finite_or_null(b.hi)},
                      {"rows", b.rows},
                      {"flips", b.flips},
                      {"predicted", b.predicted}});
    }
    out_slices.push_back(
        {{"slice", s.slice},
         {"rows", s.rows},
         {"osc", {{"p50", s.osc_p50}, {"p90", s.osc_p90}, {"p99", s.osc_p99}, {"max", s.osc_max}}},
         {"linf_max", s.linf_max},
         {"max_abs_dlogp", s.max_abs_dlogp},
         {"tv", {{"mean", s.tv_mean}, {"max", s.tv_max}}},
         {"kl", {{"mean", s.kl_mean}, {"max", s.kl_max}}},
         {"flips", s.flips},
         {"flip_rate",
          s.rows > 0 ? static_cast<double>(s.flips) / static_cast<double>(s.rows) : 0.0},
         {"predicted_flips", s.predicted_flips},
         {"missed_flips", s.missed_flips},
         {"bound_violations", s.bound_violations},
         {"by_margin", std::move(bins)}});
  }
  const SliceStats* all = find("all");
  return {{"format", kMeasurementFormat},
          {"ref", ref},
          {"cand", cand},
          {"vocab", vocab},
          {"rows", all != nullptr ? all->rows : 0},
          {"options",
           {{"prompt_length_edges", options.prompt_length_edges},
            {"position_edges", options.position_edges},
            {"decided_margin", options.decided_margin},
            {"margin_bins", options.margin_bins}}},
          {"slices", std::move(out_slices)}};
}

std::vector<std::string> slices_of(const RowInfo& info, const RowDivergence& div,
                                   const SliceOptions& options) {
  validate_options(options);
  validate_row(info, div);
  std::vector<std::string> names{"all"};
  names.push_back(range_slice("prompt_len", options.prompt_length_edges,
                              bin_of(info.prompt_length, options.prompt_length_edges)));
  names.push_back(range_slice("position", options.position_edges,
                              bin_of(info.position, options.position_edges)));
  names.emplace_back(is_decided(div, options) ? "margin:decided" : "margin:undecided");
  if (!info.task.empty()) names.push_back("task:" + info.task);
  if (!info.label.empty()) names.push_back("label:" + info.label);
  if (info.depth > 0) names.push_back("depth:" + std::to_string(info.depth));
  return names;
}

Measurement measure(std::span<const RowRecord> rows, const SliceOptions& options, std::string ref,
                    std::string cand, int64_t vocab) {
  validate_options(options);
  const std::vector<MarginBin> bins = empty_margin_bins(options.margin_bins);
  auto fresh = [&] {
    SliceAccumulator acc;
    acc.bins = bins;
    return acc;
  };
  SliceAccumulator all = fresh();
  std::vector<SliceAccumulator> prompt(options.prompt_length_edges.size() + 1, fresh());
  std::vector<SliceAccumulator> position(options.position_edges.size() + 1, fresh());
  SliceAccumulator undecided = fresh(), decided = fresh();
  std::map<std::string, SliceAccumulator> tasks, labels;  // sorted by name
  std::map<int32_t, SliceAccumulator> depths;              // by depth

  for (const RowRecord& row : rows) {
    validate_row(row.info, row.div);
    const size_t margin_bin = margin_bin_of(row.div.margin_ref, options.margin_bins);
    const bool violates = row_violates_bounds(row.div);
    auto add = [&](SliceAccumulator& acc) { acc.add(row.div, margin_bin, violates); };
    add(all);
    add(prompt[bin_of(row.info.prompt_length, options.prompt_length_edges)]);
    add(position[bin_of(row.info.position, options.position_edges)]);
    add(is_decided(row.div, options) ? decided : undecided);
    if (!row.info.task.empty()) add(tasks.try_emplace(row.info.task, fresh()).first->second);
    if (!row.info.label.empty()) add(labels.try_emplace(row.info.label, fresh()).first->second);
    if (row.info.depth > 0) add(depths.try_emplace(row.info.depth, fresh()).first->second);
  }

  Measurement m;
  m.ref = std::move(ref);
  m.cand = std::move(cand);
  m.vocab = vocab;
  m.options = options;
  auto emit = [&](SliceAccumulator& acc, std::string name) {
    if (!acc.osc.empty()) m.slices.push_back(acc.finish(std::move(name)));
  };
  emit(all, "all");
  for (size_t i = 0; i < prompt.size(); ++i) {
    emit(prompt[i], range_slice("prompt_len", options.prompt_length_edges, i));
  }
  for (size_t i = 0; i < position.size(); ++i) {
    emit(position[i], range_slice("position", options.position_edges, i));
  }
  emit(undecided, "margin:undecided");
  emit(decided, "margin:decided");
  for (auto& [name, acc] : tasks) emit(acc, "task:" + name);
  for (auto& [name, acc] : labels) emit(acc, "label:" + name);
  for (auto& [depth, acc] : depths) emit(acc, "depth:" + std::to_string(depth));
  return m;
}

json Contract::to_json() const {
  json out_slices = json::array();
  for (const SliceContract& s : slices) {
    const auto [ratio_min, ratio_max] = ratio_bounds(s.osc_max);
    out_slices.push_back({{"slice", s.slice},
                          {"rows", s.rows},
                          {"quantile", s.quantile},
                          {"osc_quantile", s.osc_quantile},
                          {"osc_max", s.osc_max},
                          {"guarantees",
                           {{"logp_abs_max", logp_bound(s.osc_max)},
                            {"tv_max", tv_bound(s.osc_max)},
                            {"kl_max", kl_bound(s.osc_max)},
                            {"ratio_min", ratio_min},
                            {"ratio_max", finite_or_null(ratio_max)},
                            {"greedy_stable_margin", s.osc_max}}}});
  }
  return {{"format", kContractFormat},
          {"metric", "osc"},
          {"ref", ref},
          {"cand", cand},
          {"slices", std::move(out_slices)}};
}

Contract Contract::from_json(const json& j, const std::string& source) {
  if (!j.is_object()) contract_error(source, "a contract must be a JSON object");
  require_keys_known(j, {"format", "metric", "ref", "cand", "slices"}, "the contract", source);
  const std::string format = require_string(j, "format", "the contract", source);
  if (format != kContractFormat) {
    contract_error(source,
                   fmt::format("unknown format '{}' (expected '{}')", format, kContractFormat));
  }
  const std::string metric = require_string(j, "metric", "the contract", source);
  if (metric != "osc") {
    contract_error(source, fmt::format("unknown metric '{}' (only 'osc' is supported)", metric));
  }
  Contract contract;
  contract.ref = require_string(j, "ref", "the contract", source);
  contract.cand = require_string(j, "cand", "the contract", source);
  const json& slices = require(j, "slices", "the contract", source);
  if (!slices.is_array() || slices.empty()) {
    contract_error(source, "'slices' must be a non-empty array");
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < slices.size(); ++i) {
    const json& s = slices[i];
    std::string where = fmt::format("slices[{}]", i);
    if (!s.is_object()) contract_error(source, where + " must be an object");
    require_keys_known(s, {"slice", "rows", "quantile", "osc_quantile", "osc_max", "guarantees"},
                       where, source);
    SliceContract sc;
    sc.slice = require_string(s, "slice", where, source);
    where = fmt::format("slice '{}'", sc.slice);
    if (!valid_slice_name(sc.slice)) {
      contract_error(
          source,
          fmt::format(
              "slices[{}]: '{}' is not a slice name (all, prompt_len:[lo,hi), position:[lo,hi), "
              "margin:undecided, margin:decided, task:NAME, label:NAME)",
              i, sc.slice));
    }
    if (!seen.insert(sc.slice).second) {
      contract_error(source, fmt::format("slice '{}' appears twice", sc.slice));
    }
    const json& rows = require(s, "rows", where, source);
    if (!rows.is_number_integer() || rows.get<int64_t>() < 0) {
      contract_error(source, fmt::format("'rows' in {} must be an integer >= 0", where));
    }
    sc.rows = rows.get<int64_t>();
    const json& quantile = require(s, "quantile", where, source);
    if (!quantile.is_number() || !(quantile.get<double>() > 0 && quantile.get<double>() <= 1)) {
      contract_error(source, fmt::format("'quantile' in {} must be a number in (0, 1] (got {})",
                                         where, quantile.dump()));
    }
    sc.quantile = quantile.get<double>();
    sc.osc_quantile = require_budget(s, "osc_quantile", where, source);
    sc.osc_max = require_budget(s, "osc_max", where, source);
    if (sc.osc_quantile > sc.osc_max) {
      contract_error(source, fmt::format("{}: osc_quantile {} exceeds osc_max {}", where,
                                         sc.osc_quantile, sc.osc_max));
    }
    // The guarantees are derived from osc_max (to_json recomputes them); only their shape is
    // checked here.
    if (s.contains("guarantees") && !s.at("guarantees").is_object()) {
      contract_error(source, fmt::format("'guarantees' in {} must be an object", where));
    }
    contract.slices.push_back(std::move(sc));
  }
  return contract;
}

Contract Contract::load(const std::string& path) {
  return from_json(io::read_json_file(path, "audit", "the contract file"), path);
}

void Contract::save(const std::string& path) const {
  io::write_file_atomic(path, to_json().dump(2) + "\n");
}

Contract fit_contract(const Measurement& m, double headroom, double quantile, double min_osc) {
  if (!std::isfinite(headroom) || headroom < 1) {
    throw InputError(
        fmt::format("[audit] contract headroom must be a finite number >= 1 (got {})", headroom));
  }
  if (!(quantile > 0 && quantile <= 1)) {
    throw InputError(fmt::format("[audit] contract quantile must be in (0, 1] (got {})", quantile));
  }
  if (!std::isfinite(min_osc) || min_osc < 0) {
    throw InputError(
        fmt::format("[audit] contract min_osc must be a finite number >= 0 (got {})", min_osc));
  }
  if (m.slices.empty()) {
    throw InputError(
        fmt::format("[audit] cannot fit a contract for {} vs {}: no rows measured", m.ref, m.cand));
  }
  Contract contract;
  contract.ref = m.ref;
  contract.cand = m.cand;
  for (const SliceStats& s : m.slices) {
    SliceContract sc;
    sc.slice = s.slice;
    sc.rows = s.rows;
    sc.quantile = quantile;
    sc.osc_quantile = std::max(headroom * s.osc_quantile(quantile), min_osc);
    sc.osc_max = std::max(headroom * s.osc_max, min_osc);
    contract.slices.push_back(std::move(sc));
  }
  return contract;
}

json CheckResult::to_json() const {
  json out = json::array();
  for (const Violation& v : violations) {
    out.push_back({{"slice", v.slice},
                   {"what", v.what},
                   {"measured", v.measured},
                   {"allowed", v.allowed},
                   {"rows_over", v.rows_over}});
  }
  return {{"format", "concord-check/1"},
          {"pass", pass},
          {"violations", std::move(out)},
          {"not_exercised", not_exercised}};
}

CheckResult check_contract(const Contract& contract, const Measurement& m) {
  CheckResult result;
  for (const SliceContract& sc : contract.slices) {
    const SliceStats* s = m.find(sc.slice);
    if (s == nullptr || s->rows == 0) {
      result.not_exercised.push_back(sc.slice);
      continue;
    }
    const auto first_over =
        std::upper_bound(s->osc_sorted.begin(), s->osc_sorted.end(), sc.osc_max);
    const auto rows_over = static_cast<int64_t>(s->osc_sorted.end() - first_over);
    const double measured_quantile = s->osc_quantile(sc.quantile);
    if (measured_quantile > sc.osc_quantile) {
      result.violations.push_back(
          {sc.slice, quantile_label(sc.quantile), measured_quantile, sc.osc_quantile, rows_over});
    }
    if (s->osc_max > sc.osc_max) {
      result.violations.push_back({sc.slice, "osc max", s->osc_max, sc.osc_max, rows_over});
    }
  }
  result.pass = result.violations.empty();
  return result;
}

}  // namespace concord::audit
