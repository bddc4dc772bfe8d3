// Expert placement (serve/eplb.h): DeepSeek EPLB's own README example reproduced slot for slot,
// the invariants of every placement, the packing and EPLB against the exhaustive optimum on small
// instances, and EPLB against the contiguous split on skewed loads.
#include "concord/serve/eplb.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "concord/numerics/check.h"

namespace concord::serve::eplb {
namespace {

// github.com/deepseek-ai/EPLB README: 2 layers of 12 experts, 16 replicas, 4 groups, 2 nodes, 8 GPUs;
// the printed phy2log (the hierarchical policy).
TEST(Eplb, ReproducesDeepSeeksReadmeExample) {
  const std::vector<std::vector<double>> weight = {{90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86},
                                                   {20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27}};
  const std::vector<std::vector<int64_t>> want = {{5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1},
                                                  {7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1}};
  for (size_t layer = 0; layer < 2; ++layer) {
    const Placement p = eplb(weight[layer], 8, 2, 4, 2);
    check(p, 12);
    EXPECT_EQ(p.slot_expert, want[layer]) << "layer " << layer;
  }
}

std::vector<double> zipf(int64_t n, double s, std::mt19937_64& rng, double tokens = 4096) {
  std::vector<double> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) w[static_cast<size_t>(i)] = tokens / std::pow(static_cast<double>(i + 1), s);
  std::shuffle(w.begin(), w.end(), rng);
  for (double& x : w) x = std::round(x);
  return w;
}

TEST(Eplb, EveryPlacementKeepsTheInvariants) {
  std::mt19937_64 rng(23);
  struct Case { int64_t E, ranks, slots, groups, nodes; };
  const Case cases[] = {{8, 4, 2, 1, 1}, {8, 4, 3, 1, 1}, {16, 8, 3, 4, 2}, {64, 16, 5, 8, 4}, {64, 64, 1, 1, 1},
                        {12, 8, 2, 4, 2}, {12, 8, 2, 3, 2} /* groups do not divide: global */, {6, 3, 4, 2, 1}};
  for (const Case& c : cases)
    for (double s : {0.0, 0.8, 1.5}) {
      const std::vector<double> w = zipf(c.E, s, rng);
      const Placement p = eplb(w, c.ranks, c.slots, c.groups, c.nodes);
      EXPECT_NO_THROW(check(p, c.E)) << c.E << " experts, " << c.ranks << " ranks";
      EXPECT_EQ(std::accumulate(p.replicas.begin(), p.replicas.end(), int64_t{0}), c.ranks * c.slots);
      // The loads add up to the tokens: every expert's tokens are split among its replicas.
      const std::vector<double> l = rank_loads(p, w);
      EXPECT_NEAR(std::accumulate(l.begin(), l.end(), 0.0), std::accumulate(w.begin(), w.end(), 0.0), 1e-6);
    }
  Placement bad = eplb(std::vector<double>{5, 1, 1, 1}, 2, 3);
  bad.replicas[0] = 0;
  EXPECT_THROW(check(bad, 4), InputError);
  EXPECT_THROW(eplb(std::vector<double>{1, 2, 3}, 2, 1), InputError);          // 3 experts, 2 slots
  EXPECT_THROW(eplb(std::vector<double>{1, 2, 3, 4}, 3, 2, 1, 2), InputError);  // 3 ranks, 2 nodes
  EXPECT_THROW(eplb(std::vector<double>{1, NAN}, 2, 1), InputError);
}

// The packing alone against brute force (every assignment with equal pack sizes), and the whole
// placement against the exhaustive optimum: never below it (a check of the optimum), and how far
// above it, over random skewed instances.
TEST(Eplb, AgainstTheExhaustiveOptimum) {
  std::mt19937_64 rng(7);
  double worst_packing = 1.0, worst_placement = 1.0, sum_placement = 0.0;
  int placements = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t packs = 2 + trial % 3, per = packs == 2 ? 2 + trial % 3 : 2, n = packs * per;  // n <= 8
    std::vector<double> w(static_cast<size_t>(n));
    for (double& x : w) x = std::round(std::exp(std::normal_distribution<double>(4.0, 1.0)(rng)));
    const std::vector<int64_t> pack = balanced_packing(w, packs);
    std::vector<double> load(static_cast<size_t>(packs), 0.0);
    std::vector<int64_t> size(static_cast<size_t>(packs), 0);
    for (int64_t i = 0; i < n; ++i) {
      load[static_cast<size_t>(pack[static_cast<size_t>(i)])] += w[static_cast<size_t>(i)];
      ++size[static_cast<size_t>(pack[static_cast<size_t>(i)])];
    }
    for (int64_t s : size) EXPECT_EQ(s, per);
    // Brute force: every pack-of-item vector (packs^n) with equal sizes.
    double best = INFINITY;
    std::vector<int64_t> a(static_cast<size_t>(n), 0);
    for (int64_t code = 0; code < static_cast<int64_t>(std::pow(packs, n)); ++code) {
      int64_t c = code;
      std::vector<double> l(static_cast<size_t>(packs), 0.0);
      std::vector<int64_t> z(static_cast<size_t>(packs), 0);
      for (int64_t i = 0; i < n; ++i, c /= packs) {
        l[static_cast<size_t>(c % packs)] += w[static_cast<size_t>(i)];
        ++z[static_cast<size_t>(c % packs)];
      }
      if (std::all_of(z.begin(), z.end(), [&](int64_t s) { return s == per; }))
        best = std::min(best, *std::max_element(l.begin(), l.end()));
    }
    const double greedy = *std::max_element(load.begin(), load.end());
    EXPECT_GE(greedy, best - 1e-9);
    worst_packing = std::max(worst_packing, greedy / best);

    // Placement: E experts, ranks x slots with spare slots for replicas.
    const int64_t E = 3 + trial % 4, ranks = 2 + trial % 2, slots = (E + 1 + ranks - 1) / ranks + trial % 2;
    const std::vector<double> wl = zipf(E, 1.2, rng, 1000);
    if (ranks * slots > 12) continue;
    const Placement opt = optimal(wl, ranks, slots);
    check(opt, E);
    const Placement heuristic = eplb(wl, ranks, slots);
    const double o = max_rank_load(opt, wl), h = max_rank_load(heuristic, wl);
    EXPECT_LE(o, h + 1e-9) << "the exhaustive optimum is above EPLB: not an optimum";
    worst_placement = std::max(worst_placement, h / o);
    sum_placement += h / o;
    ++placements;
  }
  // LPT-style greedy packing with equal pack sizes stays well inside 4/3 of the optimum here.
  EXPECT_LT(worst_packing, 4.0 / 3.0);
  std::printf("[ measured ] EPLB packing / optimum: worst %.3f; EPLB placement / optimum over %d instances: worst %.3f, "
              "mean %.3f\n", worst_packing, placements, worst_placement, sum_placement / placements);
  EXPECT_GT(placements, 20);
}

