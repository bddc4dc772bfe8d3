#include "concord/serve/ep_sim.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/io/atomic_file.h"
#include "concord/numerics/check.h"

namespace concord::serve::epsim {
namespace {

// splitmix64: the simulator's one random source (the same stream on every platform).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
  double normal() {  // Box-Muller
    const double u = 1.0 - uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
};


// Each expert's holders: in order (ranks ascending, a rank's slots in order: block_moe.cpp's
// split order, a rank twice when it holds two replicas) and as distinct ranks.
struct Holders {
  int64_t ranks = 0;
  std::vector<std::vector<int64_t>> in_order, distinct;
};

Holders holders_of(const std::vector<std::vector<int64_t>>& rank_slots, int64_t experts) {
  Holders h;
  h.ranks = static_cast<int64_t>(rank_slots.size());
  h.in_order.resize(static_cast<size_t>(experts));
  for (int64_t r = 0; r < h.ranks; ++r)
    for (int64_t e : rank_slots[static_cast<size_t>(r)]) {
      if (e < 0 || e >= experts) throw InputError(fmt::format("[ep-sim] a slot holds expert {}, the layer has {}", e, experts));
      h.in_order[static_cast<size_t>(e)].push_back(r);
    }
  h.distinct = h.in_order;
  for (auto& d : h.distinct) d.erase(std::unique(d.begin(), d.end()), d.end());  // already ascending
  return h;
}

// Per expert, (rank, rows) of each holder under the router (rows fractional under `balanced`).
std::vector<std::vector<std::pair<int64_t, double>>> shares_of(const Holders& hs, std::span<const int64_t> counts,
                                                                std::span<const double> speed, const CostModel& cost,
                                                                Router router) {
  const int64_t R = hs.ranks;
  const auto E = static_cast<int64_t>(counts.size());
  if (E != static_cast<int64_t>(hs.in_order.size()))
    throw InputError(fmt::format("[ep-sim] counts of {} experts for a placement of {}", E, hs.in_order.size()));
  auto sp = [&](int64_t r) { return speed.empty() ? 1.0 : speed[static_cast<size_t>(r)]; };
  for (int64_t e = 0; e < E; ++e)
    if (counts[static_cast<size_t>(e)] > 0 && hs.in_order[static_cast<size_t>(e)].empty())
      throw InputError(fmt::format("[ep-sim] expert {} has tokens and no slot", e));
  // Even: the i-th holder takes rows [n·i/c, n·(i+1)/c) (block_moe.cpp's split).
  std::vector<std::vector<std::pair<int64_t, double>>> share(static_cast<size_t>(E));  // (rank, rows)
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = counts[static_cast<size_t>(e)];
    const auto& h = hs.in_order[static_cast<size_t>(e)];
    const auto c = static_cast<int64_t>(h.size());
    for (int64_t i = 0; i < c; ++i) {
      const int64_t rows = n * (i + 1) / c - n * i / c;
      if (rows > 0) share[static_cast<size_t>(e)].push_back({h[static_cast<size_t>(i)], static_cast<double>(rows)});
    }
  }
  if (router == Router::balanced) {
    // Balanced (per-batch re-routing): from the even split, sweeps over the experts (most tokens
    // first), each expert's rows taken off its holders and poured back to level their compute
    // times (water filling on t_r = (pass + pieces + rows costs) / speed + the rank's own transfer
    // under all-to-all, whose largest adds to the layer). Levelling one expert's holders never
    // raises the largest of their times, so no sweep makes the layer slower.
    const double xr = cost.alltoall ? 2.0 * static_cast<double>(R - 1) / static_cast<double>(R) * cost.exchange_row_s : 0.0;
    auto row_cost = [&](int64_t r) { return std::max(cost.row_s / sp(r) + xr, 1e-15); };
    std::vector<double> t(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) t[static_cast<size_t>(r)] = cost.pass_s / sp(r);
    for (int64_t e = 0; e < E; ++e)
      for (const auto& [r, rows] : share[static_cast<size_t>(e)])
        t[static_cast<size_t>(r)] += cost.piece_s / sp(r) + row_cost(r) * rows;
    std::vector<int64_t> order;
    for (int64_t e = 0; e < E; ++e)
      if (counts[static_cast<size_t>(e)] > 0 && hs.distinct[static_cast<size_t>(e)].size() > 1) order.push_back(e);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return counts[static_cast<size_t>(a)] > counts[static_cast<size_t>(b)]; });
    std::vector<double> base;
    std::vector<size_t> by;
    for (int sweep = 0; sweep < 4; ++sweep)
      for (int64_t e : order) {
        const auto n = static_cast<double>(counts[static_cast<size_t>(e)]);
        const std::vector<int64_t>& h = hs.distinct[static_cast<size_t>(e)];
        auto& sh = share[static_cast<size_t>(e)];
        for (const auto& [r, rows] : sh) t[static_cast<size_t>(r)] -= cost.piece_s / sp(r) + row_cost(r) * rows;
        sh.clear();
        // Each holder's time if it takes a piece; rows add row_cost each. Find the level λ: Σ over
        // the holders below it of (λ - base) / row_cost = n.
        base.resize(h.size());
        by.resize(h.size());
        for (size_t i = 0; i < h.size(); ++i) base[i] = t[static_cast<size_t>(h[i])] + cost.piece_s / sp(h[i]);
        std::iota(by.begin(), by.end(), size_t{0});
        std::sort(by.begin(), by.end(), [&](size_t x, size_t y) { return base[x] < base[y]; });
        double rate = 0, filled = 0;
        size_t used = 0;
        for (; used < by.size(); ++used) {
          const size_t i = by[used];
          if (used > 0 && base[i] * rate - filled >= n) break;
          rate += 1.0 / row_cost(h[i]);
          filled += base[i] / row_cost(h[i]);
        }
        const double level = (n + filled) / rate;
        for (size_t u = 0; u < used; ++u) {
          const size_t i = by[u];
          const double rows = (level - base[i]) / row_cost(h[i]);
          if (rows <= 0) continue;
          sh.push_back({h[i], rows});
          t[static_cast<size_t>(h[i])] += cost.piece_s / sp(h[i]) + row_cost(h[i]) * rows;
        }
      }
  }
  return share;
}

