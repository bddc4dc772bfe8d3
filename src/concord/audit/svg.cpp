// Inline SVG line plots and histograms for offline reports (svg.h): axes with 4-6 "nice" ticks
// (1, 2, 2.5, 5 × 10^k; decades on log axes), grid, labels, title and legend; no scripts.
#include "concord/audit/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <limits>

#include "concord/numerics/check.h"

namespace concord::audit {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Tableau 10: distinct in print and for the common color-vision deficiencies; series beyond
// ten reuse the colors with a dash pattern.
constexpr std::array<const char*, 10> kColors = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                 "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                                                 "#9c755f", "#bab0ac"};
constexpr std::array<const char*, 3> kDashes = {"", "6 3", "2 2"};

constexpr double kCharWidth = 6.5;  // px per character of 11px sans-serif, for layout only

struct Range {
  double lo = kInf, hi = -kInf;
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
};

// One axis: its domain (the data range widened to whole ticks) and its ticks.
struct Axis {
  bool log = false;
  double lo = 0, hi = 1;      // domain; log10 of it on a log axis
  std::vector<double> ticks;  // data values
  std::vector<std::string> labels;

  // Position in [0, 1] along the axis.
  double unit(double v) const {
    const double t = log ? std::log10(v) : v;
    return (t - lo) / (hi - lo);
  }
};

// Tick label for a multiple of step = mantissa × 10^exponent.
std::string linear_label(double v, double step) {
  if (std::abs(v) < step * 1e-9) v = 0;  // no "-0" and no 1e-17 for zero
  if (step >= 1e-4 && std::abs(v) < 1e6) {
    const int exponent = static_cast<int>(std::floor(std::log10(step) + 1e-9));
    const double mantissa = step / std::pow(10.0, exponent);
    int decimals = std::max(0, -exponent);
    if (std::abs(mantissa - 2.5) < 1e-6) ++decimals;  // 2.5, 0.25 …
    return fmt::format("{:.{}f}", v, decimals);
  }
  // Enough significant digits to tell neighbouring ticks apart (1.000002e+05, 1.000004e+05).
  const double magnitude = v == 0 ? std::log10(step) : std::floor(std::log10(std::abs(v)));
  const int digits = static_cast<int>(magnitude - std::floor(std::log10(step))) + 2;
  return fmt::format("{:.{}g}", v, std::clamp(digits, 1, 17));
}

Axis linear_axis(Range r) {
  if (r.empty()) r = {0, 1};
  if (r.lo == r.hi) {
    const double pad = r.lo == 0 ? 1 : std::abs(r.lo) * 0.5;
    r = {r.lo - pad, r.hi + pad};
  }
  const double span = r.hi - r.lo;
  // Candidate steps 1, 2, 2.5, 5 × 10^k around span/5; the smallest with at most 6 ticks
  // gives 4-6 ticks (consecutive candidates differ by at most 2.5×).
  const int base = static_cast<int>(std::floor(std::log10(span / 5))) - 1;
  double step = 0, lo = 0, hi = 0;
  for (int k = base; k <= base + 3 && step == 0; ++k) {
    for (double mantissa : {1.0, 2.0, 2.5, 5.0}) {
      const double s = mantissa * std::pow(10.0, k);
      const double first = std::floor(r.lo / s), last = std::ceil(r.hi / s);
      if (last - first + 1 <= 6) {
        step = s;
        lo = first;
        hi = last;
        break;
      }
    }
  }
  CONCORD_CHECK(step > 0, "a tick step exists for any finite span");
  Axis axis;
  axis.lo = lo * step;
  axis.hi = hi * step;
  for (double k = lo; k <= hi; k += 1) {
    axis.ticks.push_back(k * step);
    axis.labels.push_back(linear_label(k * step, step));
  }
  return axis;
}

std::string decade_label(int exponent) {
  if (exponent >= -3 && exponent <= 3) return fmt::format("{:g}", std::pow(10.0, exponent));
  return fmt::format("1e{}", exponent);
}

Axis log_axis(Range r) {  // r holds positive values only
  if (r.empty()) r = {1, 10};
  auto lo = static_cast<int>(std::floor(std::log10(r.lo)));
  auto hi = static_cast<int>(std::ceil(std::log10(r.hi)));
  if (hi <= lo) hi = lo + 1;
  const int every = std::max(1, (hi - lo + 4) / 5);  // at most 6 decade ticks
  hi = lo + every * ((hi - lo + every - 1) / every);
  Axis axis;
  axis.log = true;
  axis.lo = lo;
  axis.hi = hi;
  for (int e = lo; e <= hi; e += every) {
    axis.ticks.push_back(std::pow(10.0, e));
    axis.labels.push_back(decade_label(e));
  }
  return axis;
}

bool plottable(double v, bool log) { return std::isfinite(v) && (!log || v > 0); }

void validate_options(const PlotOptions& options, const char* what) {
  if (options.width < 200 || options.width > 10000 || options.height < 120 ||
      options.height > 10000) {
    throw InputError(fmt::format("[audit] {}: plot size {}x{} is outside 200x120 .. 10000x10000",
                                 what, options.width, options.height));
  }
}

// The frame of a plot: the plot area in pixels, axes, title and labels.
class Canvas {
 public:
  Canvas(const PlotOptions& options, Axis x, Axis y, double legend_width)
      : options_(options), x_(std::move(x)), y_(std::move(y)) {
    left_ = 64;
    right_ = options.width - 16 - legend_width;
    top_ = options.title.empty() ? 12 : 32;
    bottom_ = options.height - (options.x_label.empty() ? 28 : 44);
  }

