#include "concord/serve/eplb.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::serve::eplb {
namespace {

struct Packed {
  std::vector<int64_t> pack, rank_in_pack;
};

// EPLB's balanced_packing with the rank of each item inside its pack (the order it arrived in).
// With `speed` (one per pack), each item goes to the pack with room whose time (load / speed) after
// taking it is least — the same choice as the least load when every speed is 1.
Packed pack_items(std::span<const double> weight, int64_t packs, std::span<const double> speed = {}) {
  const auto n = static_cast<int64_t>(weight.size());
  if (packs < 1 || n % packs != 0)
    throw InputError(fmt::format("[eplb] {} items do not divide into {} equal packs", n, packs));
  const int64_t per = n / packs;
  Packed out;
  out.pack.assign(static_cast<size_t>(n), 0);
  out.rank_in_pack.assign(static_cast<size_t>(n), 0);
  if (per == 1 && speed.empty()) {  // as eplb.py: item i in pack i
    std::iota(out.pack.begin(), out.pack.end(), 0);
    return out;
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return weight[static_cast<size_t>(a)] > weight[static_cast<size_t>(b)]; });
  std::vector<double> load(static_cast<size_t>(packs), 0.0);
  std::vector<int64_t> count(static_cast<size_t>(packs), 0);
  auto time_with = [&](int64_t p, double w) {
    const double l = load[static_cast<size_t>(p)] + w;
    return speed.empty() ? l : l / speed[static_cast<size_t>(p)];
  };
  for (int64_t item : order) {
    const double w = weight[static_cast<size_t>(item)];
    int64_t best = -1;
    for (int64_t p = 0; p < packs; ++p)
      if (count[static_cast<size_t>(p)] < per && (best < 0 || time_with(p, w) < time_with(best, w))) best = p;
    out.pack[static_cast<size_t>(item)] = best;
    out.rank_in_pack[static_cast<size_t>(item)] = count[static_cast<size_t>(best)]++;
    load[static_cast<size_t>(best)] += weight[static_cast<size_t>(item)];
  }
  return out;
}

struct Replicated {
  std::vector<int64_t> phy2log, rank, count;
};

// EPLB's replicate_experts: one replica each, then each further replica to the largest w / c.
Replicated replicate(std::span<const double> weight, int64_t physical) {
  const auto n = static_cast<int64_t>(weight.size());
  Replicated r;
  r.phy2log.resize(static_cast<size_t>(physical));
  r.rank.assign(static_cast<size_t>(physical), 0);
  r.count.assign(static_cast<size_t>(n), 1);
  std::iota(r.phy2log.begin(), r.phy2log.begin() + n, 0);
  for (int64_t i = n; i < physical; ++i) {
    int64_t best = 0;
    for (int64_t e = 1; e < n; ++e)
      if (weight[static_cast<size_t>(e)] / static_cast<double>(r.count[static_cast<size_t>(e)]) >
          weight[static_cast<size_t>(best)] / static_cast<double>(r.count[static_cast<size_t>(best)]))
        best = e;
    r.phy2log[static_cast<size_t>(i)] = best;
    r.rank[static_cast<size_t>(i)] = r.count[static_cast<size_t>(best)]++;
  }
  return r;
}

std::vector<int64_t> inverse(const std::vector<int64_t>& perm) {
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  return inv;
}

// The arguments every placement takes: E >= 1 experts with finite loads >= 0 on ranks x slots >= E
// slots, and (when given) one finite speed > 0 per rank.
void check_inputs(std::span<const double> load, int64_t ranks, int64_t slots_per_rank, std::span<const double> speed = {}) {
  const auto E = static_cast<int64_t>(load.size());
  if (E < 1 || ranks < 1 || slots_per_rank < 1 || ranks * slots_per_rank < E)
    throw InputError(fmt::format("[eplb] {} experts on {} ranks x {} slots: every expert needs a slot", E, ranks,
                                 slots_per_rank));
  for (double w : load)
    if (!(w >= 0.0) || !std::isfinite(w)) throw InputError("[eplb] expert loads must be finite and >= 0");
  if (!speed.empty() && static_cast<int64_t>(speed.size()) != ranks)
    throw InputError(fmt::format("[eplb] {} rank speeds for {} ranks", speed.size(), ranks));
  for (double v : speed)
    if (!(v > 0.0) || !std::isfinite(v)) throw InputError("[eplb] rank speeds must be finite and > 0");
}