RankWork work_of(const Holders& hs, std::span<const int64_t> counts, std::span<const double> speed, const CostModel& cost,
                 Router router) {
  const std::vector<std::vector<std::pair<int64_t, double>>> share = shares_of(hs, counts, speed, cost, router);
  RankWork w;
  w.rows.assign(static_cast<size_t>(hs.ranks), 0.0);
  w.pieces.assign(static_cast<size_t>(hs.ranks), 0.0);
  for (const auto& per_expert : share)
    for (const auto& [r, rows] : per_expert) {
      w.rows[static_cast<size_t>(r)] += rows;
      w.pieces[static_cast<size_t>(r)] += 1;
    }
  return w;
}

RankWork work_of_slots(const std::vector<std::vector<int64_t>>& rank_slots, std::span<const int64_t> counts,
                       std::span<const double> speed, const CostModel& cost, Router router) {
  return work_of(holders_of(rank_slots, static_cast<int64_t>(counts.size())), counts, speed, cost, router);
}

// Non-negative least squares by enumeration of the active set (a handful of terms): the smallest
// residual over every subset whose unconstrained solution is non-negative.
std::vector<double> nnls(const std::vector<std::vector<double>>& x, const std::vector<double>& y) {
  const size_t k = x.empty() ? 0 : x[0].size();
  std::vector<double> best(k, 0.0);
  double best_res = 0;
  for (double v : y) best_res += v * v;
  for (uint32_t mask = 1; mask < (1u << k); ++mask) {
    std::vector<size_t> cols;
    for (size_t j = 0; j < k; ++j)
      if (mask & (1u << j)) cols.push_back(j);
    const size_t m = cols.size();
    std::vector<double> a(m * m, 0.0), b(m, 0.0);
    for (size_t i = 0; i < y.size(); ++i)
      for (size_t p = 0; p < m; ++p) {
        b[p] += x[i][cols[p]] * y[i];
        for (size_t q = 0; q < m; ++q) a[p * m + q] += x[i][cols[p]] * x[i][cols[q]];
      }
    // Gaussian elimination with partial pivoting.
    bool singular = false;
    for (size_t c = 0; c < m && !singular; ++c) {
      size_t piv = c;
      for (size_t r = c + 1; r < m; ++r)
        if (std::abs(a[r * m + c]) > std::abs(a[piv * m + c])) piv = r;
      if (std::abs(a[piv * m + c]) < 1e-300) {
        singular = true;
        break;
      }
      for (size_t q = 0; q < m; ++q) std::swap(a[c * m + q], a[piv * m + q]);
      std::swap(b[c], b[piv]);
      for (size_t r = c + 1; r < m; ++r) {
        const double f = a[r * m + c] / a[c * m + c];
        for (size_t q = c; q < m; ++q) a[r * m + q] -= f * a[c * m + q];
        b[r] -= f * b[c];
      }
    }
    if (singular) continue;
    std::vector<double> sol(m);
    for (size_t c = m; c-- > 0;) {
      double s = b[c];
      for (size_t q = c + 1; q < m; ++q) s -= a[c * m + q] * sol[q];
      sol[c] = s / a[c * m + c];
    }
    if (std::any_of(sol.begin(), sol.end(), [](double v) { return v < 0; })) continue;
    std::vector<double> coef(k, 0.0);
    for (size_t p = 0; p < m; ++p) coef[cols[p]] = sol[p];
    double res = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      double pred = 0;
      for (size_t j = 0; j < k; ++j) pred += coef[j] * x[i][j];
      res += (y[i] - pred) * (y[i] - pred);
    }
    if (res < best_res) {
      best_res = res;
      best = coef;
    }
  }
  return best;
}

// The tokens routed to each expert by the trace layer's tokens [first, first + n).
std::vector<int64_t> counts_of(const Trace& t, const TraceLayer& l, int64_t first, int64_t n) {
  std::vector<int64_t> c(static_cast<size_t>(t.experts), 0);
  for (int64_t i = first * t.top_k; i < (first + n) * t.top_k; ++i) ++c[static_cast<size_t>(l.selected[static_cast<size_t>(i)])];
  return c;
}

