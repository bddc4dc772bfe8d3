// Speed under contention: the hot paths (GEMM driver, attention, AdamW, a training step, an
// engine rollout) at the shapes of configs/tiny.json and of the demo's model (rl's
// default_rl_model, 128 sequences of 16 tokens: 16 prompts x 8 completions). Each case is timed
// by itself; bench/contention_run.sh runs this binary once on an idle machine and once beside a
// busy process pinned to one core, and prints the slowdown ratio of each case (the baseline is
// the idle run of the same case, same binary, same settings).
#include <benchmark/benchmark.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concord/cli/runtime.h"
#include "concord/model/model.h"
#include "concord/model/ops.h"
#include "concord/rl/loop.h"
#include "concord/serve/engine.h"
#include "concord/tensor/gemm.h"
#include "concord/train/optimizer.h"

namespace {

using namespace concord;
using tensor::Trans;

model::ModelConfig tiny_model() {
  std::ifstream in(std::string(CONCORD_SOURCE_DIR) + "/configs/tiny.json");
  return model::ModelConfig::from_json(nlohmann::json::parse(in).at("model"), "configs/tiny.json");
}

// The two shapes: 0 = configs/tiny.json (16 x 128 tokens), 1 = the demo's learner batch.
struct Shape {
  const char* name;
  model::ModelConfig model;
  int64_t B, S;
};
Shape shape_of(int64_t which) {
  if (which == 0) return {"tiny", tiny_model(), 16, 128};
  return {"demo", rl::default_rl_model(), 128, 16};
}

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// One training step's GEMMs (forward, dgrad, wgrad of every layer product and the lm_head),
// fp32 driver, or bf16 with preset 1.
void BM_gemm_step(benchmark::State& state) {
  const Shape s = shape_of(state.range(0));
  const bool bf16 = state.range(1) == 1;
  const model::ModelConfig& c = s.model;
  const int64_t T = s.B * s.S, C = c.hidden_size, D = c.head_dim, F = c.intermediate_size;
  std::vector<std::pair<int64_t, int64_t>> shapes;  // (N, K) of y = x W^T
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    shapes.insert(shapes.end(), {{c.num_attention_heads * D, C}, {c.num_key_value_heads * D, C},
                                 {c.num_key_value_heads * D, C}, {C, c.num_attention_heads * D},
                                 {F, C}, {F, C}, {C, F}});
  }
  shapes.emplace_back(c.vocab_size, C);
  int64_t most = 0;
  for (auto [n, k] : shapes) most = std::max({most, T * n, T * k, n * k});
  const std::vector<float> a = random_vector(static_cast<size_t>(most), 1);
  const std::vector<float> b = random_vector(static_cast<size_t>(most), 2);
  std::vector<float> out(static_cast<size_t>(most));
  const auto gemm = bf16 ? tensor::gemm_bf16 : tensor::gemm;
  for (auto _ : state) {
    for (auto [n, k] : shapes) {
      gemm(Trans::no, Trans::yes, T, n, k, a.data(), k, b.data(), k, out.data(), n, false);
      gemm(Trans::no, Trans::no, T, k, n, a.data(), n, b.data(), k, out.data(), k, false);
      gemm(Trans::yes, Trans::no, n, k, T, a.data(), n, b.data(), k, out.data(), k, false);
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(s.name) + (bf16 ? "/bf16" : "/fp32"));
}

// Attention forward + backward of every layer of one step.
void BM_attention(benchmark::State& state) {
  const Shape s = shape_of(state.range(0));
  const model::ModelConfig& c = s.model;
  const int64_t B = s.B, S = s.S, Hq = c.num_attention_heads, Hkv = c.num_key_value_heads,
                D = c.head_dim;
  const auto nq = static_cast<size_t>(B * S * Hq * D), nkv = static_cast<size_t>(B * S * Hkv * D);
  const std::vector<float> q = random_vector(nq, 1), k = random_vector(nkv, 2),
                           v = random_vector(nkv, 3), dout = random_vector(nq, 4);
  std::vector<float> out(nq), probs(static_cast<size_t>(B * Hq * S * S)), dq(nq), dk(nkv), dv(nkv);
  for (auto _ : state) {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      model::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), B, S, Hq,
                               Hkv, D);
      model::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), probs.data(),
                                q.data(), k.data(), v.data(), B, S, Hq, Hkv, D);
    }
    benchmark::DoNotOptimize(dq.data());
  }
  state.SetLabel(s.name);
}

