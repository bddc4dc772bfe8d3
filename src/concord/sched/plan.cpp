// Offset planning (sched.h): buffers placed in one arena for an order, and the replay that checks
// a plan and measures its high-water mark.
#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "concord/numerics/check.h"
#include "concord/sched/sched.h"

namespace concord::sched {

namespace {

struct Lifetime {
  int first = 0, last = 0;
};

// Each tensor's steps under `order`, and its buffer (an in-place output shares its input's:
// recomputed here with the rule of sched.cpp's memory model).
struct Lifetimes {
  std::vector<Lifetime> tensor;
  std::vector<int> buffer_of;
  std::vector<Lifetime> buffer;  // by root tensor
};

Lifetimes lifetimes(const Graph& g, const Order& order) {
  if (!is_topological(g, order)) throw InputError("[sched] the order is not a topological order of the graph");
  const auto N = static_cast<int>(order.size()), T = static_cast<int>(g.tensors.size());
  std::vector<int> pos(g.nodes.size());
  for (int i = 0; i < N; ++i) pos[static_cast<size_t>(order[static_cast<size_t>(i)])] = i;
  std::vector<std::vector<int>> consumers(static_cast<size_t>(T));
  for (size_t v = 0; v < g.nodes.size(); ++v)
    for (int t : g.nodes[v].inputs) {
      auto& c = consumers[static_cast<size_t>(t)];
      if (std::find(c.begin(), c.end(), static_cast<int>(v)) == c.end()) c.push_back(static_cast<int>(v));
    }
  Lifetimes L;
  L.tensor.resize(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) {
    const Tensor& x = g.tensors[static_cast<size_t>(t)];
    Lifetime& l = L.tensor[static_cast<size_t>(t)];
    l.first = x.producer >= 0 ? pos[static_cast<size_t>(x.producer)] : 0;
    l.last = l.first;
    for (int c : consumers[static_cast<size_t>(t)]) l.last = std::max(l.last, pos[static_cast<size_t>(c)]);
    if (x.keep) l.last = std::max(N - 1, l.first);
  }
  L.buffer_of.resize(static_cast<size_t>(T));
  for (int t = 0; t < T; ++t) L.buffer_of[static_cast<size_t>(t)] = t;
  for (int v : order) {  // topological: an input's buffer is settled before its in-place output
    const Node& n = g.nodes[static_cast<size_t>(v)];
    if (n.inplace_input < 0 || n.outputs.empty()) continue;
    const int in = n.inputs[static_cast<size_t>(n.inplace_input)], out = n.outputs[0];
    const int root = L.buffer_of[static_cast<size_t>(in)];
    if (!g.tensors[static_cast<size_t>(in)].keep && consumers[static_cast<size_t>(in)].size() == 1 &&
        g.tensors[static_cast<size_t>(root)].bytes >= g.tensors[static_cast<size_t>(out)].bytes)
      L.buffer_of[static_cast<size_t>(out)] = root;
  }
  L.buffer.assign(static_cast<size_t>(T), {std::numeric_limits<int>::max(), -1});
  for (int t = 0; t < T; ++t) {
    Lifetime& b = L.buffer[static_cast<size_t>(L.buffer_of[static_cast<size_t>(t)])];
    b.first = std::min(b.first, L.tensor[static_cast<size_t>(t)].first);
    b.last = std::max(b.last, L.tensor[static_cast<size_t>(t)].last);
  }
  return L;
}

int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// The offset a buffer of `size` bytes takes beside the [offset, end) ranges in `busy` (sorted
// here): the lowest gap that fits, or with best_fit the smallest one.
int64_t fit(std::vector<std::pair<int64_t, int64_t>>& busy, int64_t size, bool best_fit) {
  std::sort(busy.begin(), busy.end());
  int64_t chosen = -1, chosen_gap = std::numeric_limits<int64_t>::max(), cursor = 0;
  auto consider = [&](int64_t start, int64_t end) {
    if (end - start < size) return;
    if (chosen < 0 || (best_fit && end - start < chosen_gap)) {
      chosen = start;
      chosen_gap = end - start;
    }
  };
  for (const auto& [o, e] : busy) {
    if (o > cursor) consider(cursor, o);
    cursor = std::max(cursor, e);
    if (chosen >= 0 && !best_fit) return chosen;
  }
  consider(cursor, std::numeric_limits<int64_t>::max());
  return chosen;
}

}  // namespace

const char* planner_name(Planner p) {
  switch (p) {
    case Planner::first_fit: return "first_fit";
    case Planner::best_fit: return "best_fit";
    case Planner::greedy_by_size: return "greedy_by_size";
    case Planner::greedy_by_conflicts: return "greedy_by_conflicts";
    case Planner::hill_climb: return "hill_climb";
    case Planner::exact: return "exact";
  }
  return "?";
}

ArenaPlan plan_offsets(const Graph& g, const Order& order, Planner planner, int64_t alignment) {
  g.validate();
  if (alignment < 1) throw InputError(fmt::format("[sched] alignment {} must be at least 1", alignment));
  const Lifetimes L = lifetimes(g, order);
  struct Buf {
    int root;  // tensor index, or T + node for a workspace
    int64_t size;
    Lifetime life;
  };
  const auto T = static_cast<int>(g.tensors.size());
  std::vector<Buf> bufs;
  for (int t = 0; t < T; ++t)
    if (L.buffer_of[static_cast<size_t>(t)] == t && g.tensors[static_cast<size_t>(t)].bytes > 0)
      bufs.push_back({t, round_up(g.tensors[static_cast<size_t>(t)].bytes, alignment), L.buffer[static_cast<size_t>(t)]});
  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    const int v = order[static_cast<size_t>(i)];
    if (g.nodes[static_cast<size_t>(v)].workspace > 0)
      bufs.push_back({T + v, round_up(g.nodes[static_cast<size_t>(v)].workspace, alignment), {i, i}});
  }
  // Whether two buffers are live at a common step.
  auto conflict = [&](size_t a, size_t b) {
    return bufs[a].life.first <= bufs[b].life.last && bufs[b].life.first <= bufs[a].life.last;
  };
  // Each buffer in turn at the lowest offset free for its lifetime (best_fit: the smallest gap
  // that fits); the offsets by root and the arena's size.
  std::vector<int64_t> offset_of(g.tensors.size() + g.nodes.size(), -1);
  auto place = [&](const std::vector<size_t>& sequence, bool best_fit) {
    std::vector<size_t> placed;
    int64_t arena = 0;
    for (size_t i : sequence) {
      const Buf& b = bufs[i];
      std::vector<std::pair<int64_t, int64_t>> busy;  // [offset, end) of placed buffers alive with b
      for (size_t j : placed)
        if (conflict(i, j)) {
          const int64_t o = offset_of[static_cast<size_t>(bufs[j].root)];
          busy.emplace_back(o, o + bufs[j].size);
        }
      const int64_t chosen = fit(busy, b.size, best_fit);
      offset_of[static_cast<size_t>(b.root)] = chosen;
      arena = std::max(arena, chosen + b.size);
      placed.push_back(i);
    }
    return arena;
  };
  std::vector<size_t> sequence(bufs.size());
  std::iota(sequence.begin(), sequence.end(), 0);
  auto by_size = [&](size_t a, size_t b) {
    return bufs[a].size != bufs[b].size ? bufs[a].size > bufs[b].size : bufs[a].life.first < bufs[b].life.first;
  };
  ArenaPlan plan;
  plan.alignment = alignment;
  for (int step = 0; step < static_cast<int>(order.size()); ++step) {
    int64_t live = 0;
    for (const Buf& b : bufs)
      if (b.life.first <= step && step <= b.life.last) live += b.size;
    plan.lower_bound = std::max(plan.lower_bound, live);
  }
  std::vector<size_t> first_sequence = sequence;  // by allocation step, larger first
  std::stable_sort(first_sequence.begin(), first_sequence.end(), [&](size_t a, size_t b) {
    return bufs[a].life.first != bufs[b].life.first ? bufs[a].life.first < bufs[b].life.first : bufs[a].size > bufs[b].size;
  });
  // TVM USMP's GreedyByConflicts order: the most liveness conflicts first (ties: larger, earlier).
  auto conflicts_order = [&] {
    std::vector<int64_t> conflicts(bufs.size(), 0);
    for (size_t a = 0; a < bufs.size(); ++a)
      for (size_t b = a + 1; b < bufs.size(); ++b)
        if (conflict(a, b)) {
          ++conflicts[a];
          ++conflicts[b];
        }
    std::vector<size_t> order_ = sequence;
    std::stable_sort(order_.begin(), order_.end(), [&](size_t a, size_t b) {
      return conflicts[a] != conflicts[b] ? conflicts[a] > conflicts[b] : by_size(a, b);
    });
    return order_;
  };
  const std::vector<size_t> conflict_sequence = planner == Planner::greedy_by_conflicts || planner == Planner::exact
                                                    ? conflicts_order()
                                                    : std::vector<size_t>{};
  // TVM USMP's HillClimb: swap two random buffers of the placement sequence, keep the swap when
  // the arena does not grow; a fixed number of attempts from a fixed seed. Returns the arena.
  auto climb = [&](std::vector<size_t>& seq) {
    int64_t best = place(seq, false);
    const auto n = static_cast<int64_t>(seq.size());
    const int64_t attempts = n < 2 ? 0 : std::clamp<int64_t>(200'000'000 / (n * n), 50, 2000);
    std::mt19937_64 rng(0x5EED);
    for (int64_t k = 0; k < attempts; ++k) {
      const size_t i = rng() % seq.size(), j = rng() % seq.size();
      if (i == j) continue;
      std::swap(seq[i], seq[j]);
      const int64_t arena = place(seq, false);
      if (arena <= best) best = arena;
      else std::swap(seq[i], seq[j]);
    }
    return best;
  };
  switch (planner) {
    case Planner::first_fit:
    case Planner::best_fit:
      plan.arena_bytes = place(first_sequence, planner == Planner::best_fit);
      break;
    case Planner::greedy_by_size:
      std::stable_sort(sequence.begin(), sequence.end(), by_size);
      plan.arena_bytes = place(sequence, false);
      break;
    case Planner::greedy_by_conflicts:
      plan.arena_bytes = place(conflict_sequence, false);
      break;
    case Planner::hill_climb:
      // From the greedy-by-size sequence.
      std::stable_sort(sequence.begin(), sequence.end(), by_size);
      climb(sequence);
      plan.arena_bytes = place(sequence, false);
      break;
    case Planner::exact: {
      // The incumbent: the best of the heuristics' sequences (hill climbing from greedy-by-size).
      std::vector<size_t> best_sequence = sequence;
      std::stable_sort(best_sequence.begin(), best_sequence.end(), by_size);
      int64_t best = climb(best_sequence);
      for (const std::vector<size_t>& other : {first_sequence, conflict_sequence})
        if (const int64_t a = place(other, false); a < best) {
          best = a;
          best_sequence = other;
        }
      const size_t n = bufs.size();
      std::vector<size_t> rank(n);  // candidates are tried largest first
      std::vector<size_t> candidates = sequence;
      std::stable_sort(candidates.begin(), candidates.end(), by_size);
      for (size_t r = 0; r < n; ++r) rank[candidates[r]] = r;
      std::vector<int64_t> off(n, -1);
      std::vector<char> used(n, 0);
      std::vector<size_t> current;
      // The lowest offset buffer i fits at among the placed ones: where it lands if placed next,
      // and a lower bound on where it lands later (more placed buffers only push it up).
      auto lowest_fit = [&](size_t i) {
        std::vector<std::pair<int64_t, int64_t>> busy;
        for (size_t j : current)
          if (conflict(i, j)) busy.emplace_back(off[j], off[j] + bufs[j].size);
        return fit(busy, bufs[i].size, false);
      };
      int64_t nodes = 0;
      constexpr int64_t kBudget = 2'000'000;
      bool stopped = false;
      std::function<void(int64_t)> dfs = [&](int64_t arena) {
        if (best == plan.lower_bound || stopped) return;
        if (current.size() == n) {
          if (arena < best) {
            best = arena;
            best_sequence = current;
          }
          return;
        }
        std::vector<std::pair<size_t, int64_t>> next;  // (buffer, its offset if placed now)
        int64_t bound = arena;
        for (size_t i : candidates)
          if (!used[i]) {
            const int64_t o = lowest_fit(i);
            bound = std::max(bound, o + bufs[i].size);
            next.emplace_back(i, o);
          }
        if (bound >= best) return;
        for (const auto& [i, o] : next) {
          // Two non-conflicting buffers placed one after the other land where they would in the
          // other order: only the order by rank is searched.
          if (!current.empty() && !conflict(i, current.back()) && rank[i] < rank[current.back()]) continue;
          if (++nodes > kBudget) {
            stopped = true;
            return;
          }
          used[i] = 1;
          off[i] = o;
          current.push_back(i);
          dfs(std::max(arena, o + bufs[i].size));
          current.pop_back();
          used[i] = 0;
          if (best == plan.lower_bound || stopped) return;
        }
      };
      dfs(0);
      plan.arena_bytes = place(best_sequence, false);
      plan.optimal = !stopped;
      break;
    }
  }
  plan.optimal = plan.optimal || plan.arena_bytes == plan.lower_bound;
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    if (g.tensors[t].bytes == 0) continue;
    const int root = L.buffer_of[t];
    plan.placements.push_back({static_cast<int>(t), -1, offset_of[static_cast<size_t>(root)], g.tensors[t].bytes,
                               L.tensor[t].first, L.tensor[t].last});
  }
  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    const int v = order[static_cast<size_t>(i)];
    const int64_t w = g.nodes[static_cast<size_t>(v)].workspace;
    if (w > 0) plan.placements.push_back({-1, v, offset_of[static_cast<size_t>(T + v)], w, i, i});
  }
  return plan;
}

