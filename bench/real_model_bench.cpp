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
#include <benchmark/benchmark.h>
#include <omp.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "concord/model/files.h"
#include "concord/model/kv_cache.h"
#include "concord/model/model.h"
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
    } else if (p.name != "model.embed_tokens.weight" || m.config().tie_word_embeddings) {
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
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