// One run's placement of an application, from its ep-stats records.
std::vector<std::vector<int64_t>> run_slots(const MeasuredRun& run, int64_t application, std::vector<double>* slow) {
  std::map<int64_t, const RankRecord*> by_rank;
  for (const RankRecord& r : run.records)
    if (r.application == application) by_rank[r.rank] = &r;
  std::vector<std::vector<int64_t>> slots;
  if (slow) slow->clear();
  int64_t want = 0;
  for (const auto& [rank, rec] : by_rank) {
    if (rank != want++)
      throw InputError(fmt::format("[ep-sim] {}: application {} has no record of rank {}", run.name, application, want - 1));
    slots.push_back(rec->slots);
    if (slow) slow->push_back(rec->slow_factor);
  }
  return slots;
}

const TraceLayer& trace_layer(const MeasuredRun& run, int64_t application) {
  for (const TraceLayer& l : run.trace.layers)
    if (l.application == application) return l;
  throw InputError(fmt::format("[ep-sim] {}: the routing trace has no MoE application {}", run.name, application));
}

std::vector<int64_t> applications_of(const MeasuredRun& run) {
  std::vector<int64_t> apps;
  for (const RankRecord& r : run.records) apps.push_back(r.application);
  std::sort(apps.begin(), apps.end());
  apps.erase(std::unique(apps.begin(), apps.end()), apps.end());
  return apps;
}

double exchange_rows(const RankWork& w, bool alltoall) {
  const double total = std::accumulate(w.rows.begin(), w.rows.end(), 0.0);
  const auto R = static_cast<double>(w.rows.size());
  double most = 0;
  for (double rows : w.rows)
    most = std::max(most, alltoall ? 2.0 * rows * (R - 1) / R : total - rows);
  return most;
}

// Features of one application of a run, per pass: per rank (passes, pieces, rows) and the rows
// the busiest rank receives.
struct Features {
  std::vector<std::array<double, 3>> rank;  // Σ over passes: 1, pieces, rows
  double passes = 0, received = 0;
  std::vector<RankWork> per_pass;
};

Features features_of(const MeasuredRun& run, int64_t application, const CostModel& cost) {
  const auto slots = run_slots(run, application, nullptr);
  const TraceLayer& tl = trace_layer(run, application);
  Features f;
  f.rank.assign(slots.size(), {0, 0, 0});
  int64_t offset = 0;
  for (int64_t rows : tl.pass_rows) {
    RankWork w = work_of_slots(slots, counts_of(run.trace, tl, offset, rows), {}, cost, Router::even);
    offset += rows;
    for (size_t r = 0; r < slots.size(); ++r) {
      f.rank[r][0] += 1;
      f.rank[r][1] += w.pieces[r];
      f.rank[r][2] += w.rows[r];
    }
    f.passes += 1;
    f.received += exchange_rows(w, cost.alltoall);
    f.per_pass.push_back(std::move(w));
  }
  for (const RankRecord& r : run.records)
    if (r.application == application && std::abs(f.rank[static_cast<size_t>(r.rank)][2] - static_cast<double>(r.rows)) > 0.5)
      throw InputError(fmt::format("[ep-sim] {}: rank {} computed {} rows of application {}, its routing trace gives {}: the "
                                   "ep-stats and the trace are not of the same run",
                                   run.name, r.rank, r.rows, application, f.rank[static_cast<size_t>(r.rank)][2]));
  return f;
}

// Calls fn(line number, parsed JSON) for every non-empty line of a JSON-lines file; an error in a
// line (bad JSON, a missing key, what fn throws) becomes "PATH: line N: ..." (`what` names the
// file's kind for the JSON errors).
template <class Fn>
void each_json_line(const std::string& path, const std::string& what, Fn fn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open {}", path, what));
  std::string line;
  int64_t n = 0;
  try {
    while (std::getline(in, line)) {
      ++n;
      if (!line.empty()) fn(n, nlohmann::json::parse(line));
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: line {}: not {} ({})", path, n, what, e.what()));
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: line {}: {}", path, n, e.what()));
  }
}

}  // namespace

