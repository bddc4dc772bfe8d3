// GEMM baselines on the model's shapes (M tokens x K in -> N out): OpenBLAS sgemm and oneDNN
// matmul in f32 and bf16 (bf16 inputs, f32 output), in the same run. GFLOP/s as a counter.
// This is the yardstick the tensor layer's GEMM (issue 3) will be measured against; it also
// tells whether this CPU has a bf16 matmul at all (oneDNN needs AVX512-BF16 or AMX for it).
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <dnnl.hpp>
#include <random>
#include <string>
#include <vector>

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

}  // namespace

BENCHMARK(BM_openblas_sgemm)->Apply(shapes);
BENCHMARK_CAPTURE(BM_onednn_matmul, f32, dnnl::memory::data_type::f32)->Apply(shapes);
BENCHMARK_CAPTURE(BM_onednn_matmul, bf16, dnnl::memory::data_type::bf16)->Apply(shapes);
BENCHMARK_MAIN();