// A placement of `ranks` x `slots_per_rank` slots for E experts, every slot and count still 0.
Placement empty_placement(int64_t ranks, int64_t slots_per_rank, int64_t experts) {
  Placement p;
  p.ranks = ranks;
  p.slots_per_rank = slots_per_rank;
  p.slot_expert.assign(static_cast<size_t>(ranks * slots_per_rank), 0);
  p.replica_rank.assign(static_cast<size_t>(ranks * slots_per_rank), 0);
  p.replicas.assign(static_cast<size_t>(experts), 0);
  return p;
}

// The placement of (expert, rank) replicas taken in order: each fills its rank's next slot and gets
// its expert's next replica number.
Placement place(int64_t ranks, int64_t slots_per_rank, int64_t experts,
                const std::vector<std::pair<int64_t, int64_t>>& expert_rank) {
  Placement p = empty_placement(ranks, slots_per_rank, experts);
  std::vector<int64_t> used(static_cast<size_t>(ranks), 0);
  for (const auto& [e, q] : expert_rank) {
    const int64_t slot = q * slots_per_rank + used[static_cast<size_t>(q)]++;
    p.slot_expert[static_cast<size_t>(slot)] = e;
    p.replica_rank[static_cast<size_t>(slot)] = p.replicas[static_cast<size_t>(e)]++;
  }
  return p;
}

}  // namespace

std::vector<std::vector<int64_t>> rank_slots(const Placement& p) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(p.ranks));
  for (int64_t slot = 0; slot < p.ranks * p.slots_per_rank; ++slot)
    out[static_cast<size_t>(slot / p.slots_per_rank)].push_back(p.slot_expert[static_cast<size_t>(slot)]);
  return out;
}

std::vector<double> rank_loads(const Placement& p, std::span<const double> load) {
  std::vector<double> out(static_cast<size_t>(p.ranks), 0.0);
  for (size_t slot = 0; slot < p.slot_expert.size(); ++slot) {
    const auto e = static_cast<size_t>(p.slot_expert[slot]);
    out[slot / static_cast<size_t>(p.slots_per_rank)] += load[e] / static_cast<double>(p.replicas[e]);
  }
  return out;
}

double max_rank_load(const Placement& p, std::span<const double> load) {
  const std::vector<double> l = rank_loads(p, load);
  return l.empty() ? 0.0 : *std::max_element(l.begin(), l.end());
}

std::vector<int64_t> balanced_packing(std::span<const double> weight, int64_t packs) {
  return pack_items(weight, packs).pack;
}