std::vector<std::vector<std::pair<int64_t, int64_t>>> row_shares(const std::vector<std::vector<int64_t>>& rank_slots,
                                                                   std::span<const int64_t> counts,
                                                                   std::span<const double> speed, const CostModel& cost,
                                                                   Router router) {
  const auto share = shares_of(holders_of(rank_slots, static_cast<int64_t>(counts.size())), counts, speed, cost, router);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> out(share.size());
  for (size_t e = 0; e < share.size(); ++e) {
    // Per rank (a rank holding two replicas takes both shares), floors, then the rows left to the
    // largest remainders (the lower rank on a tie).
    std::vector<std::pair<int64_t, double>> by_rank;
    for (const auto& [r, rows] : share[e]) {
      auto it = std::find_if(by_rank.begin(), by_rank.end(), [r = r](const auto& x) { return x.first == r; });
      if (it == by_rank.end()) {
        by_rank.push_back({r, rows});
      } else {
        it->second += rows;
      }
    }
    std::sort(by_rank.begin(), by_rank.end());
    int64_t given = 0;
    std::vector<int64_t> whole(by_rank.size());
    for (size_t i = 0; i < by_rank.size(); ++i) {
      whole[i] = static_cast<int64_t>(std::floor(std::max(0.0, by_rank[i].second) + 1e-9));
      given += whole[i];
    }
    std::vector<size_t> order(by_rank.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return by_rank[a].second - static_cast<double>(whole[a]) > by_rank[b].second - static_cast<double>(whole[b]);
    });
    const int64_t n = counts[e];
    for (size_t k = 0; given < n && !order.empty(); k = (k + 1) % order.size(), ++given) ++whole[order[k]];
    for (size_t i = 0; given > n && i < whole.size(); ++i)  // rounding past n (never in practice)
      while (given > n && whole[i] > 0) --whole[i], --given;
    for (size_t i = 0; i < by_rank.size(); ++i)
      if (whole[i] > 0) out[e].push_back({by_rank[i].first, whole[i]});
  }
  return out;
}

void write_trace(const std::string& path, const Trace& trace, const std::string& model) {
  std::string text = nlohmann::ordered_json{{"routing_trace", 1}, {"model", model}, {"num_experts", trace.experts},
                                            {"num_experts_per_tok", trace.top_k}}
                         .dump() +
                     "\n";
  for (const TraceLayer& l : trace.layers) {
    nlohmann::ordered_json j;
    j["application"] = l.application;
    j["pass_rows"] = l.pass_rows;
    j["selected"] = l.selected;
    text += j.dump() + "\n";
  }
  io::write_file_atomic(path, text);
}

Trace read_trace(const std::string& path) {
  Trace t;
  each_json_line(path, "a routing trace", [&](int64_t n, const nlohmann::json& j) {
    if (n == 1) {
      if (!j.contains("routing_trace")) throw InputError("the first line is not a routing-trace header");
      t.experts = j.at("num_experts").get<int64_t>();
      t.top_k = j.at("num_experts_per_tok").get<int64_t>();
      if (t.experts < 1 || t.top_k < 1 || t.top_k > t.experts)
        throw InputError(fmt::format("{} experts, top-{}: not a router", t.experts, t.top_k));
      return;
    }
    TraceLayer l;
    l.application = j.at("application").get<int64_t>();
    l.pass_rows = j.at("pass_rows").get<std::vector<int64_t>>();
    l.selected = j.at("selected").get<std::vector<int32_t>>();
    int64_t tokens = 0;
    for (int64_t r : l.pass_rows) {
      if (r < 0) throw InputError("a pass of negative rows");
      tokens += r;
    }
    if (tokens * t.top_k != static_cast<int64_t>(l.selected.size()))
      throw InputError(fmt::format("application {}: {} passes' {} tokens but {} picks (top-{})", l.application,
                                   l.pass_rows.size(), tokens, l.selected.size(), t.top_k));
    for (int32_t e : l.selected)
      if (e < 0 || e >= t.experts)
        throw InputError(fmt::format("application {}: expert {} outside 0..{}", l.application, e, t.experts - 1));
    if (!t.layers.empty() && l.pass_rows != t.layers[0].pass_rows)
      throw InputError(fmt::format("application {}: its passes differ from application {}'s", l.application,
                                   t.layers[0].application));
    t.layers.push_back(std::move(l));
  });
  if (t.experts == 0) throw InputError(fmt::format("{}: empty, not a routing trace", path));
  if (t.layers.empty()) throw InputError(fmt::format("{}: a routing trace without MoE layers", path));
  return t;
}

Trace concat(std::span<const Trace> traces) {
  if (traces.empty()) throw InputError("[ep-sim] no routing traces");
  Trace out = traces[0];
  for (size_t i = 1; i < traces.size(); ++i) {
    const Trace& t = traces[i];
    if (t.experts != out.experts || t.top_k != out.top_k || t.layers.size() != out.layers.size())
      throw InputError(fmt::format("[ep-sim] routing trace {} is of another model ({} experts top-{}, {} layers; the first: "
                                   "{} top-{}, {})",
                                   i + 1, t.experts, t.top_k, t.layers.size(), out.experts, out.top_k, out.layers.size()));
    for (size_t l = 0; l < t.layers.size(); ++l) {
      if (t.layers[l].application != out.layers[l].application)
        throw InputError(fmt::format("[ep-sim] routing trace {} has MoE application {} where the first has {}", i + 1,
                                     t.layers[l].application, out.layers[l].application));
      out.layers[l].selected.insert(out.layers[l].selected.end(), t.layers[l].selected.begin(), t.layers[l].selected.end());
      out.layers[l].pass_rows.insert(out.layers[l].pass_rows.end(), t.layers[l].pass_rows.begin(), t.layers[l].pass_rows.end());
    }
  }
  return out;
}

