// The offline HTML report of RL runs (report.h): summary table, inline SVG plots, sync events.
#include "concord/rl/report.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "concord/audit/svg.h"
#include "concord/io/atomic_file.h"
#include "concord/rl/loop.h"
#include "concord/train/fair_cast.h"

namespace concord::rl {
namespace {

using nlohmann::json;
using audit::html_escape;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string num(double v) {
  if (std::isnan(v)) return "-";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{:.3g}", v);
}

double number_at(const json& line, const json::json_pointer& ptr) {
  if (!line.contains(ptr)) return kNaN;
  const json& v = line.at(ptr);
  return v.is_number() ? v.get<double>() : kNaN;
}

// One series per arm: the value at `ptr` of every metrics line against its step; window > 1
// draws the trailing mean over that many steps (finite values only) instead.
std::vector<audit::Series> per_step(std::span<const ReportArm> arms, const std::string& ptr,
                                    size_t window = 1) {
  std::vector<audit::Series> series;
  const json::json_pointer p(ptr);
  for (const ReportArm& a : arms) {
    audit::Series s;
    s.name = a.name;
    std::vector<double> raw;
    for (const RlStepMetrics& m : a.result->steps) raw.push_back(number_at(m.line, p));
    for (size_t i = 0; i < raw.size(); ++i) {
      double sum = 0;
      size_t n = 0;
      for (size_t k = i + 1 - std::min(window, i + 1); k <= i; ++k) {
        if (std::isfinite(raw[k])) {
          sum += raw[k];
          ++n;
        }
      }
      s.x.push_back(static_cast<double>(a.result->steps[i].step));
      s.y.push_back(n > 0 ? sum / static_cast<double>(n) : kNaN);
    }
    series.push_back(std::move(s));
  }
  return series;
}

void append_figure(std::string& out, const std::string& svg, const std::string& caption) {
  fmt::format_to(std::back_inserter(out), "<figure>\n{}<figcaption>{}</figcaption>\n</figure>\n",
                 svg, html_escape(caption));
}

// One series per arm that has a held-out evaluation: `key` of each evaluation against its step,
// the final one (summary.json's eval_final) at steps + 1.
std::vector<audit::Series> per_eval(std::span<const ReportArm> arms, const std::string& key) {
  std::vector<audit::Series> series;
  for (const ReportArm& a : arms) {
    audit::Series s;
    s.name = a.name;
    for (const RlStepMetrics& m : a.result->steps) {
      if (!m.line.contains("eval")) continue;
      s.x.push_back(static_cast<double>(m.step));
      s.y.push_back(number_at(m.line.at("eval"), json::json_pointer("/" + key)));
    }
    if (a.result->summary.contains("eval_final")) {
      const json& e = a.result->summary.at("eval_final");
      s.x.push_back(number_at(e, json::json_pointer("/step")));
      s.y.push_back(number_at(e, json::json_pointer("/" + key)));
    }
    if (!s.x.empty()) series.push_back(std::move(s));
  }
  return series;
}

void append_eval(std::string& out, std::span<const ReportArm> arms, int w, int h) {
  if (per_eval(arms, "reward_served").empty()) return;
  out += "<h2>Held-out evaluation</h2>\n<table>\n<tr><th class=\"name\">run</th><th>prompts</th>"
         "<th>reward, served copy</th><th>reward, fp32 master</th><th>greedy replies the same</th>"
         "<th>same, mean over evaluations</th></tr>\n";
  for (const ReportArm& a : arms) {
    if (!a.result->summary.contains("eval_final")) continue;
    const json& e = a.result->summary.at("eval_final");
    double same = 0;
    int n = 0;
    for (const RlStepMetrics& m : a.result->steps)
      if (m.line.contains("eval")) same += number_at(m.line.at("eval"), json::json_pointer("/greedy_same")), ++n;
    same += number_at(e, json::json_pointer("/greedy_same"));
    ++n;
    fmt::format_to(std::back_inserter(out),
                   "<tr><td class=\"name\">{}</td><td>{}</td><td>{:.3f}</td><td>{:.3f}</td><td>{:.3f}</td><td>{:.3f}</td></tr>\n",
                   html_escape(a.name), num(number_at(e, json::json_pointer("/prompts"))),
                   number_at(e, json::json_pointer("/reward_served")), number_at(e, json::json_pointer("/reward_master")),
                   number_at(e, json::json_pointer("/greedy_same")), same / n);
  }
  out += "</table>\n";
  append_figure(out,
                audit::svg_line_plot(per_eval(arms, "reward_served"),
                                     {"held-out reward (greedy, served copy)", "step", "mean reward", false, false, w, h}),
                "Greedy replies of the served copy to the held-out prompts, at each evaluation (the "
                "last one after the final step).");
  append_figure(out,
                audit::svg_line_plot(per_eval(arms, "greedy_same"),
                                     {"checkpoint consistency", "step", "fraction", false, false, w, h}),
                "Fraction of held-out prompts whose greedy reply from the served copy is the same "
                "tokens as the fp32 master's.");
}

// Runs that differ only in their seed (and name and output folder) are repeats of one arm. Each
// group of two or more: a table of its reward over seeds, and its curve as the mean over seeds
// with the lowest and the highest seed's, step by step (each seed's trailing mean over `window`).
void append_seed_groups(std::string& out, std::span<const ReportArm> arms, int w, int h,
                        size_t window) {
  std::vector<std::pair<std::string, std::vector<size_t>>> groups;  // config key, arm indices
  for (size_t i = 0; i < arms.size(); ++i) {
    json key = arms[i].config->to_json();
    for (const char* k : {"seed", "name", "out", "checkpoint_every"}) key.erase(k);
    const std::string k = key.dump();
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& e) { return e.first == k; });
    if (g == groups.end()) groups.push_back({k, {i}});
    else g->second.push_back(i);
  }
  std::erase_if(groups, [](const auto& g) { return g.second.size() < 2; });
  if (groups.empty()) return;
  out += "<h2>Over seeds</h2>\n<table>\n<tr><th class=\"name\">arm</th><th class=\"name\">runs</th>"
         "<th>seeds</th><th>reward first 10%, mean (min-max)</th><th>last 10%</th>"
         "<th>lag p90, mean (min-max)</th></tr>\n";
  auto spread = [](const std::vector<double>& v) {
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    double sum = 0;
    for (double x : v) sum += x;
    return fmt::format("{:.3f} ({:.3f}-{:.3f})", sum / static_cast<double>(v.size()), *lo, *hi);
  };
  std::vector<audit::Series> curves;
  for (const auto& [key, members] : groups) {
    const RlConfig& c = *arms[members[0]].config;
    const std::string label = fmt::format("{}/{} {} lr {}", c.sampler, c.learner, c.export_rule, num(c.lr));
    std::vector<double> first, last, p90;
    std::vector<std::string> names;
    size_t steps = std::numeric_limits<size_t>::max();
    for (size_t i : members) {
      first.push_back(arms[i].result->initial_reward);
      last.push_back(arms[i].result->final_reward);
      p90.push_back(arms[i].result->lag_p90);
      names.push_back(arms[i].name);
      steps = std::min(steps, arms[i].result->steps.size());
    }
    fmt::format_to(std::back_inserter(out),
                   "<tr><td class=\"name\">{}</td><td class=\"name\">{}</td><td>{}</td><td>{}</td>"
                   "<td>{}</td><td>{}</td></tr>\n",
                   html_escape(label), html_escape(fmt::format("{}", fmt::join(names, ", "))),
                   members.size(), spread(first), spread(last), spread(p90));
    // The members' smoothed reward curves, over the steps every member has.
    std::vector<audit::Series> runs;
    for (size_t i : members) runs.push_back(per_step(arms.subspan(i, 1), "/reward", window)[0]);
    audit::Series mean{label + ": mean of " + std::to_string(members.size()) + " seeds", {}, {}};
    audit::Series lo{label + ": lowest seed", {}, {}}, hi{label + ": highest seed", {}, {}};
    for (size_t t = 0; t < steps; ++t) {
      double sum = 0, mn = std::numeric_limits<double>::infinity(), mx = -mn;
      for (const audit::Series& r : runs) {
        sum += r.y[t];
        mn = std::min(mn, r.y[t]);
        mx = std::max(mx, r.y[t]);
      }
      for (audit::Series* s : {&mean, &lo, &hi}) s->x.push_back(runs[0].x[t]);
      mean.y.push_back(sum / static_cast<double>(runs.size()));
      lo.y.push_back(mn);
      hi.y.push_back(mx);
    }
    for (audit::Series* s : {&mean, &lo, &hi}) curves.push_back(std::move(*s));
  }
  out += "</table>\n<p class=\"note\">Runs whose configurations differ only in seed, name and "
         "output folder. Reward: the sampled completions' mean over the first and the last 10% of "
         "steps of each run, then the mean and the range over its seeds.</p>\n";
  append_figure(out,
                audit::svg_line_plot(curves, {"reward over seeds", "step", "mean reward", false, false,
                                              std::max(w, 900), std::max<int>(h, 100 + 16 * static_cast<int>(curves.size()))}),
                fmt::format("Each arm's reward{}, step by step: the mean over its seeds and the lowest "
                            "and highest seed's.",
                            window > 1 ? fmt::format(" (each seed's trailing mean over {} steps)", window) : ""));
}

