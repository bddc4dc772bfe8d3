// Peak-memory scheduling (sched/sched.h): the memory model by hand on small graphs (lifetimes,
// kept tensors, workspace, in place); the exact DP against brute force over every topological
// order on random DAGs of up to 10 nodes; lower bounds never above the optimum; the budgeted DP's
// bound and order; every planner's plan replayed byte by byte, its high-water mark the plan's
// arena, never below the order's peak; bad graphs refused.
#include "concord/sched/sched.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <string>

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::sched {
namespace {

// a -> {b, c} -> d: a diamond; which branch runs first decides the peak.
Graph diamond() {
  Graph g;
  const int x = g.add_tensor("x", 10);
  const int a = g.add_tensor("a", 100), b = g.add_tensor("b", 50), c = g.add_tensor("c", 5), d = g.add_tensor("d", 1, true);
  const int b2 = g.add_tensor("b2", 5), c2 = g.add_tensor("c2", 40);
  g.add_node("A", {x}, {a});
  g.add_node("B", {a}, {b});
  g.add_node("B2", {b}, {b2});
  g.add_node("C", {a}, {c});
  g.add_node("C2", {c}, {c2});
  g.add_node("D", {b2, c2}, {d});
  return g;
}

TEST(Sched, TheMemoryModelByHand) {
  const Graph g = diamond();
  // A: x + a = 110. B: a + b = 150. B2: a + b + b2 = 155 (a still needed by C). C: a + b2 + c = 110.
  // C2: b2 + c + c2 = 50. D: b2 + c2 + d = 46.
  const Order o = {0, 1, 2, 3, 4, 5};
  std::vector<int64_t> live;
  for (const StepMemory& s : memory_profile(g, o)) live.push_back(s.live);
  EXPECT_EQ(live, (std::vector<int64_t>{110, 150, 155, 110, 50, 46}));
  EXPECT_EQ(peak(g, o), 155);
  // C's branch first: A 110, C 105, C2 145 (a, c, c2), B 190 (a + c2 + b) ...
  EXPECT_EQ(peak(g, {0, 3, 4, 1, 2, 5}), 190);
  EXPECT_EQ(dp_schedule(g).peak, 155);
  EXPECT_EQ(brute_force_schedule(g).second, 155);
}

TEST(Sched, KeptTensorsWorkspaceAndInPlace) {
  Graph g;
  const int x = g.add_tensor("x", 64);
  const int h = g.add_tensor("h", 64), y = g.add_tensor("y", 64), s = g.add_tensor("saved", 32, true);
  g.add_node("norm", {x}, {h, s}, /*workspace=*/16);
  g.add_node("act", {h}, {y}, 0, /*inplace_input=*/0);  // h's only reader: y takes its buffer
  auto prof = memory_profile(g, {0, 1});
  EXPECT_EQ(prof[0].live, 64 + 64 + 32 + 16);
  EXPECT_EQ(prof[1].live, 64 + 32);  // y in h's buffer, x freed, saved kept
  // A second reader of h: no longer in place.
  const int z = g.add_tensor("z", 8);
  g.add_node("peek", {h}, {z});
  prof = memory_profile(g, {0, 1, 2});
  EXPECT_EQ(prof[1].live, 64 + 32 + 64);
  for (Planner p : kPlanners) {
    const ArenaPlan plan = plan_offsets(g, {0, 2, 1}, p);
    EXPECT_EQ(replay_plan(g, {0, 2, 1}, plan), plan.arena_bytes);
  }
}

TEST(Sched, TheDpIsTheBruteForceOptimumAndBoundsHold) {
  int optimal_better_than_program = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    const int n = 2 + static_cast<int>(seed % 9);  // 2..10 nodes
    const Graph g = random_graph(n, seed);
    const auto [bf_order, bf_peak] = brute_force_schedule(g);
    const DpResult dp = dp_schedule(g);
    ASSERT_TRUE(dp.optimal) << seed;
    EXPECT_EQ(dp.peak, bf_peak) << "seed " << seed;
    EXPECT_EQ(peak(g, dp.order), dp.peak) << "seed " << seed;
    EXPECT_TRUE(is_topological(g, dp.order));
    EXPECT_LE(working_set_bound(g), bf_peak) << "seed " << seed;
    EXPECT_LE(bf_peak, peak(g, greedy_order(g))) << "seed " << seed;
    const int64_t program = peak(g, program_order(g));
    EXPECT_LE(bf_peak, program);
    optimal_better_than_program += bf_peak < program;
  }
  EXPECT_GT(optimal_better_than_program, 10);  // the search matters on these graphs
}

TEST(Sched, ABudgetedDpReportsAValidBoundAndItsGap) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const Graph g = random_graph(10, seed);
    const int64_t opt = brute_force_schedule(g).second;
    const DpResult r = dp_schedule(g, {.max_states = 3, .max_seconds = 60});
    EXPECT_LE(r.lower_bound, opt) << seed;
    EXPECT_GE(r.peak, opt) << seed;
    EXPECT_EQ(peak(g, r.order), r.peak) << seed;
    EXPECT_EQ(r.optimal, r.lower_bound == r.peak);
  }
}

