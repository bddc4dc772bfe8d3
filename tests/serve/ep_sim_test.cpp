// The expert-parallel simulator (serve/ep_sim.h): the even router splits rows as block_moe.cpp does,
// the balanced router never leaves a slower rank than the even one and splits by speed, the lower
// bound lies under every placement, the cost-model fit recovers a known model exactly from runs it
// generated, the trace file round-trips and rejects corrupt input, and the synthetic router keeps
// its invariants.
#include "concord/serve/ep_sim.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "concord/numerics/check.h"

namespace concord::serve::epsim {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("concord_ep_sim_" + std::to_string(::getpid()) + "_" + name)).string();
}

CostModel compute_only(double pass, double piece, double row) {
  CostModel c;
  c.pass_s = pass;
  c.piece_s = piece;
  c.row_s = row;
  return c;
}

TEST(EpSim, EvenRouterSplitsAnExpertsRowsAmongItsHoldersInOrder) {
  // 3 experts on 2 ranks of 2 slots: expert 0 on both ranks, expert 1 twice on rank 1.
  eplb::Placement p;
  p.ranks = 2;
  p.slots_per_rank = 2;
  p.slot_expert = {0, 2, 0, 1};
  const std::vector<int64_t> counts = {7, 5, 3};
  const RankWork w = rank_work(p, counts, {}, compute_only(0, 0, 1), Router::even);
  // Expert 0: holders (rank 0, rank 1): rows [0, 3) and [3, 7). Expert 1: one holder. Expert 2: rank 0.
  EXPECT_EQ(w.rows, (std::vector<double>{3 + 3, 4 + 5}));
  EXPECT_EQ(w.pieces, (std::vector<double>{2, 2}));
}

TEST(EpSim, BalancedRouterSplitsByTheHoldersSpeeds) {
  eplb::Placement p;
  p.ranks = 2;
  p.slots_per_rank = 1;
  p.slot_expert = {0, 0};
  const std::vector<int64_t> counts = {300};
  const std::vector<double> speed = {1.0, 0.5};
  const RankWork w = rank_work(p, counts, speed, compute_only(0, 0, 1e-6), Router::balanced);
  EXPECT_NEAR(w.rows[0], 200, 1e-9);
  EXPECT_NEAR(w.rows[1], 100, 1e-9);
  const LayerTime t = layer_time(w, speed, compute_only(0, 0, 1e-6));
  EXPECT_NEAR(t.compute_s[0], t.compute_s[1], 1e-15);
}

TEST(EpSim, BalancedRouterIsNeverSlowerThanTheEvenSplit) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t E = 4 + static_cast<int64_t>(rng() % 13), R = 2 + static_cast<int64_t>(rng() % 7);
    const int64_t s = (E + R - 1) / R + static_cast<int64_t>(rng() % 3);
    std::vector<double> plan(static_cast<size_t>(E));
    std::vector<int64_t> counts(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      plan[static_cast<size_t>(e)] = 1.0 + static_cast<double>(rng() % 100);
      counts[static_cast<size_t>(e)] = static_cast<int64_t>(rng() % 200);
    }
    std::vector<double> speed(static_cast<size_t>(R), 1.0);
    if (trial % 2) speed[rng() % static_cast<size_t>(R)] = 1.0 / 3.0;
    const eplb::Placement p = eplb::eplb(plan, R, s);
    const CostModel c = compute_only(1e-5, 3e-6, 1e-6);
    const LayerTime even = layer_time(rank_work(p, counts, speed, c, Router::even), speed, c);
    const LayerTime bal = layer_time(rank_work(p, counts, speed, c, Router::balanced), speed, c);
    EXPECT_LE(bal.layer_s, even.layer_s * (1 + 1e-12)) << "trial " << trial;
    // Every routed row is computed once.
    const RankWork w = rank_work(p, counts, speed, c, Router::balanced);
    EXPECT_NEAR(std::accumulate(w.rows.begin(), w.rows.end(), 0.0),
                static_cast<double>(std::accumulate(counts.begin(), counts.end(), int64_t{0})), 1e-6);
  }
}

