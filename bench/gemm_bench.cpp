// GEMM on the model's shapes (M tokens x K in -> N out): OpenBLAS sgemm and oneDNN matmul in
// f32 and bf16 (bf16 inputs, f32 output), and concord's batch-invariant gemm (fp32 panels and
// bf16-widening panels), in the same run. GFLOP/s as a counter; the concord cases also report
// their ratio to OpenBLAS sgemm on the same shape, orientation and thread count, measured in
// this run. oneDNN tells whether this CPU has a bf16 matmul at all (it needs AVX512-BF16/AMX).
// BM_skinny: decode-sized M = 1..8 against prepacked weights (weight GB/s).
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <chrono>
#include <dnnl.hpp>
#include <map>
#include <random>
#include <tuple>
#include <string>
#include <vector>

#include "concord/tensor/gemm.h"

namespace {

constexpr int64_t kM = 4096, kK = 512;

std::vector<float> random_matrix(int64_t rows, int64_t cols, unsigned seed) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& f : v) f = normal(gen);
  return v;
}

void set_flops(benchmark::State& state, int64_t n) {
  state.counters["GFLOP/s"] = benchmark::Counter(
      static_cast<double>(2 * kM * n * kK) * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

void BM_openblas_sgemm(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(1));
  openblas_set_num_threads(threads);
  const int64_t n = state.range(0);
  const auto a = random_matrix(kM, kK, 1);
  const auto w = random_matrix(kK, n, 2);
  std::vector<float> c(static_cast<size_t>(kM * n));
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(kM),
                static_cast<int>(n), static_cast<int>(kK), 1.0f, a.data(), static_cast<int>(kK),
                w.data(), static_cast<int>(n), 0.0f, c.data(), static_cast<int>(n));
    benchmark::DoNotOptimize(c.data());
  }
  set_flops(state, n);
}

