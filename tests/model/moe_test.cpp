// The Qwen3-MoE block (model/block_moe.cpp) against the independent fp64 reference
// (reference_fp64.cpp, which routes with its own softmax and top-k): logits and loss, every kind
// of gradient by central differences (router included), the KV-cache forward against the
// training forward bit for bit, thread-count invariance, zero gradients for experts no token
// chose, the config and the HF names of the experts.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "concord/io/gguf.h"
#include "concord/io/safetensors.h"
#include "concord/model/files.h"
#include "concord/model/kv_cache.h"
#include "concord/model/model.h"
#include "concord/serve/eplb.h"
#include "concord/tensor/quant_gemm.h"
#include "concord/numerics/check.h"
#include <xxhash.h>
#include "model_to_reference.h"
#include "test_inputs.h"
#include "reference_fp64.h"

namespace concord::model {
namespace {

namespace serve_placement = concord::serve::eplb;

using concord_test::same_bits;
using concord_test::tokens_of;

ModelConfig moe_config(bool norm_topk, int64_t experts = 4, int64_t top_k = 2) {
  ModelConfig c;
  c.architecture = "Qwen3MoeForCausalLM";
  c.vocab_size = 40;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = false;
  c.num_experts = experts;
  c.num_experts_per_tok = top_k;
  c.moe_intermediate_size = 12;
  c.norm_topk_prob = norm_topk;
  return c;
}

reference::Config reference_of(const ModelConfig& c) {
  reference::Config r = concord_test::reference_config(c);
  r.experts = c.num_experts;
  r.top_k = c.num_experts_per_tok;
  r.moe_intermediate = c.moe_intermediate_size;
  r.norm_topk = c.norm_topk_prob;
  return r;
}

// Random weights; routers scaled up so that the routing is decisive (no near-ties for the finite
// differences to cross) and norms away from 1.
void randomize(Model& m, uint64_t seed) {
  m.init_random(seed, 0.15f);
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const ParamSpec& s : m.params()) {
    if (!s.is_matrix())
      for (float& v : m.param(s.name)) v = 1.0f + 0.1f * normal(rng);
    if (s.kind == ParamKind::router)
      for (float& v : m.param(s.name)) v *= 8.0f;
  }
  m.weights_changed();
}

TEST(Moe, LogitsAndLossMatchTheFp64Reference) {
  for (bool norm : {false, true}) {
    const ModelConfig c = moe_config(norm);
    Model m(c);
    randomize(m, 5);
    const int64_t B = 2, T = 7;
    const auto tokens = tokens_of(B * T, 6, c.vocab_size);
    std::vector<float> logits(static_cast<size_t>(B * T * c.vocab_size));
    m.forward(tokens, B, T, logits);
    const auto ref = reference::forward_logits(reference_of(c), concord_test::reference_weights(m), tokens, B, T);
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(logits[i]) - ref[i]));
      scale = std::max(scale, std::abs(ref[i]));
    }
    EXPECT_LE(worst / scale, 1e-5) << "norm_topk_prob " << norm;
    const auto targets = reference::next_token_targets(tokens, B, T);
    const double ref_loss = reference::mean_cross_entropy(ref, targets, c.vocab_size);
    EXPECT_NEAR(m.forward_backward(tokens, targets, B, T), ref_loss, 1e-5 * ref_loss) << norm;
    std::printf("[ measured ] MoE norm_topk_prob=%d: max|Δlogit|/max|logit| %.3g\n", norm, worst / scale);
  }
}

// Central differences of the fp64 reference's loss, 10 entries per kind (router, the experts'
// gate/up/down, attention, norms), against Model::forward_backward.
TEST(Moe, EveryKindOfGradientMatchesFiniteDifferences) {
  for (bool norm : {false, true}) {
    const ModelConfig c = moe_config(norm);
    Model m(c);
    randomize(m, 11);
    const int64_t B = 2, T = 6;
    const auto tokens = tokens_of(B * T, 12, c.vocab_size);
    const auto targets = reference::next_token_targets(tokens, B, T);
    m.forward_backward(tokens, targets, B, T);
    const reference::Config ref = reference_of(c);
    const reference::Weights w = concord_test::reference_weights(m);
    std::map<ParamKind, std::vector<const ParamSpec*>> kinds;
    for (const ParamSpec& s : m.params()) kinds[s.kind].push_back(&s);
    std::mt19937_64 rng(3);
    for (const auto& [kind, specs] : kinds) {
      if (kind == ParamKind::embed) continue;  // covered by the dense check; sparse rows here
      std::vector<std::pair<double, double>> pairs;
      double scale = 0.0;
      for (int i = 0; i < 10; ++i) {
        const ParamSpec& s = *specs[std::uniform_int_distribution<size_t>(0, specs.size() - 1)(rng)];
        const int64_t index = std::uniform_int_distribution<int64_t>(0, s.numel() - 1)(rng);
        const double fd = reference::loss_gradient_central_difference(ref, w, s.name, index, tokens, targets, B, T);
        pairs.emplace_back(m.grad(s.name)[static_cast<size_t>(index)], fd);
        scale = std::max(scale, std::abs(fd));
      }
      if (scale == 0.0) continue;  // e.g. only unchosen experts drawn: their zero is checked below
      double worst = 0.0;
      for (const auto& [g, fd] : pairs) {
        EXPECT_LE(std::abs(g - fd), 1e-3 * std::abs(fd) + 1e-4 * scale)
            << param_kind_info(kind).label << " norm " << norm << ": " << g << " vs " << fd;
        worst = std::max(worst, std::abs(g - fd) / scale);
      }
      std::printf("[ measured ] MoE norm=%d %-12s scale %.3g, worst |Δ|/scale %.3g\n", norm,
                  std::string(param_kind_info(kind).label).c_str(), scale, worst);
    }
  }
}

// A NaN router weight makes every router logit NaN: the top-k still runs on a strict weak
// ordering (NaN sorts last) and the NaN reaches the logits instead of a crash or garbage order.
TEST(Moe, ANaNRouterWeightReachesTheLogitsWithoutUndefinedBehaviour) {
  const ModelConfig c = moe_config(true);
  Model m(c);
  randomize(m, 3);
  const std::string router = m.params()[static_cast<size_t>(require_param(m.params(), ParamKind::router, 0))].name;
  m.param(router)[0] = std::numeric_limits<float>::quiet_NaN();
  m.weights_changed();
  const auto tokens = tokens_of(5, 2, c.vocab_size);
  std::vector<float> logits(static_cast<size_t>(5 * c.vocab_size));
  m.forward(tokens, 1, 5, logits);
  EXPECT_TRUE(std::any_of(logits.begin(), logits.end(), [](float v) { return std::isnan(v); }));
}

