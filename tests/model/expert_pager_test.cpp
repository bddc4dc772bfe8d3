// Experts under a memory cap (model/expert_pager.h, issue 25): a Qwen3-MoE GGUF whose experts are
// paged from the file gives the uncapped model's logits bit for bit at every cap, with and without
// prefetch and a pinned hot set, batched and token by token; the bytes held never exceed the cap;
// the pager's own rules (LRU, pins, the prefetcher's reservations, a failing read) on a synthetic
// loader; what cannot be paged is refused with the figure.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "concord/model/expert_pager.h"
#include "concord/model/files.h"
#include "concord/model/kv_cache.h"
#include "concord/model/model.h"
#include "concord/numerics/check.h"
#include "concord/tensor/quant_gemm.h"
#include "test_inputs.h"

namespace concord::model {
namespace {

using concord_test::same_bits;
using concord_test::tokens_of;

ModelConfig paged_config() {
  ModelConfig c;
  c.architecture = "Qwen3MoeForCausalLM";
  c.vocab_size = 259;  // the byte vocabulary: the GGUF export writes its tokenizer
  c.hidden_size = 64;
  c.intermediate_size = 64;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = false;
  c.num_experts = 8;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 32;  // ggml blocks of 32 along the down projection's rows
  c.norm_topk_prob = true;
  return c;
}

struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("concord_expert_pager_" + std::to_string(::getpid()));
  TempDir() {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

std::filesystem::path write_gguf(const TempDir& dir, const char* dtype) {
  Model m(paged_config());
  m.init_random(21, 0.2f);
  std::mt19937_64 rng(22);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const ParamSpec& s : m.params())
    if (s.kind == ParamKind::router)
      for (float& v : m.param(s.name)) v = 2.0f * normal(rng);  // routing spread over the experts
  m.weights_changed();
  ExportOptions o;
  o.format = ExportFormat::gguf;
  o.dtype = dtype;
  const std::filesystem::path out = dir.path / (std::string(dtype) + ".gguf");
  export_model(m, out, o);
  return out;
}

// A batched pass of two sequences, then token-by-token decode of a third: every logit.
std::vector<float> run(Model& m) {
  const ModelConfig& c = m.config();
  const int64_t T = 12, V = c.vocab_size;
  const auto a = tokens_of(T, 1, V), b = tokens_of(T, 2, V), d = tokens_of(T, 3, V);
  std::vector<float> out(static_cast<size_t>(2 * T * V));
  KvCache cache(c, 3);
  const int sa = cache.allocate(), sb = cache.allocate(), sc = cache.allocate();
  const CachedInput inputs[] = {{sa, a, LogitRows::all}, {sb, b, LogitRows::all}};
  m.forward_cached(cache, inputs, out);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> row(static_cast<size_t>(V));
    const CachedInput one{sc, std::span(d).subspan(static_cast<size_t>(t), 1), LogitRows::last};
    m.forward_cached(cache, std::span(&one, 1), row);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

TEST(ExpertPager, EveryCapGivesTheUncappedModelsBits) {
  TempDir dir;
  for (const char* dtype : {"q4_0", "q8_0"}) {
    const std::filesystem::path gguf = write_gguf(dir, dtype);
    LoadedModel whole = load_model(gguf, "native");
    const std::vector<float> want = run(whole.model);
    const int64_t all = whole.model.expert_bytes_held();
    std::map<int64_t, std::vector<double>> loads;
    whole.model.set_router_stats(true);
    run(whole.model);
    const Model::RouterStats rs = whole.model.router_stats();
    for (size_t app = 0; app < rs.counts.size(); ++app)
      loads[static_cast<int64_t>(app)] = std::vector<double>(rs.counts[app].begin(), rs.counts[app].end());
    for (double share : {1.0, 0.5, 0.25, 0.0})
      for (bool prefetch : {false, true})
        for (bool pins : {false, true}) {
          ExpertPaging paging;
          paging.cap_share = share;
          // 0: the least cap there is, one expert (every expert of this model has the same bytes)
          if (share == 0.0) paging.cap_bytes = all / (3 * 8);
          paging.prefetch = prefetch;
          if (pins) paging.pin_loads = loads;
          LoadedModel paged = load_model_paged(gguf, paging);
          const std::string what = std::string(dtype) + " share " + std::to_string(share) + (prefetch ? " prefetch" : "") +
                                   (pins ? " pinned" : "");
          ASSERT_NE(paged.model.expert_pager(), nullptr);
          const std::vector<float> got = run(paged.model);
          EXPECT_TRUE(same_bits(got, want)) << what;
          const ExpertPagingStats s = paged.model.expert_pager()->stats();
          EXPECT_EQ(s.expert_bytes, all) << what;
          EXPECT_LE(s.high_water, s.cap) << what;
          EXPECT_GT(s.uses, 0) << what;
          EXPECT_EQ(s.uses, s.hits + s.waits + (s.loads - s.prefetched - s.pinned)) << what;
          if (share == 1.0) {
            EXPECT_EQ(s.evictions, 0) << what;
          }  // everything fits: each expert read once
          if (share <= 0.25) {
            EXPECT_GT(s.evictions, 0) << what;
          }
          if (pins && share > 0.0) {
            EXPECT_GT(s.pinned, 0) << what;
          }
          if (!prefetch) {
            EXPECT_EQ(s.prefetched, 0) << what;
          }
          EXPECT_LE(paged.model.expert_bytes_held(), s.cap) << what;
        }
  }
}

TEST(ExpertPager, WhatCannotBePagedIsRefusedWithTheFigure) {
  TempDir dir;
  const std::filesystem::path q4 = write_gguf(dir, "q4_0");
  ExpertPaging paging;
  paging.cap_bytes = 100;  // less than one expert
  try {
    load_model_paged(q4, paging);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot hold one expert"), std::string::npos) << e.what();
  }
  paging.cap_bytes = 0;
  paging.cap_share = 1.5;
  EXPECT_THROW(load_model_paged(q4, paging), InputError);
  paging.cap_share = 0.5;
  const std::filesystem::path f32 = write_gguf(dir, "f32");
  try {
    load_model_paged(f32, paging);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("Q4_0, Q4_1 or Q8_0"), std::string::npos) << e.what();
  }
  LoadedModel paged = load_model_paged(q4, paging);
  EXPECT_THROW(paged.model.twin(), InputError);
  EXPECT_THROW(paged.model.set_expert_parallel(std::make_shared<ExpertParallel>()), InputError);
}

// The pager alone, on a synthetic loader: q8_0 blocks of one row each, a load counter per param.
struct Synthetic {
  std::vector<ExpertPager::Expert> experts;
  std::atomic<int> loads{0};
  std::atomic<int> fail_param{-1};
  int64_t expert_bytes = 0;
  Synthetic(int64_t blocks, int64_t E) {
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t e = 0; e < E; ++e) {
        ExpertPager::Expert x;
        x.block = b;
        x.expert = e;
        for (int j = 0; j < 3; ++j) x.params[static_cast<size_t>(j)] = static_cast<int>((b * E + e) * 3 + j);
        x.bytes = 3 * static_cast<int64_t>(tensor::packed_quant_bytes(tensor::BlockQuant::q8_0, 1, 32));
        expert_bytes = x.bytes;
        experts.push_back(x);
      }
  }
  ExpertPager::Loader loader() {
    return [this](int param) {
      if (param == fail_param.load()) throw InputError("synthetic: the file went away");
      ++loads;
      std::vector<uint8_t> block(34, 0);
      block[1] = 0x3c;  // d = fp16 1.0
      block[2] = static_cast<uint8_t>(param);  // the first element: the param's id
      return std::make_shared<const tensor::QuantWeight>(tensor::pack_quant_weight(tensor::BlockQuant::q8_0, 1, 32, block));
    };
  }
};

TEST(ExpertPager, LeastRecentlyUsedGoesFirstAndPinsStay) {
  Synthetic s(2, 4);
  ExpertPager pager(s.experts, 4, 3 * s.expert_bytes, s.loader(), false);
  const std::pair<int64_t, int64_t> hot[] = {{1, 3}};
  EXPECT_EQ(pager.pin(hot, s.expert_bytes), 1);
  EXPECT_EQ(s.loads.load(), 3);
  auto use = [&](int64_t b, int64_t e) {
    const ExpertPager::Weights w = pager.acquire(b, e);
    EXPECT_TRUE(w[0] && w[0]->loaded());
    pager.release(b, e);
  };
  use(0, 0);
  use(0, 1);  // cap full: the pin, (0,0), (0,1)
  use(0, 0);  // a hit: (0,1) is now least recently used
  EXPECT_EQ(pager.stats().hits, 1);
  use(0, 2);  // evicts (0,1)
  EXPECT_EQ(pager.stats().evictions, 1);
  use(0, 0);
  EXPECT_EQ(pager.stats().hits, 2);
  use(1, 3);  // pinned: always a hit
  EXPECT_EQ(pager.stats().hits, 3);
  for (int64_t e = 0; e < 3; ++e) use(1, e);  // churn: the pin never goes
  use(1, 3);
  EXPECT_EQ(pager.stats().hits, 4);
  EXPECT_LE(pager.stats().high_water, pager.stats().cap);
  // A locked expert is never evicted: with the cap full of locked and pinned experts, nothing
  // else can come in (a pass holds one expert at a time, so it never gets here).
  (void)pager.acquire(0, 0);
  (void)pager.acquire(1, 0);
  EXPECT_THROW((void)pager.acquire(0, 3), std::logic_error);
}

TEST(ExpertPager, ThePrefetcherStaysUnderTheCapAndSparesWhatTheLayerNeeds) {
  Synthetic s(4, 8);
  ExpertPager pager(s.experts, 8, 5 * s.expert_bytes, s.loader(), true);
  std::mt19937_64 rng(5);
  for (int pass = 0; pass < 200; ++pass)
    for (int64_t b = 0; b < 4; ++b) {
      std::vector<int64_t> want, next;
      for (int64_t e = 0; e < 8; ++e)
        if (rng() % 3 == 0) want.push_back(e);
      for (int64_t e = 0; e < 8; ++e)
        if (rng() % 4 == 0) next.push_back(e);
      const std::vector<int64_t> order = pager.expect(b, want, (b + 1) % 4, next);
      ASSERT_EQ(order.size(), want.size());
      for (int64_t e : order) {
        const ExpertPager::Weights w = pager.acquire(b, e);
        ASSERT_TRUE(w[2] && w[2]->loaded());
        // The blocks are this expert's: its down projection's param id is the first element.
        std::vector<float> row(32);
        tensor::dequantize_rows(*w[2], 0, 1, row.data());
        EXPECT_EQ(row[0], static_cast<float>((b * 8 + e) * 3 + 2));
        pager.release(b, e);
      }
    }
  const ExpertPagingStats st = pager.stats();
  EXPECT_LE(st.high_water, st.cap);
  EXPECT_GT(st.prefetched, 0);
  EXPECT_GT(st.prefetch_used, 0);
  EXPECT_EQ(st.uses, st.hits + st.waits + (st.loads - st.prefetched));
}

TEST(ExpertPager, AFailedReadReachesThePass) {
  for (bool prefetch : {false, true}) {
    Synthetic s(1, 4);
    ExpertPager pager(s.experts, 4, 4 * s.expert_bytes, s.loader(), prefetch);
    s.fail_param = s.experts[2].params[1];
    const int64_t want[] = {0, 1, 2, 3};
    const std::vector<int64_t> order = pager.expect(0, want, -1, {});
    bool thrown = false;
    for (int64_t e : order) {
      try {
        (void)pager.acquire(0, e);
        pager.release(0, e);
      } catch (const InputError& err) {
        EXPECT_NE(std::string(err.what()).find("went away"), std::string::npos);
        thrown = true;
      }
    }
    EXPECT_TRUE(thrown) << prefetch;
    pager.drain();  // the prefetcher may be reading (and failing on) expert 2 again
    const ExpertPagingStats st = pager.stats();
    EXPECT_LE(st.held, 3 * s.expert_bytes) << prefetch << " loads " << st.loads << " prefetched " << st.prefetched << " uses "
                                           << st.uses << " hits " << st.hits << " waits " << st.waits;  // the failed load's reservation returned
  }
}

}  // namespace
}  // namespace concord::model
