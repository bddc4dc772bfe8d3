// The Prometheus registry: exact exposition text, histogram bounds, escaping, registration
// errors, exact totals under concurrent updates, and every rendered text read back by a small
// checker of the text format 0.0.4 (written here from the format's description, sharing nothing
// with the renderer).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "concord/numerics/check.h"
#include "concord/serve/metrics.h"

namespace concord::serve {
namespace {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;  // unescaped values
  double value;
};

// Reads exposition text; throws std::runtime_error naming the line that breaks the format:
// HELP then TYPE before a family's samples, each family once, sample names of the family's type
// (histograms: _bucket with le, _sum, _count), well-formed escaped labels, parseable values, no
// series twice, and histogram buckets with increasing le, cumulative counts, a last le="+Inf"
// equal to _count.
std::vector<Sample> parse_exposition(const std::string& text) {
  std::vector<Sample> samples;
  std::set<std::string> families_seen, series_seen;
  std::string family, type;
  bool have_help = false;
  struct Buckets {
    double last_le = -std::numeric_limits<double>::infinity();
    double last_count = 0;
    bool inf_seen = false;
    double inf_count = 0;
  };
  std::map<std::string, Buckets> buckets;  // per histogram series (labels without le)
  auto fail = [](size_t line, const std::string& why) {
    throw std::runtime_error("line " + std::to_string(line) + ": " + why);
  };
  auto parse_value = [&](size_t line, const std::string& v) {
    if (v == "+Inf") return std::numeric_limits<double>::infinity();
    if (v == "-Inf") return -std::numeric_limits<double>::infinity();
    if (v == "NaN") return std::numeric_limits<double>::quiet_NaN();
    size_t used = 0;
    double d = 0;
    try {
      d = std::stod(v, &used);
    } catch (const std::exception&) {
      fail(line, "bad value '" + v + "'");
    }
    if (used != v.size()) fail(line, "bad value '" + v + "'");
    return d;
  };
  if (!text.empty() && text.back() != '\n') fail(0, "text does not end in a newline");
  size_t line_no = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = text.find('\n', at);
    const std::string line = text.substr(at, nl - at);
    at = nl + 1;
    ++line_no;
    if (line.rfind("# HELP ", 0) == 0) {
      const size_t sp = line.find(' ', 7);
      if (sp == std::string::npos) fail(line_no, "HELP without text");
      family = line.substr(7, sp - 7);
      if (!families_seen.insert(family).second) fail(line_no, "family " + family + " twice");
      const std::string help = line.substr(sp + 1);
      for (size_t i = 0; i < help.size(); ++i) {
        if (help[i] != '\\') continue;
        if (i + 1 == help.size() || (help[i + 1] != '\\' && help[i + 1] != 'n')) fail(line_no, "bad escape in help");
        ++i;
      }
      have_help = true;
      type.clear();
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      if (!have_help || line.substr(7, family.size() + 1) != family + " ") fail(line_no, "TYPE not after its HELP");
      type = line.substr(7 + family.size() + 1);
      if (type != "counter" && type != "gauge" && type != "histogram") fail(line_no, "unknown type " + type);
      have_help = false;
      continue;
    }
    if (type.empty()) fail(line_no, "sample before its family's HELP and TYPE");
    Sample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = line.substr(0, i);
    std::string series_key = s.name + "{";
    std::string labels_without_le;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (true) {
        const size_t eq = line.find("=\"", i);
        if (eq == std::string::npos) fail(line_no, "bad label");
        const std::string label = line.substr(i, eq - i);
        std::string value;
        for (i = eq + 2; i < line.size() && line[i] != '"'; ++i) {
          if (line[i] == '\\') {
            if (++i == line.size()) fail(line_no, "escape at end of line");
            if (line[i] == 'n') value += '\n';
            else if (line[i] == '\\' || line[i] == '"') value += line[i];
            else fail(line_no, "bad escape in label value");
          } else {
            value += line[i];
          }
        }
        if (i == line.size()) fail(line_no, "unterminated label value");
        if (!s.labels.emplace(label, value).second) fail(line_no, "label " + label + " twice");
        series_key += label + "=" + value + ",";
        if (label != "le") labels_without_le += label + "=" + value + ",";
        ++i;
        if (i < line.size() && line[i] == ',') {
          ++i;
          continue;
        }
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        fail(line_no, "labels not closed");
      }
    }
    if (i >= line.size() || line[i] != ' ') fail(line_no, "no space before the value");
    s.value = parse_value(line_no, line.substr(i + 1));
    if (!series_seen.insert(series_key).second) fail(line_no, "series twice: " + series_key);
    if (type == "histogram") {
      Buckets& b = buckets[labels_without_le];
      if (s.name == family + "_bucket") {
        if (!s.labels.count("le")) fail(line_no, "bucket without le");
        const double le = parse_value(line_no, s.labels["le"]);
        if (!(le > b.last_le) || s.value < b.last_count) fail(line_no, "buckets not increasing and cumulative");
        b.last_le = le;
        b.last_count = s.value;
        if (std::isinf(le)) {
          b.inf_seen = true;
          b.inf_count = s.value;
        }
      } else if (s.name == family + "_count") {
        if (!b.inf_seen || b.inf_count != s.value) fail(line_no, "_count is not the +Inf bucket");
      } else if (s.name != family + "_sum") {
        fail(line_no, s.name + " is not a sample of histogram " + family);
      }
    } else if (s.name != family) {
      fail(line_no, s.name + " is not a sample of " + family);
    }
    samples.push_back(std::move(s));
  }
  for (const auto& [key, b] : buckets)
    if (!b.inf_seen) throw std::runtime_error("histogram series without le=\"+Inf\": " + key);
  return samples;
}

