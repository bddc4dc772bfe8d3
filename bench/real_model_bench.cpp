// The real model's serving speed: SmolLM2-135M-Instruct (Q4_1 / Q8_0 GGUF, scripts/smollm2-path)
// through concord's engine path (Model::forward_cached), measured as llama-bench defines its two
// figures, so that bench/smollm2_run.sh can put them beside llama.cpp's on the same file:
//   pp512  one 512-token prompt in one forward pass (logits of the last token only), tokens/s;
//   tg128  128 single-token decode steps after an 8-token prompt, tokens/s.
// At 1 and 2 OpenMP threads, for the file's own precision (native: W4A8 / W8A8 on the stored
// blocks) and the fp32-dequantized weights (--policy fp32). Baseline in the same run: memcpy of
// as many bytes as the native weights (GB/s), so decode's weight stream reads as a fraction of
// the copy bandwidth. Counters: tokens/s, weight_bytes, and the process's peak RSS so far.
// The model path comes from CONCORD_SMOLLM2 (the run script sets it from scripts/smollm2-path).
//
// BM_EngineServeWorkload is the in-process baseline of `concord serve`'s load test
// (bench/serve_load.py, bench/serve_run.sh): the same requests (prompt_of(k), greedy for even k,
// T 0.8 / top-p 0.95 / seed 1000 + k for odd k, the model's stop tokens) through serve::Engine with
// the same max-sequences, all submitted at once (the engine refills a freed slot from its FIFO
// queue at the next step, as the server's clients do by sending their next request), native
// policy; generated tokens/s = every sampled token / wall time of Engine::run(). It runs only
// when CONCORD_SERVE_WORKLOAD lists its cases, "S,R,T,THREADS;..." (max-sequences S, R requests of
// at most T tokens, THREADS OpenMP threads), as serve_run.sh sets it, so that the pp512/tg128 run
// of bench/smollm2_run.sh stays as it was. With CONCORD_ARENA_COMPARE=1 each case runs twice, in
// the engine's planned activation arena (the default: the memory scheduler's plan of each step)
// and in forward_cached's bump arena (arena 0 / 1), the same requests, back to back.
#include <benchmark/benchmark.h>
#include <omp.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "concord/model/files.h"
#include "concord/model/kv_cache.h"
#include "concord/model/model.h"
#include "concord/serve/engine.h"
#include "concord/tensor/quant_gemm.h"

namespace {

using concord::model::CachedInput;
using concord::model::KvCache;
using concord::model::LogitRows;
using concord::model::Model;

const char* const kPolicies[] = {"native", "fp32"};

std::string model_path() {
  const char* p = std::getenv("CONCORD_SMOLLM2");
  return p != nullptr ? p : "";
}

Model& model_of(int64_t policy) {
  static std::unique_ptr<Model> models[2];
  auto& m = models[policy];
  if (!m) {
    concord::model::LoadedModel loaded =
        concord::model::load_model(model_path(), kPolicies[policy]);
    m = std::make_unique<Model>(std::move(loaded.model));
    m->prepare_weights();
  }
  return *m;
}

// Bytes of the native model's weights as stored (what a decode step streams).
double native_weight_bytes() {
  Model& m = model_of(0);
  double bytes = 0;
  for (const auto& p : m.params()) {
    if (const auto* w = m.stored_weight(p.name)) {
      bytes += static_cast<double>(w->bytes());
    } else if (p.kind != concord::model::ParamKind::embed || m.config().tie_word_embeddings) {
      bytes += 4.0 * static_cast<double>(p.numel());
    }
  }
  return bytes;
}

// llama-bench's inputs are arbitrary token ids; these are fixed pseudo-random ones.
std::vector<int32_t> tokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint32_t x = seed * 2654435761u + 1;
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(vocab));
  }
  return t;
}

void set_counters(benchmark::State& state, double tokens_done) {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  state.counters["tokens_per_s"] = benchmark::Counter(tokens_done, benchmark::Counter::kIsRate);
  state.counters["peak_rss_mb"] = static_cast<double>(u.ru_maxrss) / 1024.0;
  state.counters["threads"] = static_cast<double>(state.range(1));
}

void BM_Prefill512(benchmark::State& state) {
  Model& m = model_of(state.range(0));
  omp_set_num_threads(static_cast<int>(state.range(1)));
  const int64_t V = m.config().vocab_size;
  const std::vector<int32_t> prompt = tokens(512, V, 1);
  KvCache cache(m.config(), 1, 1024);
  std::vector<float> logits(static_cast<size_t>(V));
  double done = 0;
  for (auto _ : state) {
    const int slot = cache.allocate();
    const CachedInput in{slot, prompt, LogitRows::last};
    m.forward_cached(cache, std::span(&in, 1), logits);
    cache.release(slot);
    done += 512;
    benchmark::DoNotOptimize(logits.data());
  }
  set_counters(state, done);
}

void BM_Decode128(benchmark::State& state) {
  Model& m = model_of(state.range(0));
  omp_set_num_threads(static_cast<int>(state.range(1)));
  const int64_t V = m.config().vocab_size;
  const std::vector<int32_t> prompt = tokens(8, V, 2), gen = tokens(128, V, 3);
  KvCache cache(m.config(), 1, 1024);
  std::vector<float> logits(static_cast<size_t>(V));
  double done = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const int slot = cache.allocate();
    const CachedInput first{slot, prompt, LogitRows::last};
    m.forward_cached(cache, std::span(&first, 1), logits);
    state.ResumeTiming();
    for (int32_t t : gen) {
      const CachedInput in{slot, std::span(&t, 1), LogitRows::last};
      m.forward_cached(cache, std::span(&in, 1), logits);
    }
    state.PauseTiming();
    cache.release(slot);
    state.ResumeTiming();
    done += 128;
    benchmark::DoNotOptimize(logits.data());
  }
  set_counters(state, done);
  // The bytes a native decode step streams (not computed for fp32: that would load the native
  // model into the fp32 process and spoil its peak RSS).
  if (state.range(0) == 0) state.counters["weight_bytes"] = native_weight_bytes();
}