  double px(double v) const { return left_ + x_.unit(v) * (right_ - left_); }
  double py(double v) const { return bottom_ - y_.unit(v) * (bottom_ - top_); }
  double right() const { return right_; }
  double top() const { return top_; }
  double bottom() const { return bottom_; }
  const Axis& x_axis() const { return x_; }
  const Axis& y_axis() const { return y_; }
  std::string& out() { return out_; }

  void begin() {
    const int w = options_.width, h = options_.height;
    fmt::format_to(std::back_inserter(out_),
                   "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
                   "viewBox=\"0 0 {0} {1}\" font-family=\"sans-serif\" font-size=\"11\" "
                   "role=\"img\">\n",
                   w, h);
    if (!options_.title.empty()) {
      fmt::format_to(std::back_inserter(out_), "<title>{}</title>\n", html_escape(options_.title));
    }
    fmt::format_to(std::back_inserter(out_),
                   "<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"#ffffff\"/>\n", w, h);
    // Grid and ticks.
    for (size_t i = 0; i < x_.ticks.size(); ++i) {
      const double x = px(x_.ticks[i]);
      fmt::format_to(std::back_inserter(out_),
                     "<line x1=\"{0:.2f}\" y1=\"{1:.2f}\" x2=\"{0:.2f}\" y2=\"{2:.2f}\" "
                     "stroke=\"#e6e6e6\"/>\n"
                     "<line x1=\"{0:.2f}\" y1=\"{2:.2f}\" x2=\"{0:.2f}\" y2=\"{3:.2f}\" "
                     "stroke=\"#333333\"/>\n"
                     "<text x=\"{0:.2f}\" y=\"{4:.2f}\" text-anchor=\"middle\">{5}</text>\n",
                     x, top_, bottom_, bottom_ + 4, bottom_ + 16, html_escape(x_.labels[i]));
    }
    for (size_t i = 0; i < y_.ticks.size(); ++i) {
      const double y = py(y_.ticks[i]);
      fmt::format_to(std::back_inserter(out_),
                     "<line x1=\"{0:.2f}\" y1=\"{2:.2f}\" x2=\"{1:.2f}\" y2=\"{2:.2f}\" "
                     "stroke=\"#e6e6e6\"/>\n"
                     "<line x1=\"{3:.2f}\" y1=\"{2:.2f}\" x2=\"{0:.2f}\" y2=\"{2:.2f}\" "
                     "stroke=\"#333333\"/>\n"
                     "<text x=\"{4:.2f}\" y=\"{5:.2f}\" text-anchor=\"end\">{6}</text>\n",
                     left_, right_, y, left_ - 4, left_ - 6, y + 4, html_escape(y_.labels[i]));
    }
    // Axes.
    fmt::format_to(std::back_inserter(out_),
                   "<line x1=\"{0:.2f}\" y1=\"{2:.2f}\" x2=\"{1:.2f}\" y2=\"{2:.2f}\" "
                   "stroke=\"#333333\"/>\n"
                   "<line x1=\"{0:.2f}\" y1=\"{3:.2f}\" x2=\"{0:.2f}\" y2=\"{2:.2f}\" "
                   "stroke=\"#333333\"/>\n",
                   left_, right_, bottom_, top_);
    if (!options_.title.empty()) {
      fmt::format_to(std::back_inserter(out_),
                     "<text x=\"{:.2f}\" y=\"20\" text-anchor=\"middle\" font-size=\"13\" "
                     "font-weight=\"bold\">{}</text>\n",
                     options_.width / 2.0, html_escape(options_.title));
    }
    if (!options_.x_label.empty()) {
      fmt::format_to(std::back_inserter(out_),
                     "<text x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\">{}</text>\n",
                     (left_ + right_) / 2, options_.height - 8.0, html_escape(options_.x_label));
    }
    if (!options_.y_label.empty()) {
      const double cy = (top_ + bottom_) / 2;
      fmt::format_to(std::back_inserter(out_),
                     "<text x=\"14\" y=\"{0:.2f}\" text-anchor=\"middle\" "
                     "transform=\"rotate(-90 14 {0:.2f})\">{1}</text>\n",
                     cy, html_escape(options_.y_label));
    }
  }

  // A grey line of text in the middle of the plot area ("no data", "every value is exactly 0").
  void message(std::string_view text) {
    fmt::format_to(std::back_inserter(out_),
                   "<text x=\"{:.2f}\" y=\"{:.2f}\" text-anchor=\"middle\" fill=\"#777777\">"
                   "{}</text>\n",
                   (left_ + right_) / 2, (top_ + bottom_) / 2, html_escape(text));
  }

  std::string end() {
    out_ += "</svg>\n";
    return std::move(out_);
  }

 private:
  PlotOptions options_;
  Axis x_, y_;
  double left_ = 0, right_ = 0, top_ = 0, bottom_ = 0;
  std::string out_;
};

void polyline(std::string& out, const std::vector<std::pair<double, double>>& points,
              const char* color, const char* dash) {
  if (points.size() < 2) return;
  fmt::format_to(std::back_inserter(out),
                 "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{}{}{} points=\"",
                 color, *dash != '\0' ? " stroke-dasharray=\"" : "", dash,
                 *dash != '\0' ? "\"" : "");
  for (size_t i = 0; i < points.size(); ++i) {
    fmt::format_to(std::back_inserter(out), "{}{:.2f},{:.2f}", i == 0 ? "" : " ", points[i].first,
                   points[i].second);
  }
  out += "\"/>\n";
}

}  // namespace

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string svg_line_plot(std::span<const Series> series, const PlotOptions& options) {
  validate_options(options, "svg_line_plot");
  // On a log y axis a value of exactly 0 cannot be drawn, yet it is a result, not a gap: a
  // series that is 0 wherever it is defined says so in its legend, and its x values still span
  // the x axis.
  constexpr std::string_view kZeroNote = " (exactly 0 throughout)";
  Range xr, yr;
  size_t longest_name = 0;
  std::vector<bool> zero_only(series.size(), false);
  bool any_zero = false;
  for (size_t k = 0; k < series.size(); ++k) {
    const Series& s = series[k];
    if (s.x.size() != s.y.size()) {
      throw InputError(
          fmt::format("[audit] svg_line_plot: series '{}' has {} x values and {} y values", s.name,
                      s.x.size(), s.y.size()));
    }
    size_t drawn = 0, zeros = 0;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!plottable(s.x[i], options.log_x)) continue;
      if (plottable(s.y[i], options.log_y)) {
        xr.add(s.x[i]);
        yr.add(s.y[i]);
        ++drawn;
      } else if (options.log_y && s.y[i] == 0) {
        xr.add(s.x[i]);
        ++zeros;
      }
    }
    zero_only[k] = drawn == 0 && zeros > 0;
    any_zero = any_zero || zero_only[k];
    longest_name = std::max(longest_name, s.name.size() + (zero_only[k] ? kZeroNote.size() : 0));
  }
  const bool legend = series.size() > 1 || (series.size() == 1 && !series[0].name.empty());
  const double legend_width =
      legend ? std::min(0.4 * options.width, 28 + kCharWidth * static_cast<double>(longest_name))
             : 0.0;
  Canvas canvas(options, options.log_x ? log_axis(xr) : linear_axis(xr),
                options.log_y ? log_axis(yr) : linear_axis(yr), legend_width);
  canvas.begin();
  if (yr.empty()) canvas.message(any_zero ? "every value is exactly 0 (not drawn on a log axis)" : "no data");
  std::string& out = canvas.out();
  for (size_t k = 0; k < series.size(); ++k) {
    const Series& s = series[k];
    const char* color = kColors[k % kColors.size()];
    const char* dash = kDashes[(k / kColors.size()) % kDashes.size()];
    // Non-finite points (and points ≤ 0 on a log axis) are skipped and break the line.
    std::vector<std::vector<std::pair<double, double>>> runs(1);
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (plottable(s.x[i], options.log_x) && plottable(s.y[i], options.log_y)) {
        runs.back().emplace_back(canvas.px(s.x[i]), canvas.py(s.y[i]));
      } else if (!runs.back().empty()) {
        runs.emplace_back();
      }
    }
    size_t points = 0;
    for (const auto& run : runs) points += run.size();
    fmt::format_to(std::back_inserter(out), "<g class=\"series\"><title>{}</title>\n",
                   html_escape(s.name));
    for (const auto& run : runs) {
      polyline(out, run, color, dash);
      // Markers where points are few enough to tell apart, and for isolated points always.
      if (points <= 50 || run.size() == 1) {
        for (const auto& [x, y] : run) {
          fmt::format_to(std::back_inserter(out),
                         "<circle cx=\"{:.2f}\" cy=\"{:.2f}\" r=\"2.5\" fill=\"{}\"/>\n", x, y,
                         color);
        }
      }
    }
    out += "</g>\n";
    if (legend) {
      const double x = canvas.right() + 12;
      const double y = canvas.top() + 8 + 16.0 * static_cast<double>(k);
      fmt::format_to(std::back_inserter(out),
                     "<line x1=\"{0:.2f}\" y1=\"{1:.2f}\" x2=\"{2:.2f}\" y2=\"{1:.2f}\" "
                     "stroke=\"{3}\" stroke-width=\"2\"{4}{5}{6}/>\n"
                     "<text x=\"{7:.2f}\" y=\"{8:.2f}\">{9}</text>\n",
                     x, y, x + 16, color, *dash != '\0' ? " stroke-dasharray=\"" : "", dash,
                     *dash != '\0' ? "\"" : "", x + 20, y + 4,
                     html_escape(zero_only[k] ? s.name + std::string(kZeroNote) : s.name));
    }
  }
  return canvas.end();
}