Placement eplb(std::span<const double> load, int64_t ranks, int64_t slots_per_rank, int64_t groups, int64_t nodes) {
  check_inputs(load, ranks, slots_per_rank);
  const auto E = static_cast<int64_t>(load.size());
  const int64_t S = ranks * slots_per_rank;
  if (groups < 1 || E % groups != 0)
    throw InputError(fmt::format("[eplb] {} experts do not divide into {} groups", E, groups));
  if (nodes < 1 || ranks % nodes != 0) throw InputError(fmt::format("[eplb] {} ranks do not divide into {} nodes", ranks, nodes));
  if (groups % nodes != 0) groups = nodes = 1;  // eplb.py's global policy
  const int64_t group_size = E / groups, groups_per_node = groups / nodes, per_node_log = E / nodes;
  const int64_t per_node_phy = S / nodes, ranks_per_node = ranks / nodes;

  // 1. groups to nodes.
  std::vector<double> group_load(static_cast<size_t>(groups), 0.0);
  for (int64_t e = 0; e < E; ++e) group_load[static_cast<size_t>(e / group_size)] += load[static_cast<size_t>(e)];
  const Packed g = pack_items(group_load, nodes);
  std::vector<int64_t> log2mlog(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const auto gi = static_cast<size_t>(e / group_size);
    log2mlog[static_cast<size_t>(e)] = (g.pack[gi] * groups_per_node + g.rank_in_pack[gi]) * group_size + e % group_size;
  }
  const std::vector<int64_t> mlog2log = inverse(log2mlog);

  Placement p = empty_placement(ranks, slots_per_rank, E);
  for (int64_t node = 0; node < nodes; ++node) {
    // 2. replicas within the node.
    std::vector<double> w(static_cast<size_t>(per_node_log));
    for (int64_t j = 0; j < per_node_log; ++j) w[static_cast<size_t>(j)] = load[static_cast<size_t>(mlog2log[static_cast<size_t>(node * per_node_log + j)])];
    const Replicated r = replicate(w, per_node_phy);
    // 3. the node's physical experts to its ranks.
    std::vector<double> phy_load(static_cast<size_t>(per_node_phy));
    for (int64_t i = 0; i < per_node_phy; ++i) {
      const auto m = static_cast<size_t>(r.phy2log[static_cast<size_t>(i)]);
      phy_load[static_cast<size_t>(i)] = w[m] / static_cast<double>(r.count[m]);
    }
    const Packed packed = pack_items(phy_load, ranks_per_node);
    for (int64_t i = 0; i < per_node_phy; ++i) {
      const int64_t slot = node * per_node_phy + packed.pack[static_cast<size_t>(i)] * slots_per_rank +
                           packed.rank_in_pack[static_cast<size_t>(i)];
      const int64_t expert = mlog2log[static_cast<size_t>(node * per_node_log + r.phy2log[static_cast<size_t>(i)])];
      p.slot_expert[static_cast<size_t>(slot)] = expert;
      p.replica_rank[static_cast<size_t>(slot)] = r.rank[static_cast<size_t>(i)];
    }
    for (int64_t j = 0; j < per_node_log; ++j)
      p.replicas[static_cast<size_t>(mlog2log[static_cast<size_t>(node * per_node_log + j)])] = r.count[static_cast<size_t>(j)];
  }
  return p;
}

double max_rank_time(const Placement& p, std::span<const double> load, std::span<const double> speed) {
  const std::vector<double> l = rank_loads(p, load);
  double worst = 0.0;
  for (size_t r = 0; r < l.size(); ++r) worst = std::max(worst, l[r] / (speed.empty() ? 1.0 : speed[r]));
  return worst;
}

Placement speed_aware(std::span<const double> load, std::span<const double> speed, int64_t slots_per_rank) {
  const auto E = static_cast<int64_t>(load.size()), ranks = static_cast<int64_t>(speed.size());
  const int64_t S = ranks * slots_per_rank;
  if (speed.empty()) throw InputError("[eplb] a speed-aware placement needs the ranks' speeds");
  check_inputs(load, ranks, slots_per_rank, speed);
  // holders[e]: the ranks of e's replicas (a rank may hold several).
  std::vector<std::vector<int64_t>> holders(static_cast<size_t>(E));
  std::vector<int64_t> fill(static_cast<size_t>(ranks), 0);
  auto worst_time = [&]() {
    std::vector<double> l(static_cast<size_t>(ranks), 0.0);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t q : holders[static_cast<size_t>(e)])
        l[static_cast<size_t>(q)] += load[static_cast<size_t>(e)] / static_cast<double>(holders[static_cast<size_t>(e)].size());
    double t = 0.0;
    for (int64_t q = 0; q < ranks; ++q) t = std::max(t, l[static_cast<size_t>(q)] / speed[static_cast<size_t>(q)]);
    return t;
  };
  // 1. One replica each, largest expert first, to the rank with room where the largest time after
  //    it is least (ties: the faster rank, then the lower).
  std::vector<int64_t> order(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return load[static_cast<size_t>(a)] > load[static_cast<size_t>(b)]; });
  auto best_step = [&](std::span<const int64_t> experts) {
    int64_t best_e = -1, best_q = -1;
    double best_t = 0.0;
    for (int64_t e : experts)
      for (int64_t q = 0; q < ranks; ++q) {
        if (fill[static_cast<size_t>(q)] == slots_per_rank) continue;
        holders[static_cast<size_t>(e)].push_back(q);
        const double t = worst_time();
        holders[static_cast<size_t>(e)].pop_back();
        const bool better = best_q < 0 || t < best_t ||
                            (t == best_t && speed[static_cast<size_t>(q)] > speed[static_cast<size_t>(best_q)]);
        if (better) best_e = e, best_q = q, best_t = t;
      }
    holders[static_cast<size_t>(best_e)].push_back(best_q);
    ++fill[static_cast<size_t>(best_q)];
  };
  for (int64_t e : order) best_step(std::span<const int64_t>(&e, 1));
  // 2. The other S - E slots: each time the (expert, rank) replica that leaves the least largest
  //    time, so a slow rank's remaining slots take small shares of cold experts.
  for (int64_t k = E; k < S; ++k) best_step(order);
  std::vector<std::pair<int64_t, int64_t>> expert_rank;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t q : holders[static_cast<size_t>(e)]) expert_rank.push_back({e, q});
  const Placement joint = place(ranks, slots_per_rank, E, expert_rank);
  // 3. The other candidate: EPLB's replicas (the hottest split most), packed largest first onto the
  //    rank with room whose time after taking it is least. Many ranks favour it (the joint greedy
  //    sees only the largest time, which one replica rarely moves); the better of the two is kept.
  const Replicated r = replicate(load, S);
  std::vector<double> share(static_cast<size_t>(S));
  for (int64_t i = 0; i < S; ++i) {
    const auto e = static_cast<size_t>(r.phy2log[static_cast<size_t>(i)]);
    share[static_cast<size_t>(i)] = load[e] / static_cast<double>(r.count[e]);
  }
  const Packed by_time = pack_items(share, ranks, speed);
  Placement packed = empty_placement(ranks, slots_per_rank, E);
  packed.replicas = r.count;
  for (int64_t i = 0; i < S; ++i) {
    const int64_t slot = by_time.pack[static_cast<size_t>(i)] * slots_per_rank + by_time.rank_in_pack[static_cast<size_t>(i)];
    packed.slot_expert[static_cast<size_t>(slot)] = r.phy2log[static_cast<size_t>(i)];
    packed.replica_rank[static_cast<size_t>(slot)] = r.rank[static_cast<size_t>(i)];
  }
  return max_rank_time(joint, load, speed) <= max_rank_time(packed, load, speed) ? joint : packed;
}