// Steps of the longest run / 20: the smoothing window of noisy per-step plots.
size_t smoothing_window(std::span<const ReportArm> arms) {
  size_t steps = 0;
  for (const ReportArm& a : arms) steps = std::max(steps, a.result->steps.size());
  return std::max<size_t>(1, steps / 20);
}


void append_summary(std::string& out, std::span<const ReportArm> arms) {
  out +=
      "<h2>Summary</h2>\n<table>\n<tr><th class=\"name\">run</th><th class=\"name\">sampler</th>"
      "<th class=\"name\">learner</th><th class=\"name\">export</th><th>lr</th><th>steps</th>"
      "<th>reward at step 1</th><th>first 10%</th><th>last 10%</th><th>mean k3 KL</th>"
      "<th>lag p50</th><th>lag p90</th><th>rollout s</th><th>learner s</th><th>sync s</th>"
      "<th>sync failures</th></tr>\n";
  for (const ReportArm& a : arms) {
    const RlConfig& c = *a.config;
    const RlResult& r = *a.result;
    fmt::format_to(std::back_inserter(out),
                   "<tr><td class=\"name\">{}</td><td class=\"name\">{}</td><td class=\"name\">{}"
                   "</td><td class=\"name\">{}</td><td>{}</td><td>{}</td><td>{:.3f}</td><td>{:.3f}</td><td>{:.3f}</td>"
                   "<td>{}</td><td>{}</td><td>{}</td><td>{:.1f}</td><td>{:.1f}</td><td>{:.1f}</td>"
                   "<td{}>{}</td></tr>\n",
                   html_escape(a.name), html_escape(c.sampler), html_escape(c.learner),
                   html_escape(c.export_rule), num(c.lr), r.steps.size(), r.warmup_reward, r.initial_reward, r.final_reward,
                   num(r.mean_mismatch_kl), num(r.lag_median), num(r.lag_p90), r.seconds_rollout,
                   r.seconds_learner, r.seconds_sync, r.sync_failures > 0 ? " class=\"bad\"" : "",
                   r.sync_failures);
  }
  out +=
      "</table>\n<p class=\"note\">reward: mean exact-match reward of the step's sampled "
      "completions (step 1: right after the warm-up; then the means over the first and the last "
      "10% of steps). k3 KL: "
      "rollout_corr/k3_kl between the sampler's and the learner's log-probs of the sampled "
      "tokens, mean over steps. lag: Fair Cast, steps between a master weight drifting half a "
      "served ulp and its served copy moving (median and p90 over closed events). Time: "
      "rollout (generation), learner (scoring, loss, backward, AdamW), sync (export, publish, "
      "transfer and the seven checks).</p>\n";
}