namespace {

void validate_heights(std::span<const double> counts, const char* what) {
  for (size_t i = 0; i < counts.size(); ++i) {
    if (!std::isfinite(counts[i]) || counts[i] < 0) {
      throw InputError(fmt::format("[audit] {}: bar {} has height {}; heights must be finite and >= 0",
                                   what, i, counts[i]));
    }
  }
}

// The y axis of bars: from 0 on a linear axis; on a log axis from a decade at or below half the
// smallest positive height, so that the smallest bar still stands visibly above the axis.
Axis bar_height_axis(std::span<const double> counts, bool log_y) {
  Range yr;
  if (!log_y) yr.add(0);  // bars stand on zero
  for (double c : counts) {
    if (plottable(c, log_y)) yr.add(c);
  }
  if (log_y && !yr.empty()) yr.add(yr.lo / 2);
  return log_y ? log_axis(yr) : linear_axis(yr);
}

// Bar i spans [x0(i), x1(i)) in data units; zero heights (and, on a log axis, nothing at all)
// draw no bar. `tip(i)` is the bar's tooltip.
template <class X0, class X1, class Tip>
void draw_bars(Canvas& canvas, std::span<const double> counts, bool log_y, X0 x0_of, X1 x1_of, Tip tip) {
  std::string& out = canvas.out();
  const double base = log_y ? canvas.bottom() : canvas.py(0);
  for (size_t i = 0; i < counts.size(); ++i) {
    if (!plottable(counts[i], log_y) || counts[i] == 0) continue;
    const double x0 = canvas.px(x0_of(i)), x1 = canvas.px(x1_of(i));
    const double y = canvas.py(counts[i]);
    fmt::format_to(std::back_inserter(out),
                   "<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" "
                   "fill=\"{}\" stroke=\"#ffffff\" stroke-width=\"0.5\"><title>{}</title></rect>\n",
                   x0, y, std::max(0.0, x1 - x0), std::max(0.0, base - y), kColors[0],
                   html_escape(tip(i)));
  }
}

}  // namespace