// The whole-row split real ranks run (row_shares): every expert's rows to its holders, in
// ascending rank order, summing to its count; the balanced router's shares within a row of the
// fractional ones; the even router's are the even split's.
TEST(EpSim, RowSharesGiveEveryRowToAHolderInWholeRows) {
  std::mt19937_64 rng(13);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t E = 4 + static_cast<int64_t>(rng() % 13), R = 2 + static_cast<int64_t>(rng() % 5);
    const int64_t s = (E + R - 1) / R + 1 + static_cast<int64_t>(rng() % 2);
    std::vector<double> plan(static_cast<size_t>(E));
    std::vector<int64_t> counts(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      plan[static_cast<size_t>(e)] = 1.0 + static_cast<double>(rng() % 100);
      counts[static_cast<size_t>(e)] = static_cast<int64_t>(rng() % 60);
    }
    std::vector<double> speed(static_cast<size_t>(R), 1.0);
    speed[rng() % static_cast<size_t>(R)] = 1.0 / 3.0;
    const eplb::Placement p = eplb::eplb(plan, R, s);
    const std::vector<std::vector<int64_t>> slots = eplb::rank_slots(p);
    const CostModel c = compute_only(1e-5, 3e-6, 1e-6);
    for (const Router router : {Router::even, Router::balanced}) {
      const auto shares = row_shares(slots, counts, speed, c, router);
      const RankWork w = rank_work(p, counts, speed, c, router);
      ASSERT_EQ(static_cast<int64_t>(shares.size()), E);
      std::vector<double> rows(static_cast<size_t>(R), 0.0);
      for (int64_t e = 0; e < E; ++e) {
        int64_t sum = 0, last = -1;
        for (const auto& [r, n] : shares[static_cast<size_t>(e)]) {
          EXPECT_GT(r, last) << "ascending ranks";
          last = r;
          EXPECT_GT(n, 0);
          const auto& held = slots[static_cast<size_t>(r)];
          EXPECT_NE(std::find(held.begin(), held.end(), e), held.end()) << "rank " << r << " does not hold expert " << e;
          sum += n;
          rows[static_cast<size_t>(r)] += static_cast<double>(n);
        }
        EXPECT_EQ(sum, counts[static_cast<size_t>(e)]) << "expert " << e;
      }
      // Whole rows within one row per expert of the model's shares on every rank.
      for (int64_t r = 0; r < R; ++r)
        EXPECT_NEAR(rows[static_cast<size_t>(r)], w.rows[static_cast<size_t>(r)], static_cast<double>(E)) << "rank " << r;
      if (router == Router::even) {
        for (int64_t r = 0; r < R; ++r) EXPECT_EQ(rows[static_cast<size_t>(r)], w.rows[static_cast<size_t>(r)]);
      }
    }
  }
}

TEST(EpSim, TheBoundLiesUnderEveryPlacementAndRouter) {
  std::mt19937_64 rng(11);
  CostModel c = default_gpu_cost();
  for (int trial = 0; trial < 100; ++trial) {
    c.alltoall = trial % 2 == 0;
    const int64_t E = 8, R = trial % 3 == 0 ? 4 : 2, s = E / R + 1;
    std::vector<double> plan(E);
    std::vector<int64_t> counts(E);
    for (int64_t e = 0; e < E; ++e) {
      plan[static_cast<size_t>(e)] = 1.0 + static_cast<double>(rng() % 50);
      counts[static_cast<size_t>(e)] = static_cast<int64_t>(rng() % 400);
    }
    std::vector<double> speed(static_cast<size_t>(R), 1.0);
    speed[0] = 0.5;
    const double lb = layer_bound(counts, speed, R, c);
    for (const eplb::Placement& p : {eplb::contiguous(E, R), eplb::eplb(plan, R, s), eplb::speed_aware(plan, speed, s)})
      for (Router r : {Router::even, Router::balanced})
        EXPECT_LE(lb, layer_time(rank_work(p, counts, speed, c, r), speed, c).layer_s * (1 + 1e-12));
  }
}

