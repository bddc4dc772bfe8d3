// Prometheus metrics for `concord serve`: a thread-safe registry of counters, gauges and
// histograms, rendered in the text exposition format 0.0.4 for GET /metrics.
//
// Use: register (or look up) a series once and keep the reference; updates are then lock-free
// (counters, gauges) or take only the histogram's own lock, so HTTP threads and the engine
// thread can update at any rate while another thread renders.
//
//   Metrics m;
//   Counter& ok = m.counter("concord_requests_total", "Requests answered, by endpoint and status.",
//                           {{"endpoint", "/v1/completions"}, {"status", "200"}});
//   ok.inc();
//   Histogram& ttft = m.histogram("concord_time_to_first_token_seconds", "Time to first token.",
//                                 kLatencyBuckets);
//   ttft.observe(0.042);
//   std::string body = m.render();   // Content-Type: kPrometheusContentType
//
// A family is one metric name with one type, one help text, one list of label names (in the
// order first given) and, for histograms, one list of buckets; a series is a family plus label
// values. Asking again for the same name and label values returns the same series. Asking for a
// name already registered with another type, help text, label names or buckets, an invalid name
// (metric: [a-zA-Z_:][a-zA-Z0-9_:]*; label: [a-zA-Z_][a-zA-Z0-9_]*, not "__..."; "le" is
// reserved in histograms), or buckets that are not finite and strictly increasing, is an
// InputError. References stay valid for the registry's lifetime.
//
// render(): families sorted by name, each "# HELP name text" (backslash and newline escaped),
// "# TYPE name counter|gauge|histogram", then its series sorted by label values, a label value
// escaped as the format says (\\, \", \n). Histograms write cumulative name_bucket{...,le="B"}
// for each bound B and le="+Inf", then name_sum and name_count; an observation equal to a bound
// counts in that bound's bucket (Prometheus's le = "less or equal"). Values are written in the
// shortest form that reads back to the same double ("3", "0.25", "1e+21"), with +Inf, -Inf, NaN
// spelled as Prometheus does. A histogram's buckets, sum and count are read together (no
// observation is half counted); different series are read one after another.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace concord::serve {

inline constexpr std::string_view kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

// Label (name, value) pairs; the names' order is the family's, kept in the output.
using Labels = std::vector<std::pair<std::string, std::string>>;

// Latency buckets in seconds, 1 ms to 60 s: for time to first token, inter-token latency and
// request duration.
inline const std::vector<double> kLatencyBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                    0.25,  0.5,    1,     2.5,  5,     10,   30, 60};

// A monotonic count. inc() with a negative or non-finite amount is an InputError.
class Counter {
 public:
  void inc(double amount = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down (queue length, running sequences).
class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  void inc(double amount = 1) { value_.fetch_add(amount, std::memory_order_relaxed); }
  void dec(double amount = 1) { value_.fetch_sub(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into fixed buckets (upper bounds, inclusive) plus sum and count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);  // validated by Metrics::histogram
  void observe(double value);  // NaN counts in +Inf only and makes the sum NaN, as Prometheus's

  struct Snapshot {
    std::vector<double> bounds;       // the finite upper bounds
    std::vector<uint64_t> cumulative; // bounds.size() + 1 counts, the last one for +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot snapshot() const;          // consistent: cumulative.back() == count

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;      // per bucket, not cumulative; last = above every bound
  double sum_ = 0;
  uint64_t count_ = 0;
};

enum class MetricType { counter, gauge, histogram };

class Metrics {
 public:
  Metrics();
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  Counter& counter(std::string_view name, std::string_view help, const Labels& labels = {});
  Gauge& gauge(std::string_view name, std::string_view help, const Labels& labels = {});
  Histogram& histogram(std::string_view name, std::string_view help, const std::vector<double>& buckets,
                       const Labels& labels = {});

  std::string render() const;

 private:
  struct Family;
  // The series for `labels` in family `name` (created as needed), under mutex_.
  struct Series;
  Series& series(std::string_view name, std::string_view help, MetricType type, const Labels& labels,
                 const std::vector<double>* buckets);

  mutable std::mutex mutex_;  // guards the maps, not the values
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families_;
};

// The exposition format's escapes: help text escapes \ and newline; a label value also ".
std::string escape_help(std::string_view text);
std::string escape_label_value(std::string_view value);
// A sample value or bucket bound as the format writes it.
std::string format_metric_value(double value);

}  // namespace concord::serve