// HF's load-balancing loss (output_router_logits): its value against the reference's, and the
// gradient of CE + coef · aux by central differences (coef 0.5 so that the aux term is visible).
TEST(Moe, TheLoadBalancingLossAndItsGradientMatchTheReference) {
  ModelConfig c = moe_config(true);
  c.output_router_logits = true;
  c.router_aux_loss_coef = 0.5;
  Model m(c);
  randomize(m, 17);
  const int64_t B = 2, T = 6;
  const auto tokens = tokens_of(B * T, 18, c.vocab_size);
  const auto targets = reference::next_token_targets(tokens, B, T);
  const float loss = m.forward_backward(tokens, targets, B, T);
  reference::Config ref = reference_of(c);
  const reference::Weights w = concord_test::reference_weights(m);
  const double ref_aux = reference::moe_aux_loss(ref, w, tokens, B, T);
  EXPECT_NEAR(m.moe_aux_loss(), ref_aux, 1e-6 * ref_aux);
  EXPECT_GT(ref_aux, 1.0);  // E · Σ f P >= 1 (equality only for perfectly balanced routing)
  ref.aux_coef = 0.5;
  const double ref_loss = reference::loss(ref, w, tokens, targets, B, T);
  EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss);
  std::mt19937_64 rng(5);
  double scale = 0.0;
  std::vector<std::pair<double, double>> pairs;
  for (const ParamSpec& s : m.params()) {
    if (s.kind != ParamKind::router) continue;
    for (int i = 0; i < 12; ++i) {
      const int64_t index = std::uniform_int_distribution<int64_t>(0, s.numel() - 1)(rng);
      const double fd = reference::loss_gradient_central_difference(ref, w, s.name, index, tokens, targets, B, T);
      pairs.emplace_back(m.grad(s.name)[static_cast<size_t>(index)], fd);
      scale = std::max(scale, std::abs(fd));
    }
  }
  ASSERT_GT(scale, 0.0);
  for (const auto& [g, fd] : pairs) EXPECT_LE(std::abs(g - fd), 1e-3 * std::abs(fd) + 1e-4 * scale) << g << " vs " << fd;
  // Without output_router_logits the same model adds nothing.
  ModelConfig off = c;
  off.output_router_logits = false;
  Model plain(off);
  randomize(plain, 17);
  plain.forward_backward(tokens, targets, B, T);
  EXPECT_EQ(plain.moe_aux_loss(), 0.0);
}

// Router statistics: every pick of every forward while on, the training forward's equal to the
// routing it reports, the cached forward's added on top; turning them on again starts afresh.
TEST(Moe, RouterStatsCountEveryPickOfEveryForward) {
  const ModelConfig c = moe_config(false, 8, 2);
  Model m(c);
  randomize(m, 6);
  const int64_t B = 2, T = 5;
  const auto tokens = tokens_of(B * T, 7, c.vocab_size);
  std::vector<float> logits(static_cast<size_t>(B * T * c.vocab_size));
  m.forward(tokens, B, T, logits);
  EXPECT_TRUE(m.router_stats().counts.empty());  // off by default
  m.set_router_stats(true);
  m.forward(tokens, B, T, logits);
  Model::RouterStats s = m.router_stats();
  ASSERT_EQ(s.counts.size(), 2u);
  EXPECT_EQ(s.rows, B * T);
  for (int64_t app = 0; app < 2; ++app) {
    std::vector<int64_t> want(8, 0);
    for (int32_t e : m.moe_selected(app)) ++want[static_cast<size_t>(e)];
    EXPECT_EQ(s.counts[static_cast<size_t>(app)], want) << app;
  }
  KvCache cache(c, 1);
  const int slot = cache.allocate();
  std::vector<float> row(static_cast<size_t>(c.vocab_size));
  const CachedInput one{slot, std::span(tokens).first(3), LogitRows::last};
  m.forward_cached(cache, std::span(&one, 1), row);
  s = m.router_stats();
  EXPECT_EQ(s.rows, B * T + 3);
  for (const auto& counts : s.counts) EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), int64_t{0}), 2 * (B * T + 3));
  m.set_router_stats(true);
  EXPECT_EQ(m.router_stats().rows, 0);
}

// The routing trace (concord ep-sim's input): each pass's tokens and every token's picks, in the
// forward's order, the same picks the forward reports.
TEST(Moe, TheRoutingTraceRecordsEveryTokensPicksPassByPass) {
  const ModelConfig c = moe_config(false, 8, 2);
  Model m(c);
  randomize(m, 6);
  const int64_t B = 2, T = 5;
  const auto tokens = tokens_of(B * T, 7, c.vocab_size);
  std::vector<float> logits(static_cast<size_t>(B * T * c.vocab_size));
  m.forward(tokens, B, T, logits);
  EXPECT_TRUE(m.router_trace().selected.empty());  // off by default
  m.set_router_trace(true);
  m.forward(tokens, B, T, logits);
  std::vector<std::vector<int32_t>> first;
  for (int64_t app = 0; app < 2; ++app) first.push_back(m.moe_selected(app));
  KvCache cache(c, 1);
  const int slot = cache.allocate();
  std::vector<float> row(static_cast<size_t>(c.vocab_size));
  const CachedInput three{slot, std::span(tokens).first(3), LogitRows::last};
  m.forward_cached(cache, std::span(&three, 1), row);
  const Model::RouterTrace& t = m.router_trace();
  ASSERT_EQ(t.selected.size(), 2u);
  for (size_t app = 0; app < 2; ++app) {
    EXPECT_EQ(t.pass_rows[app], (std::vector<int64_t>{B * T, 3})) << app;
    ASSERT_EQ(t.selected[app].size(), static_cast<size_t>(2 * (B * T + 3)));
    EXPECT_TRUE(std::equal(first[app].begin(), first[app].end(), t.selected[app].begin())) << app;
    for (size_t i = 0; i < t.selected[app].size(); i += 2) EXPECT_LT(t.selected[app][i], t.selected[app][i + 1]);
  }
  m.set_router_trace(false);
  EXPECT_TRUE(m.router_trace().pass_rows[0].empty());
}