// The lag bins labelled by their first lag (0, 1, 2, 4, ..., 512, 1024+): short enough to sit
// under a bar of a small figure; the caption gives the ranges.
std::vector<std::string> lag_bin_labels() {
  std::vector<std::string> labels;
  for (int b = 0; b < train::LagSummary::kBins; ++b) {
    const int64_t lo = train::LagSummary::bin_lo(b);
    labels.push_back(b + 1 == train::LagSummary::kBins ? fmt::format("{}+", lo) : std::to_string(lo));
  }
  return labels;
}

void append_lag_histograms(std::string& out, std::span<const ReportArm> arms) {
  out += "<h2>Fair Cast lag</h2>\n";
  const std::vector<std::string> labels = lag_bin_labels();
  for (const ReportArm& a : arms) {
    const json& lag = a.result->summary.contains("lag") ? a.result->summary.at("lag") : json();
    if (!lag.is_object()) continue;
    std::vector<double> counts;
    for (int b = 0; b < train::LagSummary::kBins; ++b)
      counts.push_back(lag.at("histogram").at(static_cast<size_t>(b)).at("count").get<double>());
    // One equal-width bar per bin and a log count axis: the bins span three decades of lag and
    // the counts five or more decades of events.
    audit::PlotOptions o{fmt::format("lag: {}", a.name), "lag (steps, bin start)", "closed events (log)",
                         false, true, arms.size() > 1 ? 460 : 640, arms.size() > 1 ? 260 : 360};
    append_figure(out, audit::svg_bar_chart(labels, counts, o),
                  fmt::format("{}: {} closed events, {} open; median {}, p90 {} steps. Bins of lag "
                              "0, 1, 2-3, 4-7, ..., 512-1023 and 1024 or more steps, each bar "
                              "labelled by its first lag; counts on a log axis.",
                              a.name, lag.at("events").get<int64_t>(), lag.at("pending").get<int64_t>(),
                              num(lag.at("median").get<double>()), num(lag.at("p90").get<double>())));
  }
}

