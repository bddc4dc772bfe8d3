// Engine throughput: prefill and decode tokens/s for configs/small.json and a Qwen3-shaped model
// with the full 151,936-token vocabulary (8 layers x 512, tied embeddings, ~100M parameters,
// random weights) at fp32, bf16 and mxfp8, batch 1 and 8, 1 and 2 threads. Baselines measured in
// the same run: oneDNN's f32 matmul on the prefill's GEMM shapes (GFLOP/s) and memcpy (GB/s).
// bench/engine_run.sh prints the ratios: prefill GFLOP/s vs oneDNN, decode weight GB/s vs memcpy.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <dnnl.hpp>
#include <nlohmann/json.hpp>

#include "concord/model/kv_cache.h"
#include "concord/model/model.h"

namespace {

using concord::model::CachedInput;
using concord::model::KvCache;
using concord::model::LogitRows;
using concord::model::Model;
using concord::model::ModelConfig;
using concord::model::PrecisionPolicy;

constexpr int64_t kPrefillTokens = 128;  // prompt tokens per sequence
constexpr int64_t kDecodeContext = 64;   // tokens cached before each timed decode step
const char* const kPresets[] = {"fp32", "bf16", "mxfp8"};
const char* const kConfigNames[] = {"small", "qwen3-152k"};

ModelConfig config_of(int64_t which) {
  if (which == 0) {
    std::ifstream in(std::string(CONCORD_SOURCE_DIR) + "/configs/small.json");
    return ModelConfig::from_json(nlohmann::json::parse(in).at("model"), "configs/small.json");
  }
  ModelConfig c;  // Qwen3-shaped, full Qwen vocabulary
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 151936;
  c.hidden_size = 512;
  c.intermediate_size = 1536;
  c.num_hidden_layers = 8;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.max_position_embeddings = 4096;
  c.tie_word_embeddings = true;
  return c;
}

// One model per (config, preset), built once: the weights are prepared on the first forward.
Model& model_of(int64_t config, int64_t preset) {
  static std::unique_ptr<Model> models[2][3];
  auto& m = models[config][preset];
  if (!m) {
    m = std::make_unique<Model>(config_of(config), PrecisionPolicy::preset(kPresets[preset]));
    m->init_random(1);
  }
  return *m;
}

// The GEMM shapes (N, K) of one token's forward through the decoder layers.
std::vector<std::pair<int64_t, int64_t>> layer_shapes(const ModelConfig& c) {
  const int64_t C = c.hidden_size, F = c.intermediate_size;
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  return {{q, C}, {kv, C}, {kv, C}, {C, q}, {F, C}, {F, C}, {C, F}};
}

// Multiply-adds x 2 of the layer GEMMs for `tokens` rows, plus lm_head for `logit_rows`.
double matmul_flops(const ModelConfig& c, int64_t tokens, int64_t logit_rows) {
  double per_token = 0;
  for (auto [n, k] : layer_shapes(c)) per_token += 2.0 * static_cast<double>(n * k);
  return per_token * static_cast<double>(c.num_hidden_layers * tokens) +
         2.0 * static_cast<double>(c.vocab_size * c.hidden_size * logit_rows);
}

// Weight bytes one decode step streams: every layer matrix and the lm_head, as the packed
// panels hold them — fp32 (4 bytes) for the fp32 preset, bf16 (2 bytes) for bf16 and mxfp8,
// whose values are bf16-exact (tensor/qgemm.h prepack_b).
double weight_bytes(const ModelConfig& c, int64_t preset) {
  double params = 0;
  for (auto [n, k] : layer_shapes(c)) params += static_cast<double>(n * k);
  params = params * static_cast<double>(c.num_hidden_layers) +
           static_cast<double>(c.vocab_size * c.hidden_size);
  return (kPresets[preset] == std::string_view("fp32") ? 4.0 : 2.0) * params;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

std::string label_of(benchmark::State& state) {
  return std::string(kConfigNames[state.range(0)]) + "/" + kPresets[state.range(1)];
}

// Prefill: `batch` prompts of kPrefillTokens in one forward_cached (last-token logits).
void BM_prefill(benchmark::State& state) {
  const int64_t config = state.range(0), preset = state.range(1), batch = state.range(2);
  omp_set_num_threads(static_cast<int>(state.range(3)));
  Model& m = model_of(config, preset);
  const ModelConfig& c = m.config();
  KvCache cache(c, batch, kPrefillTokens);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<CachedInput> inputs;
  for (int64_t b = 0; b < batch; ++b) {
    prompts.push_back(random_tokens(kPrefillTokens, c.vocab_size, static_cast<uint64_t>(b)));
    inputs.push_back({cache.allocate(), prompts.back(), LogitRows::last});
  }
  std::vector<float> logits(static_cast<size_t>(batch * c.vocab_size));
  m.forward_cached(cache, inputs, logits);  // warm-up: weights prepared once, outside the timing
  for (auto _ : state) {
    for (const CachedInput& in : inputs) cache.truncate(in.slot, 0);
    m.forward_cached(cache, inputs, logits);
    benchmark::DoNotOptimize(logits.data());
  }
  const double tokens = static_cast<double>(batch * kPrefillTokens * state.iterations());
  state.counters["tokens_per_s"] = benchmark::Counter(tokens, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(
      matmul_flops(c, batch * kPrefillTokens, batch) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
  state.SetLabel(label_of(state));
}

// Decode: one step of `batch` sequences, each with kDecodeContext tokens cached.
void BM_decode(benchmark::State& state) {
  const int64_t config = state.range(0), preset = state.range(1), batch = state.range(2);
  omp_set_num_threads(static_cast<int>(state.range(3)));
  Model& m = model_of(config, preset);
  const ModelConfig& c = m.config();
  KvCache cache(c, batch, kDecodeContext + 1);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<CachedInput> prefill, step;
  std::vector<int32_t> next(static_cast<size_t>(batch), 1);
  for (int64_t b = 0; b < batch; ++b) {
    prompts.push_back(random_tokens(kDecodeContext, c.vocab_size, static_cast<uint64_t>(b)));
    const int slot = cache.allocate();
    prefill.push_back({slot, prompts.back(), LogitRows::none});
    step.push_back({slot, std::span<const int32_t>(&next[static_cast<size_t>(b)], 1), LogitRows::last});
  }
  m.forward_cached(cache, prefill, {});
  std::vector<float> logits(static_cast<size_t>(batch * c.vocab_size));
  // One untimed step: the prefill asked for no logits, so lm_head is prepared (quantized and
  // packed once) here rather than inside the first timed iteration.
  for (const CachedInput& in : step) cache.truncate(in.slot, kDecodeContext);
  m.forward_cached(cache, step, logits);
  for (auto _ : state) {
    for (const CachedInput& in : step) cache.truncate(in.slot, kDecodeContext);
    m.forward_cached(cache, step, logits);
    benchmark::DoNotOptimize(logits.data());
  }
  const double steps = static_cast<double>(state.iterations());
  state.counters["tokens_per_s"] =
      benchmark::Counter(steps * static_cast<double>(batch), benchmark::Counter::kIsRate);
  state.counters["weight_GB/s"] =
      benchmark::Counter(steps * weight_bytes(c, preset) / 1e9, benchmark::Counter::kIsRate);
  state.SetLabel(label_of(state));
}

// oneDNN f32 matmul over the prefill's layer GEMMs (M = batch x kPrefillTokens) and lm_head for
// the last rows: the GFLOP/s a tuned f32 library reaches on the same work.
void BM_onednn_prefill(benchmark::State& state) {
  using dnnl::memory;
  const int64_t config = state.range(0), batch = state.range(1);
  omp_set_num_threads(static_cast<int>(state.range(2)));
  const ModelConfig c = config_of(config);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  struct Gemm {
    dnnl::matmul matmul;
    memory a, w, out;
  };
  std::vector<Gemm> gemms;
  auto add = [&](int64_t M, int64_t N, int64_t K) {
    const memory::desc a_desc({M, K}, memory::data_type::f32, memory::format_tag::ab);
    const memory::desc w_desc({K, N}, memory::data_type::f32, memory::format_tag::any);
    const memory::desc c_desc({M, N}, memory::data_type::f32, memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_desc, w_desc, c_desc), engine);
    Gemm g{dnnl::matmul(pd), memory(pd.src_desc(), engine), memory(pd.weights_desc(), engine),
           memory(pd.dst_desc(), engine)};
    std::memset(g.a.get_data_handle(), 0, pd.src_desc().get_size());
    std::memset(g.w.get_data_handle(), 0, pd.weights_desc().get_size());
    gemms.push_back(std::move(g));
  };
  for (auto [n, k] : layer_shapes(c)) add(batch * kPrefillTokens, n, k);
  add(batch, c.vocab_size, c.hidden_size);
  const auto layers = static_cast<int>(c.num_hidden_layers);
  for (auto _ : state) {
    for (int l = 0; l < layers; ++l) {
      for (size_t g = 0; g + 1 < gemms.size(); ++g) {
        gemms[g].matmul.execute(stream, {{DNNL_ARG_SRC, gemms[g].a}, {DNNL_ARG_WEIGHTS, gemms[g].w},
                                         {DNNL_ARG_DST, gemms[g].out}});
      }
    }
    Gemm& head = gemms.back();
    head.matmul.execute(stream, {{DNNL_ARG_SRC, head.a}, {DNNL_ARG_WEIGHTS, head.w}, {DNNL_ARG_DST, head.out}});
    stream.wait();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      matmul_flops(c, batch * kPrefillTokens, batch) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
  state.SetLabel(kConfigNames[config]);
}

// memcpy of 512 MiB, far larger than any cache (bytes read per second).
void BM_memcpy(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const size_t n = size_t{128} << 20;  // floats
  std::vector<float> src(n, 1.0f), dst(n, 0.0f);
  for (auto _ : state) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int part = 0; part < threads; ++part) {
      const size_t begin = n * static_cast<size_t>(part) / static_cast<size_t>(threads);
      const size_t end = n * static_cast<size_t>(part + 1) / static_cast<size_t>(threads);
      std::memcpy(dst.data() + begin, src.data() + begin, (end - begin) * sizeof(float));
    }
    benchmark::DoNotOptimize(dst.data());
  }
  // Bytes read (what the decode counter counts too: weights read, nothing written back).
  state.counters["read_GB/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(n * sizeof(float)) / 1e9,
      benchmark::Counter::kIsRate);
}

void engine_cases(benchmark::internal::Benchmark* b) {
  for (int64_t config : {0, 1}) {
    for (int64_t preset : {0, 1, 2}) {
      for (int64_t batch : {1, 8}) {
        for (int64_t threads : {1, 2}) b->Args({config, preset, batch, threads});
      }
    }
  }
  b->ArgNames({"config", "preset", "batch", "threads"})->UseRealTime()->MinTime(0.5)->Unit(benchmark::kMillisecond);
}

void onednn_cases(benchmark::internal::Benchmark* b) {
  for (int64_t config : {0, 1}) {
    for (int64_t batch : {1, 8}) {
      for (int64_t threads : {1, 2}) b->Args({config, batch, threads});
    }
  }
  b->ArgNames({"config", "batch", "threads"})->UseRealTime()->MinTime(0.5)->Unit(benchmark::kMillisecond);
}

}  // namespace

BENCHMARK(BM_memcpy)->Arg(1)->Arg(2)->ArgName("threads")->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_onednn_prefill)->Apply(onednn_cases);
BENCHMARK(BM_prefill)->Apply(engine_cases);
BENCHMARK(BM_decode)->Apply(engine_cases);
BENCHMARK_MAIN();
