// The Prometheus registry and its text exposition (metrics.h).
#include "concord/serve/metrics.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::serve {

struct Metrics::Series {
  std::vector<std::string> values;  // label values, in the family's label order
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
};

struct Metrics::Family {
  MetricType type;
  std::string help;
  std::vector<std::string> label_names;
  std::vector<double> buckets;  // histograms
  // Keyed by the label values, so render() walks the series in a stable, sorted order.
  std::map<std::vector<std::string>, std::unique_ptr<Series>> series;
};

namespace {

const char* type_name(MetricType t) {
  switch (t) {
    case MetricType::counter: return "counter";
    case MetricType::gauge: return "gauge";
    case MetricType::histogram: return "histogram";
  }
  return "?";
}

bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool valid_metric_name(std::string_view n) {
  if (n.empty() || !(is_alpha(n[0]) || n[0] == ':')) return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return is_alpha(c) || is_digit(c) || c == ':'; });
}

bool valid_label_name(std::string_view n) {
  if (n.empty() || !is_alpha(n[0]) || n.substr(0, 2) == "__") return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return is_alpha(c) || is_digit(c); });
}

// name{a="x",b="y"<extra>} with `extra` an already formatted ,le="..." (or empty).
void write_sample(std::string& out, std::string_view name, const std::vector<std::string>& label_names,
                  const std::vector<std::string>& values, std::string_view extra, std::string_view value) {
  out += name;
  if (!label_names.empty() || !extra.empty()) {
    out += '{';
    for (size_t i = 0; i < label_names.size(); ++i) {
      if (i > 0) out += ',';
      out += fmt::format("{}=\"{}\"", label_names[i], escape_label_value(values[i]));
    }
    if (!extra.empty()) {
      if (!label_names.empty()) out += ',';
      out += extra;
    }
    out += '}';
  }
  out += ' ';
  out += value;
  out += '\n';
}

}  // namespace

std::string escape_help(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '"') out += "\\\"";
    else out += c;
  }
  return out;
}

std::string format_metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);  // shortest round-trip form: "3", "0.25", "1e+21"
}

void Counter::inc(double amount) {
  if (!(amount >= 0) || std::isinf(amount))
    throw InputError(fmt::format("[metrics] a counter can only grow; inc({}) is not allowed", amount));
  value_.fetch_add(amount, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  // The first bound >= value: le is inclusive. NaN compares false everywhere and lands past the
  // last bound, in +Inf only.
  const size_t bucket = static_cast<size_t>(
      std::find_if(bounds_.begin(), bounds_.end(), [&](double b) { return value <= b; }) - bounds_.begin());
  const std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(counts_.size());
  const std::lock_guard lock(mutex_);
  uint64_t running = 0;
  for (size_t i = 0; i < counts_.size(); ++i) s.cumulative[i] = running += counts_[i];
  s.sum = sum_;
  s.count = count_;
  return s;
}

Metrics::Metrics() = default;
Metrics::~Metrics() = default;

Metrics::Series& Metrics::series(std::string_view name, std::string_view help, MetricType type,
                                 const Labels& labels, const std::vector<double>* buckets) {
  if (!valid_metric_name(name))
    throw InputError(fmt::format("[metrics] '{}' is not a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)", name));
  std::vector<std::string> names, values;
  for (const auto& [label, value] : labels) {
    if (!valid_label_name(label))
      throw InputError(fmt::format("[metrics] {}: '{}' is not a label name ([a-zA-Z_][a-zA-Z0-9_]*, "
                                   "not starting with __)", name, label));
    if (type == MetricType::histogram && label == "le")
      throw InputError(fmt::format("[metrics] {}: the label 'le' is the histogram's own", name));
    if (std::find(names.begin(), names.end(), label) != names.end())
      throw InputError(fmt::format("[metrics] {}: label '{}' given twice", name, label));
    names.push_back(label);
    values.push_back(value);
  }
  if (buckets) {
    for (size_t i = 0; i < buckets->size(); ++i) {
      if (!std::isfinite((*buckets)[i]) || (i > 0 && !((*buckets)[i - 1] < (*buckets)[i])))
        throw InputError(fmt::format("[metrics] {}: histogram buckets must be finite and strictly "
                                     "increasing (+Inf is implied)", name));
    }
  }

  const std::lock_guard lock(mutex_);
  auto it = families_.find(name);
  if (it == families_.end()) {
    auto f = std::make_unique<Family>();
    f->type = type;
    f->help = std::string(help);
    f->label_names = names;
    if (buckets) f->buckets = *buckets;
    it = families_.emplace(std::string(name), std::move(f)).first;
  }
  Family& f = *it->second;
  if (f.type != type)
    throw InputError(fmt::format("[metrics] {} is registered as a {}, not a {}", name, type_name(f.type),
                                 type_name(type)));
  if (f.help != help)
    throw InputError(fmt::format("[metrics] {} is registered with another help text", name));
  if (f.label_names != names)
    throw InputError(fmt::format("[metrics] {} has labels ({}), not ({})", name, fmt::join(f.label_names, ","),
                                 fmt::join(names, ",")));
  if (buckets && f.buckets != *buckets)
    throw InputError(fmt::format("[metrics] {} is registered with other buckets", name));

  auto& slot = f.series[values];
  if (!slot) {
    slot = std::make_unique<Series>();
    slot->values = values;
    switch (type) {
      case MetricType::counter: slot->counter = std::make_unique<Counter>(); break;
      case MetricType::gauge: slot->gauge = std::make_unique<Gauge>(); break;
      case MetricType::histogram: slot->histogram = std::make_unique<Histogram>(f.buckets); break;
    }
  }
  return *slot;
}

Counter& Metrics::counter(std::string_view name, std::string_view help, const Labels& labels) {
  return *series(name, help, MetricType::counter, labels, nullptr).counter;
}

Gauge& Metrics::gauge(std::string_view name, std::string_view help, const Labels& labels) {
  return *series(name, help, MetricType::gauge, labels, nullptr).gauge;
}

Histogram& Metrics::histogram(std::string_view name, std::string_view help, const std::vector<double>& buckets,
                              const Labels& labels) {
  return *series(name, help, MetricType::histogram, labels, &buckets).histogram;
}

std::string Metrics::render() const {
  std::string out;
  const std::lock_guard lock(mutex_);
  for (const auto& [name, f] : families_) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escape_help(f->help), name, type_name(f->type));
    for (const auto& [values, s] : f->series) {
      switch (f->type) {
        case MetricType::counter:
          write_sample(out, name, f->label_names, values, "", format_metric_value(s->counter->value()));
          break;
        case MetricType::gauge:
          write_sample(out, name, f->label_names, values, "", format_metric_value(s->gauge->value()));
          break;
        case MetricType::histogram: {
          const Histogram::Snapshot h = s->histogram->snapshot();
          const std::string bucket = name + "_bucket";
          for (size_t i = 0; i <= h.bounds.size(); ++i) {
            const std::string le = i < h.bounds.size() ? format_metric_value(h.bounds[i]) : "+Inf";
            write_sample(out, bucket, f->label_names, values, fmt::format("le=\"{}\"", le),
                         std::to_string(h.cumulative[i]));
          }
          write_sample(out, name + "_sum", f->label_names, values, "", format_metric_value(h.sum));
          write_sample(out, name + "_count", f->label_names, values, "", std::to_string(h.count));
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace concord::serve