Placement contiguous(int64_t experts, int64_t ranks) {
  if (experts < 1 || ranks < 1 || ranks > experts)
    throw InputError(fmt::format("[eplb] {} experts over {} ranks: each rank needs an expert", experts, ranks));
  Placement p;
  p.ranks = ranks;
  p.slots_per_rank = 0;
  for (int64_t r = 0; r < ranks; ++r)
    p.slots_per_rank = std::max(p.slots_per_rank, experts * (r + 1) / ranks - experts * r / ranks);
  if (experts % ranks != 0)
    throw InputError(fmt::format("[eplb] {} experts over {} ranks: the contiguous split has unequal slots", experts, ranks));
  p.slot_expert.resize(static_cast<size_t>(experts));
  std::iota(p.slot_expert.begin(), p.slot_expert.end(), 0);
  p.replicas.assign(static_cast<size_t>(experts), 1);
  p.replica_rank.assign(static_cast<size_t>(experts), 0);
  return p;
}

Placement optimal(std::span<const double> load, int64_t ranks, int64_t slots_per_rank, std::span<const double> speed) {
  check_inputs(load, ranks, slots_per_rank, speed);
  auto speed_of = [&](int64_t r) { return speed.empty() ? 1.0 : speed[static_cast<size_t>(r)]; };
  const auto E = static_cast<int64_t>(load.size());
  const int64_t S = ranks * slots_per_rank;
  if (E > 8 || S > 12) throw InputError(fmt::format("[eplb] the exact search takes E <= 8 and <= 12 slots, not {} and {}", E, S));
  double best = INFINITY;
  Placement out;
  std::vector<int64_t> counts(static_cast<size_t>(E), 1);
  // Items: (weight, expert), sorted descending; a branch and bound over the rank of each item, with
  // ranks of equal (load, fill) tried once.
  auto solve = [&](const std::vector<int64_t>& c) {
    std::vector<std::pair<double, int64_t>> items;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t k = 0; k < c[static_cast<size_t>(e)]; ++k)
        items.push_back({load[static_cast<size_t>(e)] / static_cast<double>(c[static_cast<size_t>(e)]), e});
    std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<double> rank_load(static_cast<size_t>(ranks), 0.0);
    std::vector<int64_t> fill(static_cast<size_t>(ranks), 0), rank_of(items.size(), 0);
    std::function<void(size_t, double)> go = [&](size_t i, double worst) {
      if (worst >= best) return;
      if (i == items.size()) {
        best = worst;
        std::vector<std::pair<int64_t, int64_t>> expert_rank;
        for (size_t j = 0; j < items.size(); ++j) expert_rank.push_back({items[j].second, rank_of[j]});
        out = place(ranks, slots_per_rank, E, expert_rank);
        return;
      }
      for (int64_t r = 0; r < ranks; ++r) {
        if (fill[static_cast<size_t>(r)] == slots_per_rank) continue;
        bool tried = false;  // an earlier rank in the same state: the same subtree
        for (int64_t q = 0; q < r && !tried; ++q)
          tried = fill[static_cast<size_t>(q)] == fill[static_cast<size_t>(r)] &&
                  rank_load[static_cast<size_t>(q)] == rank_load[static_cast<size_t>(r)] && speed_of(q) == speed_of(r);
        if (tried) continue;
        rank_load[static_cast<size_t>(r)] += items[i].first;
        ++fill[static_cast<size_t>(r)];
        rank_of[i] = r;
        go(i + 1, std::max(worst, rank_load[static_cast<size_t>(r)] / speed_of(r)));
        rank_load[static_cast<size_t>(r)] -= items[i].first;
        --fill[static_cast<size_t>(r)];
      }
    };
    go(0, 0.0);
  };
  // Every replica-count vector with c_e >= 1 and Σ c_e = S.
  std::function<void(int64_t, int64_t)> counts_from = [&](int64_t e, int64_t left) {
    if (e == E - 1) {
      counts[static_cast<size_t>(e)] = left;
      solve(counts);
      return;
    }
    for (int64_t c = 1; c <= left - (E - 1 - e); ++c) {
      counts[static_cast<size_t>(e)] = c;
      counts_from(e + 1, left - c);
    }
  };
  counts_from(0, S);
  return out;
}