TEST(Metrics, RendersTheExpositionFormatExactly) {
  Metrics m;
  m.counter("concord_requests_total", "Requests answered.", {{"endpoint", "/v1/completions"}, {"status", "200"}})
      .inc(2);
  m.counter("concord_requests_total", "Requests answered.", {{"endpoint", "/v1/chat/completions"}, {"status", "400"}})
      .inc();
  m.gauge("concord_queue_length", "Requests waiting for a slot.").set(3);
  Histogram& h = m.histogram("concord_time_to_first_token_seconds", "Time to first token.", {0.125, 0.5, 1});
  for (double v : {0.0625, 0.125, 0.75, 5.0}) h.observe(v);
  const std::string expected =
      "# HELP concord_queue_length Requests waiting for a slot.\n"
      "# TYPE concord_queue_length gauge\n"
      "concord_queue_length 3\n"
      "# HELP concord_requests_total Requests answered.\n"
      "# TYPE concord_requests_total counter\n"
      "concord_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1\n"
      "concord_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n"
      "# HELP concord_time_to_first_token_seconds Time to first token.\n"
      "# TYPE concord_time_to_first_token_seconds histogram\n"
      "concord_time_to_first_token_seconds_bucket{le=\"0.125\"} 2\n"
      "concord_time_to_first_token_seconds_bucket{le=\"0.5\"} 2\n"
      "concord_time_to_first_token_seconds_bucket{le=\"1\"} 3\n"
      "concord_time_to_first_token_seconds_bucket{le=\"+Inf\"} 4\n"
      "concord_time_to_first_token_seconds_sum 5.9375\n"
      "concord_time_to_first_token_seconds_count 4\n";
  EXPECT_EQ(m.render(), expected);
  const std::vector<Sample> samples = parse_exposition(m.render());
  ASSERT_EQ(samples.size(), 9u);
  EXPECT_EQ(samples[2].labels.at("endpoint"), "/v1/completions");
  EXPECT_EQ(samples[2].value, 2);
}

TEST(Metrics, HistogramWithLabelsPutsLeLast) {
  Metrics m;
  m.histogram("lat_seconds", "L.", {1}, {{"endpoint", "chat"}}).observe(1);
  EXPECT_EQ(m.render(),
            "# HELP lat_seconds L.\n# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{endpoint=\"chat\",le=\"1\"} 1\n"
            "lat_seconds_bucket{endpoint=\"chat\",le=\"+Inf\"} 1\n"
            "lat_seconds_sum{endpoint=\"chat\"} 1\n"
            "lat_seconds_count{endpoint=\"chat\"} 1\n");
  parse_exposition(m.render());
}

