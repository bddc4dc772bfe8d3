// capmodel (cap_model.h): a routing trace replayed under a memory cap, and the time model.
#include "concord/serve/cap_model.h"

#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::serve::capmodel {

Replay replay(const epsim::Trace& trace, const Experts& experts, int64_t cap,
              std::span<const std::pair<int64_t, int64_t>> pinned, int64_t prefill_passes) {
  const int64_t E = experts.num_experts, k = trace.top_k;
  if (E <= 0 || trace.experts != E)
    throw InputError(fmt::format("[cap model] the trace routes over {} experts, the model has {}", trace.experts, E));
  int64_t largest = 0;
  for (int64_t b : experts.bytes) largest = std::max(largest, b);
  if (cap < largest)
    throw InputError(fmt::format("[cap model] a cap of {} bytes cannot hold one expert ({} bytes)", cap, largest));
  auto bytes_of = [&](int64_t id) { return experts.bytes.at(static_cast<size_t>(id)); };

  Replay out;
  // State per expert id (block · E + expert): resident, pinned, last use.
  std::map<int64_t, uint64_t> resident;  // id -> last use (pinned ones too)
  std::vector<bool> is_pinned(experts.bytes.size(), false);
  int64_t held = 0;
  uint64_t clock = 0;
  for (const auto& [block, expert] : pinned) {
    const int64_t id = block * E + expert;
    if (is_pinned.at(static_cast<size_t>(id))) continue;
    is_pinned[static_cast<size_t>(id)] = true;
    resident[id] = ++clock;
    held += bytes_of(id);
    ++out.pinned;
  }
  if (held > cap) throw InputError(fmt::format("[cap model] the pinned experts ({} bytes) exceed the cap ({})", held, cap));
  out.high_water = held;

  std::vector<const epsim::TraceLayer*> layers;
  for (const epsim::TraceLayer& l : trace.layers) {
    if (l.application < 0 || l.application >= static_cast<int64_t>(experts.block_of_application.size()))
      throw InputError(fmt::format("[cap model] the trace's application {} is not one of the model's", l.application));
    layers.push_back(&l);
  }
  std::sort(layers.begin(), layers.end(), [](const auto* x, const auto* y) { return x->application < y->application; });
  if (layers.empty()) return out;
  const std::vector<int64_t>& passes = layers.front()->pass_rows;
  int64_t first = 0;
  for (size_t p = 0; p < passes.size(); ++p) {
    const bool prefill = static_cast<int64_t>(p) < prefill_passes;
    (prefill ? out.prefill_tokens : out.decode_tokens) += passes[p];
    for (const epsim::TraceLayer* l : layers) {
      const int64_t block = experts.block_of_application[static_cast<size_t>(l->application)];
      std::vector<bool> routed(static_cast<size_t>(E), false);
      for (int64_t t = first; t < first + passes[p]; ++t)
        for (int64_t j = 0; j < k; ++j) routed[static_cast<size_t>(l->selected[static_cast<size_t>(t * k + j)])] = true;
      std::vector<int64_t> hits, misses;
      for (int64_t e = 0; e < E; ++e)
        if (routed[static_cast<size_t>(e)]) (resident.count(block * E + e) ? hits : misses).push_back(block * E + e);
      for (int64_t id : hits) resident[id] = ++clock;
      for (int64_t id : misses) {
        while (held + bytes_of(id) > cap) {  // the least recently used unpinned expert goes
          auto victim = resident.end();
          for (auto it = resident.begin(); it != resident.end(); ++it)
            if (!is_pinned[static_cast<size_t>(it->first)] && (victim == resident.end() || it->second < victim->second))
              victim = it;
          CONCORD_CHECK(victim != resident.end(), "cap model: no expert to evict");
          held -= bytes_of(victim->first);
          resident.erase(victim);
          ++out.evictions;
        }
        held += bytes_of(id);
        out.high_water = std::max(out.high_water, held);
        resident[id] = ++clock;
      }
      const auto uses = static_cast<int64_t>(hits.size() + misses.size());
      (prefill ? out.prefill_uses : out.decode_uses) += uses;
      (prefill ? out.prefill_reads : out.decode_reads) += static_cast<int64_t>(misses.size());
    }
    first += passes[p];
  }
  return out;
}