// Eight experts, one per token, three tokens: at least five experts see no token; their
// gradients are zero (not stale), and the chosen ones' are not.
TEST(Moe, AnExpertNoTokenChoseGetsAZeroGradient) {
  const ModelConfig c = moe_config(false, 8, 1);
  Model m(c);
  randomize(m, 2);
  const auto tokens = tokens_of(3, 4, c.vocab_size);
  std::vector<int32_t> targets = {tokens[1], tokens[2], -1};
  for (const ParamSpec& s : m.params())
    if (s.kind == ParamKind::expert_down) std::fill(m.grad(s.name).begin(), m.grad(s.name).end(), 7.0f);
  m.forward_backward(tokens, targets, 1, 3);
  int zero = 0, nonzero = 0;
  for (const ParamSpec& s : m.params()) {
    if (s.kind != ParamKind::expert_down) continue;
    const auto g = m.grad(s.name);
    const bool all_zero = std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; });
    (all_zero ? zero : nonzero) += 1;
  }
  EXPECT_GE(zero, 2 * 5);  // two layers, >= 5 unchosen experts each
  EXPECT_GE(nonzero, 2);
}

// Prefill of two sequences in one call: the training forward's logits bit for bit, under
// row-local quantizers and NVFP4 (whose tensor scale runs per sequence, the experts' gathered
// rows included); token-by-token decode too, under the row-local ones.
TEST(Moe, TheCachedForwardEqualsTheTrainingForward) {
  for (const char* preset : {"fp32", "bf16", "mxfp8", "nvfp4"}) {
    const ModelConfig c = moe_config(true);
    Model m(c, PrecisionPolicy::preset(preset));
    randomize(m, 8);
    const int64_t T = 8, V = c.vocab_size;
    const auto a = tokens_of(T, 1, V), b = tokens_of(T, 2, V);
    std::vector<float> full_a(static_cast<size_t>(T * V)), full_b(full_a.size());
    m.forward(a, 1, T, full_a);
    m.forward(b, 1, T, full_b);
    KvCache cache(c, 3);
    const int sa = cache.allocate(), sb = cache.allocate(), sc = cache.allocate();
    std::vector<float> both(static_cast<size_t>(2 * T * V));
    const CachedInput inputs[] = {{sa, a, LogitRows::all}, {sb, b, LogitRows::all}};
    m.forward_cached(cache, inputs, both);
    EXPECT_TRUE(same_bits(std::span<const float>(both).first(full_a.size()), full_a)) << preset;
    EXPECT_TRUE(same_bits(std::span<const float>(both).subspan(full_a.size()), full_b)) << preset;
    // Token by token: NVFP4's tensor scale spans the rows of a pass, so one decoded row is
    // quantized on its own scale there (docs/engine.md: row-local quantizers only).
    if (std::string(preset) == "nvfp4") continue;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> row(static_cast<size_t>(V));
      const CachedInput one{sc, std::span(a).subspan(static_cast<size_t>(t), 1), LogitRows::last};
      m.forward_cached(cache, std::span(&one, 1), row);
      EXPECT_TRUE(same_bits(row, std::span<const float>(full_a).subspan(static_cast<size_t>(t * V), static_cast<size_t>(V))))
          << preset << " position " << t;
    }
  }
}

// The exchange of ranks that are threads: each rank's rows copied into a shared buffer (missing
// rows NaN) between barriers, then every row copied back.
template <class Barrier>
std::function<void(float*, const std::vector<ExpertParallel::RowRanges>&, int64_t)> thread_exchange(int r,
                                                                                                   std::vector<float>& shared,
                                                                                                   Barrier& sync) {
  return [&shared, &sync, r](float* y, const std::vector<ExpertParallel::RowRanges>& pieces, int64_t C) {
    int64_t end = 0;
    for (const auto& ranges : pieces)
      for (const auto& [first, last] : ranges) end = std::max(end, last);
    if (r == 0) shared.assign(static_cast<size_t>(end * C), std::nanf(""));
    sync.arrive_and_wait();
    for (const auto& [first, last] : pieces[static_cast<size_t>(r)])
      std::copy(y + first * C, y + last * C, shared.begin() + first * C);
    sync.arrive_and_wait();
    std::copy(shared.begin(), shared.end(), y);
    sync.arrive_and_wait();
  };
}