TEST(Metrics, HistogramBucketBoundaries) {
  Histogram h({0.5, 1, 2});
  h.observe(-3);                                   // below every bound: the first bucket
  h.observe(0.5);                                  // equal to a bound: in it (le = less or equal)
  h.observe(std::nextafter(0.5, 1.0));             // just above: the next one
  h.observe(2);
  h.observe(std::nextafter(2.0, 3.0));             // above the last bound: +Inf only
  h.observe(std::numeric_limits<double>::infinity());
  Histogram::Snapshot s = h.snapshot();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 3, 4, 6}));
  EXPECT_EQ(s.count, 6u);
  EXPECT_EQ(s.sum, std::numeric_limits<double>::infinity());

  Histogram nan({1});
  nan.observe(std::numeric_limits<double>::quiet_NaN());
  s = nan.snapshot();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(std::isnan(s.sum));

  Metrics m;  // no finite bounds: le="+Inf" only
  m.histogram("h", "H.", {}).observe(7);
  EXPECT_EQ(m.render(), "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 7\nh_count 1\n");
}

TEST(Metrics, ValuesAndEscaping) {
  EXPECT_EQ(format_metric_value(3), "3");
  EXPECT_EQ(format_metric_value(0.25), "0.25");
  EXPECT_EQ(format_metric_value(0.1), "0.1");
  EXPECT_EQ(format_metric_value(1e21), "1e+21");
  EXPECT_EQ(format_metric_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_metric_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_metric_value(std::numeric_limits<double>::quiet_NaN()), "NaN");

  Metrics m;
  const std::string nasty = "a\"b\\c\nd";
  m.counter("c_total", "Help with \\ and\nnewline \"quoted\".", {{"path", nasty}}).inc(1.5);
  EXPECT_EQ(m.render(),
            "# HELP c_total Help with \\\\ and\\nnewline \"quoted\".\n"
            "# TYPE c_total counter\n"
            "c_total{path=\"a\\\"b\\\\c\\nd\"} 1.5\n");
  const std::vector<Sample> samples = parse_exposition(m.render());
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].labels.at("path"), nasty);  // the escapes read back to the value
}

TEST(Metrics, SameSeriesAndRegistrationErrors) {
  Metrics m;
  Counter& a = m.counter("x_total", "X.", {{"k", "1"}});
  EXPECT_EQ(&a, &m.counter("x_total", "X.", {{"k", "1"}}));
  EXPECT_NE(&a, &m.counter("x_total", "X.", {{"k", "2"}}));
  EXPECT_THROW(m.gauge("x_total", "X.", {{"k", "1"}}), InputError);            // another type
  EXPECT_THROW(m.counter("x_total", "Y.", {{"k", "1"}}), InputError);          // another help
  EXPECT_THROW(m.counter("x_total", "X.", {{"j", "1"}}), InputError);          // other labels
  EXPECT_THROW(m.counter("x_total", "X."), InputError);
  EXPECT_THROW(m.counter("1x", "X."), InputError);                             // bad names
  EXPECT_THROW(m.counter("a-b", "X."), InputError);
  EXPECT_THROW(m.counter("y_total", "X.", {{"__k", "1"}}), InputError);
  EXPECT_THROW(m.counter("y_total", "X.", {{"k", "1"}, {"k", "2"}}), InputError);
  EXPECT_THROW(m.histogram("h", "H.", {1}, {{"le", "1"}}), InputError);        // reserved
  EXPECT_THROW(m.histogram("h", "H.", {1, 1}), InputError);                    // not increasing
  EXPECT_THROW(m.histogram("h", "H.", {2, 1}), InputError);
  EXPECT_THROW(m.histogram("h", "H.", {1, std::numeric_limits<double>::infinity()}), InputError);
  m.histogram("h", "H.", {1, 2});
  EXPECT_THROW(m.histogram("h", "H.", {1, 3}), InputError);                    // other buckets
  EXPECT_THROW(a.inc(-1), InputError);                                         // counters only grow
  EXPECT_THROW(a.inc(std::numeric_limits<double>::quiet_NaN()), InputError);
  EXPECT_EQ(a.value(), 0);
  m.counter("name:with_colon", "Colons are allowed in metric names.").inc();
  parse_exposition(m.render());
}