TEST(Sched, EveryPlannerPlacesEveryTensorWithoutOverlapOnLargerGraphs) {
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    const Graph g = random_graph(40, seed, 5000);
    for (const Order& o : {program_order(g), greedy_order(g)}) {
      const int64_t live_peak = peak(g, o);
      std::map<Planner, int64_t> arena;
      for (Planner p : kPlanners) {
        const ArenaPlan plan = plan_offsets(g, o, p, 64);
        const int64_t measured = replay_plan(g, o, plan);
        EXPECT_EQ(measured, plan.arena_bytes) << seed;
        EXPECT_GE(plan.arena_bytes, live_peak) << seed;  // rounding and fragmentation only add
        arena[p] = plan.arena_bytes;
      }
      // Hill climbing starts from greedy-by-size and keeps only swaps that do not grow the arena.
      EXPECT_LE(arena[Planner::hill_climb], arena[Planner::greedy_by_size]) << seed;
    }
  }
}

// The exact planner: never above any heuristic, at or above the bound, optimal within its budget on
// small graphs, and equal to a brute force over every offset assignment (on a grid of the
// alignment) on the smallest — a check that shares nothing with its lowest-fit search.
TEST(Sched, TheExactPlannerIsTheSmallestArena) {
  int better = 0;
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    const Graph g = random_graph(3 + static_cast<int>(seed % 6), seed, 256);
    const Order o = greedy_order(g);
    const ArenaPlan exact = plan_offsets(g, o, Planner::exact, 64);
    EXPECT_TRUE(exact.optimal) << seed;
    EXPECT_GE(exact.arena_bytes, exact.lower_bound) << seed;
    EXPECT_EQ(replay_plan(g, o, exact), exact.arena_bytes) << seed;
    int64_t best_heuristic = INT64_MAX;
    for (Planner p : kPlanners) best_heuristic = std::min(best_heuristic, plan_offsets(g, o, p, 64).arena_bytes);
    EXPECT_LE(exact.arena_bytes, best_heuristic) << seed;
    better += exact.arena_bytes < plan_offsets(g, o, Planner::greedy_by_size, 64).arena_bytes;
    // Brute force: buffers (an in-place output shares its input's) with their lifetimes and sizes
    // in units of 64 bytes, every offset 0..sum for each.
    struct B {
      int64_t units;
      int first, last;
    };
    std::map<int64_t, B> buffers;  // by a key: root tensor, or -(node + 1) for a workspace
    const std::vector<int> root = buffer_of(g);
    for (const Placement& p : exact.placements) {
      const int64_t key = p.tensor >= 0 ? root[static_cast<size_t>(p.tensor)] : -(p.node + 1);
      const int64_t units = (g.tensors.size() > 0 && p.tensor >= 0 ? g.tensors[static_cast<size_t>(root[static_cast<size_t>(p.tensor)])].bytes : p.bytes);
      auto [it, fresh] = buffers.try_emplace(key, B{(units + 63) / 64, p.first_step, p.last_step});
      if (!fresh) {
        it->second.first = std::min(it->second.first, p.first_step);
        it->second.last = std::max(it->second.last, p.last_step);
      }
    }
    if (buffers.size() > 6) continue;
    std::vector<B> list;
    int64_t total = 0;
    for (const auto& [k, b] : buffers) {
      list.push_back(b);
      total += b.units;
    }
    int64_t brute = INT64_MAX;
    std::vector<int64_t> at(list.size(), 0);
    std::function<void(size_t, int64_t)> search = [&](size_t i, int64_t top) {
      if (top >= brute) return;
      if (i == list.size()) {
        brute = top;
        return;
      }
      for (int64_t o2 = 0; o2 + list[i].units <= total; ++o2) {
        bool ok = true;
        for (size_t j = 0; j < i && ok; ++j)
          if (list[j].first <= list[i].last && list[i].first <= list[j].last && o2 < at[j] + list[j].units && at[j] < o2 + list[i].units)
            ok = false;
        if (!ok) continue;
        at[i] = o2;
        search(i + 1, std::max(top, o2 + list[i].units));
      }
    };
    search(0, 0);
    EXPECT_EQ(exact.arena_bytes, brute * 64) << seed;
  }
  EXPECT_GT(better, 0);  // TFLM's greedy-by-size is not always optimal
}

TEST(Sched, AReplayCatchesAnOverlappingPlan) {
  const Graph g = diamond();
  const Order o = program_order(g);
  ArenaPlan plan = plan_offsets(g, o, Planner::first_fit);
  for (Placement& p : plan.placements) p.offset = 0;  // everything on top of each other
  try {
    replay_plan(g, o, plan);
    ADD_FAILURE() << "an overlapping plan replayed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("overwrites live tensor"), std::string::npos) << e.what();
  }
}

TEST(Sched, BadGraphsAndOrdersAreRefused) {
  Graph g;
  const int a = g.add_tensor("a", 1), b = g.add_tensor("b", 1);
  g.add_node("f", {b}, {a});
  g.add_node("g", {a}, {b});
  EXPECT_THROW(g.validate(), InputError);  // a cycle
  Graph h = diamond();
  EXPECT_THROW(h.add_node("again", {0}, {1}), InputError);  // a produced twice
  EXPECT_THROW(peak(h, {1, 0, 2, 3, 4, 5}), InputError);    // not topological
  EXPECT_THROW(brute_force_schedule(random_graph(12, 1)), InputError);
}

}  // namespace
}  // namespace concord::sched