Cost calibrate(const PhaseRun& prefill, const PhaseRun& decode) {
  const int64_t reads = prefill.reads + decode.reads;
  if (reads <= 0)
    throw InputError("[cap model] the calibration run read no expert: run it under a cap (any: even 100% reads each expert "
                     "once) without prefetch");
  Cost c;
  const double both = (prefill.read_s + decode.read_s) / static_cast<double>(reads);
  c.prefill_read_s = prefill.reads > 0 ? prefill.read_s / static_cast<double>(prefill.reads) : both;
  c.decode_read_s = decode.reads > 0 ? decode.read_s / static_cast<double>(decode.reads) : both;
  c.prefill_compute_s = std::max(0.0, prefill.seconds - prefill.stall_s);
  c.decode_compute_s = std::max(0.0, decode.seconds - decode.stall_s);
  return c;
}

namespace {
// seconds = a + b · reads by least squares, a, b >= 0 (a line through the mean when b would be < 0,
// the origin's slope when a would be). When every run read as many experts (the runs cannot tell
// compute from reads), a read costs its measured seconds and the compute is the rest (calibrate's
// rule, averaged).
std::pair<double, double> fit_line(const std::vector<PhaseRun>& runs) {
  const auto n = static_cast<double>(runs.size());
  double mx = 0, my = 0;
  for (const PhaseRun& r : runs) {
    mx += static_cast<double>(r.reads);
    my += r.seconds;
  }
  mx /= n;
  my /= n;
  double sxx = 0, sxy = 0;
  for (const PhaseRun& r : runs) {
    sxx += (static_cast<double>(r.reads) - mx) * (static_cast<double>(r.reads) - mx);
    sxy += (static_cast<double>(r.reads) - mx) * (r.seconds - my);
  }
  if (sxx <= 0) {
    if (mx <= 0) return {my, 0.0};  // the phase never reads: its compute only
    double compute = 0, per_read = 0;
    for (const PhaseRun& r : runs) {
      compute += std::max(0.0, r.seconds - r.stall_s) / n;
      per_read += r.read_s / static_cast<double>(r.reads) / n;
    }
    return {compute, per_read};
  }
  const double b = sxy / sxx, a = my - b * mx;
  if (b < 0) return {my, 0.0};
  if (a < 0) {
    double sx2 = 0, sxy0 = 0;
    for (const PhaseRun& r : runs) {
      sx2 += static_cast<double>(r.reads) * static_cast<double>(r.reads);
      sxy0 += static_cast<double>(r.reads) * r.seconds;
    }
    return {0.0, std::max(0.0, sxy0 / sx2)};
  }
  return {a, b};
}
}  // namespace

Cost fit(std::span<const std::pair<PhaseRun, PhaseRun>> runs) {
  if (runs.size() < 2) throw InputError("[cap model] a fit needs at least two runs");
  std::vector<PhaseRun> prefill, decode;
  for (const auto& [p, d] : runs) {
    prefill.push_back(p);
    decode.push_back(d);
  }
  Cost c;
  std::tie(c.prefill_compute_s, c.prefill_read_s) = fit_line(prefill);
  std::tie(c.decode_compute_s, c.decode_read_s) = fit_line(decode);
  return c;
}

std::pair<double, double> predict_seconds(const Cost& cost, const Replay& r) {
  return {cost.prefill_compute_s + static_cast<double>(r.prefill_reads) * cost.prefill_read_s,
          cost.decode_compute_s + static_cast<double>(r.decode_reads) * cost.decode_read_s};
}

}  // namespace concord::serve::capmodel
