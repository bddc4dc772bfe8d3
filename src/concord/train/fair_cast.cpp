#include "concord/train/fair_cast.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/numerics/check.h"

namespace concord::train {

namespace {

int lag_bin(int64_t lag) {
  if (lag <= 0) return 0;
  int bin = 1;
  for (int64_t lo = 1; bin < LagSummary::kBins - 1 && lag >= 2 * lo; lo *= 2) ++bin;
  return bin;
}

int err_bin(double e) { return e < 0.25 ? 0 : e < 0.5 ? 1 : e < 1 ? 2 : e < 2 ? 3 : 4; }

bool same_bits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

// Nearest-rank quantile of the values counted in counts (counts[v] occurrences of v, n in all).
double quantile(const std::vector<int64_t>& counts, int64_t n, double q) {
  if (n == 0) return 0;
  const auto rank = static_cast<int64_t>(std::max(1.0, std::ceil(q * static_cast<double>(n))));
  int64_t seen = 0;
  for (size_t v = 0; v < counts.size(); ++v) {
    seen += counts[v];
    if (seen >= rank) return static_cast<double>(v);
  }
  return static_cast<double>(counts.size() - 1);
}

}  // namespace

int64_t LagSummary::bin_lo(int bin) { return bin == 0 ? 0 : int64_t{1} << (bin - 1); }

nlohmann::json LagSummary::to_json() const {
  nlohmann::json bins = nlohmann::json::array();
  for (int b = 0; b < kBins; ++b) bins.push_back({{"lo", bin_lo(b)}, {"count", histogram[static_cast<size_t>(b)]}});
  return {{"events", events}, {"pending", pending}, {"median", median}, {"p90", p90},
          {"histogram", bins}};
}

nlohmann::json FairCastStep::to_json() const {
  return {{"step", step},
          {"weights", weights},
          {"changed_fraction", changed_fraction},
          {"update_realization", std::isfinite(update_realization)
                                     ? nlohmann::json(update_realization)
                                     : nlohmann::json(nullptr)},
          {"err_ulp", {{"mean", err_ulp_mean},
                       {"max", err_ulp_max},
                       {"histogram", err_ulp_histogram},
                       {"edges", {0, 0.25, 0.5, 1, 2}}}},
          {"lag_events_closed", lag_events_closed},
          {"lag", lag.to_json()}};
}

double served_ulp(numerics::Format f, float s) {
  const numerics::FormatTraits& t = numerics::traits(f);
  if (t.is_integer() || t.specials == numerics::Specials::e8m0)
    throw InputError(fmt::format("[train] fair cast: served format {} has no ulp (not a float format)",
                                 static_cast<int>(f)));
  int e = t.emin;
  if (s != 0.0f && std::isfinite(s)) e = std::max(std::ilogb(s), t.emin);
  return std::ldexp(1.0, e - t.mantissa_bits);
}

FairCastMeter::FairCastMeter(numerics::Format served) : format_(served) {
  (void)served_ulp(served, 1.0f);  // rejects formats without an ulp
  const numerics::FormatTraits& t = numerics::traits(served);
  // record()'s UlpRule builds 2^(e - mantissa_bits) as a normal double, e >= the float's -149.
  CONCORD_CHECK(std::min(t.emin, -149) - t.mantissa_bits > -1022 && t.emin - t.mantissa_bits < 1023,
                "fair cast: a served format whose ulp is not a normal double");
}

void FairCastMeter::begin_step(uint64_t step) {
  CONCORD_CHECK(!step_open_, "fair cast: begin_step without end_step");
  CONCORD_CHECK(step > current_step_ || (current_step_ == 0 && tensors_.empty()),
                "fair cast: steps must increase");
  CONCORD_CHECK(step < (uint64_t{1} << 24), "fair cast: step past 2^24 (open events are stored as int32 and checkpointed as floats)");
  current_step_ = step;
  step_open_ = true;
  weights_ = changed_ = closed_ = 0;
  dm2_ = ds2_ = err_sum_ = err_max_ = 0;
  err_hist_ = {};
}

namespace {

// served_ulp without the library calls, for the meter's inner loop: the same value for every
// float (the exponent read off the bits; float subnormals through ilogb), built as a double
// from its bits. FairCastMeter's constructor checks that e - mantissa_bits stays a normal double.
struct UlpRule {
  int emin = 0, mantissa_bits = 0;
  double operator()(float s) const {
    const uint32_t bits = std::bit_cast<uint32_t>(s) & 0x7FFFFFFFu;
    int e = emin;
    if (bits >= 0x00800000u && bits < 0x7F800000u) e = std::max(static_cast<int>(bits >> 23) - 127, emin);
    else if (bits != 0 && bits < 0x00800000u) e = std::max(std::ilogb(s), emin);
    return std::bit_cast<double>(static_cast<uint64_t>(e - mantissa_bits + 1023) << 52);
  }
};

// What one chunk of a record adds to the step's accumulators.
struct ChunkSums {
  double dm2 = 0, ds2 = 0, err_sum = 0, err_max = 0;
  std::array<int64_t, 5> err_hist{};
  int64_t changed = 0, closed = 0;
  std::vector<int64_t> lag_counts;  // closed events by lag, as the meter's lag_counts_
};

}  // namespace

void FairCastMeter::record(int tensor, std::span<const float> master, std::span<const float> served) {
  CONCORD_CHECK(step_open_, "fair cast: record outside begin_step/end_step");
  CONCORD_CHECK(tensor >= 0 && master.size() == served.size(), "fair cast: bad record");
  if (static_cast<size_t>(tensor) >= tensors_.size()) tensors_.resize(static_cast<size_t>(tensor) + 1);
  Tensor& t = tensors_[static_cast<size_t>(tensor)];
  const size_t n = master.size();
  if (t.master.empty()) {  // starting point
    t.master.assign(master.begin(), master.end());
    t.served.assign(served.begin(), served.end());
    t.anchor = t.master;
    t.opened.assign(n, -1);
    return;
  }
  CONCORD_CHECK(t.master.size() == n, "fair cast: a tensor changed size between steps");
  const auto step = static_cast<int32_t>(current_step_);
  const numerics::FormatTraits& traits = numerics::traits(format_);
  const UlpRule ulp{traits.emin, traits.mantissa_bits};
  // Fixed chunks, summed in chunk order: the same sums whatever the thread count.
  constexpr size_t kChunk = size_t{1} << 15;
  const size_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<ChunkSums> sums(chunks);
#pragma omp parallel for schedule(static) if (n >= 4 * kChunk)
  for (size_t c = 0; c < chunks; ++c) {
    ChunkSums& cs = sums[c];
    for (size_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
      const double dm = static_cast<double>(master[i]) - t.master[i];
      const double ds = static_cast<double>(served[i]) - t.served[i];
      cs.dm2 += dm * dm;
      cs.ds2 += ds * ds;
      const double err = std::abs(static_cast<double>(served[i]) - master[i]) / ulp(served[i]);
      cs.err_sum += err;
      cs.err_max = std::max(cs.err_max, err);
      ++cs.err_hist[static_cast<size_t>(err_bin(err))];
      // Lag: open when the drift since the last move passes half an ulp of the served value the
      // drift was measured against, close when the served value moves.
      if (t.opened[i] < 0 && std::abs(static_cast<double>(master[i]) - t.anchor[i]) > 0.5 * ulp(t.served[i]))
        t.opened[i] = step;
      if (!same_bits(served[i], t.served[i])) {
        ++cs.changed;
        if (t.opened[i] >= 0) {
          const auto lag = static_cast<size_t>(step - t.opened[i]);
          if (lag >= cs.lag_counts.size()) cs.lag_counts.resize(lag + 1, 0);
          ++cs.lag_counts[lag];
          ++cs.closed;
        }
        t.opened[i] = -1;
        t.anchor[i] = master[i];
      }
      t.master[i] = master[i];
      t.served[i] = served[i];
    }
  }
  for (const ChunkSums& cs : sums) {
    dm2_ += cs.dm2;
    ds2_ += cs.ds2;
    err_sum_ += cs.err_sum;
    err_max_ = std::max(err_max_, cs.err_max);
    for (size_t b = 0; b < err_hist_.size(); ++b) err_hist_[b] += cs.err_hist[b];
    changed_ += cs.changed;
    closed_ += cs.closed;
    lag_events_ += cs.closed;
    if (cs.lag_counts.size() > lag_counts_.size()) lag_counts_.resize(cs.lag_counts.size(), 0);
    for (size_t l = 0; l < cs.lag_counts.size(); ++l) lag_counts_[l] += cs.lag_counts[l];
  }
  weights_ += static_cast<int64_t>(n);
}

LagSummary FairCastMeter::lag() const {
  LagSummary s;
  for (size_t l = 0; l < lag_counts_.size(); ++l)
    s.histogram[static_cast<size_t>(lag_bin(static_cast<int64_t>(l)))] += lag_counts_[l];
  s.events = lag_events_;
  for (const Tensor& t : tensors_)
    s.pending += std::count_if(t.opened.begin(), t.opened.end(), [](int64_t o) { return o >= 0; });
  s.median = quantile(lag_counts_, lag_events_, 0.5);
  s.p90 = quantile(lag_counts_, lag_events_, 0.9);
  return s;
}

FairCastStep FairCastMeter::end_step() {
  CONCORD_CHECK(step_open_, "fair cast: end_step without begin_step");
  step_open_ = false;
  FairCastStep r;
  r.step = current_step_;
  r.weights = weights_;
  r.changed = changed_;
  r.changed_fraction = weights_ ? static_cast<double>(changed_) / static_cast<double>(weights_) : 0;
  r.master_update_norm = std::sqrt(dm2_);
  r.served_update_norm = std::sqrt(ds2_);
  r.update_realization = dm2_ > 0 ? r.served_update_norm / r.master_update_norm
                                   : std::numeric_limits<double>::quiet_NaN();
  r.err_ulp_histogram = err_hist_;
  r.err_ulp_mean = weights_ ? err_sum_ / static_cast<double>(weights_) : 0;
  r.err_ulp_max = err_max_;
  r.lag_events_closed = closed_;
  r.lag = lag();
  return r;
}

std::vector<NamedTensor> FairCastMeter::state_tensors(std::string_view prefix) const {
  CONCORD_CHECK(!step_open_, "fair cast: state_tensors inside a step");
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    const auto n = static_cast<int64_t>(t.master.size());
    const std::string base = fmt::format("{}.{}.", prefix, i);
    out.push_back({base + "master", {n}, t.master});
    out.push_back({base + "served", {n}, t.served});
    out.push_back({base + "anchor", {n}, t.anchor});
    std::vector<float> opened(t.opened.size());
    for (size_t k = 0; k < opened.size(); ++k) {
      // Steps are exact in a float below 2^24 (checkpoints name steps below 10^8; RL runs are far shorter).
      CONCORD_CHECK(t.opened[k] < (int64_t{1} << 24), "fair cast: step too large to checkpoint");
      opened[k] = static_cast<float>(t.opened[k]);
    }
    out.push_back({base + "opened", {n}, std::move(opened)});
  }
  return out;
}