#include "concord/model/kv_cache.h"
#include "concord/model/model.h"
#include "concord/sched/executor.h"
#include "concord/sched/model_graph.h"

namespace concord::sched {
namespace {

model::ModelConfig model_config(bool moe) {
  model::ModelConfig c;
  c.architecture = moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM";
  c.vocab_size = 300;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 256;
  if (moe) {
    c.num_experts = 4;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 32;
    c.mlp_only_layers = {0};
  }
  return c;
}

model::ModelConfig qwen2_config() {  // no QK-norm (RoPE copies), q/k/v biases
  model::ModelConfig c = model_config(false);
  c.architecture = "Qwen2ForCausalLM";
  return c;
}

// The test configs by name: "qwen3", "qwen2", "moe", "moe-aux" (with the load-balancing loss),
// "repeat" (the schedule {0, 1, 1, 2}), "recurrent".
model::ModelConfig recompute_config(const std::string& kind) {
  model::ModelConfig c = kind == "qwen2" ? qwen2_config() : model_config(kind == "moe" || kind == "moe-aux");
  c.output_router_logits = kind == "moe-aux";
  if (kind == "repeat") c.schedule = {0, 1, 1, 2};
  if (kind == "recurrent") {  // Huginn-style: prelude, a 2-layer core, coda
    c.architecture = "ConcordRecurrentForCausalLM";
    c.num_hidden_layers = 4;
    c.n_layers_in_prelude = 1;
    c.n_layers_in_recurrent_block = 2;
    c.n_layers_in_coda = 1;
    c.mean_recurrence = 2;
    c.max_recurrence = 8;
    c.state_init = "random";
    c.state_init_std = 0.5;
  }
  return c;
}

// The model's own node list as a graph: every node of every block in it, the DP certifies an
// order on it within its budget, the training pass (activations kept) peaks above inference,
// and every planner's plan replays.
TEST(SchedModel, TheModelsPassesAreCertifiedAndPlanned) {
  for (const bool moe : {false, true}) {
    const model::Model m(model_config(moe));
    size_t block_nodes = 0;
    for (int64_t a = 0; a < m.config().applications(); ++a) block_nodes += m.describe_block(m.config().block_of(a)).size();
    int64_t forward_peak = 0;
    for (const Pass pass : {Pass::forward, Pass::train}) {
      const Graph g = model_graph(m, pass, 64, 2);
      EXPECT_EQ(g.nodes.size(), block_nodes + 3) << moe;  // + embed, final_norm, lm_head
      const DpResult dp = dp_schedule(g, {.max_states = 2'000'000, .max_seconds = 60});
      EXPECT_TRUE(dp.optimal) << moe;
      EXPECT_EQ(peak(g, dp.order), dp.peak);
      EXPECT_LE(dp.peak, peak(g, program_order(g)));
      EXPECT_LE(working_set_bound(g), dp.peak);
      for (Planner p : kPlanners) {
        const ArenaPlan plan = plan_offsets(g, dp.order, p);
        EXPECT_EQ(replay_plan(g, dp.order, plan), plan.arena_bytes);
        EXPECT_GE(plan.arena_bytes, dp.peak);
      }
      if (pass == Pass::forward) forward_peak = dp.peak;
      else EXPECT_GT(dp.peak, forward_peak) << moe;
    }
  }
  EXPECT_THROW(pass_from_name("backward"), InputError);
}

// A decode step's graph: one row per sequence, each attention appending to its application's KV
// cache (outside the graph: outside_bytes is the whole cache) with its scores over the context as
// workspace; certified by the DP, planned, its peak growing with the context. A prefill chunk after
// the same context peaks above it; a full-sequence executor call refuses a cached graph.
TEST(SchedModel, ADecodeStepAndAPrefillChunkArePlannedAndCertified) {
  for (const bool moe : {false, true}) {
    model::Model m(model_config(moe));
    int64_t previous = 0;
    for (int64_t context : {16, 64, 200}) {
      const Graph g = model_graph(m, Pass::decode, 1, 4, nullptr, context);
      const DpResult dp = dp_schedule(g);
      EXPECT_TRUE(dp.optimal);
      EXPECT_GT(dp.peak, previous);
      previous = dp.peak;
      for (Planner p : kPlanners) EXPECT_EQ(replay_plan(g, dp.order, plan_offsets(g, dp.order, p)), plan_offsets(g, dp.order, p).arena_bytes);
      EXPECT_EQ(g.outside_bytes, m.config().applications() * 2 * 4 * (context + 1) * m.config().num_key_value_heads * m.config().head_dim * 4);
      const std::vector<int32_t> tokens(4, 1);
      EXPECT_THROW(execute_dynamic(m, g, dp.order, tokens, 4, 1), InputError);
      // A prefill chunk of 32 after the same context peaks above the decode step.
      const Graph chunk = model_graph(m, Pass::prefill, 32, 4, nullptr, context);
      EXPECT_GT(dp_schedule(chunk).peak, dp.peak);
    }
  }
  model::Model m(model_config(false));
  EXPECT_THROW(model_graph(m, Pass::decode, 2, 4, nullptr, 8), InputError);     // one token per step
  EXPECT_THROW(model_graph(m, Pass::forward, 8, 1, nullptr, 8), InputError);    // no context there
  EXPECT_THROW(model_graph(m, Pass::prefill, 200, 1, nullptr, 100), InputError);  // past 256 positions
  CachedShape shape{.context = {10, 0}, .tokens = {1, 0}, .logits = {model::LogitRows::last, model::LogitRows::last}};
  EXPECT_THROW(model_graph(m, shape), InputError);  // an input without new tokens
  shape.tokens = {1, 4};
  shape.key_capacity = 8;  // below the 11 keys of the first row
  EXPECT_THROW(model_graph(m, shape), InputError);
}

}  // namespace
}  // namespace concord::sched