// Expert parallelism without MPI: R threads, each a rank with its own twin of the model and its
// share of the experts, the exchange a shared buffer between two barriers. Every rank's logits (a
// batched forward and a cached decode) are the single model's bit for bit, for every R up to E,
// with the contiguous split and with EPLB's placement (replicated experts' rows split among their
// holders); every routed row is computed once; a backward is refused.
TEST(Moe, ExpertParallelRanksGiveTheSingleModelsBits) {
  for (const int mode : {0, 1, 2})  // contiguous; replicas split evenly; replicas split by a hook
  for (const char* preset : {"fp32", "bf16", "mxfp8"}) {
    const bool replicas = mode > 0;
    const ModelConfig c = moe_config(true, 5, 2);
    Model m(c, PrecisionPolicy::preset(preset));
    randomize(m, 21);
    const int64_t B = 2, T = 7, V = c.vocab_size;
    const auto tokens = tokens_of(B * T, 3, V);
    std::vector<float> want(static_cast<size_t>(B * T * V));
    m.forward(tokens, B, T, want);
    for (int ranks = replicas ? 3 : 1; ranks <= 5; ++ranks) {  // with replicas: 2 slots a rank, >= 5 slots
      std::vector<float> shared;
      std::barrier sync(ranks);
      std::vector<std::vector<float>> got(static_cast<size_t>(ranks)), decoded(static_cast<size_t>(ranks));
      std::vector<int64_t> rows(static_cast<size_t>(ranks));
      std::vector<std::thread> threads;
      for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
          Model mine = m.twin();
          auto ep = std::make_shared<ExpertParallel>();
          ep->rank = r;
          ep->ranks = ranks;
          ep->exchange = thread_exchange(r, shared, sync);
          if (replicas) {  // EPLB's placement of made-up loads over 2 slots a rank: hot experts replicated
            const std::vector<double> load = {900, 40, 300, 70, 10};
            const serve_placement::Placement pl = serve_placement::eplb(load, ranks, 2);
            ep->rank_experts.assign(static_cast<size_t>(c.applications()), {});
            for (auto& per_app : ep->rank_experts) per_app = serve_placement::rank_slots(pl);
          }
          if (mode == 2) {  // an uneven split: a replicated expert's first holder takes a third, its last the rest
            const auto slots = ep->rank_experts[0];
            ep->split = [slots, ranks](int64_t, const std::vector<int64_t>& counts) {
              std::vector<std::vector<std::pair<int64_t, int64_t>>> out(counts.size());
              for (size_t e = 0; e < counts.size(); ++e) {
                std::vector<int64_t> holders;
                for (int q = 0; q < ranks; ++q)
                  if (std::find(slots[static_cast<size_t>(q)].begin(), slots[static_cast<size_t>(q)].end(),
                                static_cast<int64_t>(e)) != slots[static_cast<size_t>(q)].end())
                    holders.push_back(q);
                const int64_t first = holders.size() > 1 ? counts[e] / 3 : 0;
                if (first > 0) out[e].push_back({holders.front(), first});
                if (counts[e] - first > 0) out[e].push_back({holders.back(), counts[e] - first});
              }
              return out;
            };
          }
          mine.set_expert_parallel(ep);
          got[static_cast<size_t>(r)].resize(want.size());
          mine.forward(tokens, B, T, got[static_cast<size_t>(r)]);
          // Decode the first sequence token by token through the KV cache.
          KvCache cache(c, 1);
          const int slot = cache.allocate();
          for (int64_t t = 0; t < T; ++t) {
            std::vector<float> row(static_cast<size_t>(V));
            const CachedInput one{slot, std::span(tokens).subspan(static_cast<size_t>(t), 1), LogitRows::last};
            mine.forward_cached(cache, std::span(&one, 1), row);
            decoded[static_cast<size_t>(r)].insert(decoded[static_cast<size_t>(r)].end(), row.begin(), row.end());
          }
          for (const ExpertParallel::Layer& l : mine.expert_parallel()->layers) rows[static_cast<size_t>(r)] += l.rows;
          EXPECT_THROW(mine.forward_backward(tokens, tokens, B, T), InputError);
        });
      for (std::thread& t : threads) t.join();
      int64_t total = 0;
      for (int r = 0; r < ranks; ++r) {
        EXPECT_TRUE(same_bits(got[static_cast<size_t>(r)], want)) << preset << " " << ranks << " ranks, rank " << r
                                                                  << (replicas ? " (replicas)" : "");
        EXPECT_TRUE(same_bits(decoded[static_cast<size_t>(r)], std::span<const float>(want).first(static_cast<size_t>(T * V))))
            << preset << " decode, " << ranks << " ranks, rank " << r;
        total += rows[static_cast<size_t>(r)];
      }
      // The ranks' rows add up to every routed row once: (B*T + T decode rows) * k per layer.
      EXPECT_EQ(total, (B * T + T) * c.num_experts_per_tok * c.num_hidden_layers) << preset << " " << ranks;
    }
  }
}

// Data-parallel attention over R threads: each rank runs its own sequence (its own prompt length,
// its own number of decode steps) with its own KV cache, the MoE layers trading rows through an
// all-to-all board between barriers; a rank whose sequence has ended joins the others' passes
// with idle passes. Every rank's logits are the single model's on that rank's sequence alone, bit
// for bit, for 2 and 3 ranks, the contiguous split and EPLB's replicas, under row-local precisions;
// the rows sent equal the rows received.
TEST(Moe, DataParallelAttentionGivesEachRankItsOwnSequencesBits) {
  for (const bool replicas : {false, true})
  for (const char* preset : {"fp32", "bf16", "mxfp8"})
  for (int ranks = 2; ranks <= 3; ++ranks) {
    const ModelConfig c = moe_config(true, 5, 2);
    Model m(c, PrecisionPolicy::preset(preset));
    randomize(m, 31);
    const int64_t V = c.vocab_size;
    // Rank r: a prompt of 4 + 3r tokens, then 6 - 2r decode steps (teacher-forced from its list).
    auto prompt_len = [](int r) { return int64_t{4} + 3 * r; };
    auto decode_steps = [](int r) { return int64_t{6} - 2 * r; };
    std::vector<std::vector<int32_t>> seq(static_cast<size_t>(ranks));
    std::vector<std::vector<float>> want(static_cast<size_t>(ranks));
    int64_t passes = 0;
    for (int r = 0; r < ranks; ++r) {
      seq[static_cast<size_t>(r)] = tokens_of(prompt_len(r) + decode_steps(r), 40 + static_cast<uint64_t>(r), V);
      passes = std::max(passes, 1 + decode_steps(r));
      KvCache cache(c, 1);
      const int slot = cache.allocate();
      std::vector<float> row(static_cast<size_t>(V));
      const CachedInput first{slot, std::span(seq[static_cast<size_t>(r)]).first(static_cast<size_t>(prompt_len(r))), LogitRows::last};
      m.forward_cached(cache, std::span(&first, 1), row);
      want[static_cast<size_t>(r)] = row;
      for (int64_t t = 0; t < decode_steps(r); ++t) {
        const CachedInput one{slot, std::span(seq[static_cast<size_t>(r)]).subspan(static_cast<size_t>(prompt_len(r) + t), 1),
                              LogitRows::last};
        m.forward_cached(cache, std::span(&one, 1), row);
        want[static_cast<size_t>(r)].insert(want[static_cast<size_t>(r)].end(), row.begin(), row.end());
      }
    }
    std::vector<std::vector<std::vector<uint8_t>>> board(static_cast<size_t>(ranks),
                                                         std::vector<std::vector<uint8_t>>(static_cast<size_t>(ranks)));
    std::barrier sync(ranks);
    std::vector<std::vector<float>> got(static_cast<size_t>(ranks));
    std::vector<int64_t> sent(static_cast<size_t>(ranks)), received(static_cast<size_t>(ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
       try {
        Model mine = m.twin();
        auto ep = std::make_shared<ExpertParallel>();
        ep->rank = r;
        ep->ranks = ranks;
        ep->exchange = [](float*, const std::vector<ExpertParallel::RowRanges>&, int64_t) {};
        ep->data_parallel = true;
        ep->alltoallv = [&, r](const ExpertParallel::Parcels& to) {
          for (int q = 0; q < ranks; ++q) board[static_cast<size_t>(r)][static_cast<size_t>(q)] = to[static_cast<size_t>(q)];
          sync.arrive_and_wait();
          ExpertParallel::Parcels from(static_cast<size_t>(ranks));
          for (int q = 0; q < ranks; ++q) from[static_cast<size_t>(q)] = board[static_cast<size_t>(q)][static_cast<size_t>(r)];
          sync.arrive_and_wait();
          return from;
        };
        if (replicas) {  // 3 slots a rank on 2 ranks, 2 on 3: the hot experts on two ranks
          const std::vector<double> load = {900, 40, 300, 70, 10};
          const serve_placement::Placement pl = serve_placement::eplb(load, ranks, ranks == 2 ? 3 : 2);
          ep->rank_experts.assign(static_cast<size_t>(c.applications()), serve_placement::rank_slots(pl));
        }
        mine.set_expert_parallel(ep);
        KvCache cache(c, 1);
        const int slot = cache.allocate();
        const std::vector<int32_t>& s = seq[static_cast<size_t>(r)];
        std::vector<float> row(static_cast<size_t>(V));
        for (int64_t pass = 0; pass < passes; ++pass) {
          if (pass > decode_steps(r)) {
            mine.expert_parallel_idle_pass();
            continue;
          }
          const int64_t from = pass == 0 ? 0 : prompt_len(r) + pass - 1, n = pass == 0 ? prompt_len(r) : 1;
          const CachedInput in{slot, std::span(s).subspan(static_cast<size_t>(from), static_cast<size_t>(n)), LogitRows::last};
          mine.forward_cached(cache, std::span(&in, 1), row);
          got[static_cast<size_t>(r)].insert(got[static_cast<size_t>(r)].end(), row.begin(), row.end());
        }
        sent[static_cast<size_t>(r)] = mine.expert_parallel()->rows_sent;
        received[static_cast<size_t>(r)] = mine.expert_parallel()->rows_received;
       } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
        std::abort();
       }
      });
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < ranks; ++r)
      EXPECT_TRUE(same_bits(got[static_cast<size_t>(r)], want[static_cast<size_t>(r)]))
          << preset << " " << ranks << " ranks, rank " << r << (replicas ? " (replicas)" : "");
    EXPECT_EQ(std::accumulate(sent.begin(), sent.end(), int64_t{0}), std::accumulate(received.begin(), received.end(), int64_t{0}));
    EXPECT_GT(std::accumulate(sent.begin(), sent.end(), int64_t{0}), 0);
  }
}