void BM_onednn_matmul(benchmark::State& state, dnnl::memory::data_type input_type) {
  using dnnl::memory;
  omp_set_num_threads(static_cast<int>(state.range(1)));
  const int64_t n = state.range(0);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::desc a_desc({kM, kK}, input_type, memory::format_tag::ab);
  const memory::desc w_desc({kK, n}, input_type, memory::format_tag::any);
  const memory::desc c_desc({kM, n}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_desc, w_desc, c_desc), engine);
  } catch (const dnnl::error&) {
    state.SkipWithError("oneDNN has no matmul for this data type on this CPU");
    return;
  }
  memory a(pd.src_desc(), engine), w(pd.weights_desc(), engine), c(pd.dst_desc(), engine);
  // Fill the inputs through an f32 reorder so bf16 runs on real values, not zeros.
  const auto a_f32 = random_matrix(kM, kK, 1), w_f32 = random_matrix(kK, n, 2);
  memory a_src({{kM, kK}, memory::data_type::f32, memory::format_tag::ab}, engine,
               const_cast<float*>(a_f32.data()));
  memory w_src({{kK, n}, memory::data_type::f32, memory::format_tag::ab}, engine,
               const_cast<float*>(w_f32.data()));
  dnnl::reorder(a_src, a).execute(stream, a_src, a);
  dnnl::reorder(w_src, w).execute(stream, w_src, w);
  dnnl::matmul matmul(pd);
  for (auto _ : state) {
    matmul.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_DST, c}});
    stream.wait();
  }
  state.SetLabel(pd.impl_info_str());
  set_flops(state, n);
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {512, 1536}) {
    for (int64_t threads : {1, 2}) b->Args({n, threads});
  }
  b->ArgNames({"N", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
}

// The model's GEMM roles (tensor layer's target shapes), C = op(A)·op(B):
//   fwd_nn / fwd_nt   forward, M = 4096 tokens, K = 512, N = 512 or 1536 (W stored (K,N) / (N,K))
//   dgrad_nn          dX = dY·W, M = 4096, K = 1536, N = 512
//   wgrad_tn          dW = dYᵀ·X, op(A) = Aᵀ, M = 512 or 1536, K = 4096 tokens, N = 512
struct Case {
  const char* name;
  bool ta, tb;
  int64_t M, N, K;
};
constexpr Case kCases[] = {
    {"fwd_nn", false, false, 4096, 512, 512},   {"fwd_nn", false, false, 4096, 1536, 512},
    {"fwd_nt", false, true, 4096, 512, 512},    {"fwd_nt", false, true, 4096, 1536, 512},
    {"dgrad_nn", false, false, 4096, 512, 1536}, {"wgrad_tn", true, false, 512, 512, 4096},
    {"wgrad_tn", true, false, 1536, 512, 4096},
};

struct CaseData {
  std::vector<float> a, b, c;
  int64_t lda, ldb;
};
CaseData make_case(const Case& k, bool bf16) {
  CaseData d{random_matrix(k.M, k.K, 1), random_matrix(k.K, k.N, 2),
             std::vector<float>(static_cast<size_t>(k.M * k.N)), k.ta ? k.M : k.K,
             k.tb ? k.K : k.N};
  if (bf16) {  // bf16-representable values: truncate the low 16 bits
    for (auto* v : {&d.a, &d.b}) {
      for (float& f : *v) f = std::bit_cast<float>(std::bit_cast<uint32_t>(f) & 0xFFFF0000u);
    }
  }
  return d;
}

// sgemm GFLOP/s per (case, threads), for the ratio counters of the concord cases.
std::map<std::pair<int64_t, int64_t>, double>& sgemm_rate() {
  static std::map<std::pair<int64_t, int64_t>, double> rate;
  return rate;
}

double case_flops(const Case& k) { return 2.0 * static_cast<double>(k.M * k.N * k.K); }

void set_case_counters(benchmark::State& state, const Case& k, double seconds, bool baseline) {
  const double rate = case_flops(k) * static_cast<double>(state.iterations()) / seconds / 1e9;
  state.counters["GFLOP/s"] = benchmark::Counter(
      case_flops(k) * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate,
      benchmark::Counter::kIs1000);
  const auto key = std::make_pair(state.range(0), state.range(1));
  auto& sgemm = sgemm_rate();
  if (baseline) {
    sgemm[key] = rate;
  } else if (sgemm.count(key) != 0) {
    state.counters["vs_sgemm"] = rate / sgemm[key];
  }
}

void BM_case_openblas_sgemm(benchmark::State& state) {
  const Case& k = kCases[state.range(0)];
  openblas_set_num_threads(static_cast<int>(state.range(1)));
  CaseData d = make_case(k, false);
  double seconds = 0.0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, k.ta ? CblasTrans : CblasNoTrans, k.tb ? CblasTrans : CblasNoTrans,
                static_cast<int>(k.M), static_cast<int>(k.N), static_cast<int>(k.K), 1.0f,
                d.a.data(), static_cast<int>(d.lda), d.b.data(), static_cast<int>(d.ldb), 0.0f,
                d.c.data(), static_cast<int>(k.N));
    benchmark::DoNotOptimize(d.c.data());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  state.SetLabel(k.name);
  set_case_counters(state, k, seconds, true);
}

void BM_case_concord(benchmark::State& state, bool bf16) {
  using concord::tensor::Trans;
  const Case& k = kCases[state.range(0)];
  omp_set_num_threads(static_cast<int>(state.range(1)));
  CaseData d = make_case(k, bf16);
  const auto fn = bf16 ? concord::tensor::gemm_bf16 : concord::tensor::gemm;
  double seconds = 0.0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(k.ta ? Trans::yes : Trans::no, k.tb ? Trans::yes : Trans::no, k.M, k.N, k.K, d.a.data(),
       d.lda, d.b.data(), d.ldb, d.c.data(), k.N, false);
    benchmark::DoNotOptimize(d.c.data());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  state.SetLabel(std::string(k.name) + " " + concord::tensor::gemm_isa_name());
  set_case_counters(state, k, seconds, false);
}