void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(native_weight_bytes());
  std::vector<char> a(bytes, 1), b(bytes, 0);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.counters["bytes_per_s"] =
      benchmark::Counter(static_cast<double>(bytes) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

// bench/serve_load.py's prompt_of(k), word for word.
std::string serve_prompt(int64_t k) {
  static const char* const topics[] = {"the sea",   "a city at night", "mountains", "the moon",
                                       "a library", "rain",            "coffee",    "trains",
                                       "a garden",  "winter",          "music",     "the desert",
                                       "bread",     "rivers",          "clocks",    "birds"};
  return fmt::format("Request {}: three facts about {}:", k, topics[k % 16]);
}

void BM_EngineServeWorkload(benchmark::State& state) {
  static std::unique_ptr<concord::model::LoadedModel> loaded;
  if (!loaded) {
    loaded = std::make_unique<concord::model::LoadedModel>(
        concord::model::load_model(model_path(), "native"));
    loaded->model.prepare_weights();
  }
  const int64_t max_sequences = state.range(0), count = state.range(1), max_tokens = state.range(2);
  const auto arena = state.range(4) == 0 ? concord::serve::ActivationArena::planned : concord::serve::ActivationArena::bump;
  omp_set_num_threads(static_cast<int>(state.range(3)));
  const concord::io::Tokenizer& tokenizer = *loaded->source.tokenizer;
  std::vector<concord::serve::Request> requests;
  for (int64_t k = 0; k < count; ++k) {
    concord::serve::Request r;
    r.prompt = tokenizer.encode_for_model(serve_prompt(k));
    r.max_tokens = max_tokens;
    r.stop_tokens = loaded->source.stop_token_ids;
    if (k % 2 == 0) {
      r.sampling.temperature = 0;
    } else {
      r.sampling.temperature = 0.8f;
      r.sampling.top_p = 0.95f;
      r.sampling.seed = static_cast<uint64_t>(1000 + k);
    }
    requests.push_back(std::move(r));
  }
  double generated = 0;
  concord::serve::EngineStats stats;  // of the last iteration: where the time goes
  for (auto _ : state) {
    concord::serve::Engine engine(loaded->model, {.max_sequences = max_sequences, .activation_arena = arena});
    const auto done = engine.generate(requests);
    for (const auto& c : done) generated += static_cast<double>(c.tokens.size());
    stats = engine.stats();
  }
  auto rate = [](int64_t n, double seconds) {
    return seconds > 0 ? static_cast<double>(n) / seconds : 0.0;
  };
  state.counters["prefill_seconds"] = stats.prefill_seconds;
  state.counters["decode_seconds"] = stats.decode_seconds;
  state.counters["decode_rows_per_s"] = rate(stats.decode_tokens, stats.decode_seconds);
  state.counters["steps"] = static_cast<double>(stats.steps);
  state.counters["generated_tokens_per_s"] =
      benchmark::Counter(generated, benchmark::Counter::kIsRate);
  state.counters["generated_tokens"] = generated / static_cast<double>(state.iterations());
  state.counters["max_sequences"] = static_cast<double>(max_sequences);
  state.counters["threads"] = static_cast<double>(state.range(3));
  state.counters["activation_arena_bytes"] = static_cast<double>(stats.activation_arena_bytes);
  state.counters["activation_plans"] = static_cast<double>(stats.activation_plans);
}

void policy_threads(benchmark::internal::Benchmark* b) {
  b->ArgNames({"policy", "threads"});
  for (int64_t p = 0; p < 2; ++p)
    for (int64_t t : {1, 2}) b->Args({p, t});
  b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
}

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Prefill512)->Apply(policy_threads);
BENCHMARK(BM_Decode128)->Apply(policy_threads);

}  // namespace

int main(int argc, char** argv) {
  if (model_path().empty()) {
    std::fprintf(stderr, "real_model_bench: set CONCORD_SMOLLM2 to the GGUF (scripts/smollm2-path); "
                         "bench/smollm2_run.sh does\n");
    return 2;
  }
  if (const char* w = std::getenv("CONCORD_SERVE_WORKLOAD"); w != nullptr && *w != 0) {
    auto* b = benchmark::RegisterBenchmark("BM_EngineServeWorkload", BM_EngineServeWorkload);
    b->ArgNames({"max_sequences", "requests", "max_tokens", "threads", "arena"});
    const char* compare = std::getenv("CONCORD_ARENA_COMPARE");
    const bool both = compare != nullptr && std::strcmp(compare, "1") == 0;
    for (const char* p = w; *p != 0;) {
      long long v[4] = {0, 0, 0, 0};
      int used = 0;
      if (std::sscanf(p, "%lld,%lld,%lld,%lld%n", &v[0], &v[1], &v[2], &v[3], &used) != 4 ||
          v[0] < 1 || v[1] < 1 || v[2] < 1 || v[3] < 1) {
        std::fprintf(stderr, "real_model_bench: CONCORD_SERVE_WORKLOAD '%s': expected "
                             "S,R,T,THREADS[;...] of positive integers\n", w);
        return 2;
      }
      for (int64_t arena = 0; arena < (both ? 2 : 1); ++arena)
        b->Args({static_cast<int64_t>(v[0]), static_cast<int64_t>(v[1]), static_cast<int64_t>(v[2]),
                 static_cast<int64_t>(v[3]), arena});
      p += used;
      if (*p == ';') ++p;
    }
    b->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