void check(const Placement& p, int64_t experts) {
  const int64_t S = p.ranks * p.slots_per_rank;
  if (p.ranks < 1 || p.slots_per_rank < 1) throw InputError("[eplb] a placement needs ranks and slots");
  if (static_cast<int64_t>(p.slot_expert.size()) != S || static_cast<int64_t>(p.replica_rank.size()) != S)
    throw InputError(fmt::format("[eplb] {} slot entries for {} ranks x {} slots", p.slot_expert.size(), p.ranks,
                                 p.slots_per_rank));
  if (static_cast<int64_t>(p.replicas.size()) != experts)
    throw InputError(fmt::format("[eplb] replica counts for {} experts, the layer has {}", p.replicas.size(), experts));
  std::vector<int64_t> seen(static_cast<size_t>(experts), 0);
  std::vector<std::vector<bool>> numbered(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    if (p.replicas[static_cast<size_t>(e)] < 1) throw InputError(fmt::format("[eplb] expert {} has no replica", e));
    numbered[static_cast<size_t>(e)].assign(static_cast<size_t>(p.replicas[static_cast<size_t>(e)]), false);
  }
  for (int64_t slot = 0; slot < S; ++slot) {
    const int64_t e = p.slot_expert[static_cast<size_t>(slot)], k = p.replica_rank[static_cast<size_t>(slot)];
    if (e < 0 || e >= experts) throw InputError(fmt::format("[eplb] slot {} holds expert {} of {}", slot, e, experts));
    if (k < 0 || k >= p.replicas[static_cast<size_t>(e)] || numbered[static_cast<size_t>(e)][static_cast<size_t>(k)])
      throw InputError(fmt::format("[eplb] slot {}: replica {} of expert {} (of {}) is not a fresh number", slot, k, e,
                                   p.replicas[static_cast<size_t>(e)]));
    numbered[static_cast<size_t>(e)][static_cast<size_t>(k)] = true;
    ++seen[static_cast<size_t>(e)];
  }
  for (int64_t e = 0; e < experts; ++e)
    if (seen[static_cast<size_t>(e)] != p.replicas[static_cast<size_t>(e)])
      throw InputError(fmt::format("[eplb] expert {} has {} replicas on slots, {} counted", e, seen[static_cast<size_t>(e)],
                                   p.replicas[static_cast<size_t>(e)]));
}

}  // namespace concord::serve::eplb