std::vector<Batch> passes_of(const Trace& trace) {
  std::vector<Batch> out;
  int64_t offset = 0;
  for (size_t p = 0; !trace.layers.empty() && p < trace.layers[0].pass_rows.size(); ++p) {
    const int64_t rows = trace.layers[0].pass_rows[p];  // every layer's passes are the same (read_trace)
    Batch b;
    for (const TraceLayer& l : trace.layers) b.counts.push_back(counts_of(trace, l, offset, rows));
    offset += rows;
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<Batch> sample_batches(const Trace& trace, int64_t tokens, int64_t batches, bool contiguous, uint64_t seed) {
  const int64_t T = trace.tokens();
  if (tokens < 1 || batches < 1) throw InputError("[ep-sim] batches of at least 1 token, at least 1 batch");
  if (contiguous && tokens > T)
    throw InputError(fmt::format("[ep-sim] contiguous batches of {} tokens from a trace of {}", tokens, T));
  Rng rng{seed};
  std::vector<Batch> out(static_cast<size_t>(batches));
  for (Batch& b : out) {
    std::vector<int64_t> picks(static_cast<size_t>(tokens));
    const int64_t start = contiguous ? rng.below(T - tokens + 1) : 0;
    for (int64_t i = 0; i < tokens; ++i) picks[static_cast<size_t>(i)] = contiguous ? start + i : rng.below(T);
    for (const TraceLayer& l : trace.layers) {
      std::vector<int64_t> c(static_cast<size_t>(trace.experts), 0);
      for (int64_t tok : picks)
        for (int64_t j = 0; j < trace.top_k; ++j) ++c[static_cast<size_t>(l.selected[static_cast<size_t>(tok * trace.top_k + j)])];
      b.counts.push_back(std::move(c));
    }
  }
  return out;
}

std::vector<Batch> zipf_batches(const Zipf& z, int64_t batches, uint64_t seed) {
  if (z.experts < 1 || z.top_k < 1 || z.top_k > z.experts || z.layers < 1 || z.tokens < 1 || batches < 1)
    throw InputError(fmt::format("[ep-sim] a Zipf router of {} experts top-{}, {} layers, {} tokens: each at least 1 and "
                                 "top-k at most the experts",
                                 z.experts, z.top_k, z.layers, z.tokens));
  if (!(z.skew >= 0) || !(z.burst >= 0)) throw InputError("[ep-sim] --zipf skew and --burst must be >= 0");
  Rng model{z.router_seed}, rng{seed};
  const auto E = static_cast<size_t>(z.experts);
  std::vector<std::vector<double>> popularity(static_cast<size_t>(z.layers), std::vector<double>(E));
  for (auto& p : popularity) {
    std::vector<int64_t> perm(E);
    std::iota(perm.begin(), perm.end(), 0);
    for (size_t i = E; i-- > 1;) std::swap(perm[i], perm[static_cast<size_t>(model.below(static_cast<int64_t>(i) + 1))]);
    for (size_t e = 0; e < E; ++e) p[static_cast<size_t>(perm[e])] = 1.0 / std::pow(static_cast<double>(e + 1), z.skew);
  }
  std::vector<Batch> out(static_cast<size_t>(batches));
  std::vector<double> cum(E);
  std::vector<uint8_t> taken(E);
  for (Batch& b : out)
    for (int64_t l = 0; l < z.layers; ++l) {
      double total = 0;
      for (size_t e = 0; e < E; ++e) {
        total += popularity[static_cast<size_t>(l)][e] * std::exp(z.burst * rng.normal());
        cum[e] = total;
      }
      std::vector<int64_t> c(E, 0);
      for (int64_t t = 0; t < z.tokens; ++t) {
        std::vector<size_t> picked;
        for (int64_t j = 0; j < z.top_k; ++j) {
          size_t e = 0;
          for (int tries = 0;; ++tries) {
            e = static_cast<size_t>(std::upper_bound(cum.begin(), cum.end(), rng.uniform() * total) - cum.begin());
            e = std::min(e, E - 1);
            if (!taken[e]) break;
            if (tries == 64) {  // nearly every weight taken: the first free expert
              e = 0;
              while (taken[e]) ++e;
              break;
            }
          }
          taken[e] = 1;
          picked.push_back(e);
          ++c[e];
        }
        for (size_t e : picked) taken[e] = 0;
      }
      b.counts.push_back(std::move(c));
    }
  return out;
}

CostModel default_gpu_cost() {
  CostModel c;
  c.pass_s = 30e-6;
  c.piece_s = 8e-6;
  c.row_s = 0.2e-6;
  c.exchange_pass_s = 25e-6;
  c.exchange_row_s = 7168.0 / 50e9;
  c.alltoall = true;
  return c;
}

RankWork rank_work(const eplb::Placement& p, std::span<const int64_t> counts, std::span<const double> speed,
                   const CostModel& cost, Router router) {
  return work_of_slots(eplb::rank_slots(p), counts, speed, cost, router);
}

LayerTime layer_time(const RankWork& w, std::span<const double> speed, const CostModel& cost) {
  LayerTime t;
  const size_t R = w.rows.size();
  t.compute_s.resize(R);
  double slowest = 0, total = 0, most = 0;
  for (size_t r = 0; r < R; ++r) {
    const double s = speed.empty() ? 1.0 : speed[r];
    t.compute_s[r] = (cost.pass_s + cost.piece_s * w.pieces[r] + cost.row_s * w.rows[r]) / s;
    slowest = std::max(slowest, t.compute_s[r]);
    total += w.rows[r];
    most = std::max(most, w.rows[r]);
  }
  t.exchange_s = cost.exchange_pass_s + cost.exchange_row_s * exchange_rows(w, cost.alltoall);
  t.layer_s = slowest + t.exchange_s;
  t.imbalance = total > 0 ? most / (total / static_cast<double>(R)) : 1.0;
  return t;
}

LayerTime layer_time_of_slots(const std::vector<std::vector<int64_t>>& rank_slots, std::span<const int64_t> counts,
                              std::span<const double> speed, const CostModel& cost, Router router) {
  return layer_time(work_of_slots(rank_slots, counts, speed, cost, router), speed, cost);
}

Summary simulate(std::span<const Batch> batches, std::span<const eplb::Placement> placements, std::span<const double> speed,
                 const CostModel& cost, Router router) {
  Summary s;
  double waited = 0, busy = 0, imbalance = 0;
  std::vector<Holders> holders;
  for (const eplb::Placement& p : placements)
    holders.push_back(holders_of(eplb::rank_slots(p), static_cast<int64_t>(p.replicas.size())));
  for (const Batch& b : batches) {
    if (b.counts.size() != placements.size())
      throw InputError(fmt::format("[ep-sim] a batch of {} layers, {} placements", b.counts.size(), placements.size()));
    for (size_t l = 0; l < b.counts.size(); ++l) {
      if (!speed.empty() && static_cast<int64_t>(speed.size()) != placements[l].ranks)
        throw InputError(fmt::format("[ep-sim] {} rank speeds for {} ranks", speed.size(), placements[l].ranks));
      const LayerTime t = layer_time(work_of(holders[l], b.counts[l], speed, cost, router), speed, cost);
      const double slowest = t.layer_s - t.exchange_s;
      for (double c : t.compute_s) waited += slowest - c;
      busy += t.layer_s * static_cast<double>(t.compute_s.size());
      imbalance += t.imbalance;
      s.layer_s.push_back(t.layer_s);
    }
  }
  if (s.layer_s.empty()) return s;
  s.p50 = quantile(s.layer_s, 0.5);
  s.p99 = quantile(s.layer_s, 0.99);
  s.mean = std::accumulate(s.layer_s.begin(), s.layer_s.end(), 0.0) / static_cast<double>(s.layer_s.size());
  s.wait_share = busy > 0 ? waited / busy : 0.0;
  s.imbalance = imbalance / static_cast<double>(s.layer_s.size());
  return s;
}

double layer_bound(std::span<const int64_t> counts, std::span<const double> speed, int64_t ranks, const CostModel& cost) {
  double total = 0, active = 0, speeds = 0;
  for (int64_t c : counts) {
    total += static_cast<double>(c);
    active += c > 0 ? 1.0 : 0.0;
  }
  for (int64_t r = 0; r < ranks; ++r) speeds += speed.empty() ? 1.0 : speed[static_cast<size_t>(r)];
  const auto R = static_cast<double>(ranks);
  const double received = cost.alltoall ? 2.0 * total / R * (R - 1) / R : total * (R - 1) / R;
  return (R * cost.pass_s + active * cost.piece_s + total * cost.row_s) / speeds + cost.exchange_pass_s +
         cost.exchange_row_s * received;
}

Summary bound(std::span<const Batch> batches, std::span<const double> speed, int64_t ranks, const CostModel& cost) {
  Summary s;
  for (const Batch& b : batches)
    for (const auto& c : b.counts) s.layer_s.push_back(layer_bound(c, speed, ranks, cost));
  if (s.layer_s.empty()) return s;
  s.p50 = quantile(s.layer_s, 0.5);
  s.p99 = quantile(s.layer_s, 0.99);
  s.mean = std::accumulate(s.layer_s.begin(), s.layer_s.end(), 0.0) / static_cast<double>(s.layer_s.size());
  return s;
}

namespace {

// The layer times of a placement over the planning counts, and each one's slowest rank.
struct Evaluated {
  std::vector<double> time;
  std::vector<int64_t> slowest;
  double objective = 0;  // mean of the slowest quarter
};

Evaluated evaluate(const eplb::Placement& p, std::span<const std::vector<int64_t>> plan, std::span<const double> speed,
                   const CostModel& cost, Router router) {
  const Holders h = holders_of(eplb::rank_slots(p), static_cast<int64_t>(p.replicas.size()));
  Evaluated ev;
  for (const std::vector<int64_t>& counts : plan) {
    const LayerTime t = layer_time(work_of(h, counts, speed, cost, router), speed, cost);
    ev.time.push_back(t.layer_s);
    ev.slowest.push_back(std::max_element(t.compute_s.begin(), t.compute_s.end()) - t.compute_s.begin());
  }
  std::vector<double> sorted = ev.time;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const size_t worst = std::max<size_t>(1, sorted.size() / 4);
  ev.objective = std::accumulate(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(worst), 0.0) /
                 static_cast<double>(worst);
  return ev;
}

// replicas and replica_rank from slot_expert.
void renumber(eplb::Placement& p) {
  std::fill(p.replicas.begin(), p.replicas.end(), 0);
  for (size_t slot = 0; slot < p.slot_expert.size(); ++slot)
    p.replica_rank[slot] = p.replicas[static_cast<size_t>(p.slot_expert[slot])]++;
}

}  // namespace

double tail_objective(const eplb::Placement& p, std::span<const std::vector<int64_t>> plan_counts,
                      std::span<const double> speed, const CostModel& cost, Router router) {
  return evaluate(p, plan_counts, speed, cost, router).objective;
}

eplb::Placement tail_search(const eplb::Placement& start, std::span<const std::vector<int64_t>> plan_counts,
                            std::span<const double> speed, const CostModel& cost, Router router, int64_t tries,
                            uint64_t seed) {
  if (plan_counts.empty()) throw InputError("[ep-sim] the tail search needs planning batches");
  eplb::Placement p = start;
  const int64_t R = p.ranks, s = p.slots_per_rank;
  if (R < 2) return p;
  Rng rng{seed};
  Evaluated cur = evaluate(p, plan_counts, speed, cost, router);
  std::vector<size_t> by_time(cur.time.size());
  for (int64_t t = 0; t < tries; ++t) {
    // A bottleneck: the slowest rank of one of the worst quarter of the batches.
    std::iota(by_time.begin(), by_time.end(), size_t{0});
    std::sort(by_time.begin(), by_time.end(), [&](size_t a, size_t b) { return cur.time[a] > cur.time[b]; });
    const size_t worst = std::max<size_t>(1, by_time.size() / 4);
    const int64_t hot = cur.slowest[by_time[static_cast<size_t>(rng.below(static_cast<int64_t>(worst)))]];
    int64_t other = rng.below(R - 1);
    if (other >= hot) ++other;
    const auto i = static_cast<size_t>(hot * s + rng.below(s));
    const int64_t e_hot = p.slot_expert[i];
    eplb::Placement q = p;
    if (rng.below(2) == 0) {  // swap a slot of the hot rank with one of another rank
      const auto j = static_cast<size_t>(other * s + rng.below(s));
      if (q.slot_expert[j] == e_hot) continue;
      std::swap(q.slot_expert[i], q.slot_expert[j]);
    } else {  // another rank's spare replica becomes a replica of the hot rank's expert
      std::vector<size_t> spare;
      for (int64_t k = 0; k < s; ++k) {
        const auto j = static_cast<size_t>(other * s + k);
        const int64_t e = q.slot_expert[j];
        if (e != e_hot && q.replicas[static_cast<size_t>(e)] > 1) spare.push_back(j);
      }
      if (spare.empty()) continue;
      q.slot_expert[spare[static_cast<size_t>(rng.below(static_cast<int64_t>(spare.size())))]] = e_hot;
    }
    renumber(q);
    Evaluated next = evaluate(q, plan_counts, speed, cost, router);
    if (next.objective < cur.objective * (1 - 1e-9)) {
      p = std::move(q);
      cur = std::move(next);
    }
  }
  return p;
}

std::vector<std::vector<double>> layer_loads(std::span<const Batch> batches) {
  std::vector<std::vector<double>> out;
  for (const Batch& b : batches) {
    if (out.empty())
      for (const auto& c : b.counts) out.emplace_back(c.size(), 0.0);
    for (size_t l = 0; l < b.counts.size(); ++l)
      for (size_t e = 0; e < b.counts[l].size(); ++e) out[l][e] += static_cast<double>(b.counts[l][e]);
  }
  return out;
}

std::vector<RankRecord> read_ep_stats(const std::string& path) {
  std::vector<RankRecord> out;
  each_json_line(path, "concord's --ep-stats", [&](int64_t, const nlohmann::json& j) {
    RankRecord r;
    r.application = j.at("application").get<int64_t>();
    r.rank = j.at("rank").get<int64_t>();
    r.passes = j.at("passes").get<int64_t>();
    r.rows = j.at("rows").get<int64_t>();
    r.compute_s = j.at("compute_s").get<double>();
    r.wait_s = j.at("wait_s").get<double>();
    r.slow_factor = j.value("slow_factor", 1.0);
    if (j.contains("pass_compute_s") || j.contains("pass_wait_s")) {
      r.pass_compute_s = j.at("pass_compute_s").get<std::vector<double>>();
      r.pass_wait_s = j.at("pass_wait_s").get<std::vector<double>>();
      if (static_cast<int64_t>(r.pass_compute_s.size()) != r.passes || static_cast<int64_t>(r.pass_wait_s.size()) != r.passes)
        throw InputError(fmt::format("{} passes but {} and {} per-pass times", r.passes, r.pass_compute_s.size(),
                                     r.pass_wait_s.size()));
    }
    if (j.contains("slots")) {
      r.slots = j.at("slots").get<std::vector<int64_t>>();
    } else {  // older files: the contiguous range
      const auto range = j.at("experts").get<std::vector<int64_t>>();
      if (range.size() != 2) throw InputError("'experts' is not [first, last)");
      for (int64_t e = range[0]; e < range[1]; ++e) r.slots.push_back(e);
    }
    if (r.rank < 0 || r.passes < 0 || r.rows < 0 || !(r.compute_s >= 0) || !(r.wait_s >= 0) || !(r.slow_factor >= 1))
      throw InputError("a negative count or time, or a slow factor below 1");
    out.push_back(std::move(r));
  });
  if (out.empty()) throw InputError(fmt::format("{}: no records", path));
  return out;
}

CostModel fit(std::span<const MeasuredRun> runs) {
  CostModel cost;  // alltoall false: concord's ranks exchange by MPI_Allgatherv
  std::vector<std::vector<double>> xc, xe;
  std::vector<double> yc, ye;
  for (const MeasuredRun& run : runs)
    for (int64_t app : applications_of(run)) {
      const Features f = features_of(run, app, cost);
      std::vector<const RankRecord*> recs;
      for (const RankRecord& r : run.records)
        if (r.application == app) recs.push_back(&r);
      const bool per_pass = std::all_of(recs.begin(), recs.end(), [&](const RankRecord* r) {
        return r->pass_compute_s.size() == f.per_pass.size();
      });
      if (per_pass) {
        for (size_t k = 0; k < f.per_pass.size(); ++k) {
          double min_wait = -1;
          for (const RankRecord* r : recs) {
            const auto q = static_cast<size_t>(r->rank);
            xc.push_back({1.0, f.per_pass[k].pieces[q], f.per_pass[k].rows[q]});
            yc.push_back(r->pass_compute_s[k] / r->slow_factor);
            min_wait = min_wait < 0 ? r->pass_wait_s[k] : std::min(min_wait, r->pass_wait_s[k]);
          }
          xe.push_back({1.0, exchange_rows(f.per_pass[k], cost.alltoall)});
          ye.push_back(min_wait);
        }
        continue;
      }
      double min_wait = -1;
      for (const RankRecord* r : recs) {
        const auto& fr = f.rank[static_cast<size_t>(r->rank)];
        xc.push_back({fr[0], fr[1], fr[2]});
        yc.push_back(r->compute_s / r->slow_factor);
        min_wait = min_wait < 0 ? r->wait_s : std::min(min_wait, r->wait_s);
      }
      xe.push_back({f.passes, f.received});
      ye.push_back(min_wait);
    }
  if (yc.size() < 3) throw InputError("[ep-sim] --calibrate: fewer than 3 records to fit a cost model to");
  const std::vector<double> c = nnls(xc, yc), e = nnls(xe, ye);
  cost.pass_s = c[0];
  cost.piece_s = c[1];
  cost.row_s = c[2];
  cost.exchange_pass_s = e[0];
  cost.exchange_row_s = e[1];
  return cost;
}

std::vector<Prediction> predict(const MeasuredRun& run, const CostModel& cost) {
  std::vector<Prediction> out;
  for (int64_t app : applications_of(run)) {
    std::vector<double> slow;
    run_slots(run, app, &slow);
    std::vector<double> speed;
    for (double f : slow) speed.push_back(1.0 / f);
    const Features f = features_of(run, app, cost);
    Prediction p;
    p.application = app;
    for (const RankWork& w : f.per_pass) {
      p.predicted_pass_s.push_back(layer_time(w, speed, cost).layer_s);
      p.predicted_s += p.predicted_pass_s.back();
    }
    std::vector<const RankRecord*> recs;
    for (const RankRecord& r : run.records)
      if (r.application == app) recs.push_back(&r);
    // Measured: the slowest rank's compute plus the least wait (the exchange once the last rank
    // arrived): a rank that starts the layer late for reasons outside it (rank 0 also samples and
    // prints the token) adds its lateness to the others' waits, which is not the layer's time.
    double slowest = 0, least_wait = -1;
    for (const RankRecord* r : recs) {
      slowest = std::max(slowest, r->compute_s);
      least_wait = least_wait < 0 ? r->wait_s : std::min(least_wait, r->wait_s);
    }
    p.measured_s = slowest + least_wait;
    if (std::all_of(recs.begin(), recs.end(), [&](const RankRecord* r) { return r->pass_compute_s.size() == f.per_pass.size(); })) {
      p.measured_s = 0;
      for (size_t k = 0; k < f.per_pass.size(); ++k) {
        double most = 0, least = -1;
        for (const RankRecord* r : recs) {
          most = std::max(most, r->pass_compute_s[k]);
          least = least < 0 ? r->pass_wait_s[k] : std::min(least, r->pass_wait_s[k]);
        }
        p.measured_pass_s.push_back(most + least);
        p.measured_s += most + least;
      }
    }
    out.push_back(std::move(p));
  }
  return out;
}

double quantile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto n = static_cast<double>(values.size());
  const auto i = static_cast<size_t>(std::clamp(std::ceil(p * n) - 1.0, 0.0, n - 1.0));
  return values[i];
}

}  // namespace concord::serve::epsim