TEST(EpSim, LayerTimeWaitsForTheSlowestRank) {
  RankWork w;
  w.rows = {100, 100};
  w.pieces = {1, 1};
  CostModel c = compute_only(1e-6, 2e-6, 1e-7);
  c.exchange_pass_s = 5e-6;
  c.exchange_row_s = 1e-8;
  const LayerTime even = layer_time(w, {}, c);
  EXPECT_DOUBLE_EQ(even.compute_s[0], even.compute_s[1]);
  EXPECT_DOUBLE_EQ(even.imbalance, 1.0);
  const std::vector<double> speed = {1.0, 0.25};
  const LayerTime slow = layer_time(w, speed, c);
  EXPECT_DOUBLE_EQ(slow.compute_s[1], 4 * even.compute_s[1]);
  EXPECT_DOUBLE_EQ(slow.layer_s, slow.compute_s[1] + slow.exchange_s);
  EXPECT_DOUBLE_EQ(slow.exchange_s, 5e-6 + 1e-8 * 100);  // allgather: each rank receives the other's 100 rows
}

Trace small_trace() {
  Trace t;
  t.experts = 6;
  t.top_k = 2;
  std::mt19937_64 rng(3);
  for (int64_t app : {0, 2}) {
    TraceLayer l;
    l.application = app;
    l.pass_rows = {5, 1, 1, 3};
    for (int64_t tok = 0; tok < 10; ++tok) {
      const auto a = static_cast<int32_t>(rng() % 6);
      const auto b = static_cast<int32_t>((a + 1 + static_cast<int32_t>(rng() % 5)) % 6);
      l.selected.push_back(std::min(a, b));
      l.selected.push_back(std::max(a, b));
    }
    t.layers.push_back(l);
  }
  return t;
}

