// The offline HTML report of RL runs (loop.h): one run (OUT/report.html of `concord rl`) or the
// arms of `concord demo` side by side (OUT/report.html beside each arm's own). Inline SVG only
// (audit/svg.h), no scripts or external files, so a browser opens it offline.
//
// Contents: a summary table (sampler, learner, export, reward after the warm-up and at the end,
// mean mismatch k3 KL, Fair Cast lag median/p90, time split, sync failures), plots per step of
// reward, rollout_corr/k3_kl, entropy, the Fair Cast changed fraction and update realization,
// each run's lag histogram, the table of failed syncs (step, sampler, check, message) and each
// run's config.
#pragma once

#include <filesystem>
#include <span>
#include <string>

namespace concord::rl {

struct RlConfig;
struct RlResult;

struct ReportArm {
  std::string name;
  const RlConfig* config = nullptr;
  const RlResult* result = nullptr;
};

std::string rl_report_html(const std::string& title, std::span<const ReportArm> arms);
// Written atomically.
void write_rl_report(const std::filesystem::path& path, const std::string& title,
                     std::span<const ReportArm> arms);

}  // namespace concord::rl