// The arms whose value at `ptr` is exactly 0 on every step that has it (a matched pair's
// mismatch KL): a log plot cannot draw them, so the caption names them.
std::vector<std::string> arms_exactly_zero(std::span<const ReportArm> arms, const std::string& ptr) {
  std::vector<std::string> names;
  const json::json_pointer p(ptr);
  for (const ReportArm& a : arms) {
    bool any = false, all_zero = true;
    for (const RlStepMetrics& m : a.result->steps) {
      const double v = number_at(m.line, p);
      if (std::isnan(v)) continue;
      any = true;
      all_zero = all_zero && v == 0;
    }
    if (any && all_zero) names.push_back(a.name);
  }
  return names;
}

void append_sync_events(std::string& out, std::span<const ReportArm> arms) {
  out += "<h2>Weight sync</h2>\n";
  bool any = false;
  std::string rows;
  for (const ReportArm& a : arms) {
    if (!a.result->summary.contains("sync_events")) continue;
    for (const json& e : a.result->summary.at("sync_events")) {
      any = true;
      fmt::format_to(std::back_inserter(rows),
                     "<tr><td class=\"name\">{}</td><td>{}</td><td>{}</td><td class=\"name bad\">{}"
                     "</td><td class=\"name\">{}</td></tr>\n",
                     html_escape(a.name), e.at("step").get<int64_t>(), e.at("rank").get<int>(),
                     html_escape(e.at("check").get<std::string>()),
                     html_escape(e.at("message").get<std::string>()));
    }
  }
  if (!any) {
    out += "<p>Every sync passed the seven checks (version, manifest, precision plan, content, "
           "derived state, scale sanity, behaviour probe); no alarm was raised.</p>\n";
    return;
  }
  out += "<p class=\"note\">Failed syncs: the sampler kept serving the previous version.</p>\n"
         "<table>\n<tr><th class=\"name\">run</th><th>step</th><th>sampler</th>"
         "<th class=\"name\">check</th><th class=\"name\">message</th></tr>\n" +
         rows + "</table>\n";
}

}  // namespace