namespace concord::sched {
namespace {


std::vector<int32_t> some_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>((seed * 7919 + static_cast<uint64_t>(i) * 104729) % static_cast<uint64_t>(vocab));
  return t;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // (memcmp's arguments must not be null even for zero bytes: an empty vector's data() may be.)
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0);
}

// The executor runs the model's passes node by node through memory it owns: for every config
// (Qwen3 dense, Qwen2 without QK-norm and with biases, Qwen3-MoE, a depth-recurrent model at
// depth 3 with a random initial state), pass, order (program, greedy,
// the DP's, random valid reorderings) and planner, the logits equal Model::forward's bit for bit;
// the planned arena's high-water mark — from its allocations and read back from the canary bytes
// the nodes overwrote — is the plan's arena size, byte for byte; the dynamic executor's counter
// of bytes held peaks at exactly the memory model's prediction (sched::peak).
// Sanitizer builds run ~8x slower (this test was 608 s of CI's ASan stage): there, one random
// order, and every planner on the program's and the DP's orders (the others: first fit).
#if defined(__SANITIZE_ADDRESS__)
constexpr uint64_t kRandomOrders = 1;
constexpr bool kEveryPlannerOnEveryOrder = false;
#else
constexpr uint64_t kRandomOrders = 3;
constexpr bool kEveryPlannerOnEveryOrder = true;
#endif

TEST(SchedExecutor, EveryOrderAndPlannerComputesForwardsLogitsAndItsPredictedPeak) {
  const int64_t B = 2, S = 24;
  struct Case {
    model::ModelConfig config;
    const char* policy;
  };
  const model::ModelConfig recurrent = recompute_config("recurrent");
  const std::vector<Case> cases = {{model_config(false), "fp32"},   {model_config(false), "mxfp8"},
                                    {qwen2_config(), "bf16"},       {model_config(true), "fp32"},
                                    {model_config(true), "fp8-tensor"}, {recurrent, "fp32"}};
  for (const Case& k : cases) {
    model::Model m(k.config, model::PrecisionPolicy::preset(k.policy));
    m.init_random(11, 0.08f);
    if (k.config.recurrent()) {
      m.set_depth(3);
      m.set_state_seed(17);
    }
    const std::vector<int32_t> tokens = some_tokens(B * S, k.config.vocab_size, 3);
    std::vector<float> reference(static_cast<size_t>(B * S * k.config.vocab_size));
    m.forward(tokens, B, S, reference);
    const ExpertRows rows = expert_rows_of(m, tokens, B, S);
    const std::string what = fmt::format("{} {}", k.config.architecture, k.policy);
    for (const Pass pass : {Pass::forward, Pass::train}) {
      const Graph g = model_graph(m, pass, S, B, &rows);
      std::vector<Order> orders = {program_order(g), dp_schedule(g).order, greedy_order(g)};
      for (uint64_t seed = 1; seed <= kRandomOrders; ++seed) orders.push_back(random_order(g, seed));
      for (size_t o = 0; o < orders.size(); ++o) {
        const Order& order = orders[o];
        ASSERT_TRUE(is_topological(g, order));
        const Execution dynamic = execute_dynamic(m, g, order, tokens, B, S);
        EXPECT_TRUE(same_bits(dynamic.logits, reference)) << what;
        EXPECT_EQ(dynamic.high_water, peak(g, order)) << what;
        std::vector<Planner> planners = {Planner::first_fit};
        if (kEveryPlannerOnEveryOrder || o < 2) {
          planners.assign(std::begin(kPlanners), std::end(kPlanners));
          planners.push_back(Planner::exact);
        }
        for (Planner p : planners) {
          const ArenaPlan plan = plan_offsets(g, order, p);
          const Execution planned = execute_planned(m, g, order, plan, tokens, B, S);
          EXPECT_TRUE(same_bits(planned.logits, reference)) << what;
          EXPECT_EQ(planned.high_water, plan.arena_bytes) << what;
          EXPECT_EQ(planned.touched_bytes, plan.arena_bytes) << what;
        }
      }
    }
  }
}