std::string svg_histogram(std::span<const double> edges, std::span<const double> counts,
                          const PlotOptions& options) {
  validate_options(options, "svg_histogram");
  if (counts.empty() || edges.size() != counts.size() + 1) {
    throw InputError(
        fmt::format("[audit] svg_histogram: {} edges for {} bars (need bars + 1 "
                    "edges and at least one bar)",
                    edges.size(), counts.size()));
  }
  for (size_t i = 0; i < edges.size(); ++i) {
    if (!plottable(edges[i], options.log_x) || (i > 0 && edges[i] <= edges[i - 1])) {
      throw InputError(
          fmt::format("[audit] svg_histogram: edges must be strictly increasing "
                      "finite numbers{} (edge {} is {})",
                      options.log_x ? " > 0 on a log axis" : "", i, edges[i]));
    }
  }
  validate_heights(counts, "svg_histogram");
  Range xr{edges.front(), edges.back()};
  Canvas canvas(options, options.log_x ? log_axis(xr) : linear_axis(xr),
                bar_height_axis(counts, options.log_y), 0);
  canvas.begin();
  draw_bars(canvas, counts, options.log_y, [&](size_t i) { return edges[i]; },
            [&](size_t i) { return edges[i + 1]; },
            [&](size_t i) { return fmt::format("[{:g}, {:g}): {:g}", edges[i], edges[i + 1], counts[i]); });
  return canvas.end();
}

