// Numerics throughput: fp32 -> bf16 and block quantize/dequantize against memcpy of the same
// 64 MiB fp32 buffer in the same run, at 1 and 2 OpenMP threads (bench/run.sh makes the table).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstring>
#include <random>
#include <vector>

#include "concord/numerics/block.h"
#include "concord/numerics/convert.h"

namespace concord::numerics {
namespace {

constexpr int64_t kCols = 4096;
constexpr int64_t kRows = (int64_t{64} << 20) / 4 / kCols;  // 64 MiB of fp32
constexpr int64_t kElements = kRows * kCols;

const std::vector<float>& input() {
  static const std::vector<float> x = [] {
    std::vector<float> v(static_cast<size_t>(kElements));
    std::mt19937 gen(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& f : v) f = normal(gen);
    return v;
  }();
  return x;
}

// Throughput is counted in bytes of fp32 input (the tensor being converted).
void finish(benchmark::State& state) {
  state.SetBytesProcessed(state.iterations() * kElements * static_cast<int64_t>(sizeof(float)));
  state.SetLabel(std::string(active_isa_name()));
}

void BM_memcpy(benchmark::State& state) {
  omp_set_num_threads(static_cast<int>(state.range(0)));
  const std::vector<float>& x = input();
  std::vector<float> out(x.size());
  const int64_t chunk = 1 << 20;
  for (auto _ : state) {
    // Split like the conversions so that 2 threads copy in parallel too.
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < kElements / chunk; ++c) {
      std::memcpy(out.data() + c * chunk, x.data() + c * chunk, chunk * sizeof(float));
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  finish(state);
}

void BM_bf16(benchmark::State& state, Rounding rounding) {
  omp_set_num_threads(static_cast<int>(state.range(0)));
  const std::vector<float>& x = input();
  std::vector<uint16_t> out(x.size());
  for (auto _ : state) {
    encode_array(Format::bf16, rounding, Overflow::saturate, x.data(), out.data(), x.size(),
                 RandomStream{7, 0});
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  finish(state);
}

void BM_quantize(benchmark::State& state, QuantDesc desc) {
  omp_set_num_threads(static_cast<int>(state.range(0)));
  const std::vector<float>& x = input();
  for (auto _ : state) {
    QuantizedTensor q = quantize(desc, x.data(), kRows, kCols);
    benchmark::DoNotOptimize(q.codes.data());
  }
  finish(state);
}

void BM_dequantize(benchmark::State& state, QuantDesc desc) {
  omp_set_num_threads(static_cast<int>(state.range(0)));
  const std::vector<float>& x = input();
  const QuantizedTensor q = quantize(desc, x.data(), kRows, kCols);
  std::vector<float> out(x.size());
  for (auto _ : state) {
    dequantize(q, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  finish(state);
}

void thread_counts(benchmark::internal::Benchmark* b) {
  b->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
}

BENCHMARK(BM_memcpy)->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_bf16, rne, Rounding::rne)->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_bf16, sr, Rounding::stochastic)->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_quantize, mxfp8_e4m3, QuantDesc::mx(Format::e4m3))->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_dequantize, mxfp8_e4m3, QuantDesc::mx(Format::e4m3))->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_quantize, mxfp4, QuantDesc::mx(Format::e2m1))->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_dequantize, mxfp4, QuantDesc::mx(Format::e2m1))->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_quantize, nvfp4, QuantDesc::nvfp4())->Apply(thread_counts);
BENCHMARK_CAPTURE(BM_dequantize, nvfp4, QuantDesc::nvfp4())->Apply(thread_counts);

}  // namespace
}  // namespace concord::numerics

BENCHMARK_MAIN();