void cases(benchmark::internal::Benchmark* b) {
  for (int64_t c = 0; c < static_cast<int64_t>(std::size(kCases)); ++c) {
    for (int64_t threads : {1, 2}) b->Args({c, threads});
  }
  b->ArgNames({"case", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
}

// Skinny M (decode: one row per sequence, M = 1..8) against an (N, K) weight, Y = X·Wᵀ: weight
// bytes streamed per second. mode 0: gemm() (packs W's panels per call), 1: gemm_packed on fp32
// panels packed once, 2: gemm_packed on bf16 panels (bf16 weight values). The GB/s counter
// counts the fp32 weight (N·K·4 bytes) per call whatever the panel format, as the engine
// benchmark does; enough copies of the weight rotate to exceed the L3 (the engine's weights do
// not fit in it either).
struct SkinnyShape {
  const char* name;
  int64_t N, K;
};
constexpr SkinnyShape kSkinny[] = {
    {"gate/up", 1536, 512}, {"down", 512, 1536}, {"lm_head", 151936, 512}};

void BM_skinny(benchmark::State& state) {
  using concord::tensor::Trans;
  const SkinnyShape& shape = kSkinny[state.range(0)];
  const int64_t M = state.range(1), mode = state.range(2);
  omp_set_num_threads(static_cast<int>(state.range(3)));
  const int64_t N = shape.N, K = shape.K;
  const double weight_bytes = 4.0 * static_cast<double>(N * K);
  const auto copies = static_cast<size_t>(std::max(1.0, std::ceil(96e6 / weight_bytes)));
  std::vector<std::vector<float>> weights;
  std::vector<concord::tensor::PackedB> packed(copies);
  for (size_t i = 0; i < copies; ++i) {
    weights.push_back(random_matrix(N, K, static_cast<unsigned>(10 + i)));
    if (mode == 2) {
      for (float& f : weights.back()) {
        f = std::bit_cast<float>(std::bit_cast<uint32_t>(f) & 0xFFFF0000u);
      }
    }
    if (mode != 0) {
      concord::tensor::pack_b(packed[i], Trans::yes, K, N, weights.back().data(), K, mode == 2);
    }
  }
  const std::vector<float> x = random_matrix(M, K, 3);
  std::vector<float> y(static_cast<size_t>(M * N));
  size_t next = 0;
  for (auto _ : state) {
    if (mode == 0) {
      concord::tensor::gemm(Trans::no, Trans::yes, M, N, K, x.data(), K, weights[next].data(), K,
                            y.data(), N);
    } else {
      concord::tensor::gemm_packed(Trans::no, M, N, K, x.data(), K, packed[next], y.data(), N);
    }
    benchmark::DoNotOptimize(y.data());
    next = (next + 1) % copies;
  }
  state.counters["weight_GB/s"] =
      benchmark::Counter(weight_bytes * static_cast<double>(state.iterations()) / 1e9,
                         benchmark::Counter::kIsRate);
  static const char* const kModes[] = {"gemm per-call packing", "packed fp32", "packed bf16"};
  state.SetLabel(std::string(shape.name) + " " + kModes[mode] + " " +
                 concord::tensor::gemm_isa_name());
}

void skinny_cases(benchmark::internal::Benchmark* b) {
  for (int64_t shape = 0; shape < static_cast<int64_t>(std::size(kSkinny)); ++shape) {
    for (int64_t M : {1, 4, 8}) {
      for (int64_t mode : {0, 1, 2}) {
        for (int64_t threads : {1, 2}) b->Args({shape, M, mode, threads});
      }
    }
  }
  b->ArgNames({"shape", "M", "mode", "threads"})->UseRealTime()->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(BM_openblas_sgemm)->Apply(shapes);
BENCHMARK_CAPTURE(BM_onednn_matmul, f32, dnnl::memory::data_type::f32)->Apply(shapes);
BENCHMARK_CAPTURE(BM_onednn_matmul, bf16, dnnl::memory::data_type::bf16)->Apply(shapes);
// Registration order is run order: the sgemm cases run first, and each concord case divides
// its rate by the sgemm rate of the same (case, threads) from earlier in this run.
BENCHMARK(BM_case_openblas_sgemm)->Apply(cases);
BENCHMARK_CAPTURE(BM_case_concord, fp32, false)->Apply(cases);
BENCHMARK_CAPTURE(BM_case_concord, bf16, true)->Apply(cases);
BENCHMARK(BM_skinny)->Apply(skinny_cases);
BENCHMARK_MAIN();