std::string rl_report_html(const std::string& title, std::span<const ReportArm> arms) {
  std::string out;
  fmt::format_to(std::back_inserter(out),
                 "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{}</title>"
                 "<style>{}</style></head><body>\n<h1>{}</h1>\n",
                 html_escape(title), audit::report_style(), html_escape(title));
  append_summary(out, arms);

  out += "<h2>Per step</h2>\n";
  // Wider and taller with many runs, so that the legend fits beside the plot.
  const int w = arms.size() > 4 ? 900 : 640;
  const int h = std::max(360, 100 + 16 * static_cast<int>(arms.size()));
  const size_t window = smoothing_window(arms);
  append_figure(out,
                audit::svg_line_plot(per_step(arms, "/reward", window),
                                     {"reward", "step", "mean reward", false, false, w, h}),
                window > 1 ? fmt::format("Mean exact-match reward of the sampled completions, "
                                         "trailing mean over {} steps.", window)
                           : std::string("Mean exact-match reward of the sampled completions."));
  append_figure(out,
                audit::svg_line_plot(per_step(arms, "/rollout_corr~1k3_kl"),
                                     {"mismatch KL (rollout_corr/k3_kl)", "step", "k3 KL", false, true, w, h}),
                [&] {
                  std::string caption =
                      "Sampler vs learner log-probs of the sampled tokens (k3 estimator, log axis; "
                      "steps with exactly 0 are not drawn).";
                  const std::vector<std::string> zero = arms_exactly_zero(arms, "/rollout_corr~1k3_kl");
                  if (!zero.empty())
                    caption += fmt::format(" Exactly 0 on every step (sampler and learner agree "
                                           "bit for bit): {}.", fmt::join(zero, ", "));
                  return caption;
                }());
  append_figure(out,
                audit::svg_line_plot(per_step(arms, "/entropy", window), {"entropy", "step", "nats", false, false, w, h}),
                fmt::format("Mean entropy of the learner's distributions over completion tokens{}.",
                            window > 1 ? fmt::format(", trailing mean over {} steps", window) : ""));
  append_figure(out,
                audit::svg_line_plot(per_step(arms, "/fair_cast/changed_fraction"),
                                     {"served weights changed", "step", "fraction", false, true, w, h}),
                "Fair Cast: share of weights whose served value changed this step.");
  append_figure(out,
                audit::svg_line_plot(per_step(arms, "/fair_cast/update_realization"),
                                     {"update realization", "step", "|Δserved| / |Δmaster|", false, false, w, h}),
                "Fair Cast: ‖Δserved‖ / ‖Δmaster‖ of the step, over all weights. Above 1 is "
                "expected: a served weight moves by whole served ulps or not at all, so the "
                "served copy's step carries rounding noise on top of the master's update (a "
                "weight that moves one ulp for a master step of a fraction of an ulp adds far "
                "more to the norm). The ratio measures the served copy's movement, not how "
                "much of the update is lost; the lag below measures that.");
  append_figure(out,
                audit::svg_line_plot(per_step(arms, "/fair_cast/lag/median"),
                                     {"lag median (cumulative)", "step", "steps", false, false, w, h}),
                "Fair Cast: median lag of the events closed so far.");
  append_figure(out,
                audit::svg_line_plot(per_step(arms, "/token_mult_prob_error"),
                                     {"token_mult_prob_error", "step", "mean e^|Δlogp|", false, false, w, h}),
                "NeMo-RL's token_mult_prob_error: the mean over sampled tokens of e^|Δlogp| between "
                "sampler and learner (1: they agree).");
  append_eval(out, arms, w, h);
  append_seed_groups(out, arms, w, h, window);
  append_lag_histograms(out, arms);
  append_sync_events(out, arms);

  out += "<h2>Configuration</h2>\n";
  for (const ReportArm& a : arms) {
    fmt::format_to(std::back_inserter(out), "<details><summary>{}</summary><pre>{}</pre></details>\n",
                   html_escape(a.name), html_escape(a.config->to_json().dump(2)));
  }
  out += "</body></html>\n";
  return out;
}

void write_rl_report(const std::filesystem::path& path, const std::string& title,
                     std::span<const ReportArm> arms) {
  io::write_file_atomic(path, rl_report_html(title, arms));
}

}  // namespace concord::rl