// What data-parallel attention refuses: quantizers whose scale spans rows (a row's output would
// depend on other ranks' rows), re-placement, a missing all-to-all, an idle pass without it.
TEST(Moe, DataParallelAttentionRefusesWhatItCannotKeepExact) {
  const ModelConfig c = moe_config(true, 5, 2);
  auto one_rank = [] {
    auto ep = std::make_shared<ExpertParallel>();
    ep->exchange = [](float*, const std::vector<ExpertParallel::RowRanges>&, int64_t) {};
    ep->data_parallel = true;
    ep->alltoallv = [](const ExpertParallel::Parcels& to) { return to; };
    return ep;
  };
  Model nvfp4(c, PrecisionPolicy::preset("nvfp4"));
  randomize(nvfp4, 3);
  nvfp4.set_expert_parallel(one_rank());
  KvCache cache(c, 1);
  const int slot = cache.allocate();
  const auto tokens = tokens_of(4, 1, c.vocab_size);
  std::vector<float> row(static_cast<size_t>(c.vocab_size));
  const CachedInput in{slot, tokens, LogitRows::last};
  EXPECT_THROW(nvfp4.forward_cached(cache, std::span(&in, 1), row), InputError);
  Model fp32(c, PrecisionPolicy::preset("fp32"));
  randomize(fp32, 3);
  EXPECT_THROW(fp32.expert_parallel_idle_pass(), InputError);  // no expert parallelism
  auto replan = one_rank();
  replan->replan_every = 2;
  EXPECT_THROW(fp32.set_expert_parallel(replan), InputError);
  auto none = one_rank();
  none->alltoallv = nullptr;
  EXPECT_THROW(fp32.set_expert_parallel(none), InputError);
  // One rank: everything stays here, the single model's logits.
  fp32.set_expert_parallel(one_rank());
  KvCache cache2(c, 1);
  const int slot2 = cache2.allocate();
  std::vector<float> got(row.size()), want(row.size());
  const CachedInput in2{slot2, tokens, LogitRows::last};
  fp32.forward_cached(cache2, std::span(&in2, 1), got);
  fp32.set_expert_parallel(nullptr);
  KvCache cache3(c, 1);
  const int slot3 = cache3.allocate();
  const CachedInput in3{slot3, tokens, LogitRows::last};
  fp32.forward_cached(cache3, std::span(&in3, 1), want);
  EXPECT_TRUE(same_bits(got, want));
}

// A barrier whose waiters give up (throw) once a rank has failed: a rank that stops at a failed
// content check must not leave the others waiting at the exchange forever.
class AbortableBarrier {
 public:
  explicit AbortableBarrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock lock(mu_);
    const int64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return gen_ != gen || aborted_; });
    }
    if (aborted_) throw InputError("another rank failed");
  }
  void abort() {
    std::lock_guard lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, arrived_ = 0;
  int64_t gen_ = 0;
  bool aborted_ = false;
};

