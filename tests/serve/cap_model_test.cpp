// The cap planner (serve/cap_model.h, issue 25): a routing trace replayed by the pager's documented
// rules counts exactly the expert reads, uses and evictions the real pager (model/expert_pager.h,
// no prefetch) makes under the same cap, prefill and decode apart, with and without pins; the time
// model's arithmetic; what it refuses.
#include "concord/serve/cap_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "concord/model/expert_pager.h"
#include "concord/model/files.h"
#include "concord/model/kv_cache.h"
#include "concord/model/model.h"
#include "concord/numerics/check.h"

namespace concord::serve::capmodel {
namespace {

model::ModelConfig config() {
  model::ModelConfig c;
  c.architecture = "Qwen3MoeForCausalLM";
  c.vocab_size = 259;
  c.hidden_size = 64;
  c.intermediate_size = 64;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = false;
  c.num_experts = 16;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;
  c.norm_topk_prob = true;
  return c;
}

// A prefill pass of 20 tokens, then 16 decode steps; the pager's counters after the prefill and at
// the end.
std::pair<model::ExpertPagingStats, model::ExpertPagingStats> run(model::Model& m) {
  const int64_t V = m.config().vocab_size;
  std::mt19937_64 rng(3);
  std::vector<int32_t> prompt(20);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
  model::KvCache cache(m.config(), 1);
  const int slot = cache.allocate();
  std::vector<float> logits(static_cast<size_t>(V));
  const model::CachedInput in{slot, prompt, model::LogitRows::last};
  m.forward_cached(cache, std::span(&in, 1), logits);
  model::ExpertPagingStats after_prefill;
  if (m.expert_pager()) after_prefill = m.expert_pager()->stats();
  for (int step = 0; step < 16; ++step) {
    const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const model::CachedInput one{slot, std::span(&next, 1), model::LogitRows::last};
    m.forward_cached(cache, std::span(&one, 1), logits);
  }
  return {after_prefill, m.expert_pager() ? m.expert_pager()->stats() : model::ExpertPagingStats{}};
}

TEST(CapModel, TheReplayCountsThePagersReadsExactly) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("concord_cap_model_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const model::ModelConfig c = config();
  {
    model::Model m(c);
    m.init_random(5, 0.2f);
    std::mt19937_64 rng(6);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (const model::ParamSpec& s : m.params())
      if (s.kind == model::ParamKind::router)
        for (float& v : m.param(s.name)) v = 3.0f * normal(rng);
    m.weights_changed();
    model::ExportOptions o;
    o.format = model::ExportFormat::gguf;
    o.dtype = "q4_0";
    model::export_model(m, dir / "m.gguf", o);
  }
  // The workload's trace and router statistics, from the uncapped model.
  model::LoadedModel whole = model::load_model(dir / "m.gguf", "native");
  whole.model.set_router_trace(true);
  whole.model.set_router_stats(true);
  run(whole.model);
  epsim::Trace trace;
  trace.experts = c.num_experts;
  trace.top_k = c.num_experts_per_tok;
  const model::Model::RouterTrace& rt = whole.model.router_trace();
  for (size_t app = 0; app < rt.selected.size(); ++app)
    if (!rt.pass_rows[app].empty()) trace.layers.push_back({static_cast<int64_t>(app), rt.selected[app], rt.pass_rows[app]});
  std::map<int64_t, std::vector<double>> loads;
  const model::Model::RouterStats rs = whole.model.router_stats();
  for (size_t app = 0; app < rs.counts.size(); ++app)
    loads[static_cast<int64_t>(app)] = std::vector<double>(rs.counts[app].begin(), rs.counts[app].end());

  int64_t checked_reads = 0;
  for (double share : {1.0, 0.5, 0.25, 0.1})
    for (bool pins : {false, true}) {
      model::ExpertPaging paging;
      paging.cap_share = share;
      paging.prefetch = false;
      if (pins) paging.pin_loads = loads;
      model::LoadedModel paged = model::load_model_paged(dir / "m.gguf", paging);
      const model::ExpertPager& pager = *paged.model.expert_pager();
      Experts experts;
      experts.num_experts = c.num_experts;
      experts.bytes.assign(static_cast<size_t>(c.num_hidden_layers * c.num_experts), 0);
      int64_t largest = 0;
      for (const auto& x : pager.experts()) {
        experts.bytes[static_cast<size_t>(x.block * c.num_experts + x.expert)] = x.bytes;
        largest = std::max(largest, x.bytes);
      }
      for (int64_t app = 0; app < c.applications(); ++app) experts.block_of_application.push_back(c.block_of(app));
      const int64_t cap = pager.stats().cap;
      std::vector<std::pair<int64_t, int64_t>> pinned;
      if (pins)
        pinned = model::ExpertPager::select_pins(
            model::hottest_experts(c, loads),
            [&](int64_t b, int64_t e) { return experts.bytes[static_cast<size_t>(b * c.num_experts + e)]; },
            static_cast<int64_t>(paging.pin_share * static_cast<double>(cap)), cap, largest);
      const Replay r = replay(trace, experts, cap, pinned, 1);
      const auto [prefill, end] = run(paged.model);
      const std::string what = "share " + std::to_string(share) + (pins ? " pinned" : "");
      EXPECT_EQ(r.pinned, end.pinned) << what;
      EXPECT_EQ(r.prefill_tokens, 20) << what;
      EXPECT_EQ(r.decode_tokens, 16) << what;
      EXPECT_EQ(r.prefill_uses, prefill.uses) << what;
      EXPECT_EQ(r.prefill_reads, prefill.loads - end.pinned) << what;
      EXPECT_EQ(r.decode_uses, end.uses - prefill.uses) << what;
      EXPECT_EQ(r.decode_reads, end.loads - prefill.loads) << what;
      EXPECT_EQ(r.evictions, end.evictions) << what;
      EXPECT_EQ(r.high_water, end.high_water) << what;
      if (share <= 0.25) {
        EXPECT_GT(r.decode_reads, 0) << what;
      }
      checked_reads += r.prefill_reads + r.decode_reads;
    }
  EXPECT_GT(checked_reads, 100);
  std::filesystem::remove_all(dir);
}

TEST(CapModel, TheTimeModelAndWhatItRefuses) {
  PhaseRun prefill{100, 10, 0.5, 0.1, 0.08}, decode{50, 20, 1.0, 0.3, 0.2};
  const Cost c = calibrate(prefill, decode);
  EXPECT_DOUBLE_EQ(c.prefill_compute_s, 0.4);
  EXPECT_DOUBLE_EQ(c.decode_compute_s, 0.7);
  EXPECT_DOUBLE_EQ(c.prefill_read_s, 0.008);
  EXPECT_DOUBLE_EQ(c.decode_read_s, 0.01);
  Replay r;
  r.prefill_reads = 5;
  r.decode_reads = 40;
  const auto [ps, ds] = predict_seconds(c, r);
  EXPECT_DOUBLE_EQ(ps, 0.4 + 5 * 0.008);
  EXPECT_DOUBLE_EQ(ds, 0.7 + 40 * 0.01);
  const Cost only_prefill = calibrate(prefill, PhaseRun{50, 0, 0.6, 0.0, 0.0});
  EXPECT_DOUBLE_EQ(only_prefill.decode_read_s, 0.008);  // no decode reads: the prefill's cost
  EXPECT_THROW(calibrate(PhaseRun{}, PhaseRun{}), InputError);
  // The fit: decode seconds 1 + 0.1 per read through three runs; the prefill never reads.
  const std::pair<PhaseRun, PhaseRun> runs[] = {{PhaseRun{10, 0, 0.5, 0, 0}, PhaseRun{50, 0, 1.0, 0, 0}},
                                                {PhaseRun{10, 0, 0.7, 0, 0}, PhaseRun{50, 10, 2.0, 0, 0}},
                                                {PhaseRun{10, 0, 0.6, 0, 0}, PhaseRun{50, 20, 3.0, 0, 0}}};
  const Cost f = fit(runs);
  EXPECT_NEAR(f.decode_compute_s, 1.0, 1e-12);
  EXPECT_NEAR(f.decode_read_s, 0.1, 1e-12);
  EXPECT_NEAR(f.prefill_compute_s, 0.6, 1e-12);
  EXPECT_EQ(f.prefill_read_s, 0.0);
  // One read count in a phase: no slope to fit; a read costs its measured seconds.
  const std::pair<PhaseRun, PhaseRun> same[] = {{PhaseRun{10, 5, 0.5, 0.1, 0.05}, PhaseRun{}},
                                                {PhaseRun{10, 5, 0.7, 0.1, 0.15}, PhaseRun{}}};
  const Cost g = fit(same);
  EXPECT_NEAR(g.prefill_compute_s, 0.5, 1e-12);
  EXPECT_NEAR(g.prefill_read_s, 0.02, 1e-12);
  EXPECT_THROW(fit(std::span(runs).first(1)), InputError);

  epsim::Trace t;
  t.experts = 4;
  t.top_k = 1;
  t.layers.push_back({0, {0, 1, 2, 3}, {2, 1, 1}});
  Experts x;
  x.num_experts = 4;
  x.block_of_application = {0};
  x.bytes = {10, 10, 10, 10};
  const Replay lru = replay(t, x, 20, {}, 1);  // room for two: 0 1 | 2 (evicts 0) | 3 (evicts 1)
  EXPECT_EQ(lru.prefill_reads, 2);
  EXPECT_EQ(lru.decode_reads, 2);
  EXPECT_EQ(lru.evictions, 2);
  EXPECT_EQ(lru.high_water, 20);
  EXPECT_THROW(replay(t, x, 9, {}, 1), InputError);  // less than one expert
  Experts wrong = x;
  wrong.num_experts = 8;
  EXPECT_THROW(replay(t, wrong, 20, {}, 1), InputError);
  epsim::Trace other = t;
  other.layers[0].application = 3;
  EXPECT_THROW(replay(other, x, 20, {}, 1), InputError);
}

}  // namespace
}  // namespace concord::serve::capmodel