TEST(EpSim, TraceFilesRoundTripAndCorruptOnesAreRejected) {
  const Trace t = small_trace();
  const std::string path = temp_path("trace.jsonl");
  write_trace(path, t, "m.gguf");
  const Trace back = read_trace(path);
  EXPECT_EQ(back.experts, 6);
  EXPECT_EQ(back.top_k, 2);
  ASSERT_EQ(back.layers.size(), 2u);
  EXPECT_EQ(back.layers[1].application, 2);
  EXPECT_EQ(back.layers[1].selected, t.layers[1].selected);
  EXPECT_EQ(back.layers[0].pass_rows, t.layers[0].pass_rows);
  EXPECT_EQ(back.tokens(), 10);

  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  auto rejects = [&](const std::vector<std::string>& ls, const std::string& want) {
    const std::string bad = temp_path("bad.jsonl");
    std::ofstream out(bad);
    for (const std::string& l : ls) out << l << "\n";
    out.close();
    try {
      read_trace(bad);
      ADD_FAILURE() << "accepted a trace that should fail with: " << want;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    std::filesystem::remove(bad);
  };
  rejects({lines[0], lines[1].substr(0, lines[1].size() / 2)}, "line 2: not a routing trace");
  std::string out_of_range = lines[1];
  out_of_range.replace(out_of_range.find("\"selected\":[") + 12, 1, "9");
  rejects({lines[0], out_of_range}, "expert 9 outside 0..5");
  std::string short_pass = lines[2];
  short_pass.replace(short_pass.find("[5,"), 3, "[4,");
  rejects({lines[0], lines[1], short_pass}, "picks");
  rejects({lines[1]}, "the first line is not a routing-trace header");
  rejects({lines[0]}, "without MoE layers");
  std::filesystem::remove(path);
}

TEST(EpSim, PassesAndBatchesCountTheTracesPicks) {
  const Trace t = small_trace();
  const std::vector<Batch> passes = passes_of(t);
  ASSERT_EQ(passes.size(), 4u);
  // Pass 0 holds tokens 0..4 of each layer.
  for (size_t l = 0; l < 2; ++l) {
    std::vector<int64_t> want(6, 0);
    for (int i = 0; i < 10; ++i) ++want[static_cast<size_t>(t.layers[l].selected[static_cast<size_t>(i)])];
    EXPECT_EQ(passes[0].counts[l], want);
  }
  const std::vector<Batch> b = sample_batches(t, 4, 30, true, 5);
  EXPECT_EQ(b.size(), 30u);
  for (const Batch& x : b)
    for (const auto& c : x.counts) EXPECT_EQ(std::accumulate(c.begin(), c.end(), int64_t{0}), 8);
  const std::vector<Batch> again = sample_batches(t, 4, 30, false, 5);
  EXPECT_EQ(sample_batches(t, 4, 30, false, 5)[7].counts, again[7].counts);  // seeded
  EXPECT_THROW(sample_batches(t, 11, 1, true, 1), InputError);
}

TEST(EpSim, TheZipfRouterPicksDistinctExpertsAndIsSeeded) {
  Zipf z;
  z.experts = 16;
  z.top_k = 4;
  z.layers = 3;
  z.tokens = 50;
  z.skew = 1.2;
  const std::vector<Batch> a = zipf_batches(z, 20, 9), b = zipf_batches(z, 20, 9), c = zipf_batches(z, 20, 10);
  EXPECT_EQ(a[19].counts, b[19].counts);
  EXPECT_NE(a[19].counts, c[19].counts);
  std::vector<double> total(16, 0.0);
  for (const Batch& x : a)
    for (const auto& layer : x.counts) {
      EXPECT_EQ(std::accumulate(layer.begin(), layer.end(), int64_t{0}), 200);
      for (int64_t n : layer) EXPECT_LE(n, 50);  // distinct picks: at most once per token
    }
  for (size_t e = 0; e < 16; ++e) total[e] = static_cast<double>(a[0].counts[0][e]);
  // Skewed: the hottest expert of a layer carries well above the mean (200 / 16 = 12.5).
  EXPECT_GT(*std::max_element(total.begin(), total.end()), 25.0);
  z.top_k = 17;
  EXPECT_THROW(zipf_batches(z, 1, 1), InputError);
}

TEST(EpSim, TheFitRecoversTheCostModelThatMadeTheRuns) {
  // Runs "measured" with a known cost model: the fit must give it back and predict them exactly.
  const Trace t = small_trace();
  CostModel truth = compute_only(4e-6, 3e-6, 2e-7);
  truth.exchange_pass_s = 6e-6;
  truth.exchange_row_s = 5e-8;
  std::vector<MeasuredRun> runs;
  const std::vector<std::vector<std::vector<int64_t>>> placements = {{{0, 1, 2}, {3, 4, 5}}, {{0, 1, 5}, {2, 3, 4, 0}}};
  for (size_t k = 0; k < placements.size(); ++k) {
    MeasuredRun run;
    run.name = "run" + std::to_string(k);
    run.trace = t;
    const std::vector<double> slow = {1.0, k == 1 ? 2.0 : 1.0};
    for (const TraceLayer& l : t.layers) {
      std::vector<RankRecord> recs(2);
      int64_t offset = 0;
      for (int64_t rows : l.pass_rows) {
        std::vector<int64_t> counts(6, 0);
        for (int64_t i = offset * 2; i < (offset + rows) * 2; ++i) ++counts[static_cast<size_t>(l.selected[static_cast<size_t>(i)])];
        offset += rows;
        RankWork w;  // unequal slots: the even split by hand
        w.rows.assign(2, 0);
        w.pieces.assign(2, 0);
        std::vector<std::vector<int64_t>> holders(6);
        for (int64_t r = 0; r < 2; ++r)
          for (int64_t e : placements[k][static_cast<size_t>(r)]) holders[static_cast<size_t>(e)].push_back(r);
        for (int64_t e = 0; e < 6; ++e) {
          const auto c = static_cast<int64_t>(holders[static_cast<size_t>(e)].size());
          for (int64_t i = 0; i < c; ++i) {
            const int64_t n = counts[static_cast<size_t>(e)] * (i + 1) / c - counts[static_cast<size_t>(e)] * i / c;
            if (n == 0) continue;
            w.rows[static_cast<size_t>(holders[static_cast<size_t>(e)][static_cast<size_t>(i)])] += static_cast<double>(n);
            w.pieces[static_cast<size_t>(holders[static_cast<size_t>(e)][static_cast<size_t>(i)])] += 1;
          }
        }
        std::vector<double> speed = {1.0 / slow[0], 1.0 / slow[1]};
        const LayerTime lt = layer_time(w, speed, truth);
        const double slowest = lt.layer_s - lt.exchange_s;
        for (int64_t r = 0; r < 2; ++r) {
          RankRecord& rec = recs[static_cast<size_t>(r)];
          rec.pass_compute_s.push_back(lt.compute_s[static_cast<size_t>(r)]);
          rec.pass_wait_s.push_back(slowest - lt.compute_s[static_cast<size_t>(r)] + lt.exchange_s);
          rec.rows += static_cast<int64_t>(w.rows[static_cast<size_t>(r)]);
        }
      }
      for (int64_t r = 0; r < 2; ++r) {
        RankRecord& rec = recs[static_cast<size_t>(r)];
        rec.application = l.application;
        rec.rank = r;
        rec.passes = static_cast<int64_t>(l.pass_rows.size());
        rec.slow_factor = slow[static_cast<size_t>(r)];
        rec.slots = placements[k][static_cast<size_t>(r)];
        for (size_t i = 0; i < rec.pass_compute_s.size(); ++i) {
          rec.compute_s += rec.pass_compute_s[i];
          rec.wait_s += rec.pass_wait_s[i];
        }
        run.records.push_back(rec);
      }
    }
    runs.push_back(run);
  }
  const CostModel got = fit(std::span<const MeasuredRun>(runs.data(), 1));
  EXPECT_NEAR(got.pass_s, truth.pass_s, 1e-12);
  EXPECT_NEAR(got.piece_s, truth.piece_s, 1e-12);
  EXPECT_NEAR(got.row_s, truth.row_s, 1e-13);
  EXPECT_NEAR(got.exchange_pass_s, truth.exchange_pass_s, 1e-12);
  EXPECT_NEAR(got.exchange_row_s, truth.exchange_row_s, 1e-13);
  // The other run (a replicated placement, a rank 2x slower) predicted from the fit alone.
  for (const Prediction& p : predict(runs[1], got)) {
    EXPECT_NEAR(p.predicted_s, p.measured_s, 1e-9 * p.measured_s) << "application " << p.application;
    ASSERT_EQ(p.measured_pass_s.size(), 4u);
    for (size_t k = 0; k < 4; ++k) EXPECT_NEAR(p.predicted_pass_s[k], p.measured_pass_s[k], 1e-15);
  }
  // A trace of another run: one pick moved from rank 0's experts (0-2) to rank 1's (3-5), so the
  // ranks' rows disagree with the records, and the error says so.
  MeasuredRun wrong = runs[0];
  int32_t& pick = wrong.trace.layers[0].selected[0];
  pick = pick < 3 ? 5 : 0;
  try {
    fit(std::span<const MeasuredRun>(&wrong, 1));
    ADD_FAILURE() << "a trace that disagrees with the records was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("not of the same run"), std::string::npos) << e.what();
  }
}

TEST(EpSim, SimulateSummarisesEveryLayerOfEveryBatch) {
  Zipf z;
  z.experts = 8;
  z.top_k = 2;
  z.layers = 2;
  z.tokens = 64;
  z.skew = 1.5;
  const std::vector<Batch> plan = zipf_batches(z, 10, 1), run = zipf_batches(z, 40, 2);
  const auto loads = layer_loads(plan);
  CostModel c = compute_only(1e-6, 1e-7, 1e-6);
  c.exchange_pass_s = 1e-6;
  c.exchange_row_s = 1e-8;
  std::vector<eplb::Placement> contiguous, balanced;
  for (const auto& w : loads) {
    contiguous.push_back(eplb::contiguous(8, 4));
    balanced.push_back(eplb::eplb(w, 4, 3));
  }
  const Summary a = simulate(run, contiguous, {}, c, Router::even), b = simulate(run, balanced, {}, c, Router::balanced);
  EXPECT_EQ(a.layer_s.size(), 80u);
  EXPECT_LE(a.p50, a.p99);
  EXPECT_GE(a.imbalance, 1.0);
  EXPECT_GE(a.wait_share, 0.0);
  EXPECT_LT(a.wait_share, 1.0);
  EXPECT_LT(b.mean, a.mean);  // skewed routing: EPLB with re-routing beats the contiguous split
  const Summary lb = bound(run, {}, 4, c);
  EXPECT_LE(lb.mean, b.mean);
  EXPECT_DOUBLE_EQ(quantile({3, 1, 2, 4}, 0.5), 2);
  EXPECT_DOUBLE_EQ(quantile({3, 1, 2, 4}, 0.99), 4);
}

}  // namespace
}  // namespace concord::serve::epsim