// The whole training step as nodes (pass `step`): under every order and planner the loss and every
// gradient equal Model::forward_backward's bit for bit — Qwen3, Qwen2, a schedule that applies a
// block twice, Qwen3-MoE (experts, router and top-k backward on the batch's exact expert rows),
// Qwen3-MoE with the load-balancing loss (it reads every MoE application's routing), and a
// depth-recurrent model at depth 3 (the adapter's backward, d e summed over the iterations), also
// with truncated backpropagation through its last 2 iterations — under fp32, bf16, mxfp8 and
// nvfp4 (stochastic rounding and Hadamard signs in the backward GEMMs, seeded by the step) — and
// the measured memory is the predicted. The DP certifies an order at least as good as the
// program's.
TEST(SchedExecutor, TheTrainingStepsGradientsAreForwardBackwardsUnderEveryOrder) {
  const int64_t B = 2, S = 16;
  const uint64_t step = 5;
  for (const std::string kind : {"qwen3", "qwen2", "repeat", "moe", "moe-aux", "recurrent", "truncated"})
    for (const char* policy : {"fp32", "bf16", "mxfp8", "nvfp4"}) {
      if ((kind == "moe" || kind == "moe-aux" || kind == "truncated") && policy != std::string("fp32") &&
          policy != std::string("nvfp4"))
        continue;  // the backward GEMMs' precisions are the dense cases'; fp32 and nvfp4 (seeded) suffice
      const model::ModelConfig c = recompute_config(kind == "truncated" ? "recurrent" : kind);
      model::Model m(c, model::PrecisionPolicy::preset(policy));
      m.init_random(23, 0.08f);
      if (c.recurrent()) {  // three core iterations, a random s0
        m.set_depth(3);
        m.set_state_seed(9);
        if (kind == "truncated") m.set_backprop_iterations(2);
      }
      const std::vector<int32_t> tokens = some_tokens(B * S, c.vocab_size, 4), targets = some_tokens(B * S, c.vocab_size, 8);
      const float loss = m.forward_backward(tokens, targets, B, S, step);
      std::vector<std::vector<float>> reference;
      for (const model::ParamSpec& p : m.params()) {
        const auto gr = m.grad(p.name);
        reference.emplace_back(gr.begin(), gr.end());
      }
      auto grads_equal = [&] {
        for (size_t i = 0; i < reference.size(); ++i)
          if (!same_bits(reference[i], std::vector<float>(m.grad(m.params()[i].name).begin(), m.grad(m.params()[i].name).end())))
            return false;
        return true;
      };
      const std::string what = fmt::format("{} {}", kind, policy);
      const ExpertRows rows = c.moe() ? expert_rows_of(m, tokens, B, S) : ExpertRows{};
      const Graph g = model_graph(m, Pass::step, S, B, c.moe() ? &rows : nullptr);
      const DpResult dp = dp_schedule(g);
      EXPECT_TRUE(dp.optimal) << what;
      EXPECT_LE(dp.peak, peak(g, program_order(g))) << what;
      std::vector<Order> orders = {program_order(g), greedy_order(g), dp.order, random_order(g, 1), random_order(g, 2)};
      for (const Order& order : orders) {
        const Execution dynamic = execute_dynamic(m, g, order, tokens, B, S, targets, step);
        EXPECT_EQ(static_cast<float>(dynamic.loss), loss) << what;
        EXPECT_TRUE(grads_equal()) << what;
        EXPECT_EQ(dynamic.high_water, peak(g, order)) << what;
        EXPECT_TRUE(dynamic.logits.empty());
        for (Planner p : {Planner::first_fit, Planner::greedy_by_size, Planner::exact}) {
          const ArenaPlan plan = plan_offsets(g, order, p);
          const Execution planned = execute_planned(m, g, order, plan, tokens, B, S, targets, step);
          EXPECT_EQ(static_cast<float>(planned.loss), loss) << what;
          EXPECT_TRUE(grads_equal()) << what;
          EXPECT_EQ(planned.high_water, plan.arena_bytes) << what;
          EXPECT_EQ(planned.touched_bytes, plan.arena_bytes) << what;
        }
      }
      EXPECT_THROW(execute_dynamic(m, g, program_order(g), tokens, B, S), InputError);  // no targets
      if (kind == "truncated") {  // no backward node for an iteration run without gradient
        size_t backward = 0;
        for (const Node& n : g.nodes) backward += n.name.ends_with(".bwd");
        m.set_backprop_iterations(0);
        size_t full = 0;
        for (const Node& n : model_graph(m, Pass::step, S, B).nodes) full += n.name.ends_with(".bwd");
        EXPECT_LT(backward, full);
      }
    }
}

