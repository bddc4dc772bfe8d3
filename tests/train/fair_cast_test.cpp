// Fair Cast metrics: the served ulp against the formats' definitions, and the lag the three
// export rules give a slowly drifting weight (round-to-nearest lags by about ulp/(2u) steps,
// stochastic rounding and error feedback do not).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "concord/numerics/check.h"
#include "concord/train/export.h"
#include "concord/train/fair_cast.h"

namespace concord::train {
namespace {

using numerics::Format;

float bf16_from_bits(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

TEST(FairCast, ServedUlpMatchesTheNextRepresentableValue) {
  // bf16: for every positive normal code, ulp(s) = the next code's value − s (also at the top of a
  // binade, where the next value starts the next binade one ulp up).
  for (uint32_t code = 0x0080; code < 0x7F7F; ++code) {
    const float s = bf16_from_bits(static_cast<uint16_t>(code));
    const float next = bf16_from_bits(static_cast<uint16_t>(code + 1));
    const double spacing = static_cast<double>(next) - s;
    const double ulp = served_ulp(Format::bf16, s);
    ASSERT_EQ(ulp, spacing) << "code " << code;
  }
  EXPECT_EQ(served_ulp(Format::bf16, 0.0f), std::ldexp(1.0, -133));
  EXPECT_EQ(served_ulp(Format::bf16, 1.0f), std::ldexp(1.0, -7));
  EXPECT_EQ(served_ulp(Format::bf16, -0.75f), std::ldexp(1.0, -8));
  EXPECT_EQ(served_ulp(Format::e4m3, 448.0f), 32.0);
  EXPECT_EQ(served_ulp(Format::e4m3, 1.0f), 0.125);
  EXPECT_EQ(served_ulp(Format::e4m3, 0.001f), std::ldexp(1.0, -9));  // subnormal spacing
  EXPECT_EQ(served_ulp(Format::e2m1, 5.0f), 2.0);
  EXPECT_EQ(served_ulp(Format::f32, 1.0f), std::ldexp(1.0, -23));
  EXPECT_THROW(served_ulp(Format::int8, 1.0f), InputError);
  EXPECT_THROW(FairCastMeter{Format::e8m0}, InputError);
}

// n weights drifting up by u = ulp/50 per step from random bf16 values in [1, 2), exported with
// `rule` to bf16 each step; returns the meter's last step.
FairCastStep drift(const char* rule, int steps, FairCastMeter& meter) {
  const int n = 256;
  const double ulp = std::ldexp(1.0, -7);
  std::mt19937 gen(7);
  std::vector<double> start(n);
  for (double& s : start) s = 1.0 + std::ldexp(static_cast<double>(gen() % 100), -7);
  auto export_rule = make_export_rule(rule, Format::bf16, /*seed=*/3);
  std::vector<float> master(n), served(n);
  FairCastStep last;
  for (int t = 0; t <= steps; ++t) {
    for (int i = 0; i < n; ++i) master[i] = static_cast<float>(start[i] + t * ulp / 50);
    export_rule->apply(0, master, served, 16, 16, static_cast<uint64_t>(t));  // a 16x16 matrix
    meter.begin_step(static_cast<uint64_t>(t));
    meter.record(0, master, served);
    last = meter.end_step();
  }
  return last;
}

TEST(FairCast, RoundToNearestLagsByHalfAnUlpOfDrift) {
  FairCastMeter meter(Format::bf16);
  const FairCastStep s = drift("rne", 400, meter);
  // After a move the master sits just above the midpoint, half an ulp below the new served value:
  // after ulp/(2u) = 25 more steps (26 for a drift strictly above half an ulp) the event opens,
  // and it closes when the master passes the next midpoint, ~50 steps after the move: lag 23-24.
  EXPECT_GT(s.lag.events, 256 * 5);
  EXPECT_GE(s.lag.median, 22);
  EXPECT_LE(s.lag.median, 25);
  EXPECT_LE(s.lag.p90, 25);
  // Between moves the served copy holds still: about one weight in 50 changes per step.
  EXPECT_NEAR(s.changed_fraction, 1.0 / 50, 0.03);
  EXPECT_LE(s.err_ulp_max, 0.5 + 1e-6);  // RNE: within half an ulp
  EXPECT_EQ(s.err_ulp_histogram[3] + s.err_ulp_histogram[4], 0);
}

TEST(FairCast, StochasticRoundingAndErrorFeedbackRemoveTheLag) {
  for (const char* rule : {"sr", "ef"}) {
    FairCastMeter meter(Format::bf16);
    const FairCastStep s = drift(rule, 400, meter);
    // sr: events open and close within a step or two; ef: the served value dithers between the
    // two neighbours in proportion, so the drift since a move never reaches half an ulp.
    EXPECT_LE(s.lag.median, 2) << rule;  // against 23-24 for rne
    EXPECT_LE(s.lag.p90, 10) << rule;  // rne: 23-25
    EXPECT_LT(s.lag.pending, 256 / 8) << rule;
    EXPECT_LT(s.err_ulp_max, 1.0 + 1e-6) << rule;  // never a full ulp away
  }
}

TEST(FairCast, UpdateRealizationAndChangedFraction) {
  FairCastMeter meter(Format::bf16);
  std::vector<float> master{1.0f, 2.0f, 3.0f, 4.0f}, served = master;
  meter.begin_step(0);
  meter.record(0, master, served);  // starting point
  FairCastStep s0 = meter.end_step();
  EXPECT_EQ(s0.weights, 0);
  // The served copy follows the master exactly: realization 1, every weight changed.
  for (float& m : master) m += 1.0f;
  served = master;
  meter.begin_step(1);
  meter.record(0, master, served);
  FairCastStep s1 = meter.end_step();
  EXPECT_EQ(s1.weights, 4);
  EXPECT_DOUBLE_EQ(s1.update_realization, 1.0);
  EXPECT_DOUBLE_EQ(s1.changed_fraction, 1.0);
  // The master moves, the served copy does not: realization 0.
  for (float& m : master) m += 1e-3f;
  meter.begin_step(2);
  meter.record(0, master, served);
  FairCastStep s2 = meter.end_step();
  EXPECT_DOUBLE_EQ(s2.update_realization, 0.0);
  EXPECT_EQ(s2.changed, 0);
  // Neither moves: realization undefined (NaN, null in JSON).
  meter.begin_step(3);
  meter.record(0, master, served);
  FairCastStep s3 = meter.end_step();
  EXPECT_TRUE(std::isnan(s3.update_realization));
  EXPECT_TRUE(s3.to_json()["update_realization"].is_null());
  EXPECT_EQ(s3.to_json()["lag"]["histogram"].size(), static_cast<size_t>(LagSummary::kBins));
}

// The meter's chunked, parallel record against the definitions written as one plain loop per
// weight (served_ulp from std::ilogb and std::ldexp, the sums in index order): counts, lags and
// the histogram equal; the sums agree to rounding (chunk order) and are the same at 1 and 2
// threads. A tensor of 9.5 chunks with drifting masters, an RNE served copy, zeros, subnormals.
TEST(FairCast, ChunkedRecordMatchesAPlainLoopAtAnyThreadCount) {
  const size_t n = (size_t{1} << 15) * 19 / 2;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> master(n);
  for (size_t i = 0; i < n; ++i) master[i] = i % 97 == 0 ? 0.0f : i % 89 == 0 ? 1e-40f : dist(rng);
  auto rne = [](float x) {  // bf16, round to nearest even
    uint32_t b;
    std::memcpy(&b, &x, 4);
    b = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  };
  struct Plain {  // the definitions, one weight at a time
    std::vector<float> m, s, anchor;
    std::vector<int64_t> opened;
    std::vector<int64_t> lag_counts;
    double dm2 = 0, ds2 = 0, err_sum = 0, err_max = 0;
    int64_t changed = 0;
  } plain;
  auto run = [&](int threads, bool with_plain) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    FairCastMeter meter(Format::bf16);
    std::vector<float> m = master, served(n);
    std::vector<FairCastStep> steps;
    std::mt19937 drift(11);
    std::normal_distribution<float> d(0.0f, 2e-4f);
    for (uint64_t step = 0; step < 6; ++step) {
      if (step > 0)
        for (float& x : m) x += d(drift);
      for (size_t i = 0; i < n; ++i) served[i] = rne(m[i]);
      meter.begin_step(step);
      meter.record(0, m, served);
      steps.push_back(meter.end_step());
      if (!with_plain) continue;
      if (step == 0) {
        plain.m = m, plain.s = served, plain.anchor = m, plain.opened.assign(n, -1);
        continue;
      }
      plain.dm2 = plain.ds2 = plain.err_sum = plain.err_max = 0;
      plain.changed = 0;
      for (size_t i = 0; i < n; ++i) {
        plain.dm2 += std::pow(static_cast<double>(m[i]) - plain.m[i], 2);
        plain.ds2 += std::pow(static_cast<double>(served[i]) - plain.s[i], 2);
        const double err = std::abs(static_cast<double>(served[i]) - m[i]) / served_ulp(Format::bf16, served[i]);
        plain.err_sum += err;
        plain.err_max = std::max(plain.err_max, err);
        if (plain.opened[i] < 0 &&
            std::abs(static_cast<double>(m[i]) - plain.anchor[i]) > 0.5 * served_ulp(Format::bf16, plain.s[i]))
          plain.opened[i] = static_cast<int64_t>(step);
        uint32_t a, b;
        std::memcpy(&a, &served[i], 4);
        std::memcpy(&b, &plain.s[i], 4);
        if (a != b) {
          ++plain.changed;
          if (plain.opened[i] >= 0) {
            const auto lag = static_cast<size_t>(static_cast<int64_t>(step) - plain.opened[i]);
            if (lag >= plain.lag_counts.size()) plain.lag_counts.resize(lag + 1, 0);
            ++plain.lag_counts[lag];
          }
          plain.opened[i] = -1;
          plain.anchor[i] = m[i];
        }
        plain.m[i] = m[i];
        plain.s[i] = served[i];
      }
      const FairCastStep& s = steps.back();
      EXPECT_EQ(s.changed, plain.changed) << step;
      EXPECT_NEAR(s.master_update_norm, std::sqrt(plain.dm2), 1e-12 * std::sqrt(plain.dm2)) << step;
      EXPECT_NEAR(s.served_update_norm, std::sqrt(plain.ds2), 1e-12 * std::sqrt(plain.ds2)) << step;
      EXPECT_NEAR(s.err_ulp_mean * static_cast<double>(n), plain.err_sum, 1e-12 * plain.err_sum) << step;
      EXPECT_EQ(s.err_ulp_max, plain.err_max) << step;
    }
    omp_set_num_threads(saved);
    return std::make_pair(steps, meter.lag());
  };
  const auto [two, lag_two] = run(2, true);
  int64_t events = 0;
  for (int64_t c : plain.lag_counts) events += c;
  EXPECT_GT(events, 1000);  // the drift closes many events: the lag bookkeeping is exercised
  EXPECT_EQ(lag_two.events, events);
  EXPECT_EQ(lag_two.pending, std::count_if(plain.opened.begin(), plain.opened.end(), [](int64_t o) { return o >= 0; }));
  const auto [one, lag_one] = run(1, false);
  for (size_t k = 0; k < two.size(); ++k)
    EXPECT_EQ(one[k].to_json().dump(), two[k].to_json().dump()) << "step " << k;
}

TEST(FairCast, LagBinsAndMisuse) {
  EXPECT_EQ(LagSummary::bin_lo(0), 0);
  EXPECT_EQ(LagSummary::bin_lo(1), 1);
  EXPECT_EQ(LagSummary::bin_lo(2), 2);
  EXPECT_EQ(LagSummary::bin_lo(11), 1024);
  FairCastMeter meter(Format::bf16);
  std::vector<float> a{1.0f}, b{1.0f, 2.0f};
  EXPECT_THROW(meter.record(0, a, a), InternalError);  // outside a step
  meter.begin_step(5);
  EXPECT_THROW(meter.record(0, a, b), InternalError);  // mismatched sizes
  meter.record(0, a, a);
  meter.end_step();
  EXPECT_THROW(meter.begin_step(5), InternalError);  // steps must increase
  meter.begin_step(6);
  EXPECT_THROW(meter.record(0, b, b), InternalError);  // a tensor changed size
}

}  // namespace
}  // namespace concord::train