std::string svg_bar_chart(std::span<const std::string> labels, std::span<const double> counts,
                          const PlotOptions& options) {
  validate_options(options, "svg_bar_chart");
  if (counts.empty() || labels.size() != counts.size()) {
    throw InputError(fmt::format("[audit] svg_bar_chart: {} labels for {} bars (need one label per "
                                 "bar and at least one bar)", labels.size(), counts.size()));
  }
  if (options.log_x) throw InputError("[audit] svg_bar_chart: the category axis cannot be logarithmic");
  validate_heights(counts, "svg_bar_chart");
  // One unit of the x axis per category, the label under the middle of its bar.
  Axis categories;
  categories.lo = 0;
  categories.hi = static_cast<double>(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    categories.ticks.push_back(static_cast<double>(i) + 0.5);
    categories.labels.push_back(labels[i]);
  }
  Canvas canvas(options, std::move(categories), bar_height_axis(counts, options.log_y), 0);
  canvas.begin();
  if (std::none_of(counts.begin(), counts.end(), [](double c) { return c > 0; }))
    canvas.message("every bar is 0");
  draw_bars(canvas, counts, options.log_y, [](size_t i) { return static_cast<double>(i) + 0.08; },
            [](size_t i) { return static_cast<double>(i) + 0.92; },
            [&](size_t i) { return fmt::format("{}: {:g}", labels[i], counts[i]); });
  return canvas.end();
}

std::string_view report_style() {
  return R"(
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; }
td.name, th.name { text-align: left; font-family: monospace; }
td.bad { background: #fde2e2; color: #b00020; font-weight: bold; }
.verdict { font-size: 1.3em; font-weight: bold; }
.pass { color: #1b7f3b; } .fail { color: #b00020; }
figure { display: inline-block; margin: 8px 16px 8px 0; vertical-align: top; }
figcaption { font-size: 0.85em; color: #555; max-width: 640px; }
p.note { font-size: 0.9em; color: #555; max-width: 900px; }
pre { font-size: 0.8em; background: #f7f7f7; padding: 8px; max-height: 300px; overflow: auto; }
)";
}

}  // namespace concord::audit
