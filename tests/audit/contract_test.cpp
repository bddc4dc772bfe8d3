// Slices, per-slice statistics, contracts (fit, JSON, check), SVG plots and the HTML report.
// Statistics are checked against a recomputation written here (slice membership parsed from the
// slice name, quantiles by integer nearest rank, sums in long double); guarantees against the
// formulas of docs/contracts.md written out again.
#include "concord/audit/contract.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "concord/audit/bounds.h"
#include "concord/audit/report.h"
#include "concord/audit/svg.h"
#include "concord/numerics/check.h"
#include "audit/svg_bars.h"
#include "train/temp_dir.h"

namespace concord::audit {
namespace {

using nlohmann::json;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double ref_tv_bound(double eps) { return std::tanh(eps / 4); }
double ref_kl_bound(double eps) { return std::min(eps * eps / 8, eps * std::tanh(eps / 4)); }

// A divergence that satisfies every guarantee with room to spare.
RowDivergence make_div(double osc, double margin, bool flip = false) {
  RowDivergence d;
  d.osc = osc;
  d.linf = osc * 0.75;
  d.max_abs_dlogp = osc * 0.6;
  d.tv = ref_tv_bound(osc) * 0.5;
  d.kl = ref_kl_bound(osc) * 0.4;
  d.kl_reverse = ref_kl_bound(osc) * 0.3;
  d.margin_ref = margin;
  d.flip_possible = !(margin > osc);
  d.flip = flip && d.flip_possible;
  d.top_ref = 3;
  d.top_cand = d.flip ? 4 : 3;
  return d;
}

RowRecord make_row(int64_t sequence, int32_t position, int32_t prompt_length, std::string task,
                   std::string label, RowDivergence div) {
  RowRecord r;
  r.info.sequence = sequence;
  r.info.position = position;
  r.info.prompt_length = prompt_length;
  r.info.task = std::move(task);
  r.info.label = std::move(label);
  r.div = div;
  return r;
}

// ---- slice membership, independently of the library: parsed from the slice's name ----

bool in_range(std::string_view range, int64_t v) {  // "[lo,hi)" or "[lo,inf)"
  const size_t comma = range.find(',');
  const int64_t lo = std::stoll(std::string(range.substr(1, comma - 1)));
  const std::string hi(range.substr(comma + 1, range.size() - comma - 2));
  return v >= lo && (hi == "inf" || v < std::stoll(hi));
}

bool member(const std::string& slice, const RowRecord& r, double decided_margin) {
  if (slice == "all") return true;
  if (slice == "margin:decided") return r.div.margin_ref > decided_margin;
  if (slice == "margin:undecided") return r.div.margin_ref <= decided_margin;
  if (slice.rfind("task:", 0) == 0) return r.info.task == slice.substr(5);
  if (slice.rfind("label:", 0) == 0) return r.info.label == slice.substr(6);
  if (slice.rfind("prompt_len:", 0) == 0) return in_range(slice.substr(11), r.info.prompt_length);
  if (slice.rfind("position:", 0) == 0) return in_range(slice.substr(9), r.info.position);
  ADD_FAILURE() << "unexpected slice name " << slice;
  return false;
}

// Nearest rank for q = percent/100, in integers: ceil(percent·n/100).
double nearest_rank(std::vector<double> values, int64_t percent) {
  std::sort(values.begin(), values.end());
  const auto n = static_cast<int64_t>(values.size());
  const int64_t rank = (percent * n + 99) / 100;
  return values[static_cast<size_t>(rank - 1)];
}

std::vector<std::string> slice_names(const Measurement& m) {
  std::vector<std::string> names;
  for (const SliceStats& s : m.slices) names.push_back(s.slice);
  return names;
}

// Random rows over every dimension; fixed seed.
std::vector<RowRecord> random_rows(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const std::vector<std::string> tasks{"", "add", "mul", "sort"};
  const std::vector<std::string> labels{"", "", "x", "b<&>"};
  std::vector<RowRecord> rows;
  for (int i = 0; i < n; ++i) {
    const double osc = std::pow(10.0, -4 + 3 * unit(rng));
    const double margin = unit(rng) < 0.05 ? kInf : std::pow(10.0, -4 + 5 * unit(rng));
    const bool flip = unit(rng) < 0.5;
    rows.push_back(make_row(i / 7, static_cast<int32_t>(rng() % 100),
                            static_cast<int32_t>(rng() % 80), tasks[rng() % tasks.size()],
                            labels[rng() % labels.size()], make_div(osc, margin, flip)));
  }
  return rows;
}

std::string fmt_label(int i) { return (i < 10 ? "L0" : "L") + std::to_string(i); }

// ---- slices ----

TEST(ContractSlices, EdgesAreInclusiveBelowExclusiveAbove) {
  const SliceOptions options;  // edges {16, 64}, decided margin 1
  auto names = [&](int32_t prompt_length, int32_t position, double margin) {
    return slices_of(make_row(0, position, prompt_length, "", "", make_div(0.1, margin)).info,
                     make_div(0.1, margin), options);
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(names(0, 0, 0.5),
            (V{"all", "prompt_len:[0,16)", "position:[0,16)", "margin:undecided"}));
  EXPECT_EQ(names(15, 15, 1.0),
            (V{"all", "prompt_len:[0,16)", "position:[0,16)", "margin:undecided"}));
  EXPECT_EQ(names(16, 16, std::nextafter(1.0, 2.0)),
            (V{"all", "prompt_len:[16,64)", "position:[16,64)", "margin:decided"}));
  EXPECT_EQ(names(63, 63, 2.0),
            (V{"all", "prompt_len:[16,64)", "position:[16,64)", "margin:decided"}));
  EXPECT_EQ(names(64, 64, 0.0),
            (V{"all", "prompt_len:[64,inf)", "position:[64,inf)", "margin:undecided"}));
  EXPECT_EQ(names(100000, 2000000, kInf),  // V = 1: the margin is +inf, decided
            (V{"all", "prompt_len:[64,inf)", "position:[64,inf)", "margin:decided"}));
}

TEST(ContractSlices, TaskLabelAndCustomEdges) {
  SliceOptions options;
  options.prompt_length_edges = {};
  options.position_edges = {1, 2, 8};
  options.decided_margin = 0.25;
  const RowRecord r = make_row(0, 1, 5, "add", "a b", make_div(0.1, 0.25));
  EXPECT_EQ(slices_of(r.info, r.div, options),
            (std::vector<std::string>{"all", "prompt_len:[0,inf)", "position:[1,2)",
                                      "margin:undecided", "task:add", "label:a b"}));
  const RowRecord s = make_row(0, 9, 0, "", "only-label", make_div(0.1, 0.3));
  EXPECT_EQ(slices_of(s.info, s.div, options),
            (std::vector<std::string>{"all", "prompt_len:[0,inf)", "position:[8,inf)",
                                      "margin:decided", "label:only-label"}));
}

TEST(ContractSlices, RejectsBadOptionsAndRows) {
  const RowRecord r = make_row(0, 1, 5, "", "", make_div(0.1, 0.5));
  auto expect_error = [&](const SliceOptions& options, const char* needle) {
    try {
      slices_of(r.info, r.div, options);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  SliceOptions o;
  o.position_edges = {16, 16};
  expect_error(o, "position_edges");
  o = {};
  o.prompt_length_edges = {0, 4};
  expect_error(o, "prompt_length_edges");
  o = {};
  o.decided_margin = kNaN;
  expect_error(o, "decided_margin");
  o = {};
  o.margin_bins = {0.1, 0.01};
  expect_error(o, "margin_bins");

  RowRecord bad = r;
  bad.info.position = -1;
  EXPECT_THROW(slices_of(bad.info, bad.div, SliceOptions{}), InputError);
  bad = r;
  bad.div.osc = kNaN;
  EXPECT_THROW(measure(std::span(&bad, 1), SliceOptions{}, "a", "b", 8), InputError);
  bad = r;
  bad.div.margin_ref = kNaN;
  EXPECT_THROW(measure(std::span(&bad, 1), SliceOptions{}, "a", "b", 8), InputError);
}

// ---- quantiles and statistics ----

TEST(ContractMeasure, NearestRankQuantiles) {
  for (int n = 1; n <= 300; ++n) {
    SliceStats s;
    for (int i = 1; i <= n; ++i) s.osc_sorted.push_back(i);  // value = rank
    for (int64_t percent : {1, 7, 10, 29, 50, 57, 90, 99, 100}) {
      const int64_t rank = (percent * n + 99) / 100;
      ASSERT_EQ(s.osc_quantile(static_cast<double>(percent) / 100), static_cast<double>(rank))
          << "n=" << n << " q=" << percent << "%";
    }
  }
  SliceStats s;
  s.osc_sorted = {1, 2};
  EXPECT_THROW(s.osc_quantile(0.0), InputError);
  EXPECT_THROW(s.osc_quantile(1.01), InputError);
  EXPECT_THROW(s.osc_quantile(kNaN), InputError);
}

TEST(ContractMeasure, StatisticsMatchRecomputation) {
  std::vector<RowRecord> rows = random_rows(2000, 12345);
  const SliceOptions options;
  const Measurement m = measure(rows, options, "fp32", "bf16", 4242);
  EXPECT_EQ(m.ref, "fp32");
  EXPECT_EQ(m.cand, "bf16");
  EXPECT_EQ(m.vocab, 4242);
  // Every slice, in the documented order (labels sorted bytewise: "b<&>" < "x").
  EXPECT_EQ(slice_names(m),
            (std::vector<std::string>{
                "all", "prompt_len:[0,16)", "prompt_len:[16,64)", "prompt_len:[64,inf)",
                "position:[0,16)", "position:[16,64)", "position:[64,inf)", "margin:undecided",
                "margin:decided", "task:add", "task:mul", "task:sort", "label:b<&>", "label:x"}));
  int64_t rows_seen = 0;
  for (const SliceStats& s : m.slices) {
    std::vector<double> osc;
    long double tv_sum = 0, kl_sum = 0;
    double tv_max = 0, kl_max = 0, linf_max = 0, dlogp_max = 0;
    int64_t flips = 0, predicted = 0, missed = 0;
    std::vector<int64_t> bin_rows(options.margin_bins.size() + 1), bin_flips(bin_rows.size()),
        bin_predicted(bin_rows.size());
    for (const RowRecord& r : rows) {
      if (!member(s.slice, r, options.decided_margin)) continue;
      osc.push_back(r.div.osc);
      tv_sum += r.div.tv;
      kl_sum += r.div.kl;
      tv_max = std::max(tv_max, r.div.tv);
      kl_max = std::max(kl_max, r.div.kl);
      linf_max = std::max(linf_max, r.div.linf);
      dlogp_max = std::max(dlogp_max, r.div.max_abs_dlogp);
      flips += r.div.flip;
      predicted += r.div.flip_possible;
      missed += r.div.flip && !r.div.flip_possible;
      size_t bin = 0;
      while (bin < options.margin_bins.size() && r.div.margin_ref >= options.margin_bins[bin])
        ++bin;
      ++bin_rows[bin];
      bin_flips[bin] += r.div.flip;
      bin_predicted[bin] += r.div.flip_possible;
    }
    SCOPED_TRACE(s.slice);
    ASSERT_EQ(s.rows, static_cast<int64_t>(osc.size()));
    ASSERT_GT(s.rows, 0);
    if (s.slice == "all") rows_seen = s.rows;
    EXPECT_EQ(s.osc_p50, nearest_rank(osc, 50));
    EXPECT_EQ(s.osc_p90, nearest_rank(osc, 90));
    EXPECT_EQ(s.osc_p99, nearest_rank(osc, 99));
    EXPECT_EQ(s.osc_max, *std::max_element(osc.begin(), osc.end()));
    EXPECT_TRUE(std::is_sorted(s.osc_sorted.begin(), s.osc_sorted.end()));
    EXPECT_EQ(s.osc_sorted.size(), osc.size());
    const auto n = static_cast<long double>(osc.size());
    EXPECT_NEAR(s.tv_mean, static_cast<double>(tv_sum / n),
                1e-13 * static_cast<double>(tv_sum / n));
    EXPECT_NEAR(s.kl_mean, static_cast<double>(kl_sum / n),
                1e-13 * static_cast<double>(kl_sum / n));
    EXPECT_EQ(s.tv_max, tv_max);
    EXPECT_EQ(s.kl_max, kl_max);
    EXPECT_EQ(s.linf_max, linf_max);
    EXPECT_EQ(s.max_abs_dlogp, dlogp_max);
    EXPECT_EQ(s.flips, flips);
    EXPECT_EQ(s.predicted_flips, predicted);
    EXPECT_EQ(s.missed_flips, missed);
    EXPECT_EQ(s.missed_flips, 0);
    EXPECT_EQ(s.bound_violations, 0);
    ASSERT_EQ(s.by_margin.size(), bin_rows.size());
    for (size_t b = 0; b < bin_rows.size(); ++b) {
      EXPECT_EQ(s.by_margin[b].lo, b == 0 ? 0.0 : options.margin_bins[b - 1]);
      EXPECT_EQ(s.by_margin[b].hi, b == options.margin_bins.size() ? kInf : options.margin_bins[b]);
      EXPECT_EQ(s.by_margin[b].rows, bin_rows[b]);
      EXPECT_EQ(s.by_margin[b].flips, bin_flips[b]);
      EXPECT_EQ(s.by_margin[b].predicted, bin_predicted[b]);
    }
  }
  EXPECT_EQ(rows_seen, 2000);
  // Row order does not matter (beyond the rounding of the means).
  std::vector<RowRecord> reversed(rows.rbegin(), rows.rend());
  const Measurement r = measure(reversed, options, "fp32", "bf16", 4242);
  ASSERT_EQ(slice_names(r), slice_names(m));
  for (size_t i = 0; i < m.slices.size(); ++i) {
    EXPECT_EQ(r.slices[i].osc_sorted, m.slices[i].osc_sorted);
    EXPECT_EQ(r.slices[i].flips, m.slices[i].flips);
    EXPECT_NEAR(r.slices[i].tv_mean, m.slices[i].tv_mean, 1e-13 * m.slices[i].tv_mean);
  }
}

TEST(ContractMeasure, EmptySlicesAreOmitted) {
  std::vector<RowRecord> rows{make_row(0, 3, 4, "", "", make_div(0.5, 0.1)),
                              make_row(0, 70, 4, "", "", make_div(0.5, 0.2))};
  const Measurement m = measure(rows, SliceOptions{}, "a", "b", 10);
  EXPECT_EQ(slice_names(m), (std::vector<std::string>{"all", "prompt_len:[0,16)", "position:[0,16)",
                                                      "position:[64,inf)", "margin:undecided"}));
  EXPECT_EQ(m.find("margin:decided"), nullptr);
  ASSERT_NE(m.find("position:[64,inf)"), nullptr);
  EXPECT_EQ(m.find("position:[64,inf)")->rows, 1);
  EXPECT_TRUE(measure({}, SliceOptions{}, "a", "b", 10).slices.empty());
}

TEST(ContractMeasure, CountsEachKindOfBoundViolationOnce) {
  const double osc = 0.3;
  std::vector<RowRecord> rows;
  auto add = [&](auto mutate) {
    RowDivergence d = make_div(osc, 2.0);
    mutate(d);
    rows.push_back(make_row(0, static_cast<int32_t>(rows.size()), 0, "", "", d));
  };
  // Within the documented slack: not violations.
  add([&](RowDivergence& d) { d.max_abs_dlogp = osc * (1 + 1e-10); });
  add([&](RowDivergence& d) { d.tv = ref_tv_bound(osc) + 5e-13; });
  add([&](RowDivergence& d) { d.kl = ref_kl_bound(osc) * (1 + 1e-10); });
  add([&](RowDivergence& d) {
    d.max_abs_dlogp = osc;
    d.tv = ref_tv_bound(osc);
  });
  const int64_t clean = static_cast<int64_t>(rows.size());
  // Beyond it: one violation each.
  add([&](RowDivergence& d) { d.max_abs_dlogp = osc * (1 + 1e-7); });
  add([&](RowDivergence& d) { d.tv = ref_tv_bound(osc) + 1e-9; });
  add([&](RowDivergence& d) { d.kl = ref_kl_bound(osc) * (1 + 1e-7); });
  add([&](RowDivergence& d) { d.kl_reverse = ref_kl_bound(osc) * (1 + 1e-7); });
  add([&](RowDivergence& d) {
    d.token = 5;
    d.dlogp_token = -osc * 1.01;
  });
  add([&](RowDivergence& d) {
    d.token = 5;
    d.dp_token = -ref_tv_bound(osc) * 1.01;
  });
  add([&](RowDivergence& d) {
    d.flip = true;
    d.flip_possible = false;
    d.top_cand = 9;
  });
  add([&](RowDivergence& d) { d.tv = kNaN; });
  // Several failures in one row count once.
  add([&](RowDivergence& d) {
    d.tv = 1;
    d.kl = 1;
    d.max_abs_dlogp = 1;
  });
  // A token given and inside the bounds is fine.
  add([&](RowDivergence& d) {
    d.token = 1;
    d.dlogp_token = osc * 0.9;
    d.dp_token = 0.01;
  });
  const Measurement m = measure(rows, SliceOptions{}, "a", "b", 10);
  const SliceStats* all = m.find("all");
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(all->bound_violations, static_cast<int64_t>(rows.size()) - clean - 1);
  EXPECT_EQ(all->missed_flips, 1);
  EXPECT_EQ(all->flips, 1);
  EXPECT_EQ(all->predicted_flips, 0);
}

TEST(ContractMeasure, RowsFromRowDivergenceHoldEveryBound) {
  // Synthetic logits: a reference row and a perturbed candidate, with near-ties and decided
  // rows mixed; the library's divergences must satisfy every guarantee (fixed seed).
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<RowRecord> rows;
  const int vocab = 257;
  for (int i = 0; i < 120; ++i) {
    std::vector<float> ref(vocab), cand(vocab);
    const double scale = std::pow(10.0, -5 + (i % 6));
    for (int v = 0; v < vocab; ++v) {
      ref[v] = static_cast<float>(3 * normal(rng));
      cand[v] = static_cast<float>(ref[v] + scale * normal(rng));
    }
    if (i % 3 == 0) ref[11] = ref[12] = 40.0f;  // a tie at the top: margin 0, undecided
    if (i % 3 == 1) ref[5] = 50.0f;             // decided
    const int32_t token = static_cast<int32_t>(rng() % vocab);
    rows.push_back(make_row(i / 10, i % 10 * 10, 20, i % 2 ? "add" : "mul", "",
                            row_divergence(ref, cand, token)));
  }
  const std::vector<float> single{1.5f};
  const std::vector<float> single_cand{-2.0f};
  RowRecord one = make_row(99, 0, 0, "", "v1", row_divergence(single, single_cand));
  EXPECT_EQ(one.div.margin_ref, kInf);
  EXPECT_EQ(slices_of(one.info, one.div, SliceOptions{})[3], "margin:decided");
  rows.push_back(one);
  const Measurement m = measure(rows, SliceOptions{}, "a", "b", vocab);
  for (const SliceStats& s : m.slices) {
    EXPECT_EQ(s.bound_violations, 0) << s.slice;
    EXPECT_EQ(s.missed_flips, 0) << s.slice;
  }
  ASSERT_NE(m.find("margin:undecided"), nullptr);
  EXPECT_GE(m.find("margin:undecided")->rows, 40);
  ASSERT_NE(m.find("label:v1"), nullptr);
  EXPECT_EQ(m.find("label:v1")->osc_max, 0.0);
}

// ---- contracts ----

TEST(Contract, FitThenCheckPassesOnTheSameMeasurement) {
  const std::vector<RowRecord> rows = random_rows(800, 99);
  const Measurement m = measure(rows, SliceOptions{}, "fp32", "bf16", 100);
  const Contract c = fit_contract(m, 2.0, 0.9);
  ASSERT_EQ(c.slices.size(), m.slices.size());
  for (size_t i = 0; i < c.slices.size(); ++i) {
    const SliceStats& s = m.slices[i];
    EXPECT_EQ(c.slices[i].slice, s.slice);
    EXPECT_EQ(c.slices[i].rows, s.rows);
    EXPECT_EQ(c.slices[i].quantile, 0.9);
    EXPECT_EQ(c.slices[i].osc_quantile, 2.0 * nearest_rank(s.osc_sorted, 90));
    EXPECT_EQ(c.slices[i].osc_max, 2.0 * s.osc_max);
  }
  const CheckResult r = check_contract(c, m);
  EXPECT_TRUE(r.pass);
  EXPECT_TRUE(r.violations.empty());
  EXPECT_TRUE(r.not_exercised.empty());
  // Headroom 1: the measurement sits exactly on its budgets and still passes.
  EXPECT_TRUE(check_contract(fit_contract(m, 1.0), m).pass);

  // Bitwise-equal kernels get the min_osc floor, not a zero budget.
  std::vector<RowRecord> equal{make_row(0, 0, 0, "", "", make_div(0.0, 1.0))};
  const Contract zero = fit_contract(measure(equal, SliceOptions{}, "a", "a", 4), 2.0, 0.99, 1e-6);
  EXPECT_EQ(zero.slices[0].osc_max, 1e-6);
  EXPECT_EQ(zero.slices[0].osc_quantile, 1e-6);

  EXPECT_THROW(fit_contract(measure({}, SliceOptions{}, "a", "b", 4)), InputError);
  EXPECT_THROW(fit_contract(m, 0.5), InputError);
  EXPECT_THROW(fit_contract(m, kNaN), InputError);
  EXPECT_THROW(fit_contract(m, 2.0, 0.0), InputError);
  EXPECT_THROW(fit_contract(m, 2.0, 0.99, -1.0), InputError);
}

TEST(Contract, LargerOscFailsExactlyTheSlicesHoldingThoseRows) {
  std::vector<RowRecord> rows = random_rows(1500, 2024);
  const SliceOptions options;
  const Contract c = fit_contract(measure(rows, options, "fp32", "x", 100));
  // A late-position kernel bug: a few rows at positions ≥ 64 of task "mul" deviate 1000× more.
  std::map<std::string, int64_t> bumped;  // slice → rows bumped in it
  int count = 0;
  for (RowRecord& r : rows) {
    if (r.info.position >= 64 && r.info.task == "mul" && count < 3) {
      r.div = make_div(r.div.osc * 1000 + 5, r.div.margin_ref);
      ++count;
      for (const std::string& s : slices_of(r.info, r.div, options)) ++bumped[s];
    }
  }
  ASSERT_EQ(count, 3);
  ASSERT_EQ(bumped.count("position:[0,16)"), 0u);
  const Measurement m = measure(rows, options, "fp32", "x", 100);
  const CheckResult result = check_contract(c, m);
  EXPECT_FALSE(result.pass);
  std::set<std::string> failing;
  for (const Violation& v : result.violations) {
    failing.insert(v.slice);
    SCOPED_TRACE(v.slice + " " + v.what);
    ASSERT_EQ(bumped.count(v.slice), 1u);
    EXPECT_GT(v.measured, v.allowed);
    EXPECT_TRUE(v.what == "osc max" || v.what == "osc p99") << v.what;
    EXPECT_EQ(v.rows_over, bumped[v.slice]);
  }
  for (const auto& [slice, n] : bumped) {
    EXPECT_EQ(failing.count(slice), 1u) << slice << " holds " << n << " bumped rows";
    // The maximum always trips; the slice's own p99 only where the bumped rows reach it.
    const bool has_max =
        std::any_of(result.violations.begin(), result.violations.end(),
                    [&](const Violation& v) { return v.slice == slice && v.what == "osc max"; });
    EXPECT_TRUE(has_max) << slice;
  }
  EXPECT_GE(failing.count("position:[64,inf)"), 1u);
  EXPECT_GE(failing.count("task:mul"), 1u);
  EXPECT_EQ(failing.count("task:add"), 0u);

  const json j = result.to_json();
  EXPECT_EQ(j.at("pass"), false);
  EXPECT_EQ(j.at("violations").size(), result.violations.size());
  EXPECT_TRUE(j.at("violations")[0].contains("rows_over"));
}

TEST(Contract, QuantileViolationAndNotExercisedSlices) {
  std::vector<RowRecord> rows;
  for (int i = 0; i < 100; ++i) rows.push_back(make_row(0, i, 0, "", "", make_div(0.01, 5.0)));
  Contract c = fit_contract(measure(rows, SliceOptions{}, "a", "b", 4), 2.0, 0.5);
  c.slices.push_back({"task:never", 10, 0.99, 0.1, 0.2});
  // Budgets: median and max 0.02 (2 × 0.01). 60 rows at 0.03 move the median to 0.03.
  for (int i = 0; i < 60; ++i) rows[i].div = make_div(0.03, 5.0);
  const CheckResult r = check_contract(c, measure(rows, SliceOptions{}, "a", "b", 4));
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.not_exercised, std::vector<std::string>{"task:never"});
  bool p50 = false;
  for (const Violation& v : r.violations) {
    if (v.slice == "all" && v.what == "osc p50") {
      p50 = true;
      EXPECT_EQ(v.measured, 0.03);
      EXPECT_EQ(v.allowed, 0.02);
      EXPECT_EQ(v.rows_over, 60);
    }
  }
  EXPECT_TRUE(p50);
  // Only the quantile budget tripped: a loose maximum and a tight median.
  Contract q;
  q.slices.push_back({"all", 100, 0.5, 0.02, 1.0});
  const CheckResult only_q = check_contract(q, measure(rows, SliceOptions{}, "a", "b", 4));
  ASSERT_EQ(only_q.violations.size(), 1u);
  EXPECT_EQ(only_q.violations[0].what, "osc p50");
  EXPECT_EQ(only_q.violations[0].rows_over, 0);
  // Not exercised alone is not a failure.
  Contract absent;
  absent.slices.push_back({"label:zzz", 1, 0.99, 0.0, 0.0});
  EXPECT_TRUE(check_contract(absent, measure(rows, SliceOptions{}, "a", "b", 4)).pass);
}

TEST(Contract, JsonRoundTripAndGuarantees) {
  const Measurement m = measure(random_rows(300, 5), SliceOptions{}, "fp64", "nvfp4", 50);
  const Contract c = fit_contract(m, 3.0, 0.99);
  const json j = c.to_json();
  EXPECT_EQ(j.at("format"), "concord-contract/1");
  EXPECT_EQ(j.at("metric"), "osc");
  EXPECT_EQ(j.at("ref"), "fp64");
  EXPECT_EQ(j.at("cand"), "nvfp4");
  for (const json& s : j.at("slices")) {
    const double eps = s.at("osc_max").get<double>();
    const json& g = s.at("guarantees");
    EXPECT_DOUBLE_EQ(g.at("logp_abs_max").get<double>(), eps);
    EXPECT_DOUBLE_EQ(g.at("tv_max").get<double>(), ref_tv_bound(eps));
    EXPECT_DOUBLE_EQ(g.at("kl_max").get<double>(), ref_kl_bound(eps));
    EXPECT_DOUBLE_EQ(g.at("ratio_min").get<double>(), std::exp(-eps));
    EXPECT_DOUBLE_EQ(g.at("ratio_max").get<double>(), std::exp(eps));
    EXPECT_DOUBLE_EQ(g.at("greedy_stable_margin").get<double>(), eps);
  }
  auto same = [](const Contract& a, const Contract& b) {
    ASSERT_EQ(a.slices.size(), b.slices.size());
    EXPECT_EQ(a.ref, b.ref);
    EXPECT_EQ(a.cand, b.cand);
    for (size_t i = 0; i < a.slices.size(); ++i) {
      EXPECT_EQ(a.slices[i].slice, b.slices[i].slice);
      EXPECT_EQ(a.slices[i].rows, b.slices[i].rows);
      EXPECT_EQ(a.slices[i].quantile, b.slices[i].quantile);
      EXPECT_EQ(a.slices[i].osc_quantile, b.slices[i].osc_quantile);
      EXPECT_EQ(a.slices[i].osc_max, b.slices[i].osc_max);
    }
  };
  same(Contract::from_json(j, "mem"), c);
  // Through text and a file (doubles survive the round trip exactly).
  same(Contract::from_json(json::parse(j.dump()), "mem"), c);
  train::TempDir dir;
  const std::string path = (dir.path / "c.json").string();
  c.save(path);
  same(Contract::load(path), c);
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path)) {
    ++files;
    EXPECT_EQ(entry.path().filename(), "c.json");  // no temporary left behind
  }
  EXPECT_EQ(files, 1);

  const json mj = m.to_json();
  EXPECT_EQ(mj.at("format"), "concord-measurement/1");
  EXPECT_EQ(mj.at("rows"), 300);
  EXPECT_EQ(mj.at("vocab"), 50);
  EXPECT_EQ(mj.at("options").at("position_edges").get<std::vector<int>>(),
            (std::vector<int>{16, 64}));
  const json& first = mj.at("slices")[0];
  EXPECT_EQ(first.at("slice"), "all");
  for (const char* key :
       {"rows", "osc", "linf_max", "max_abs_dlogp", "tv", "kl", "flips", "flip_rate",
        "predicted_flips", "missed_flips", "bound_violations", "by_margin"}) {
    EXPECT_TRUE(first.contains(key)) << key;
  }
  EXPECT_EQ(first.at("osc").at("p99").get<double>(), m.slices[0].osc_p99);
  EXPECT_DOUBLE_EQ(first.at("flip_rate").get<double>(),
                   static_cast<double>(m.slices[0].flips) / 300.0);
  EXPECT_TRUE(first.at("by_margin").back().at("hi").is_null());  // the open bin: +inf
  EXPECT_FALSE(first.contains("osc_sorted"));
}

TEST(Contract, RejectsHostileJson) {
  const std::string good_slice =
      R"({"slice": "all", "rows": 5, "quantile": 0.99, "osc_quantile": 0.1, "osc_max": 0.2})";
  auto doc = [&](const std::string& slices) {
    return R"({"format": "concord-contract/1", "metric": "osc", "ref": "a", "cand": "b", "slices": )" +
           slices + "}";
  };
  auto slice_with = [&](const std::string& replace, const std::string& with) {
    std::string s = good_slice;
    s.replace(s.find(replace), replace.size(), with);
    return doc("[" + s + "]");
  };
  ASSERT_NO_THROW(Contract::from_json(json::parse(doc("[" + good_slice + "]")), "ok.json"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[]", "JSON object"},
      {R"({"metric": "osc", "ref": "a", "cand": "b", "slices": []})", "missing key 'format'"},
      {R"({"format": "concord-contract/2", "metric": "osc", "ref": "a", "cand": "b", "slices": []})",
       "unknown format"},
      {R"({"format": 1, "metric": "osc", "ref": "a", "cand": "b", "slices": []})", "string"},
      {R"({"format": "concord-contract/1", "metric": "linf", "ref": "a", "cand": "b", "slices": []})",
       "unknown metric"},
      {R"({"format": "concord-contract/1", "metric": "osc", "cand": "b", "slices": []})",
       "missing key 'ref'"},
      {R"({"format": "concord-contract/1", "metric": "osc", "ref": "a", "cand": "b"})",
       "missing key 'slices'"},
      {doc("[]"), "non-empty"},
      {doc("{}"), "non-empty array"},
      {doc("[3]"), "must be an object"},
      {doc("[" + good_slice + ", " + good_slice + "]"), "appears twice"},
      {R"({"format": "concord-contract/1", "metric": "osc", "ref": "a", "cand": "b", "slices": [], "x": 1})",
       "unknown key 'x'"},
      {slice_with(R"("rows": 5)", R"("rows": 5, "osc_p99": 1)"), "unknown key 'osc_p99'"},
      {slice_with(R"("slice": "all", )", ""), "missing key 'slice'"},
      {slice_with(R"("all")", "\"positon:[0,16)\""), "not a slice name"},
      {slice_with(R"("all")", "\"position:[16,0)\""), "not a slice name"},
      {slice_with(R"("all")", "\"position:[a,16)\""), "not a slice name"},
      {slice_with(R"("all")", R"("task:")"), "not a slice name"},
      {slice_with(R"("all")", "7"), "must be a string"},
      {slice_with(R"("rows": 5)", R"("rows": -1)"), "'rows'"},
      {slice_with(R"("rows": 5)", R"("rows": 1.5)"), "'rows'"},
      {slice_with(R"("quantile": 0.99)", R"("quantile": 0)"), "(0, 1]"},
      {slice_with(R"("quantile": 0.99)", R"("quantile": 1.5)"), "(0, 1]"},
      {slice_with(R"("quantile": 0.99)", R"("quantile": "p99")"), "(0, 1]"},
      {slice_with(R"("quantile": 0.99, )", ""), "missing key 'quantile'"},
      {slice_with(R"("osc_max": 0.2)", R"("osc_max": -0.2)"), "finite number >= 0"},
      {slice_with(R"("osc_max": 0.2)", R"("osc_max": null)"), "must be a number"},
      {slice_with(R"("osc_quantile": 0.1)", R"("osc_quantile": 0.3)"), "exceeds osc_max"},
      {slice_with(R"("osc_max": 0.2)", R"("osc_max": 0.2, "guarantees": 3)"), "'guarantees'"},
  };
  for (const auto& [text, needle] : cases) {
    SCOPED_TRACE(text);
    try {
      Contract::from_json(json::parse(text), "bad.json");
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("[audit] bad.json: ", 0), 0u) << what;
      EXPECT_NE(what.find(needle), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
  // Non-finite budgets built in memory (JSON text cannot spell NaN or Inf).
  for (double bad : {kNaN, kInf}) {
    json j = json::parse(doc("[" + good_slice + "]"));
    j["slices"][0]["osc_max"] = bad;
    EXPECT_THROW(Contract::from_json(j, "mem"), InputError);
  }
  // Text that overflows a double is not a valid contract file.

  train::TempDir dir;
  const std::string missing = (dir.path / "nope.json").string();
  try {
    Contract::load(missing);
    ADD_FAILURE() << "loaded a missing file";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  const std::string broken = (dir.path / "broken.json").string();
  std::ofstream(broken) << R"({"format": "concord-contract/1", )";
  const std::string overflow = (dir.path / "overflow.json").string();
  std::ofstream(overflow) << doc(
      R"([{"slice": "all", "rows": 5, "quantile": 0.99, "osc_quantile": 0.1, "osc_max": 1e999}])");
  EXPECT_THROW(Contract::load(overflow), InputError);
  try {
    Contract::load(broken);
    ADD_FAILURE() << "loaded broken JSON";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(broken + ": not valid JSON"), std::string::npos)
        << e.what();
  }
}

// ---- SVG ----

// A tiny XML well-formedness check: tags balance, attribute values are quoted and free of '<',
// text holds no raw '<' or unescaped '&'. Void HTML elements (meta) are allowed unclosed.
// Returns "" or the first problem; counts element names in `counts`.
std::string check_markup(const std::string& text, std::map<std::string, int>& counts) {
  std::vector<std::string> stack;
  size_t i = 0;
  auto entity_ok = [&](size_t at) {
    for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&#39;"}) {
      if (text.compare(at, std::strlen(e), e) == 0) return true;
    }
    return false;
  };
  while (i < text.size()) {
    if (text[i] == '&' && !entity_ok(i)) return "raw & at " + std::to_string(i);
    if (text[i] != '<') {
      if (text[i] == '>') return "raw > in text at " + std::to_string(i);
      ++i;
      continue;
    }
    if (text.compare(i, 9, "<!DOCTYPE") == 0) {
      i = text.find('>', i) + 1;
      continue;
    }
    const bool closing = i + 1 < text.size() && text[i + 1] == '/';
    size_t j = i + (closing ? 2 : 1);
    const size_t name_start = j;
    while (j < text.size() && (std::isalnum(static_cast<unsigned char>(text[j])) || text[j] == '-'))
      ++j;
    const std::string name = text.substr(name_start, j - name_start);
    if (name.empty()) return "bad tag at " + std::to_string(i);
    bool self_closing = false;
    while (j < text.size() && text[j] != '>') {
      if (text[j] == '"') {
        const size_t end = text.find('"', j + 1);
        if (end == std::string::npos) return "unterminated attribute";
        if (text.substr(j + 1, end - j - 1).find('<') != std::string::npos) return "< in attribute";
        j = end + 1;
        continue;
      }
      if (text[j] == '<') return "< inside tag " + name;
      if (text[j] == '/' && j + 1 < text.size() && text[j + 1] == '>') self_closing = true;
      ++j;
    }
    if (j >= text.size()) return "unterminated tag " + name;
    if (closing) {
      if (stack.empty() || stack.back() != name) return "unbalanced </" + name + ">";
      stack.pop_back();
    } else {
      ++counts[name];
      if (!self_closing && name != "meta") stack.push_back(name);
    }
    i = j + 1;
    // Raw text elements: skip to their end tag.
    if (!closing && (name == "style")) {
      const size_t end = text.find("</style>", i);
      if (end == std::string::npos) return "unterminated style";
      i = end;
    }
  }
  return stack.empty() ? "" : "unclosed <" + stack.back() + ">";
}

int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(Svg, LinePlotIsWellFormedAndSkipsBadPoints) {
  std::vector<Series> series(3);
  series[0] = {"a < b & \"c\"", {1, 2, 3, kNaN, 5, 6}, {0.1, 0.4, 0.2, 0.3, 0.5, kInf}};
  series[1] = {"second", {1, 2, 3}, {0.3, 0.2, 0.1}};
  series[2] = {"empty", {}, {}};
  PlotOptions options;
  options.title = "flips <vs> margin";
  options.x_label = "margin & more";
  options.y_label = "rate";
  const std::string svg = svg_line_plot(series, options);
  std::map<std::string, int> counts;
  EXPECT_EQ(check_markup(svg, counts), "") << svg;
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(counts["svg"], 1);
  // Series 0 breaks at the NaN (3 points, then 1 point before the inf): one polyline and one
  // isolated marker; series 1 is one polyline.
  EXPECT_EQ(counts["polyline"], 2);
  EXPECT_EQ(counts["circle"], 3 + 1 + 3);
  EXPECT_NE(svg.find("a &lt; b &amp; &quot;c&quot;"), std::string::npos);
  EXPECT_NE(svg.find("flips &lt;vs&gt; margin"), std::string::npos);
  EXPECT_NE(svg.find("margin &amp; more"), std::string::npos);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
  // Three distinct colors.
  std::set<std::string> colors;
  for (const char* c : {"#4e79a7", "#f28e2b", "#e15759"}) {
    if (svg.find(c) != std::string::npos) colors.insert(c);
  }
  EXPECT_EQ(colors.size(), 3u);

  std::vector<Series> bad{{"x", {1, 2}, {1}}};
  EXPECT_THROW(svg_line_plot(bad, options), InputError);
  PlotOptions tiny = options;
  tiny.width = 10;
  EXPECT_THROW(svg_line_plot(series, tiny), InputError);
  // No plottable point at all: still a valid plot saying so.
  std::vector<Series> none{{"n", {kNaN}, {1}}};
  const std::string empty = svg_line_plot(none, options);
  EXPECT_EQ(check_markup(empty, counts), "");
  EXPECT_NE(empty.find("no data"), std::string::npos);
}

TEST(Svg, LinearTicksAreFourToSixNiceValues) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int trial = 0; trial < 300; ++trial) {
    const double lo = (unit(rng) - 0.5) * std::pow(10.0, -6 + 12 * unit(rng));
    const double span = std::pow(10.0, -6 + 12 * unit(rng));
    std::vector<Series> s{{"", {0, 1}, {lo, lo + span}}};
    const std::string svg = svg_line_plot(s, PlotOptions{});
    // y tick labels are the only right-anchored texts.
    const int ticks = count_of(svg, "text-anchor=\"end\"");
    EXPECT_GE(ticks, 4) << lo << " + " << span;
    EXPECT_LE(ticks, 6) << lo << " + " << span;
  }
  // Labels of 0 .. 1 in steps of 0.2 or 0.25.
  std::vector<Series> s{{"", {0, 1}, {0, 1}}};
  const std::string svg = svg_line_plot(s, PlotOptions{});
  EXPECT_NE(svg.find(">0.2<"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">1.0<"), std::string::npos) << svg;
  EXPECT_EQ(svg.find(">-0"), std::string::npos);
}

TEST(Svg, LogAxesUseDecadesAndSkipNonPositive) {
  std::vector<Series> s{{"cdf", {0, 1e-5, 3e-4, 2e-2, -1}, {0.1, 0.2, 0.5, 1.0, 1.0}}};
  PlotOptions options;
  options.log_x = true;
  const std::string svg = svg_line_plot(s, options);
  std::map<std::string, int> counts;
  EXPECT_EQ(check_markup(svg, counts), "");
  for (const char* label : {">1e-5<", ">1e-4<", ">0.001<", ">0.01<", ">0.1<"}) {
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  }
  EXPECT_EQ(counts["circle"], 3);  // 0 and -1 are off the axis
  EXPECT_EQ(counts["polyline"], 1);
}

TEST(Svg, HistogramBarsAndValidation) {
  const std::vector<double> edges{0, 1, 2, 4};
  const std::vector<double> heights{3, 0, 7};
  PlotOptions options;
  options.title = "osc";
  const std::string svg = svg_histogram(edges, heights, options);
  std::map<std::string, int> counts;
  EXPECT_EQ(check_markup(svg, counts), "");
  EXPECT_EQ(counts["rect"], 1 + 2);  // background + the two nonzero bars
  EXPECT_NE(svg.find("[2, 4): 7"), std::string::npos);
  const std::vector<double> short_edges{0, 1};
  EXPECT_THROW(svg_histogram(short_edges, heights, options), InputError);
  const std::vector<double> unsorted{0, 2, 1, 4};
  EXPECT_THROW(svg_histogram(unsorted, heights, options), InputError);
  const std::vector<double> negative{3, -1, 7};
  EXPECT_THROW(svg_histogram(edges, negative, options), InputError);
  PlotOptions log = options;
  log.log_x = true;
  EXPECT_THROW(svg_histogram(edges, heights, log), InputError);  // edge 0 on a log axis
}

TEST(Svg, BarChartHasOneEqualBarPerCategory) {
  const std::vector<std::string> labels{"0", "1", "2-3", "4+"};
  const std::vector<double> heights{1e6, 0, 30, 1};
  PlotOptions options;
  options.title = "lag";
  options.log_y = true;
  const std::string svg = svg_bar_chart(labels, heights, options);
  std::map<std::string, int> counts;
  EXPECT_EQ(check_markup(svg, counts), "") << svg;
  EXPECT_EQ(counts["rect"], 1 + 3);  // background + the three nonzero bars
  for (const char* label : {">0<", ">1<", ">2-3<", ">4+<", ">1e5<"})
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  EXPECT_NE(svg.find("<title>2-3: 30</title>"), std::string::npos);
  // Equal widths, and the smallest count (1) still stands above the axis on the log scale.
  std::set<double> widths;
  for (const auto& [width, height] : concord::test::svg_bars(svg)) {
    widths.insert(width);
    EXPECT_GT(height, 1.0);
  }
  EXPECT_EQ(widths.size(), 1u);
  const std::vector<double> zeros{0, 0, 0, 0};
  EXPECT_NE(svg_bar_chart(labels, zeros, options).find("every bar is 0"), std::string::npos);
  const std::vector<std::string> three{"a", "b", "c"};
  EXPECT_THROW(svg_bar_chart(three, heights, options), InputError);
  const std::vector<double> negative{1, -1, 2, 3};
  EXPECT_THROW(svg_bar_chart(labels, negative, options), InputError);
  PlotOptions log_x = options;
  log_x.log_x = true;
  EXPECT_THROW(svg_bar_chart(labels, heights, log_x), InputError);
}

TEST(Svg, LogPlotSaysWhenASeriesIsExactlyZero) {
  PlotOptions options;
  options.log_y = true;
  std::vector<Series> zero{{"matched", {0, 5, 10}, {0, kNaN, 0}}};
  std::map<std::string, int> counts;
  const std::string only = svg_line_plot(zero, options);
  EXPECT_EQ(check_markup(only, counts), "");
  EXPECT_EQ(only.find("no data"), std::string::npos);
  EXPECT_NE(only.find("every value is exactly 0"), std::string::npos);
  EXPECT_NE(only.find("matched (exactly 0 throughout)"), std::string::npos);
  EXPECT_NE(only.find(">10<"), std::string::npos) << "x axis spans the zero points: " << only;
  std::vector<Series> mixed{{"matched", {1, 2, 3}, {0, 0, 0}}, {"other", {1, 2, 3}, {1e-3, 0, 2e-3}}};
  const std::string both = svg_line_plot(mixed, options);
  EXPECT_NE(both.find("matched (exactly 0 throughout)"), std::string::npos);
  EXPECT_EQ(both.find("other (exactly"), std::string::npos) << "a series with a positive value is drawn";
  EXPECT_EQ(both.find("every value is exactly 0"), std::string::npos);
  // On a linear axis 0 is an ordinary value.
  PlotOptions linear;
  EXPECT_EQ(svg_line_plot(zero, linear).find("exactly 0"), std::string::npos);
}

TEST(Svg, HtmlEscape) {
  EXPECT_EQ(html_escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  EXPECT_EQ(html_escape("plain"), "plain");
}

// ---- report ----

TEST(Report, OneOfflineFileWithTablesPlotsAndVerdict) {
  std::vector<RowRecord> rows = random_rows(600, 77);
  const Measurement base = measure(rows, SliceOptions{}, "fp32 <ref>", "bf16", 1000);
  const Contract contract = fit_contract(base);
  for (RowRecord& r : rows) {
    if (r.info.position >= 64) r.div = make_div(r.div.osc * 100 + 1, r.div.margin_ref);
  }
  rows[0].div.flip = true;  // a missed flip and a violation, to be shown in red
  rows[0].div.flip_possible = false;
  const Measurement m = measure(rows, SliceOptions{}, "fp32 <ref>", "bf16", 1000);
  const CheckResult check = check_contract(contract, m);
  ASSERT_FALSE(check.pass);

  train::TempDir dir;
  const std::string path = (dir.path / "report.html").string();
  write_contract_report(path, m, &contract, &check);
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string html = buffer.str();
  std::map<std::string, int> counts;
  EXPECT_EQ(check_markup(html, counts), "");
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(count_of(html, "http"), counts["svg"]);  // the SVG namespace only: no external URLs
  EXPECT_GE(counts["svg"], 6);                       // flips: all + 4 dimensions; osc: 5 dimensions
  EXPECT_NE(html.find("fp32 &lt;ref&gt;"), std::string::npos);
  EXPECT_EQ(html.find("fp32 <ref>"), std::string::npos);
  for (const SliceStats& s : m.slices) {
    EXPECT_NE(html.find(html_escape(s.slice)), std::string::npos) << s.slice;
  }
  EXPECT_NE(html.find("label:b&lt;&amp;&gt;"), std::string::npos);
  EXPECT_NE(html.find("FAIL"), std::string::npos);
  EXPECT_NE(html.find("class=\"bad\">1<"), std::string::npos);  // the missed flip, in red
  EXPECT_NE(html.find("Greedy flip rate vs reference top-1 margin"), std::string::npos);
  EXPECT_NE(html.find("osc distribution per slice"), std::string::npos);
  EXPECT_NE(html.find("<h2>Contract</h2>"), std::string::npos);
  for (const Violation& v : check.violations) {
    EXPECT_NE(html.find(html_escape(v.slice)), std::string::npos);
  }

  // Without contract and check: still a report, no verdict.
  write_contract_report(path, base, nullptr, nullptr);
  std::ifstream again(path);
  std::stringstream b2;
  b2 << again.rdbuf();
  EXPECT_EQ(b2.str().find("PASS"), std::string::npos);
  EXPECT_EQ(b2.str().find("<h2>Contract</h2>"), std::string::npos);
  EXPECT_EQ(check_markup(b2.str(), counts), "");
}

TEST(Report, ManySlicesDrawOnlyTheLargestPerPlot) {
  // 20 labels with 1..20 rows: the table lists every one, each plot draws the 12 largest.
  std::vector<RowRecord> rows;
  for (int label = 1; label <= 20; ++label) {
    for (int i = 0; i < label; ++i) {
      rows.push_back(make_row(label, i, 0, "", fmt_label(label), make_div(0.01 * label, 0.5)));
    }
  }
  const Measurement m = measure(rows, SliceOptions{}, "a", "b", 10);
  train::TempDir dir;
  const std::string path = (dir.path / "r.html").string();
  write_contract_report(path, m, nullptr, nullptr);
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string html = buffer.str();
  std::map<std::string, int> counts;
  EXPECT_EQ(check_markup(html, counts), "");
  EXPECT_EQ(count_of(html, "8 smaller slices of this dimension are not drawn"), 2);
  // The table row only, for the smallest; table + legend + series title in two plots, largest.
  EXPECT_EQ(count_of(html, ">label:L01<"), 1);
  EXPECT_EQ(count_of(html, ">label:L08<"), 1);
  EXPECT_EQ(count_of(html, ">label:L09<"), 5);
  EXPECT_EQ(count_of(html, ">label:L20<"), 5);
}

}  // namespace
}  // namespace concord::audit
