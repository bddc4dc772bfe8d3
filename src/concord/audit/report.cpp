// The offline HTML report of a contract measurement and check (report.h): tables, inline SVG.
#include "concord/audit/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <set>

#include "concord/audit/svg.h"
#include "concord/io/atomic_file.h"

namespace concord::audit {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr size_t kCdfPoints = 256;  // points per CDF line; enough for a 640 px plot
constexpr size_t kMaxSeries = 12;   // lines per plot whose legend fits its height

std::string num(double v) {
  if (std::isnan(v)) return "-";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{:.3g}", v);
}

// A slice's dimension: the part of its name before ':' ("all" for "all").
std::string dimension_of(const std::string& slice) {
  const size_t colon = slice.find(':');
  return colon == std::string::npos ? slice : slice.substr(0, colon);
}

// Where a margin bin is drawn on the log x axis: the geometric middle of its edges; the first
// bin [0, hi) at hi/2 and the open last bin [lo, inf) at 2·lo.
double margin_bin_x(const MarginBin& bin) {
  if (bin.lo <= 0) return bin.hi / 2;
  if (!std::isfinite(bin.hi)) return bin.lo * 2;
  return std::sqrt(bin.lo * bin.hi);
}

Series flip_rate_series(const SliceStats& s, bool predicted, std::string name) {
  Series series;
  series.name = std::move(name);
  for (const MarginBin& bin : s.by_margin) {
    series.x.push_back(margin_bin_x(bin));
    const auto hits = static_cast<double>(predicted ? bin.predicted : bin.flips);
    series.y.push_back(bin.rows > 0 ? hits / static_cast<double>(bin.rows) : kNaN);
  }
  return series;
}

// The empirical CDF of a slice's osc, at most kCdfPoints points.
Series cdf_series(const SliceStats& s) {
  Series series;
  series.name = s.slice;
  const size_t n = s.osc_sorted.size();
  if (n == 0) return series;
  const size_t points = std::min(n, kCdfPoints);
  for (size_t k = 0; k < points; ++k) {
    const size_t i = points == 1 ? n - 1 : k * (n - 1) / (points - 1);
    series.x.push_back(s.osc_sorted[i]);
    series.y.push_back(static_cast<double>(i + 1) / static_cast<double>(n));
  }
  return series;
}

void append_meta(std::string& out, const Measurement& m) {
  const SliceStats* all = m.find("all");
  fmt::format_to(std::back_inserter(out),
                 "<table class=\"meta\">\n"
                 "<tr><th class=\"name\">reference</th><td class=\"name\">{}</td></tr>\n"
                 "<tr><th class=\"name\">candidate</th><td class=\"name\">{}</td></tr>\n"
                 "<tr><th class=\"name\">vocabulary</th><td>{}</td></tr>\n"
                 "<tr><th class=\"name\">rows</th><td>{}</td></tr>\n"
                 "<tr><th class=\"name\">slicing</th><td class=\"name\">prompt length edges "
                 "[{}], position edges [{}], decided margin &gt; {} nats</td></tr>\n"
                 "</table>\n",
                 html_escape(m.ref), html_escape(m.cand), m.vocab, all != nullptr ? all->rows : 0,
                 fmt::join(m.options.prompt_length_edges, ", "),
                 fmt::join(m.options.position_edges, ", "), num(m.options.decided_margin));
}

void append_check(std::string& out, const CheckResult& check) {
  out += "<h2>Contract check</h2>\n";
  fmt::format_to(std::back_inserter(out), "<p class=\"verdict {}\">{}</p>\n",
                 check.pass ? "pass" : "fail", check.pass ? "PASS" : "FAIL");
  if (!check.violations.empty()) {
    out +=
        "<table>\n<tr><th class=\"name\">slice</th><th class=\"name\">limit</th>"
        "<th>measured</th><th>allowed</th><th>rows over osc max</th></tr>\n";
    for (const Violation& v : check.violations) {
      fmt::format_to(std::back_inserter(out),
                     "<tr><td class=\"name bad\">{}</td><td class=\"name\">{}</td><td "
                     "class=\"bad\">{}</td><td>{}</td><td>{}</td></tr>\n",
                     html_escape(v.slice), html_escape(v.what), num(v.measured), num(v.allowed),
                     v.rows_over);
    }
    out += "</table>\n";
  }
  if (!check.not_exercised.empty()) {
    std::vector<std::string> names;
    for (const std::string& s : check.not_exercised) names.push_back(html_escape(s));
    fmt::format_to(std::back_inserter(out),
                   "<p class=\"note\">Contract slices with no rows in this measurement (not "
                   "checked, not a failure): <code>{}</code></p>\n",
                   fmt::join(names, "</code>, <code>"));
  }
}

void append_slice_table(std::string& out, const Measurement& m, const CheckResult* check) {
  std::set<std::string> violating;
  if (check != nullptr) {
    for (const Violation& v : check->violations) violating.insert(v.slice);
  }
  out +=
      "<h2>Slices</h2>\n<table>\n<tr><th class=\"name\">slice</th><th>rows</th>"
      "<th>osc p50</th><th>osc p90</th><th>osc p99</th><th>osc max</th>"
      "<th>TV mean</th><th>TV max</th><th>KL mean</th><th>KL max</th>"
      "<th>flips</th><th>predicted</th><th>missed</th><th>bound violations</th></tr>\n";
  for (const SliceStats& s : m.slices) {
    auto cell = [](int64_t v) {
      return fmt::format("<td{}>{}</td>", v != 0 ? " class=\"bad\"" : "", v);
    };
    fmt::format_to(std::back_inserter(out),
                   "<tr><td class=\"name{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                   "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                   "{}{}</tr>\n",
                   violating.count(s.slice) != 0 ? " bad" : "", html_escape(s.slice), s.rows,
                   num(s.osc_p50), num(s.osc_p90), num(s.osc_p99), num(s.osc_max), num(s.tv_mean),
                   num(s.tv_max), num(s.kl_mean), num(s.kl_max), s.flips, s.predicted_flips,
                   cell(s.missed_flips), cell(s.bound_violations));
  }
  out +=
      "</table>\n<p class=\"note\">osc = max Δ − min Δ of the logit difference Δ = "
      "z<sub>ref</sub> − z<sub>cand</sub>; flips: rows whose greedy token changed; "
      "predicted: rows where the reference's top-1 margin ≤ osc (the only rows that can "
      "flip); missed: flips the predictor did not flag; bound violations: rows where a "
      "guarantee of docs/contracts.md failed (|Δ log p| ≤ osc, TV ≤ tanh(osc/4), KL ≤ "
      "min(osc²/8, osc·tanh(osc/4)), no unflagged flip). Both must be 0.</p>\n";
}

void append_figure(std::string& out, const std::string& svg, const std::string& caption) {
  fmt::format_to(std::back_inserter(out), "<figure>\n{}<figcaption>{}</figcaption>\n</figure>\n",
                 svg, html_escape(caption));
}

// The slices of one dimension to draw: all of them, or the kMaxSeries with the most rows (in
// slice order); `left_out` counts the others.
std::vector<const SliceStats*> slices_to_draw(const Measurement& m, const std::string& dim,
                                              size_t& left_out) {
  std::vector<const SliceStats*> slices;
  for (const SliceStats& s : m.slices) {
    if (dimension_of(s.slice) == dim) slices.push_back(&s);
  }
  left_out = slices.size() > kMaxSeries ? slices.size() - kMaxSeries : 0;
  if (left_out == 0) return slices;
  std::vector<const SliceStats*> largest = slices;
  std::stable_sort(largest.begin(), largest.end(),
                   [](const SliceStats* a, const SliceStats* b) { return a->rows > b->rows; });
  largest.resize(kMaxSeries);
  std::erase_if(slices, [&](const SliceStats* s) {
    return std::find(largest.begin(), largest.end(), s) == largest.end();
  });
  return slices;
}

std::string left_out_note(size_t left_out) {
  return left_out == 0
             ? ""
             : fmt::format(" {} smaller slices of this dimension are not drawn.", left_out);
}

// Dimensions present in the measurement, in slice order ("all" excluded).
std::vector<std::string> dimensions(const Measurement& m) {
  std::vector<std::string> dims;
  for (const SliceStats& s : m.slices) {
    const std::string d = dimension_of(s.slice);
    if (d != "all" && std::find(dims.begin(), dims.end(), d) == dims.end()) dims.push_back(d);
  }
  return dims;
}

void append_flip_plots(std::string& out, const Measurement& m) {
  out += "<h2>Greedy flip rate vs reference top-1 margin</h2>\n";
  PlotOptions options;
  options.x_label = "reference top-1 margin (nats)";
  options.y_label = "flip rate";
  options.log_x = true;
  const std::string caption =
      "One point per margin bin (edges: " +
      fmt::format("{}", fmt::join(m.options.margin_bins, ", ")) +
      "), at the geometric middle of its edges (the first bin at half its upper edge, the open "
      "last bin at twice its lower edge); empty bins are left out.";
  if (const SliceStats* all = m.find("all")) {
    std::vector<Series> series{flip_rate_series(*all, false, "observed"),
                               flip_rate_series(*all, true, "predicted (margin ≤ osc)")};
    options.title = "all rows: observed vs predicted flip rate";
    append_figure(out, svg_line_plot(series, options), caption);
  }
  for (const std::string& dim : dimensions(m)) {
    if (dim == "margin") continue;  // a function of the margin itself
    std::vector<Series> series;
    size_t left_out = 0;
    for (const SliceStats* s : slices_to_draw(m, dim, left_out)) {
      series.push_back(flip_rate_series(*s, false, s->slice));
    }
    options.title = "observed flip rate by " + dim;
    append_figure(out, svg_line_plot(series, options), caption + left_out_note(left_out));
  }
}

void append_osc_plots(std::string& out, const Measurement& m) {
  out += "<h2>osc distribution per slice</h2>\n";
  PlotOptions options;
  options.x_label = "osc (nats)";
  options.y_label = "fraction of rows ≤ osc";
  options.log_x = true;
  const SliceStats* all = m.find("all");
  int64_t zero = 0;
  if (all != nullptr) {
    zero = std::upper_bound(all->osc_sorted.begin(), all->osc_sorted.end(), 0.0) -
           all->osc_sorted.begin();
  }
  const std::string caption = fmt::format(
      "Empirical CDF of osc per slice; rows with osc = 0 (logits equal up to a constant) lie off "
      "the log axis: {} of {}.",
      zero, all != nullptr ? all->rows : 0);
  for (const std::string& dim : dimensions(m)) {
    std::vector<Series> series;
    if (all != nullptr) series.push_back(cdf_series(*all));
    size_t left_out = 0;
    for (const SliceStats* s : slices_to_draw(m, dim, left_out)) series.push_back(cdf_series(*s));
    options.title = "osc CDF by " + dim;
    append_figure(out, svg_line_plot(series, options), caption + left_out_note(left_out));
  }
}

void append_contract(std::string& out, const Contract& contract) {
  out += "<h2>Contract</h2>\n";
  fmt::format_to(std::back_inserter(out),
                 "<p class=\"note\">Reference <code>{}</code>, candidate <code>{}</code>. A "
                 "slice passes when its measured osc quantile and maximum stay within the "
                 "budgets; the guarantees then hold for every row of the slice.</p>\n",
                 html_escape(contract.ref), html_escape(contract.cand));
  out +=
      "<table>\n<tr><th class=\"name\">slice</th><th>fitted on rows</th><th>quantile</th>"
      "<th>allowed osc at quantile</th><th>allowed osc max</th><th>|Δ log p| ≤</th>"
      "<th>p ratio in</th><th>TV ≤</th><th>KL ≤</th><th>greedy stable when margin &gt;</th>"
      "</tr>\n";
  for (const SliceContract& s : contract.slices) {
    const auto [ratio_min, ratio_max] = ratio_bounds(s.osc_max);
    fmt::format_to(std::back_inserter(out),
                   "<tr><td class=\"name\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                   "<td>{}</td><td>[{}, {}]</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                   html_escape(s.slice), s.rows, num(s.quantile), num(s.osc_quantile),
                   num(s.osc_max), num(logp_bound(s.osc_max)), num(ratio_min), num(ratio_max),
                   num(tv_bound(s.osc_max)), num(kl_bound(s.osc_max)), num(s.osc_max));
  }
  out += "</table>\n";
}

}  // namespace

void write_contract_report(const std::string& path, const Measurement& m, const Contract* contract,
                           const CheckResult* check) {
  std::string out;
  fmt::format_to(std::back_inserter(out),
                 "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                 "<title>Kernel contract: {} vs {}</title>\n<style>{}</style>\n</head>\n<body>\n"
                 "<h1>Kernel contract: <code>{}</code> vs <code>{}</code></h1>\n",
                 html_escape(m.ref), html_escape(m.cand), report_style(), html_escape(m.ref),
                 html_escape(m.cand));
  append_meta(out, m);
  if (check != nullptr) append_check(out, *check);
  append_slice_table(out, m, check);
  append_flip_plots(out, m);
  append_osc_plots(out, m);
  if (contract != nullptr) append_contract(out, *contract);
  out +=
      "<p class=\"note\">Written by concord (docs/contracts.md states and proves the "
      "bounds).</p>\n</body>\n</html>\n";
  io::write_file_atomic(path, out);
}

}  // namespace concord::audit