// A cached pass (the engine's step: Model::forward_cached's inputs) node by node: a mixed step of
// a prompt chunk returning its last row, a speculative verify returning every row and a chunk
// returning none, then mixed chunk and decode rows, then a decode step. For Qwen3 (fp32, nvfp4 —
// a tensor-wide activation scale, so each input's rows must be quantized on their own), Qwen2
// (bf16) and Qwen3-MoE (fp8-tensor, planned with the step's exact expert rows), every order and
// planner: the logits and every cache row equal forward_cached's bit for bit, the planned arena's
// high-water mark (allocations and canary) is the plan's, the dynamic executor's peak the memory
// model's; a reused ArenaMemory and a key capacity above the need give the same bits. A
// depth-recurrent model at depth 3 too: with a slot per iteration (the slots past the depth filled
// from the last iteration: `fill_skipped`) and with 2 slots (Huginn's budget: iteration 2 writes
// slot 0).
TEST(SchedExecutor, CachedPassesAreForwardCachedsUnderEveryOrderAndPlanner) {
  struct Case {
    model::ModelConfig config;
    const char* policy;
    int64_t core_slots = 0;
  };
  const model::ModelConfig recurrent = recompute_config("recurrent");
  const std::vector<Case> cases = {{model_config(false), "fp32"}, {model_config(false), "nvfp4"},
                                    {qwen2_config(), "bf16"},     {model_config(true), "fp8-tensor"},
                                    {recurrent, "fp32"},          {recurrent, "bf16", 2}};
  using LR = model::LogitRows;
  struct Step {
    std::vector<int64_t> tokens;
    std::vector<LR> logits;
  };
  const std::vector<Step> steps = {{{20, 7, 12}, {LR::last, LR::all, LR::none}},
                                   {{1, 3, 5}, {LR::last, LR::all, LR::last}},
                                   {{1, 1, 1}, {LR::last, LR::last, LR::last}},
                                   {{4, 1, 2}, {LR::none, LR::none, LR::none}}};
  for (const Case& k : cases) {
    model::Model m(k.config, model::PrecisionPolicy::preset(k.policy));
    m.init_random(13, 0.08f);
    if (k.config.recurrent()) {
      m.set_depth(3);
      m.set_state_seed(5);
    }
    const std::string what = fmt::format("{} {} slots {}", k.config.architecture, k.policy, k.core_slots);
    model::KvCache reference(k.config, 3, 64, k.core_slots), cache(k.config, 3, 64, k.core_slots);
    for (int i = 0; i < 3; ++i) {
      reference.allocate();
      cache.allocate();
    }
    ArenaMemory memory;
    uint64_t seed = 20;
    for (const Step& step : steps) {
      std::vector<std::vector<int32_t>> tokens;
      std::vector<model::CachedInput> inputs;
      CachedShape shape;
      for (size_t i = 0; i < step.tokens.size(); ++i) tokens.push_back(some_tokens(step.tokens[i], k.config.vocab_size, ++seed));
      for (size_t i = 0; i < step.tokens.size(); ++i) {
        inputs.push_back({static_cast<int>(i), tokens[i], step.logits[i]});
        shape.context.push_back(reference.length(static_cast<int>(i)));
        shape.tokens.push_back(step.tokens[i]);
        shape.logits.push_back(step.logits[i]);
      }
      std::vector<float> logits(static_cast<size_t>(model::logit_rows(inputs) * k.config.vocab_size));
      m.set_router_stats(true);
      m.forward_cached(reference, inputs, logits);
      const ExpertRows rows = m.router_stats().counts;
      m.set_router_stats(false);
      const ExpertRows* exact = k.config.moe() ? &rows : nullptr;
      const Graph g = model_graph(m, shape, exact);
      // Each run starts from the cache before the step (its rows are rewritten identically).
      auto rewind = [&] {
        for (size_t i = 0; i < inputs.size(); ++i) cache.truncate(static_cast<int>(i), shape.context[i]);
      };
      auto same_cache = [&] {
        bool same = true;
        for (int slot = 0; slot < 3; ++slot) {
          same &= cache.length(slot) == reference.length(slot);
          const auto floats = static_cast<size_t>(cache.length(slot) * cache.row_width());
          for (int64_t layer = 0; floats > 0 && layer < cache.num_layers(); ++layer)
            same &= std::memcmp(cache.keys(slot, layer), reference.keys(slot, layer), 4 * floats) == 0 &&
                    std::memcmp(cache.values(slot, layer), reference.values(slot, layer), 4 * floats) == 0;
        }
        return same;
      };
      // (The recurrent graphs are long chains: program order and one random order are enough.)
      std::vector<Order> orders = {program_order(g), random_order(g, 1)};
      if (!k.config.recurrent()) {
        orders.push_back(greedy_order(g));
        orders.push_back(dp_schedule(g).order);
        orders.push_back(random_order(g, 2));
      }
      bool first = true;
      for (const Order& order : orders) {
        if (!first) rewind();
        first = false;
        const Execution dynamic = execute_dynamic(m, g, order, cache, inputs);
        EXPECT_TRUE(same_bits(dynamic.logits, logits)) << what;
        EXPECT_TRUE(same_cache()) << what;
        EXPECT_EQ(dynamic.high_water, peak(g, order)) << what;
        std::vector<Planner> planners(std::begin(kPlanners), std::end(kPlanners));
        if (!k.config.recurrent()) planners.push_back(Planner::exact);  // its search is long on the chains
        for (Planner p : planners) {
          rewind();
          const ArenaPlan plan = plan_offsets(g, order, p);
          const Execution planned = execute_planned(m, g, order, plan, cache, inputs);
          EXPECT_TRUE(same_bits(planned.logits, logits)) << what << " " << planner_name(p);
          EXPECT_TRUE(same_cache()) << what;
          EXPECT_EQ(planned.high_water, plan.arena_bytes) << what;
          EXPECT_EQ(planned.touched_bytes, plan.arena_bytes) << what;
        }
      }
      // The engine's way: reused memory, a plan with room for more keys.
      rewind();
      CachedShape roomy = shape;
      roomy.key_capacity = 64;
      const Graph wide = model_graph(m, roomy, exact);
      const Order order = program_order(wide);
      const ArenaPlan plan = plan_offsets(wide, order, Planner::greedy_by_size);
      const Execution reused = execute_planned(m, wide, order, plan, cache, inputs, &memory);
      EXPECT_TRUE(same_bits(reused.logits, logits)) << what;
      EXPECT_TRUE(same_cache()) << what;
      EXPECT_EQ(reused.high_water, plan.arena_bytes);
      EXPECT_GE(memory.bytes(), plan.arena_bytes);
      // Prepared once, run again (the engine keeps one per step shape): the logits into the
      // caller's buffer, which must be the pass's size.
      rewind();
      const PreparedPass prepared(wide, order, plan);
      std::vector<float> into(logits.size());
      prepared.run(m, cache, inputs, memory, into);
      EXPECT_TRUE(same_bits(into, logits)) << what;
      EXPECT_TRUE(same_cache()) << what;
      rewind();
      std::vector<float> short_buffer(logits.size() + 1);
      EXPECT_THROW(prepared.run(m, cache, inputs, memory, short_buffer), InputError);
      EXPECT_THROW(PreparedPass(model_graph(m, Pass::forward, 4, 1), {}, {}), InputError);
      // A graph of another shape, and a full-sequence graph, are refused before anything runs.
      rewind();
      CachedShape other = shape;
      ++other.tokens[0];
      const Graph mismatched = model_graph(m, other);
      EXPECT_THROW(execute_dynamic(m, mismatched, program_order(mismatched), cache, inputs), InputError);
      const Graph full = model_graph(m, Pass::forward, 4, 1);
      EXPECT_THROW(execute_dynamic(m, full, program_order(full), cache, inputs), InputError);
      for (size_t i = 0; i < inputs.size(); ++i) EXPECT_EQ(cache.length(static_cast<int>(i)), shape.context[i]);
      // Leave the cache as the reference (the next step starts from it).
      execute_dynamic(m, g, program_order(g), cache, inputs);
      EXPECT_TRUE(same_cache());
    }
  }
}