// One AdamW step (global norm + update) over the model's parameters.
void BM_adamw(benchmark::State& state) {
  const Shape s = shape_of(state.range(0));
  model::Model m(s.model, model::PrecisionPolicy::preset("fp32"));
  std::vector<std::vector<float>> values, grads;
  for (const auto& p : m.params()) {
    values.emplace_back(m.param(p.name).begin(), m.param(p.name).end());
    grads.push_back(random_vector(values.back().size(), static_cast<uint32_t>(grads.size())));
  }
  const auto opt = train::make_optimizer({.name = "adamw", .adamw = {1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0}, .binary = {}});
  for (auto _ : state) {
    std::vector<train::ParamView> views;
    for (size_t p = 0; p < values.size(); ++p)
      views.push_back({m.params()[p].name, values[p], grads[p], m.params()[p].is_matrix()});
    benchmark::DoNotOptimize(opt->step(views, 1e-3));
  }
  state.SetLabel(s.name);
}

// One training step: forward + backward + AdamW on the shape's batch, at fp32 or bf16.
void BM_train_step(benchmark::State& state) {
  const Shape s = shape_of(state.range(0));
  const char* preset = state.range(1) == 1 ? "bf16" : "fp32";
  model::Model m(s.model, model::PrecisionPolicy::preset(preset));
  m.init_random(1);
  std::mt19937 rng(2);
  std::vector<int32_t> tokens(static_cast<size_t>(s.B * s.S)), targets(tokens.size());
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 256);
  for (size_t i = 0; i < tokens.size(); ++i)
    targets[i] = (i + 1) % static_cast<size_t>(s.S) == 0 ? -1 : tokens[i + 1];
  // The optimizer updates the model's own values (no master copy): what is measured is the
  // contention of a step's work, not an export rule.
  const auto opt = train::make_optimizer({.name = "adamw", .adamw = {1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0}, .binary = {}});
  uint64_t step = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(m.forward_backward(tokens, targets, s.B, s.S, step));
    std::vector<train::ParamView> views;
    for (const auto& p : m.params())
      views.push_back({p.name, m.param(p.name), m.grad(p.name), p.is_matrix()});
    opt->step(views, 1e-3);
    m.weights_changed();
    ++step;
  }
  state.SetLabel(std::string(s.name) + "/" + preset);
}

// The demo's rollout: 128 sequences of a 12-token prompt, 4 new tokens each (prefill + 4 batched
// decode steps of the engine), on the demo's model.
void BM_engine_rollout(benchmark::State& state) {
  model::Model m(rl::default_rl_model(), model::PrecisionPolicy::preset("bf16"));
  m.init_random(1);
  serve::EngineOptions options;
  options.max_sequences = 128;
  serve::Engine engine(m, options);
  std::mt19937 rng(3);
  uint64_t seed = 0;
  for (auto _ : state) {
    std::vector<serve::Request> requests(128);
    for (auto& r : requests) {
      for (int i = 0; i < 12; ++i) r.prompt.push_back(static_cast<int32_t>(rng() % 256));
      r.max_tokens = 4;
      r.sampling.seed = ++seed;
    }
    benchmark::DoNotOptimize(engine.generate(std::move(requests)));
  }
  state.SetLabel("demo/bf16");
}

}  // namespace

BENCHMARK(BM_gemm_step)->ArgNames({"shape", "bf16"})->Args({0, 0})->Args({1, 0})->Args({1, 1})
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_attention)->ArgName("shape")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_adamw)->ArgName("shape")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_train_step)->ArgNames({"shape", "bf16"})->Args({0, 0})->Args({1, 0})->Args({1, 1})
    ->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_engine_rollout)->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
  concord::cli::configure_runtime(argv);  // the OpenMP wait policy concord's main() sets
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