// Experts moved between passes: ranks hold only their experts' weights, and every 2 passes a new
// placement (the contiguous split rotated by one expert per re-placement, so experts must move)
// brings each newly held expert from its lowest holder; the logits of a token-by-token decode
// stay the single model's bit for bit, experts move, a released expert's memory is gone, and a
// corrupted transfer is caught by the content check.
TEST(Moe, ExpertsMovedBetweenPassesKeepTheSingleModelsBits) {
  const ModelConfig c = moe_config(true, 6, 2);
  Model m(c, PrecisionPolicy::preset("fp32"));
  randomize(m, 23);
  const int64_t T = 9, V = c.vocab_size, E = c.num_experts;
  const auto tokens = tokens_of(T, 5, V);
  std::vector<float> want;
  {
    Model single = m.twin();
    KvCache cache(c, 1);
    const int slot = cache.allocate();
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> row(static_cast<size_t>(V));
      const CachedInput one{slot, std::span(tokens).subspan(static_cast<size_t>(t), 1), LogitRows::last};
      single.forward_cached(cache, std::span(&one, 1), row);
      want.insert(want.end(), row.begin(), row.end());
    }
  }
  std::vector<std::vector<uint64_t>> hashes(static_cast<size_t>(c.applications()));
  for (int64_t app = 0; app < c.applications(); ++app)
    if (c.is_moe_layer(c.block_of(app)))
      for (int64_t e = 0; e < E; ++e) {
        const std::vector<uint8_t> b = m.expert_bytes(c.block_of(app), e);
        hashes[static_cast<size_t>(app)].push_back(XXH3_64bits(b.data(), b.size()));
      }
  const int64_t all_bytes = m.expert_bytes_held();
  auto rotated = [&](int ranks, int64_t shift) {  // per application, per rank: its experts
    std::vector<std::vector<std::vector<int64_t>>> out(static_cast<size_t>(c.applications()));
    for (int64_t app = 0; app < c.applications(); ++app) {
      if (!c.is_moe_layer(c.block_of(app))) continue;
      out[static_cast<size_t>(app)].resize(static_cast<size_t>(ranks));
      for (int q = 0; q < ranks; ++q)
        for (int64_t i = E * q / ranks; i < E * (q + 1) / ranks; ++i)
          out[static_cast<size_t>(app)][static_cast<size_t>(q)].push_back((i + shift) % E);
    }
    return out;
  };
  for (const bool corrupt : {false, true})
    for (int ranks : {2, 3}) {
      if (corrupt && ranks == 3) continue;
      std::vector<float> shared;
      AbortableBarrier sync(ranks);
      std::mutex box_mu;
      std::condition_variable box_cv;
      bool failed = false;
      std::map<std::pair<int, int>, std::deque<std::vector<uint8_t>>> box;
      std::vector<std::vector<float>> decoded(static_cast<size_t>(ranks));
      std::vector<int64_t> moved(static_cast<size_t>(ranks)), replans(static_cast<size_t>(ranks)), held(static_cast<size_t>(ranks));
      std::vector<std::string> errors(static_cast<size_t>(ranks));
      std::vector<std::thread> threads;
      for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
          Model mine = m.twin();
          auto ep = std::make_shared<ExpertParallel>();
          ep->rank = r;
          ep->ranks = ranks;
          ep->exchange = thread_exchange(r, shared, sync);
          ep->send_recv = [&](int src, int dst, std::vector<uint8_t>& bytes) {
            std::unique_lock lock(box_mu);
            if (r == src) {
              box[{src, dst}].push_back(bytes);
              box_cv.notify_all();
              return;
            }
            box_cv.wait(lock, [&] { return !box[{src, dst}].empty() || failed; });
            if (box[{src, dst}].empty()) throw InputError("another rank failed");
            bytes = std::move(box[{src, dst}].front());
            box[{src, dst}].pop_front();
          };
          ep->rank_experts = rotated(ranks, 0);
          ep->expert_hash = hashes;
          ep->replan_every = 2;
          int64_t shift = 0;
          ep->plan = [&, ranks, shift](const std::vector<std::vector<int64_t>>& window) mutable {
            int64_t routed = 0;
            for (const auto& w : window) routed += std::accumulate(w.begin(), w.end(), int64_t{0});
            EXPECT_EQ(routed, 2 * c.num_experts_per_tok * c.num_hidden_layers);  // 2 one-token passes
            return rotated(ranks, ++shift);
          };
          ep->corrupt_next_move = corrupt && r == 1;
          for (int64_t app = 0; app < c.applications(); ++app)
            if (c.is_moe_layer(c.block_of(app)))
              for (int64_t e = 0; e < E; ++e) {
                const auto& own = ep->rank_experts[static_cast<size_t>(app)][static_cast<size_t>(r)];
                if (std::find(own.begin(), own.end(), e) == own.end()) mine.release_expert(c.block_of(app), e);
              }
          held[static_cast<size_t>(r)] = mine.expert_bytes_held();
          mine.set_expert_parallel(ep);
          try {
            KvCache cache(c, 1);
            const int slot = cache.allocate();
            for (int64_t t = 0; t < T; ++t) {
              std::vector<float> row(static_cast<size_t>(V));
              const CachedInput one{slot, std::span(tokens).subspan(static_cast<size_t>(t), 1), LogitRows::last};
              mine.forward_cached(cache, std::span(&one, 1), row);
              decoded[static_cast<size_t>(r)].insert(decoded[static_cast<size_t>(r)].end(), row.begin(), row.end());
            }
          } catch (const InputError& e) {
            errors[static_cast<size_t>(r)] = e.what();
            sync.abort();
            {
              std::lock_guard lock(box_mu);
              failed = true;
            }
            box_cv.notify_all();
          }
          moved[static_cast<size_t>(r)] = mine.expert_parallel()->moved_in;
          replans[static_cast<size_t>(r)] = mine.expert_parallel()->replans;
        });
      for (std::thread& t : threads) t.join();
      if (corrupt) {
        EXPECT_NE(errors[1].find("content check failed"), std::string::npos) << errors[1];
        continue;
      }
      for (int r = 0; r < ranks; ++r) {
        EXPECT_EQ(errors[static_cast<size_t>(r)], "") << ranks << " ranks, rank " << r;
        if (!errors[static_cast<size_t>(r)].empty()) continue;
        EXPECT_TRUE(same_bits(decoded[static_cast<size_t>(r)], want)) << ranks << " ranks, rank " << r;
        EXPECT_EQ(replans[static_cast<size_t>(r)], (T - 1) / 2) << ranks << " ranks, rank " << r;
        EXPECT_GT(moved[static_cast<size_t>(r)], 0) << ranks << " ranks, rank " << r;
        EXPECT_LT(held[static_cast<size_t>(r)], all_bytes);
      }
    }
  // A released expert is gone: reading it, or computing with it, is refused.
  Model part = m.twin();
  part.release_expert(c.block_of(0), 1);
  EXPECT_FALSE(part.holds_expert(c.block_of(0), 1));
  EXPECT_THROW(part.expert_bytes(c.block_of(0), 1), InputError);
  std::vector<float> logits(static_cast<size_t>(T * V));
  EXPECT_THROW(part.forward(tokens, 1, T, logits), InputError);
  EXPECT_THROW(part.set_expert_bytes(c.block_of(0), 1, std::vector<uint8_t>(3)), InputError);
  part.set_expert_bytes(c.block_of(0), 1, m.expert_bytes(c.block_of(0), 1));
  part.forward(tokens, 1, T, logits);
}

TEST(Moe, ExpertParallelRefusesTooManyRanks) {
  Model four(moe_config(true), PrecisionPolicy::preset("fp32"));
  auto too_many = std::make_shared<ExpertParallel>();
  too_many->ranks = 5;
  too_many->exchange = [](float*, const std::vector<ExpertParallel::RowRanges>&, int64_t) {};
  EXPECT_THROW(four.set_expert_parallel(too_many), InputError);  // 4 experts over 5 ranks
}