// Wrong memory is caught, not computed with: a plan with two live tensors at one offset, expert
// buffers sized for another batch's routing, too few tokens.
TEST(SchedExecutor, OverlapsAndMisSizedBuffersAreRefused) {
  const int64_t B = 1, S = 16;
  model::Model m(model_config(true));
  m.init_random(5, 0.08f);
  const std::vector<int32_t> tokens = some_tokens(B * S, 300, 9);
  ExpertRows rows = expert_rows_of(m, tokens, B, S);
  const Graph g = model_graph(m, Pass::forward, S, B, &rows);
  const Order order = program_order(g);
  ArenaPlan plan = plan_offsets(g, order, Planner::best_fit);
  for (Placement& p : plan.placements) p.offset = 0;
  plan.arena_bytes = 0;
  for (const Placement& p : plan.placements) plan.arena_bytes = std::max(plan.arena_bytes, (p.bytes + 63) / 64 * 64);
  EXPECT_THROW(execute_planned(m, g, order, plan, tokens, B, S), InternalError);

  for (std::vector<int64_t>& a : rows)
    if (!a.empty() && a[0] > 0) {
      --a[0];
      ++a[1];
      break;
    }
  const Graph wrong = model_graph(m, Pass::forward, S, B, &rows);
  EXPECT_THROW(execute_dynamic(m, wrong, program_order(wrong), tokens, B, S), InputError);
  EXPECT_THROW(execute_dynamic(m, g, order, std::span<const int32_t>(tokens).first(8), B, S), InputError);
  const Order backwards(order.rbegin(), order.rend());
  EXPECT_THROW(execute_dynamic(m, g, backwards, tokens, B, S), InputError);
}

}  // namespace
}  // namespace concord::sched

#include "concord/sched/recompute.h"