// Many threads register, update and render at once (the server's HTTP threads and engine
// thread); the totals are exact and every render in between reads as valid exposition text with
// consistent histograms.
TEST(Metrics, ConcurrentUpdatesGiveExactTotals) {
  Metrics m;
  constexpr int kThreads = 8, kPerThread = 20000;
  std::vector<std::thread> threads;
  std::atomic<bool> done{false};
  std::atomic<int> renders{0};
  std::string reader_error;
  std::thread reader([&] {
    try {
      while (!done.load()) {
        parse_exposition(m.render());
        ++renders;
      }
    } catch (const std::exception& e) {
      reader_error = e.what();
    }
  });
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Gauge& running = m.gauge("running", "Running.");
      Histogram& h = m.histogram("lat_seconds", "Latency.", {0.5, 1.5});
      for (int i = 0; i < kPerThread; ++i) {
        // Looked up each time on purpose: registration races too.
        m.counter("req_total", "Requests.", {{"parity", t % 2 ? "odd" : "even"}}).inc();
        m.counter("tokens_total", "Tokens.").inc(3);
        running.inc();
        h.observe(i % 3);  // 0, 1, 2: one third in each bucket
        running.dec();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  done = true;
  reader.join();
  EXPECT_EQ(reader_error, "");
  EXPECT_GT(renders.load(), 0);
  EXPECT_EQ(m.counter("req_total", "Requests.", {{"parity", "odd"}}).value(), kThreads / 2 * kPerThread);
  EXPECT_EQ(m.counter("req_total", "Requests.", {{"parity", "even"}}).value(), kThreads / 2 * kPerThread);
  EXPECT_EQ(m.counter("tokens_total", "Tokens.").value(), 3.0 * kThreads * kPerThread);
  EXPECT_EQ(m.gauge("running", "Running.").value(), 0);
  const Histogram::Snapshot s = m.histogram("lat_seconds", "Latency.", {0.5, 1.5}).snapshot();
  const uint64_t n = uint64_t{kThreads} * kPerThread;
  // kPerThread = 20000 = 3 * 6666 + 2: per thread 6667 zeros, 6667 ones, 6666 twos.
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{kThreads * 6667u, kThreads * 13334u, n}));
  EXPECT_EQ(s.sum, kThreads * (6667.0 + 2 * 6666.0));
  EXPECT_EQ(s.count, n);
}

TEST(Metrics, CheckerRejectsBrokenText) {
  // The checker itself must be able to fail, or the parse_exposition calls above prove nothing.
  EXPECT_THROW(parse_exposition("x 1\n"), std::runtime_error);  // no HELP/TYPE
  EXPECT_THROW(parse_exposition("# HELP x X.\n# TYPE x counter\nx{a=\"1} 1\n"), std::runtime_error);
  EXPECT_THROW(parse_exposition("# HELP x X.\n# TYPE x counter\nx{a=\"\\q\"} 1\n"), std::runtime_error);
  EXPECT_THROW(parse_exposition("# HELP x X.\n# TYPE x counter\nx one\n"), std::runtime_error);
  EXPECT_THROW(parse_exposition("# HELP x X.\n# TYPE x counter\nx 1\nx 2\n"), std::runtime_error);
  EXPECT_THROW(parse_exposition("# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                                "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"),
               std::runtime_error);  // not cumulative
  EXPECT_THROW(parse_exposition("# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n"),
               std::runtime_error);  // _count != +Inf
  EXPECT_THROW(parse_exposition("# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\n"),
               std::runtime_error);  // no +Inf
  EXPECT_NO_THROW(parse_exposition("# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\n"
                                   "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"));
}

}  // namespace
}  // namespace concord::serve