int64_t replay_plan(const Graph& g, const Order& order, const ArenaPlan& plan) {
  const Lifetimes L = lifetimes(g, order);
  const int64_t a = plan.alignment;
  if (a < 1 || plan.arena_bytes % a != 0) throw InputError("[sched] the plan's arena is not a multiple of its alignment");
  // Tensors by index, then node workspaces at T + node: each an owner id in the arena.
  const auto T = static_cast<int>(g.tensors.size());
  std::vector<const Placement*> of(g.tensors.size() + g.nodes.size(), nullptr);
  for (const Placement& p : plan.placements) {
    const int id = p.tensor >= 0 ? p.tensor : T + p.node;
    if (p.tensor >= T || (p.tensor < 0 && (p.node < 0 || p.node >= static_cast<int>(g.nodes.size()))) ||
        of[static_cast<size_t>(id)])
      throw InputError(fmt::format("[sched] the plan places tensor {} / workspace {} twice or out of range", p.tensor, p.node));
    if (p.offset < 0 || p.offset % a != 0 || p.offset + p.bytes > plan.arena_bytes)
      throw InputError(fmt::format("[sched] tensor '{}' at {} (+{}) outside the {}-byte arena or misaligned",
                                   g.tensors[static_cast<size_t>(p.tensor)].name, p.offset, p.bytes, plan.arena_bytes));
    of[static_cast<size_t>(id)] = &p;
  }
  for (size_t t = 0; t < g.tensors.size(); ++t)
    if (g.tensors[t].bytes > 0 && !of[t])
      throw InputError(fmt::format("[sched] the plan does not place tensor '{}'", g.tensors[t].name));
  for (size_t v = 0; v < g.nodes.size(); ++v)
    if (g.nodes[v].workspace > 0 && !of[static_cast<size_t>(T) + v])
      throw InputError(fmt::format("[sched] the plan does not place node '{}''s workspace", g.nodes[v].name));
  auto name_of = [&](int id) {
    return id < T ? g.tensors[static_cast<size_t>(id)].name
                  : "workspace of " + g.nodes[static_cast<size_t>(id - T)].name;
  };
  auto same_buffer = [&](int x, int y) {
    return x < T && y < T && L.buffer_of[static_cast<size_t>(x)] == L.buffer_of[static_cast<size_t>(y)];
  };
  // The arena as granules, each owned by the tensor whose bytes it holds (-1: free).
  std::vector<int> owner(static_cast<size_t>(plan.arena_bytes / a), -1);
  int64_t high_water = 0;
  auto take = [&](int t, bool inplace_of_live) {
    const Placement& p = *of[static_cast<size_t>(t)];
    for (int64_t k = p.offset / a; k < (p.offset + p.bytes + a - 1) / a; ++k) {
      const int prev = owner[static_cast<size_t>(k)];
      if (prev >= 0 && prev != t && !(inplace_of_live && same_buffer(prev, t)))
        throw InputError(fmt::format("[sched] tensor '{}' overwrites live tensor '{}' at byte {}", name_of(t),
                                     name_of(prev), k * a));
      owner[static_cast<size_t>(k)] = t;
    }
    high_water = std::max(high_water, (p.offset + p.bytes + a - 1) / a * a);
  };
  auto check = [&](int t, const char* what, int v) {
    const Placement& p = *of[static_cast<size_t>(t)];
    for (int64_t k = p.offset / a; k < (p.offset + p.bytes + a - 1) / a; ++k)
      if (owner[static_cast<size_t>(k)] != t)
        throw InputError(fmt::format("[sched] node '{}' {} tensor '{}', whose bytes were overwritten",
                                     g.nodes[static_cast<size_t>(v)].name, what, name_of(t)));
  };
  auto release = [&](int t) {
    const Placement& p = *of[static_cast<size_t>(t)];
    for (int64_t k = p.offset / a; k < (p.offset + p.bytes + a - 1) / a; ++k)
      if (owner[static_cast<size_t>(k)] == t) owner[static_cast<size_t>(k)] = -1;
  };
  for (size_t t = 0; t < g.tensors.size(); ++t)
    if (g.tensors[t].producer < 0 && g.tensors[t].bytes > 0) take(static_cast<int>(t), false);
  for (int i = 0; i < static_cast<int>(order.size()); ++i) {
    const int v = order[static_cast<size_t>(i)];
    const Node& n = g.nodes[static_cast<size_t>(v)];
    for (int t : n.inputs)
      if (g.tensors[static_cast<size_t>(t)].bytes > 0) check(t, "reads", v);
    for (int t : n.outputs)
      if (g.tensors[static_cast<size_t>(t)].bytes > 0) take(t, L.buffer_of[static_cast<size_t>(t)] != t);
    if (n.workspace > 0) {
      take(T + v, false);
      const int taken_over = n.inplace_input >= 0 && !n.outputs.empty() &&
                                     same_buffer(n.outputs[0], n.inputs[static_cast<size_t>(n.inplace_input)])
                                 ? n.inputs[static_cast<size_t>(n.inplace_input)]
                                 : -1;
      for (int t : n.inputs)  // the workspace did not overwrite what the node reads
        if (g.tensors[static_cast<size_t>(t)].bytes > 0 && t != taken_over) check(t, "reads", v);
      release(T + v);
    }
    for (size_t t = 0; t < g.tensors.size(); ++t)
      if (g.tensors[t].bytes > 0 && L.tensor[t].last == i && L.tensor[t].first <= i) release(static_cast<int>(t));
  }
  return high_water;
}

}  // namespace concord::sched
