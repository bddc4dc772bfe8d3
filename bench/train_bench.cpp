// Training throughput: one optimizer step (export master -> served, forward + backward, AdamW)
// of the tiny and small configs at every precision preset, with tokens/s, and — measured in the
// same run — the GEMM-bound rate: the time the step's GEMMs alone take in concord's fp32 GEMM on
// the same shapes (one step's forward, dgrad and wgrad products). ratio_to_gemm_bound =
// (tokens/s of the step) / (tokens/s the GEMMs alone would allow). Peak RSS is the process's;
// bench/train_run.sh runs each case in its own process so that it is the case's own.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <chrono>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "concord/model/model.h"
#include "concord/tensor/gemm.h"
#include "concord/train/train_state.h"
#include "concord/train/optimizer.h"
#include "concord/train/trainer.h"

namespace {

using namespace concord;

const char* kConfigs[] = {"tiny", "small"};

train::TrainConfig load_config(int which) {
  return train::TrainConfig::load(std::string(CONCORD_SOURCE_DIR) + "/configs/" + kConfigs[which] + ".json");
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;
}

// Seconds one step's GEMMs take in the fp32 GEMM (best of `reps`).
double gemm_seconds_per_step(const model::ModelConfig& c, int64_t T) {
  struct Shape { int64_t N, K; };
  std::vector<Shape> shapes;
  const int64_t C = c.hidden_size, D = c.head_dim, F = c.intermediate_size;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    shapes.push_back({c.num_attention_heads * D, C});
    shapes.push_back({c.num_key_value_heads * D, C});
    shapes.push_back({c.num_key_value_heads * D, C});
    shapes.push_back({C, c.num_attention_heads * D});
    shapes.push_back({F, C});
    shapes.push_back({F, C});
    shapes.push_back({C, F});
  }
  shapes.push_back({c.vocab_size, C});
  int64_t max_elems = 0;
  for (const Shape& s : shapes) max_elems = std::max({max_elems, T * s.N, T * s.K, s.N * s.K});
  std::vector<float> a(static_cast<size_t>(max_elems)), b(a.size()), out(a.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = normal(rng), b[i] = normal(rng);
  using tensor::Trans;
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const Shape& s : shapes) {
      tensor::gemm(Trans::no, Trans::yes, T, s.N, s.K, a.data(), s.K, b.data(), s.K, out.data(), s.N);  // forward
      tensor::gemm(Trans::no, Trans::no, T, s.K, s.N, a.data(), s.N, b.data(), s.K, out.data(), s.K);   // dgrad
      tensor::gemm(Trans::yes, Trans::no, s.N, s.K, T, a.data(), s.N, b.data(), s.K, out.data(), s.K);  // wgrad
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

std::map<int, double>& gemm_bound_cache() {
  static std::map<int, double> cache;
  return cache;
}

void BM_gemm_bound(benchmark::State& state) {
  const train::TrainConfig cfg = load_config(static_cast<int>(state.range(0)));
  const int64_t T = cfg.batch_size * cfg.seq_len;
  double seconds = 0;
  for (auto _ : state) seconds = gemm_seconds_per_step(cfg.model, T);
  gemm_bound_cache()[static_cast<int>(state.range(0))] = seconds;
  state.counters["gemm_s_per_step"] = seconds;
  state.counters["tokens_per_s"] = static_cast<double>(T) / seconds;
  state.SetLabel(kConfigs[state.range(0)]);
}

void BM_train_step(benchmark::State& state) {
  const int which = static_cast<int>(state.range(0));
  const std::vector<std::string> presets = model::PrecisionPolicy::preset_names();
  const std::string preset = presets.at(static_cast<size_t>(state.range(1)));
  train::TrainConfig cfg = load_config(which);
  cfg.policy = model::PrecisionPolicy::preset(preset);
  const int64_t B = cfg.batch_size, S = cfg.seq_len;
  model::Model m(cfg.model, cfg.policy);
  m.init_random(1);
  // The training state `concord train` holds (train/train_state.h): fp32 master, rne export,
  // AdamW with the config's settings.
  train::TrainState ts(m, cfg.policy, "rne", 1,
                       {.name = "adamw", .adamw = {cfg.lr, cfg.beta1, cfg.beta2, 1e-8, cfg.weight_decay, cfg.grad_clip}, .binary = {}});
  std::mt19937 rng(2);
  std::vector<int32_t> tokens(static_cast<size_t>(B * S)), targets(tokens.size());
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 256);
  for (size_t i = 0; i < tokens.size(); ++i) targets[i] = (i + 1) % S == 0 ? -1 : tokens[i + 1];
  uint64_t step = 0;
  for (auto _ : state) {
    ts.export_to(m, static_cast<int64_t>(step));
    benchmark::DoNotOptimize(m.forward_backward(tokens, targets, B, S, step));
    ts.step(m, cfg.lr);
    ++step;
  }
  const double tokens_done = static_cast<double>(B * S) * static_cast<double>(state.iterations());
  state.counters["tokens_per_s"] = benchmark::Counter(tokens_done, benchmark::Counter::kIsRate);
  state.counters["peak_rss_MiB"] = peak_rss_mib();
  state.counters["params_M"] = static_cast<double>(cfg.model.parameter_count()) / 1e6;
  auto bound = gemm_bound_cache().find(which);
  if (bound != gemm_bound_cache().end())
    state.counters["ratio_to_gemm_bound"] = benchmark::Counter(
        bound->second * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel(std::string(kConfigs[which]) + "/" + preset);
}

void train_cases(benchmark::internal::Benchmark* b) {
  b->ArgNames({"config", "preset"})->UseRealTime()->Unit(benchmark::kMillisecond);
  for (int64_t config : {0, 1})
    for (int64_t p = 0; p < 6; ++p) b->Args({config, p});
}

}  // namespace

// The GEMM bound runs first; each train case divides by the bound of its config.
BENCHMARK(BM_gemm_bound)->Arg(0)->Arg(1)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_train_step)->Apply(train_cases)->MinTime(20.0);
BENCHMARK_MAIN();