// Ranks of unequal speed (a rank 3x slower): the speed-aware placement against the exhaustive
// optimum of the same objective (the largest load / speed), and against EPLB, which balances loads
// and so leaves the slow rank the longest.
TEST(Eplb, SpeedAwarePlacementAgainstTheOptimumAndEplb) {
  std::mt19937_64 rng(11);
  double worst = 1.0, sum = 0.0, eplb_sum = 0.0;
  int n = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t E = 3 + trial % 4, ranks = 2 + trial % 2, slots = (E + 1 + ranks - 1) / ranks + trial % 2;
    if (ranks * slots > 12) continue;
    const std::vector<double> w = zipf(E, 1.0, rng, 1000);
    std::vector<double> speed(static_cast<size_t>(ranks), 1.0);
    speed[static_cast<size_t>(trial % ranks)] = 1.0 / 3.0;
    const Placement fast = speed_aware(w, speed, slots);
    check(fast, E);
    const Placement opt = optimal(w, ranks, slots, speed);
    check(opt, E);
    const double o = max_rank_time(opt, w, speed), h = max_rank_time(fast, w, speed);
    EXPECT_LE(o, h + 1e-9);
    EXPECT_LE(o, max_rank_time(eplb(w, ranks, slots), w, speed) + 1e-9);
    worst = std::max(worst, h / o);
    sum += h / o;
    eplb_sum += max_rank_time(eplb(w, ranks, slots), w, speed) / o;
    ++n;
  }
  EXPECT_GT(n, 20);
  EXPECT_LT(sum / n, eplb_sum / n);  // on average nearer the optimum than speed-blind EPLB
  std::printf("[ measured ] a rank 3x slower, %d instances: speed-aware / optimum worst %.3f mean %.3f; EPLB / optimum "
              "mean %.3f\n", n, worst, sum / n, eplb_sum / n);
  // 64 Zipf experts on 16 ranks, one 3x slower, 5 slots a rank.
  const std::vector<double> w = zipf(64, 1.2, rng);
  std::vector<double> speed(16, 1.0);
  speed[3] = 1.0 / 3.0;
  const double balanced = max_rank_time(eplb(w, 16, 5), w, speed), aware = max_rank_time(speed_aware(w, speed, 5), w, speed);
  EXPECT_LT(aware, balanced);
  std::printf("[ measured ] 64 experts, 16 ranks, rank 3 3x slower: largest time EPLB %.0f, speed-aware %.0f (%.0f%% "
              "less)\n", balanced, aware, 100.0 * (1.0 - aware / balanced));
  EXPECT_THROW(speed_aware(w, std::vector<double>{1.0, 0.0}, 40), InputError);
}

TEST(Eplb, ReplicasCutTheSkewOfTheContiguousSplit) {
  std::mt19937_64 rng(5);
  const std::vector<double> w = zipf(64, 1.2, rng);
  const double mean = std::accumulate(w.begin(), w.end(), 0.0) / 16.0;
  const double plain = max_rank_load(contiguous(64, 16), w);
  const double balanced = max_rank_load(eplb(w, 16, 5), w);  // 16 spare slots
  EXPECT_LT(balanced, plain);
  EXPECT_LT(balanced / mean, 1.25);
  std::printf("[ measured ] 64 experts (Zipf 1.2) on 16 ranks: contiguous max/mean %.2f, EPLB with 16 replicas %.2f\n",
              plain / mean, balanced / mean);
}

}  // namespace
}  // namespace concord::serve::eplb