nlohmann::json FairCastMeter::state_json() const {
  return {{"step", current_step_}, {"tensors", tensors_.size()}, {"lag_events", lag_events_},
          {"lag_counts", lag_counts_}};
}

void FairCastMeter::restore(std::span<const NamedTensor> tensors, std::string_view prefix,
                            const nlohmann::json& state) {
  CONCORD_CHECK(!step_open_, "fair cast: restore inside a step");
  std::vector<Tensor> restored;
  std::vector<int64_t> counts;
  int64_t events = 0;
  uint64_t step = 0;
  try {
    step = state.at("step").get<uint64_t>();
    restored.resize(state.at("tensors").get<size_t>());
    events = state.at("lag_events").get<int64_t>();
    counts = state.at("lag_counts").get<std::vector<int64_t>>();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("[train] fair cast state: {}", e.what()));
  }
  int64_t counted = 0;
  for (int64_t c : counts) {
    if (c < 0) throw InputError("[train] fair cast state: a negative lag count");
    counted += c;
  }
  if (counted != events)
    throw InputError(fmt::format("[train] fair cast state: lag counts add up to {}, not lag_events {}",
                                 counted, events));
  for (size_t i = 0; i < restored.size(); ++i) {
    const std::string base = fmt::format("{}.{}.", prefix, i);
    auto get = [&](const char* what) -> const std::vector<float>& {
      const NamedTensor* t = find_tensor(tensors, base + what);
      if (t == nullptr) throw InputError(fmt::format("[train] fair cast state: tensor '{}{}' is missing", base, what));
      return t->values;
    };
    Tensor& t = restored[i];
    t.master = get("master");
    t.served = get("served");
    t.anchor = get("anchor");
    const std::vector<float>& opened = get("opened");
    const size_t n = t.master.size();
    if (t.served.size() != n || t.anchor.size() != n || opened.size() != n)
      throw InputError(fmt::format("[train] fair cast state: the tensors '{}*' differ in size", base));
    t.opened.resize(n);
    for (size_t k = 0; k < n; ++k) {
      const float o = opened[k];
      if (!(o == -1.0f || (o >= 0 && o <= static_cast<float>(step) && o == std::floor(o))))
        throw InputError(fmt::format("[train] fair cast state: '{}opened' holds {}, not a step in [0, {}] or -1",
                                     base, o, step));
      t.opened[k] = static_cast<int32_t>(o);
    }
  }
  tensors_ = std::move(restored);
  lag_counts_ = std::move(counts);
  lag_events_ = events;
  current_step_ = step;
}

}  // namespace concord::train