TEST(Moe, LossAndGradientsDoNotDependOnTheThreadCount) {
  const ModelConfig c = moe_config(true);
  std::vector<std::vector<float>> grads[2];
  float loss[2];
  const int64_t B = 4, T = 16;
  const auto tokens = tokens_of(B * T, 9, c.vocab_size);
  const auto targets = reference::next_token_targets(tokens, B, T);
  const int threads[2] = {1, 2};
  for (int i = 0; i < 2; ++i) {
    omp_set_num_threads(threads[i]);
    Model m(c, PrecisionPolicy::preset("mxfp8"));
    randomize(m, 1);
    loss[i] = m.forward_backward(tokens, targets, B, T, 3);
    for (const ParamSpec& s : m.params()) grads[i].emplace_back(m.grad(s.name).begin(), m.grad(s.name).end());
  }
  omp_set_num_threads(2);
  EXPECT_EQ(std::bit_cast<uint32_t>(loss[0]), std::bit_cast<uint32_t>(loss[1]));
  for (size_t p = 0; p < grads[0].size(); ++p) EXPECT_TRUE(same_bits(grads[0][p], grads[1][p])) << p;
}

TEST(Moe, ConfigReadsHfsKeysAndRefusesWhatItCannotRun) {
  nlohmann::json j = moe_config(true).to_json();
  EXPECT_EQ(j.at("model_type"), "qwen3_moe");
  EXPECT_EQ(j.at("num_experts"), 4);
  const ModelConfig back = ModelConfig::from_json(j, "t");
  EXPECT_TRUE(back.moe());
  EXPECT_EQ(back.num_experts_per_tok, 2);
  EXPECT_TRUE(back.norm_topk_prob);
  EXPECT_EQ(back.to_json(), j);
  // HF's defaults for absent keys (Qwen3MoeConfig).
  nlohmann::json bare = j;
  for (const char* k : {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                        "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef", "output_router_logits"})
    bare.erase(k);
  const ModelConfig defaults = ModelConfig::from_json(bare, "t");
  EXPECT_EQ(defaults.num_experts, 128);
  EXPECT_EQ(defaults.num_experts_per_tok, 8);
  EXPECT_EQ(defaults.moe_intermediate_size, 768);
  EXPECT_FALSE(defaults.norm_topk_prob);
  // mlp_only_layers and decoder_sparse_step choose dense layers, as HF's decoder layer does.
  nlohmann::json mixed = j;
  mixed["num_hidden_layers"] = 4;
  mixed["decoder_sparse_step"] = 2;
  mixed["mlp_only_layers"] = {3};
  const ModelConfig mc = ModelConfig::from_json(mixed, "t");
  EXPECT_FALSE(mc.is_moe_layer(0));
  EXPECT_TRUE(mc.is_moe_layer(1));
  EXPECT_FALSE(mc.is_moe_layer(2));
  EXPECT_FALSE(mc.is_moe_layer(3));
  auto message = [](nlohmann::json bad) {
    try {
      ModelConfig::from_json(bad, "cfg.json");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  nlohmann::json bad = j;
  bad["num_experts_per_tok"] = 5;
  EXPECT_EQ(message(bad), "[config] cfg.json: 'num_experts_per_tok' must lie in 1..num_experts = 4 (got 5)");
  nlohmann::json dense = ModelConfig{}.to_json();
  dense["num_experts"] = 4;
  EXPECT_EQ(message(dense), "[config] cfg.json: unknown field 'num_experts' for Qwen3ForCausalLM (a "
                            "Qwen3MoeForCausalLM field: this architecture has no experts)");
}

// The experts' HF names (model.layers.{i}.mlp.experts.{e}.gate_proj.weight, mlp.gate.weight) go
// through the registry; a safetensors folder loads back to the same logits; GGUF is refused.
TEST(Moe, ExpertNamesAndASafetensorsFolderRoundTrip) {
  const ModelConfig c = moe_config(false);
  Model m(c);
  randomize(m, 3);
  EXPECT_EQ(m.params()[static_cast<size_t>(require_param(m.params(), ParamKind::expert_up, 1, 3))].name,
            "model.layers.1.mlp.experts.3.up_proj.weight");
  EXPECT_EQ(m.params()[static_cast<size_t>(require_param(m.params(), ParamKind::router, 0))].name, "model.layers.0.mlp.gate.weight");
  EXPECT_EQ(parse_hf_param_name("model.layers.1.mlp.experts.3.down_proj.weight"), (ParamName{ParamKind::expert_down, 1, 3}));
  EXPECT_EQ(parse_hf_param_name("model.layers.1.mlp.experts.x.down_proj.weight"), std::nullopt);
  EXPECT_EQ(parse_gguf_param_name("blk.1.ffn_down_exps.weight"), (ParamName{ParamKind::expert_down, 1, -1}));
  EXPECT_EQ(hf_tensor_name("blk.1.ffn_down_exps.weight"), std::nullopt);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("concord_moe_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  export_model(m, dir / "hf", ExportOptions{});
  LoadedModel back = load_model(dir / "hf");
  EXPECT_TRUE(back.model.config().moe());
  const auto tokens = tokens_of(6, 1, c.vocab_size);
  std::vector<float> x(static_cast<size_t>(6 * c.vocab_size)), y(x.size());
  m.forward(tokens, 1, 6, x);
  back.model.forward(tokens, 1, 6, y);
  EXPECT_TRUE(same_bits(x, y));
  ExportOptions gguf;
  gguf.format = ExportFormat::gguf;
  EXPECT_THROW(export_model(m, dir / "m.gguf", gguf), InputError);
  std::filesystem::remove_all(dir);
}

// GGUF in llama.cpp's qwen3moe layout (gguf-py's MODEL_TENSORS[QWEN3MOE]): a layer's experts in
// one 3-D tensor per projection, {cols, rows, experts}; the router ffn_gate_inp in f32; the
// expert keys. f32 loads back to the same logits bit for bit; q8_0 loads its experts as stored
// blocks (the W8A8 kernels) and re-exports to the same bytes; what llama.cpp cannot run is refused.
TEST(Moe, GgufInLlamaCppsLayoutRoundTrips) {
  ModelConfig c = moe_config(true);
  c.vocab_size = 259;  // concord's byte vocabulary: the export writes its byte-level tokenizer
  c.moe_intermediate_size = 64;  // q8_0 blocks of 32 along every row; not C, so the dims tell
  Model m(c);
  randomize(m, 12);
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("concord_moe_gguf_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ExportOptions gguf;
  gguf.format = ExportFormat::gguf;
  export_model(m, dir / "f32.gguf", gguf);
  {
    const io::GgufFile f = io::GgufFile::open(dir / "f32.gguf");
    EXPECT_EQ(f.get_string("general.architecture"), "qwen3moe");
    EXPECT_EQ(f.get_int("qwen3moe.expert_count"), 4);
    EXPECT_EQ(f.get_int("qwen3moe.expert_used_count"), 2);
    EXPECT_EQ(f.get_int("qwen3moe.expert_feed_forward_length"), 64);
    ASSERT_NE(f.find("blk.1.ffn_gate_exps.weight"), nullptr);
    EXPECT_EQ(f.find("blk.1.ffn_gate_exps.weight")->dims, (std::vector<int64_t>{32, 64, 4}));  // {C, Fm, E}
    EXPECT_EQ(f.find("blk.1.ffn_up_exps.weight")->dims, (std::vector<int64_t>{32, 64, 4}));
    EXPECT_EQ(f.find("blk.1.ffn_down_exps.weight")->dims, (std::vector<int64_t>{64, 32, 4}));  // {Fm, C, E}
    EXPECT_EQ(f.find("blk.0.ffn_gate_inp.weight")->dims, (std::vector<int64_t>{32, 4}));
    EXPECT_EQ(f.find("blk.0.ffn_gate.weight"), nullptr);
  }
  LoadedModel back = load_model(dir / "f32.gguf");
  const auto tokens = tokens_of(6, 1, c.vocab_size);
  std::vector<float> x(static_cast<size_t>(6 * c.vocab_size)), y(x.size()), z(x.size());
  m.forward(tokens, 1, 6, x);
  back.model.forward(tokens, 1, 6, y);
  EXPECT_TRUE(same_bits(x, y));

  gguf.dtype = "q8_0";
  export_model(m, dir / "q8.gguf", gguf);
  {
    const io::GgufFile f = io::GgufFile::open(dir / "q8.gguf");
    EXPECT_EQ(f.find("blk.1.ffn_down_exps.weight")->type, io::GgmlType::q8_0);
    EXPECT_EQ(f.find("blk.1.ffn_gate_inp.weight")->type, io::GgmlType::f32);
  }
  // Served as stored: each expert's blocks are its slab of the 3-D tensor (their dequantized
  // rows equal the fp32 load's values), the router stays fp32, and the W8A8 forward runs.
  LoadedModel native = load_model(dir / "q8.gguf", "native");
  LoadedModel dequantized = load_model(dir / "q8.gguf");
  EXPECT_EQ(native.model.stored_weight("model.layers.1.mlp.gate.weight"), nullptr);
  for (const ParamSpec& s : dequantized.model.params()) {
    if (s.expert < 0) continue;
    const tensor::QuantWeight* w = native.model.stored_weight(s.name);
    ASSERT_NE(w, nullptr) << s.name;
    std::vector<float> rows(static_cast<size_t>(s.numel()));
    tensor::dequantize_rows(*w, 0, s.shape[0], rows.data());
    EXPECT_TRUE(same_bits(rows, dequantized.model.param(s.name))) << s.name;
  }
  native.model.forward(tokens, 1, 6, z);
  EXPECT_TRUE(std::all_of(z.begin(), z.end(), [](float v) { return std::isfinite(v); }));
  export_model(dequantized.model, dir / "q8_again.gguf", gguf);
  {
    const io::GgufFile a = io::GgufFile::open(dir / "q8.gguf"), b = io::GgufFile::open(dir / "q8_again.gguf");
    for (const char* name : {"blk.0.ffn_gate_exps.weight", "blk.1.ffn_down_exps.weight"}) {
      const auto& ta = a.find(name)->bytes;
      const auto& tb = b.find(name)->bytes;
      EXPECT_TRUE(ta.size() == tb.size() && std::equal(ta.begin(), ta.end(), tb.begin())) << name;
    }
  }
  ModelConfig dense_first = c;
  dense_first.mlp_only_layers = {0};
  Model mixed(dense_first);
  try {
    ExportOptions mixed_gguf;
    mixed_gguf.format = ExportFormat::gguf;
    export_model(mixed, dir / "mixed.gguf", mixed_gguf);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0 is dense"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// llama.cpp reads concord's qwen3moe GGUF as the same model (tools/make_llamacpp_moe_golden.py:
// llama.cpp's logits of every position of two byte sequences on tests/golden/moe/tiny_qwen3moe.gguf,
// which concord wrote). concord's fp32 forward on that file against llama.cpp's f32 one.
TEST(Moe, LlamaCppRunsConcordsGgufToTheSameLogits) {
  const std::filesystem::path dir = std::filesystem::path(CONCORD_GOLDEN_DIR) / "moe";
  LoadedModel m = load_model(dir / "tiny_qwen3moe.gguf");
  ASSERT_TRUE(m.model.config().moe());
  const auto file = io::SafetensorsFile::open(dir / "llamacpp_logits.safetensors");
  const io::TensorInfo& tok = file.get("tokens");
  const int64_t S = tok.shape.at(0), T = tok.shape.at(1), V = m.model.config().vocab_size;
  std::vector<int32_t> tokens(static_cast<size_t>(S * T));
  std::memcpy(tokens.data(), tok.bytes.data(), tok.bytes.size());
  const std::vector<float> want = io::tensor_to_floats(file.get("logits"));
  ASSERT_EQ(static_cast<int64_t>(want.size()), S * T * V);
  double worst = 0.0, scale = 0.0;
  for (int64_t s = 0; s < S; ++s) {
    std::vector<float> got(static_cast<size_t>(T * V));
    m.model.forward(std::span(tokens).subspan(static_cast<size_t>(s * T), static_cast<size_t>(T)), 1, T, got);
    for (int64_t i = 0; i < T * V; ++i) {
      const double ref = want[static_cast<size_t>(s * T * V + i)];
      worst = std::max(worst, std::abs(static_cast<double>(got[static_cast<size_t>(i)]) - ref));
      scale = std::max(scale, std::abs(ref));
    }
  }
  // Measured 3.3e-7 (llama.cpp run with an f32 KV cache and no flash attention): fp32 rounding of
  // two different reduction orders. A wrong expert layout or routing would be off by O(1).
  EXPECT_LE(worst / scale, 1e-5) << "max|Δlogit| " << worst << " of max|logit| " << scale;
  std::printf("[ measured ] llama.cpp vs concord on concord's qwen3moe GGUF: max|Δlogit|/max|logit| %.3g\n",
              worst / scale);
}

}  // namespace
}  // namespace concord::model
