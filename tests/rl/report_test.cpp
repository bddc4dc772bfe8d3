// The RL report's plots read as a person needs them to: the Fair Cast lag histogram draws one
// visible bar per bin on a log count axis (bins span decades of lag, counts decades of events),
// a matched pair's mismatch KL of exactly 0 is said, not shown as "no data", and the update
// realization caption says why the ratio exceeds 1.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "audit/svg_bars.h"
#include "concord/rl/loop.h"
#include "concord/rl/report.h"
#include "concord/train/fair_cast.h"

namespace concord::rl {
namespace {

using nlohmann::json;

// A run of `steps` steps whose k3 KL is `kl` on every step and whose lag histogram holds
// `counts` (one per bin).
RlResult synthetic_run(int steps, double kl, const std::vector<int64_t>& counts) {
  RlResult r;
  for (int s = 1; s <= steps; ++s) {
    RlStepMetrics m;
    m.step = s;
    m.line = {{"step", s}, {"reward", 0.5}, {"entropy", 1.0},
              {"rollout_corr/k3_kl", kl},
              {"fair_cast", {{"changed_fraction", 1e-3}, {"update_realization", 1.4},
                             {"lag", {{"median", 2}}}}}};
    r.steps.push_back(m);
  }
  train::LagSummary lag;
  for (int b = 0; b < train::LagSummary::kBins; ++b) {
    lag.histogram[static_cast<size_t>(b)] = counts[static_cast<size_t>(b)];
    lag.events += counts[static_cast<size_t>(b)];
  }
  r.summary = {{"lag", lag.to_json()}};
  return r;
}

// The <svg>…</svg> element whose <title> is `title`.
std::string figure_with_title(const std::string& html, const std::string& title) {
  const size_t at = html.find("<title>" + title + "</title>");
  if (at == std::string::npos) return "";
  const size_t begin = html.rfind("<svg", at);
  const size_t end = html.find("</svg>", at);
  return html.substr(begin, end - begin);
}

TEST(RlReport, LagHistogramHasOneVisibleBarPerBinOnALogCountAxis) {
  // 8.8M events, most at lag 0-1: over a linear 0..2048 axis the first bars were 0.2 px wide.
  const std::vector<int64_t> counts{5000000, 3000000, 600000, 150000, 40000, 9000,
                                    2000,    500,     100,    20,     4,     1};
  const RlConfig config;
  const RlResult run = synthetic_run(20, 1e-3, counts);
  const std::vector<ReportArm> arms{{"bf16/bf16 rne", &config, &run}};
  const std::string html = rl_report_html("t", arms);
  const std::string svg = figure_with_title(html, "lag: bf16/bf16 rne");
  ASSERT_FALSE(svg.empty()) << html;
  const auto bars = concord::test::svg_bars(svg);
  for (const auto& [width, height] : bars) {
    EXPECT_GT(width, 20.0) << "every bin is a bar a reader can see";
    EXPECT_GT(height, 1.0) << "even the bin with one event has a visible height";
  }
  EXPECT_EQ(bars.size(), static_cast<size_t>(train::LagSummary::kBins));
  for (const char* label : {">0<", ">1<", ">2<", ">4<", ">512<", ">1024+<", ">1e5<"})
    EXPECT_NE(svg.find(label), std::string::npos) << label;
  EXPECT_NE(html.find("counts on a log axis"), std::string::npos);
}

TEST(RlReport, MatchedPairsMismatchOfExactlyZeroIsSaidNotNoData) {
  const std::vector<int64_t> counts(train::LagSummary::kBins, 1);
  const RlConfig config;
  const RlResult matched = synthetic_run(10, 0.0, counts);
  const RlResult mismatched = synthetic_run(10, 2e-3, counts);
  {
    const std::vector<ReportArm> arms{{"bf16/bf16 rne", &config, &matched}};
    const std::string html = rl_report_html("t", arms);
    const std::string svg = figure_with_title(html, "mismatch KL (rollout_corr/k3_kl)");
    ASSERT_FALSE(svg.empty());
    EXPECT_EQ(svg.find("no data"), std::string::npos) << svg;
    EXPECT_NE(svg.find("every value is exactly 0"), std::string::npos) << svg;
    EXPECT_NE(svg.find(">10<"), std::string::npos) << "the x axis spans the steps: " << svg;
    EXPECT_NE(html.find("Exactly 0 on every step (sampler and learner agree bit for bit): bf16/bf16 rne."),
              std::string::npos);
  }
  const std::vector<ReportArm> both{{"bf16/bf16 rne", &config, &matched},
                                    {"bf16/mxfp8 rne", &config, &mismatched}};
  const std::string html = rl_report_html("t", both);
  const std::string svg = figure_with_title(html, "mismatch KL (rollout_corr/k3_kl)");
  EXPECT_NE(svg.find("bf16/bf16 rne (exactly 0 throughout)"), std::string::npos) << svg;
  EXPECT_EQ(svg.find("bf16/mxfp8 rne (exactly"), std::string::npos);
  EXPECT_NE(html.find("Exactly 0 on every step (sampler and learner agree bit for bit): bf16/bf16 rne."),
            std::string::npos);
  EXPECT_NE(html.find("Above 1 is expected"), std::string::npos);
}

// Runs that differ only in seed are one arm repeated: the report gives their reward over seeds
// (mean and range) and draws the mean and the extreme seeds' curves; an arm with one seed is not
// grouped.
TEST(RlReport, RunsThatDifferOnlyInSeedAreShownAsOneArmWithItsSpread) {
  const std::vector<int64_t> counts(train::LagSummary::kBins, 1);
  RlConfig s1, s2, other;
  s1.seed = 1;
  s1.name = "fc-rne-s1";
  s2 = s1;
  s2.seed = 2;
  s2.name = "fc-rne-s2";
  s2.out = "elsewhere";
  other = s1;
  other.lr = 2e-6;
  RlResult r1 = synthetic_run(10, 0.0, counts), r2 = synthetic_run(10, 0.0, counts),
           r3 = synthetic_run(10, 0.0, counts);
  r1.initial_reward = 0.2;
  r2.initial_reward = 0.4;
  r1.final_reward = 0.9;
  r2.final_reward = 1.0;
  for (size_t i = 0; i < r2.steps.size(); ++i) r2.steps[i].line["reward"] = 0.7;
  const std::vector<ReportArm> arms{{"fc-rne-s1", &s1, &r1}, {"fc-rne-s2", &s2, &r2},
                                    {"low lr", &other, &r3}};
  const std::string html = rl_report_html("t", arms);
  const size_t at = html.find("<h2>Over seeds</h2>");
  ASSERT_NE(at, std::string::npos) << html;
  const std::string section = html.substr(at, html.find("<h2>", at + 5) - at);
  EXPECT_NE(section.find("fc-rne-s1, fc-rne-s2"), std::string::npos) << section;
  EXPECT_NE(section.find("0.300 (0.200-0.400)"), std::string::npos) << section;
  EXPECT_NE(section.find("0.950 (0.900-1.000)"), std::string::npos) << section;
  EXPECT_EQ(section.find("low lr"), std::string::npos) << "a single seed is not a group";
  const std::string svg = figure_with_title(section, "reward over seeds");
  ASSERT_FALSE(svg.empty()) << section;
  for (const char* name : {": mean of 2 seeds", ": lowest seed", ": highest seed"})
    EXPECT_NE(svg.find(name), std::string::npos) << name;
  // One seed each: no section.
  const std::vector<ReportArm> single{{"fc-rne-s1", &s1, &r1}, {"low lr", &other, &r3}};
  EXPECT_EQ(rl_report_html("t", single).find("Over seeds"), std::string::npos);
}

}  // namespace
}  // namespace concord::rl