namespace concord::serve::epsim {
namespace {

// The tail search: never worse than its start on the planning batches (it only keeps improvements),
// a valid placement (every expert held, equal slots), seeded, and better than EPLB on skewed bursty
// batches it was not planned on.
TEST(EpSim, TheTailSearchKeepsAValidPlacementAndLowersTheTail) {
  Zipf z;
  z.experts = 32;
  z.top_k = 4;
  z.layers = 1;
  z.tokens = 512;
  z.skew = 1.0;
  const std::vector<Batch> plan = zipf_batches(z, 40, 1), run = zipf_batches(z, 200, 2);
  std::vector<std::vector<int64_t>> plan_counts;
  for (const Batch& b : plan) plan_counts.push_back(b.counts[0]);
  const auto loads = layer_loads(plan);
  const CostModel c = default_gpu_cost();
  const eplb::Placement start = eplb::eplb(loads[0], 8, 5);
  const eplb::Placement a = tail_search(start, plan_counts, {}, c, Router::balanced, 300, 7);
  const eplb::Placement b = tail_search(start, plan_counts, {}, c, Router::balanced, 300, 7);
  EXPECT_EQ(a.slot_expert, b.slot_expert);
  eplb::check(a, 32);
  EXPECT_LE(tail_objective(a, plan_counts, {}, c, Router::balanced), tail_objective(start, plan_counts, {}, c, Router::balanced));
  const Summary s_eplb = simulate(run, std::vector<eplb::Placement>{start}, {}, c, Router::even);
  const Summary s_search = simulate(run, std::vector<eplb::Placement>{a}, {}, c, Router::balanced);
  EXPECT_LT(s_search.p99, s_eplb.p99);
  EXPECT_GE(s_search.p99, bound(run, {}, 8, c).p99);
  // A slow rank: the search starts anywhere and still keeps every expert placed.
  const std::vector<double> speed = {1, 1, 1, 0.5, 1, 1, 1, 1};
  const eplb::Placement slow = tail_search(start, plan_counts, speed, c, Router::balanced, 200, 3);
  eplb::check(slow, 32);
  EXPECT_LT(tail_objective(slow, plan_counts, speed, c, Router::balanced),
            tail_objective(start, plan_counts, speed, c, Router::balanced));
}

}  // namespace
}  // namespace concord::serve::epsim