namespace concord::sched {
namespace {


// The arena's live high-water mark of a training step equals training_memory's prediction byte
// for byte, for every kind of plan on dense, Qwen2, MoE (with and without the aux loss) and a
// repeated block; and the plans: plan_recompute == the branch and bound == brute force over every
// plan, the greedy never cheaper, the curve monotone.
TEST(SchedRecompute, ThePredictedPeakIsTheArenasAndThePlansAreOptimal) {
  const int64_t B = 2, S = 24;
  for (const std::string kind : {"qwen3", "qwen2", "moe", "moe-aux", "repeat"}) {
    const model::ModelConfig c = recompute_config(kind);
    model::Model m(c);
    m.init_random(3, 0.08f);
    const auto A = static_cast<size_t>(c.applications());
    std::vector<int32_t> tokens = some_tokens(B * S, c.vocab_size, 5), targets = some_tokens(B * S, c.vocab_size, 6);
    // Every plan (3^A, at most 81 here).
    std::vector<std::vector<Recompute>> plans(1);
    for (size_t a = 0; a < A; ++a) {
      std::vector<std::vector<Recompute>> next;
      for (const auto& p : plans)
        for (Recompute r : {Recompute::keep, Recompute::attention, Recompute::block}) {
          if (r == Recompute::block && c.output_router_logits && c.is_moe_layer(c.block_of(static_cast<int64_t>(a)))) continue;
          next.push_back(p);
          next.back().push_back(r);
        }
      plans = std::move(next);
    }
    int64_t keep_peak = 0, low = INT64_MAX;
    for (const auto& p : plans) {
      m.set_recompute(p);
      m.forward_backward(tokens, targets, B, S, 1);
      const TrainingMemory t = training_memory(c, B, S, p);
      ASSERT_EQ(t.peak, m.activation_memory().live_high_water) << kind << " " << recompute_name(p[0]) << recompute_name(p.back());
      low = std::min(low, t.peak);
      if (std::all_of(p.begin(), p.end(), [](Recompute r) { return r == Recompute::keep; })) keep_peak = t.peak;
    }
    EXPECT_LT(low, keep_peak) << kind;
    for (int i = 0; i <= 6; ++i) {
      const int64_t budget = low + (keep_peak - low) * i / 6 - (i == 0 ? 1 : 0);
      double brute = -1;
      for (const auto& p : plans) {
        const TrainingMemory t = training_memory(c, B, S, p);
        if (t.peak <= budget && (brute < 0 || t.recompute_flops < brute)) brute = t.recompute_flops;
      }
      const auto exact = recompute_exact(c, B, S, budget);
      const auto planned = plan_recompute(c, B, S, budget);
      const auto greedy = recompute_greedy(c, B, S, budget);
      ASSERT_EQ(exact.has_value(), brute >= 0) << kind << " " << budget;
      if (!exact) {
        EXPECT_FALSE(planned.has_value());
        continue;
      }
      EXPECT_EQ(exact->memory.recompute_flops, brute) << kind << " " << budget;
      ASSERT_TRUE(planned.has_value()) << kind << " " << budget;
      EXPECT_EQ(planned->memory.recompute_flops, brute) << kind << " " << budget;
      EXPECT_LE(planned->memory.peak, budget);
      if (greedy) {
        EXPECT_GE(greedy->memory.recompute_flops, brute) << kind;
        EXPECT_LE(greedy->memory.peak, budget);
      }
    }
    const std::vector<RecomputePlan> curve = recompute_curve(c, B, S, 8);
    ASSERT_GE(curve.size(), 2u) << kind;
    for (size_t i = 1; i < curve.size(); ++i) {
      EXPECT_GT(curve[i].memory.peak, curve[i - 1].memory.peak);
      EXPECT_LE(curve[i].memory.recompute_flops, curve[i - 1].memory.recompute_flops);
    }
  }
  EXPECT_THROW(training_memory(model_config(false), 1, 8, std::vector<Recompute>{Recompute::keep}), InputError);
  EXPECT_THROW(recompute_from_name("some"), InputError);
}

}  // namespace
}  // namespace concord::sched

namespace concord::sched {
namespace {

// The lower bounds' traps (docs/sched.md, "Where the bounds are tight and where they are not"):
// constructed graphs whose numbers are worked out by hand.
TEST(Sched, TheBoundsTraps) {
  // A join: k branches each make a tensor the last node reads together. The join's working set is
  // everything live at the peak: the working-set bound is tight.
  {
    Graph g;
    const int in = g.add_tensor("in", 8);
    std::vector<int> parts;
    for (int i = 0; i < 4; ++i) {
      parts.push_back(g.add_tensor(fmt::format("p{}", i), 100));
      g.add_node(fmt::format("branch{}", i), {in}, {parts.back()});
    }
    const int out = g.add_tensor("out", 10, true);
    g.add_node("join", parts, {out});
    const DpResult dp = dp_schedule(g);
    EXPECT_EQ(working_set_bound(g), 410);
    EXPECT_EQ(dp.peak, 410);
  }
  // A skip connection: a large tensor made first and read last lives through a chain whose nodes
  // never touch it. The chain's working sets miss it: the bound (the merge's) is loose by what the
  // chain adds on top of the skip.
  {
    Graph g;
    const int in = g.add_tensor("in", 8);
    const int skip = g.add_tensor("skip", 1000), a0 = g.add_tensor("a0", 50);
    g.add_node("split", {in}, {skip, a0});
    int a = a0;
    for (int i = 1; i <= 5; ++i) {
      const int next = g.add_tensor(fmt::format("a{}", i), 50);
      g.add_node(fmt::format("chain{}", i), {a}, {next});
      a = next;
    }
    const int out = g.add_tensor("out", 10, true);
    g.add_node("merge", {skip, a}, {out});
    const DpResult dp = dp_schedule(g);
    EXPECT_EQ(working_set_bound(g), 1060);  // merge: skip + a5 + out
    EXPECT_EQ(dp.peak, 1100);               // every chain step: skip + two chain tensors
    EXPECT_TRUE(dp.optimal);
  }
  // Greedy's trap: a cheap step now that makes a long-lived tensor, taken before the expensive step
  // that frees a big one. Greedy runs v (in -> M, kept to the end) first, and u1 (X -> T) then
  // finds M live: 230 bytes. The optimum runs x0, u1, u2 first: 181. The working-set bound (u1:
  // X + T) is 180.
  {
    Graph g;
    const int in = g.add_tensor("in", 1);
    const int X = g.add_tensor("X", 100);
    g.add_node("x0", {in}, {X});
    const int T = g.add_tensor("T", 80);
    g.add_node("u1", {X}, {T});
    const int small = g.add_tensor("s", 1);
    g.add_node("u2", {T}, {small});
    const int M = g.add_tensor("M", 50);
    g.add_node("v", {in}, {M});
    const int out = g.add_tensor("out", 1, true);
    g.add_node("join", {small, M}, {out});
    const auto [best, optimum] = brute_force_schedule(g);
    EXPECT_EQ(optimum, 181);
    EXPECT_EQ(dp_schedule(g).peak, 181);
    EXPECT_EQ(peak(g, greedy_order(g)), 230);
    EXPECT_EQ(working_set_bound(g), 180);
  }
}

}  // namespace
}  // namespace concord::sched
