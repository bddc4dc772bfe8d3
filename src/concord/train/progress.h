// Progress display and metrics log of a training run.
//
// ProgressBar draws one line on stderr:
//   [######..............] step 120/600  loss 2.314  12.3k tok/s  ETA 1m05s
// redrawn in place (\r) when the stream is a terminal, and otherwise (CI logs, files) printed as
// a plain line at the first update, every 5% of the run and at the last step.
// MetricsWriter appends one JSON object per line (JSON Lines) and flushes each line, so a killed
// run loses at most the line being written; a resumed run continues the same file after
// truncate_after_step() dropped the lines past the checkpoint it resumed from.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace concord::train {

// "42s", "1m05s", "2h03m", "3d04h"; "--" for a negative or non-finite duration.
std::string format_duration(double seconds);
// "950", "12.3k", "4.56M", "1.2G" (three significant figures at most); "--" when not finite.
std::string format_rate(double per_second);
// The bar line without \r or newline; eta_seconds < 0 prints "ETA --".
std::string format_progress_line(int64_t step, int64_t total_steps, double loss,
                                 double tokens_per_s, double eta_seconds, int bar_width = 20);

class ProgressBar {
 public:
  // Writes to `stream`; redraws in place when interactive (by default: when it is a terminal).
  explicit ProgressBar(std::FILE* stream = stderr);
  ProgressBar(std::FILE* stream, bool interactive);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // `step` is the number of steps done (1..total_steps). The ETA extrapolates the wall time
  // since the first update over the steps done since then.
  void update(int64_t step, int64_t total_steps, double loss, double tokens_per_s);
  // A line of text above the bar (which is redrawn under it).
  void message(std::string_view text);
  // Ends the bar's line (interactive) or prints the last state if it was not printed yet.
  void finish();

 private:
  void draw(bool force);

  std::FILE* stream_;
  bool interactive_;
  bool started_ = false, finished_ = false, shown_last_ = true;
  int64_t first_step_ = 0, step_ = 0, total_ = 0;
  double loss_ = 0.0, tokens_per_s_ = 0.0;
  int64_t last_bucket_ = -1;  // the 5% bucket last printed (non-interactive)
  size_t drawn_width_ = 0;    // length of the line on screen (interactive)
  std::chrono::steady_clock::time_point start_, last_draw_;
};

class MetricsWriter {
 public:
  // Opens `path` for appending (creating it and its folder); InputError when it cannot.
  explicit MetricsWriter(const std::filesystem::path& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Appends `record` as one compact line and flushes it.
  void write(const nlohmann::json& record);
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

// Rewrites `path` atomically, keeping the lines whose "step" is <= step (and lines without a
// "step"); drops a torn last line (a crash mid-write). A missing file is left missing. Returns
// the number of lines dropped. InputError for an unparsable line that is not the last one.
int64_t truncate_after_step(const std::filesystem::path& path, int64_t step);

}  // namespace concord::train
