// The progress bar and the JSON-lines metrics log (see progress.h).
#include "concord/train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "concord/io/atomic_file.h"
#include "concord/numerics/check.h"

namespace concord::train {
namespace fs = std::filesystem;

namespace {

// Interactive redraws at most this often (the last step is always drawn).
constexpr double kRedrawSeconds = 0.1;
// Non-interactive: one line per this many buckets of the run (20 buckets = every 5%).
constexpr int64_t kLogBuckets = 20;

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0.0) return "--";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", s / 60, s % 60);
  if (s < 86400) return fmt::format("{}h{:02d}m", s / 3600, (s % 3600) / 60);
  return fmt::format("{}d{:02d}h", s / 86400, (s % 86400) / 3600);
}

std::string format_rate(double per_second) {
  if (!std::isfinite(per_second)) return "--";
  const double x = std::fabs(per_second);
  const char* sign = per_second < 0.0 ? "-" : "";
  // Pick the unit after rounding, so 999,960 prints as "1.00M", not "1000k".
  if (std::round(x) < 1000.0) return fmt::format("{}{:.0f}", sign, x);
  static constexpr const char* kUnits[] = {"k", "M", "G", "T"};
  double scaled = x / 1000.0;
  int unit = 0;
  while (unit < 3 && std::round(scaled) >= 1000.0) {
    scaled /= 1000.0;
    ++unit;
  }
  // Three significant figures: 1.23k, 12.3k, 123k.
  if (std::round(scaled * 100.0) < 1000.0) return fmt::format("{}{:.2f}{}", sign, scaled, kUnits[unit]);
  if (std::round(scaled * 10.0) < 1000.0) return fmt::format("{}{:.1f}{}", sign, scaled, kUnits[unit]);
  return fmt::format("{}{:.0f}{}", sign, scaled, kUnits[unit]);
}

std::string format_progress_line(int64_t step, int64_t total_steps, double loss,
                                 double tokens_per_s, double eta_seconds, int bar_width) {
  const double fraction =
      total_steps > 0 ? std::clamp(static_cast<double>(step) / static_cast<double>(total_steps),
                                   0.0, 1.0)
                      : 0.0;
  const auto filled = static_cast<int>(std::floor(fraction * bar_width));
  std::string bar(static_cast<size_t>(std::max(bar_width, 0)), '.');
  std::fill_n(bar.begin(), std::clamp(filled, 0, bar_width), '#');
  return fmt::format("[{}] step {}/{}  loss {:.3f}  {} tok/s  ETA {}", bar, step, total_steps,
                     loss, format_rate(tokens_per_s), format_duration(eta_seconds));
}

ProgressBar::ProgressBar(std::FILE* stream)
    : ProgressBar(stream, stream != nullptr && ::isatty(::fileno(stream)) == 1) {}

ProgressBar::ProgressBar(std::FILE* stream, bool interactive)
    : stream_(stream), interactive_(interactive) {}

ProgressBar::~ProgressBar() {
  if (started_ && !finished_) finish();
}

void ProgressBar::update(int64_t step, int64_t total_steps, double loss, double tokens_per_s) {
  const auto now = std::chrono::steady_clock::now();
  if (!started_) {
    started_ = true;
    finished_ = false;
    // The ETA's clock starts at the step before the first one reported (a resumed run starts
    // mid-way; its earlier steps took no time in this process).
    first_step_ = step - 1;
    start_ = now;
    last_draw_ = now - std::chrono::seconds(1);
  }
  step_ = step;
  total_ = total_steps;
  loss_ = loss;
  tokens_per_s_ = tokens_per_s;
  shown_last_ = false;
  draw(step >= total_steps);
}

void ProgressBar::draw(bool force) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const int64_t done = step_ - first_step_;
  const double eta = done > 0 && elapsed > 0.0
                         ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - step_)
                         : -1.0;
  const std::string line = format_progress_line(step_, total_, loss_, tokens_per_s_, eta);
  if (interactive_) {
    if (!force && std::chrono::duration<double>(now - last_draw_).count() < kRedrawSeconds) return;
    const size_t pad = drawn_width_ > line.size() ? drawn_width_ - line.size() : 0;
    std::fprintf(stream_, "\r%s%*s", line.c_str(), static_cast<int>(pad), "");
    drawn_width_ = line.size();
  } else {
    const int64_t bucket = total_ > 0 ? step_ * kLogBuckets / total_ : 0;
    if (!force && bucket == last_bucket_) return;
    last_bucket_ = bucket;
    std::fprintf(stream_, "%s\n", line.c_str());
  }
  std::fflush(stream_);
  last_draw_ = now;
  shown_last_ = true;
}

void ProgressBar::message(std::string_view text) {
  if (interactive_ && drawn_width_ > 0) {
    std::fprintf(stream_, "\r%*s\r%.*s\n", static_cast<int>(drawn_width_), "",
                 static_cast<int>(text.size()), text.data());
    drawn_width_ = 0;
    if (started_ && !finished_) draw(true);
  } else {
    std::fprintf(stream_, "%.*s\n", static_cast<int>(text.size()), text.data());
  }
  std::fflush(stream_);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (!started_) return;
  if (!shown_last_) draw(true);
  if (interactive_ && drawn_width_ > 0) {
    std::fputc('\n', stream_);
    drawn_width_ = 0;
  }
  std::fflush(stream_);
}

MetricsWriter::MetricsWriter(const fs::path& path) : path_(path) {
  std::error_code ec;
  if (path.has_parent_path()) fs::create_directories(path.parent_path(), ec);
  file_ = std::fopen(path.c_str(), "a");
  if (file_ == nullptr) {
    throw InputError(fmt::format("[metrics] {}: cannot open for appending: {}", path.string(),
                                 std::strerror(errno)));
  }
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsWriter::write(const nlohmann::json& record) {
  std::string line;
  try {
    line = record.dump() + "\n";
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("[metrics] {}: record cannot be written as JSON ({})",
                                 path_.string(), e.what()));
  }
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    throw InputError(fmt::format("[metrics] {}: write failed: {}", path_.string(),
                                 std::strerror(errno)));
  }
}

int64_t truncate_after_step(const fs::path& path, int64_t step) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!fs::exists(path, ec)) return 0;
    throw InputError(fmt::format("[metrics] {}: cannot read: {}", path.string(),
                                 std::strerror(errno)));
  }
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
  std::string kept;
  int64_t dropped = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      if (i + 1 == lines.size()) {  // a torn last line: the run died while writing it
        ++dropped;
        continue;
      }
      throw InputError(fmt::format("[metrics] {}: line {} is not JSON; fix or delete the file",
                                   path.string(), i + 1));
    }
    const bool past = record.is_object() && record.contains("step") &&
                      record["step"].is_number() && record["step"].get<double>() > static_cast<double>(step);
    if (past) {
      ++dropped;
    } else {
      kept += line;
      kept += '\n';
    }
  }
  io::write_file_atomic(path, std::string_view(kept));
  return dropped;
}

}  // namespace concord::train
