// Plots as inline SVG for offline HTML reports (no scripts, no external files): line plots and
// bar histograms with axes, ticks, labels and a legend. Reports of contracts (report.h) and RL
// runs use them.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace concord::audit {

struct Series {
  std::string name;
  std::vector<double> x, y;  // same length; non-finite points are skipped
};

struct PlotOptions {
  std::string title, x_label, y_label;
  // Points ≤ 0 are skipped on a log axis; on a log y axis a line plot's series that is exactly 0
  // wherever it is defined is named so in the legend ("exactly 0 throughout").
  bool log_x = false, log_y = false;
  int width = 640, height = 360;
};

std::string svg_line_plot(std::span<const Series> series, const PlotOptions& options);
// Bars over [edges[i], edges[i+1]) with heights counts[i] (edges.size() == counts.size() + 1).
std::string svg_histogram(std::span<const double> edges, std::span<const double> counts,
                          const PlotOptions& options);
// Equal-width bars, one per category, labels[i] under bar i: for bins whose widths span decades
// (lags 0, 1, 2-3, ..., 1024+), where bars drawn over their true widths would vanish. With log_y
// zero bars are not drawn and the axis starts at the decade below the smallest positive count.
std::string svg_bar_chart(std::span<const std::string> labels, std::span<const double> counts,
                          const PlotOptions& options);
std::string html_escape(std::string_view text);
// The stylesheet every concord HTML report shares (tables, figures, verdicts, notes, <pre>), for
// a <style> element: the contract report (report.h) and the RL report (rl/report.h).
std::string_view report_style();

}  // namespace concord::audit
