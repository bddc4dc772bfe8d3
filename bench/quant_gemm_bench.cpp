// quant_gemm (W4A8 / W8A8 on ggml blocks) at SmolLM2-135M's shapes, in one run beside its
// baselines: M = 1 (decode) as packed-weight GB/s and its ratio to a memcpy of the same bytes
// (threads split the copy like the kernel splits the weight), M = 512 (prefill) as GFLOP/s and
// its ratio to OpenBLAS sgemm fp32 of the same shape (X·Wᵀ), at 1 and 2 threads.
// "stream" cases cycle over enough copies of the weight (>= 96 MiB, like a whole model's layers)
// that it comes from DRAM; "hot" cases reuse one copy (cache-resident, like a kernel in a loop).
// "gemm/<isa>/<shape>/m<M>" (M = 1, 8, 64, 512; every ISA path this CPU runs) reports int8
// multiply-adds per second, their ratio to OpenBLAS sgemm at the same M and shape ("sgemm/<shape>/
// m<M>", x_sgemm: multiply-adds per second against sgemm's) and to the core's int8 peak measured in the same run by
// "int8_peak/<isa>": a tight loop of the instruction the kernels multiply with (AVX2 vpmaddubsw,
// 32 u8 x s8 products per instruction; AVX-512 VNNI vpdpbusd, 64), 12 independent chains per
// thread, each product reading its chain's last result so that nothing is hoisted (x_peak).
// "int8_peak/avx2_pair" times vpmaddubsw + vpaddw, the pair the AVX2 kernels issue per product
// (x_pair): the rate AVX2 code that sums its products in int16 can reach at most.
// Registration order is run order: each baseline runs just before the cases it divides.
#include <immintrin.h>
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "concord/tensor/quant_gemm.h"

namespace {

using concord::tensor::BlockQuant;
using concord::tensor::QuantWeight;

struct Shape {
  int64_t N, K;
  BlockQuant type;
  const char* name;
};
// The SmolLM2-135M file's matrices: q/o (576x576), k/v (192x576), gate/up (1536x576), down
// (576x1536) in q4_1, token embedding / LM head (49152x576) in q8_0.
const Shape kShapes[] = {{576, 576, BlockQuant::q4_1, "attn_q"},
                         {192, 576, BlockQuant::q4_1, "attn_k"},
                         {1536, 576, BlockQuant::q4_1, "ffn_up"},
                         {576, 1536, BlockQuant::q4_1, "ffn_down"},
                         {49152, 576, BlockQuant::q8_0, "lm_head"}};
constexpr int64_t kPrefillM = 512;
constexpr size_t kStreamBytes = size_t{96} << 20;

std::vector<uint8_t> random_blocks(const Shape& s, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  const size_t bb = concord::tensor::ggml_block_bytes(s.type);
  std::vector<uint8_t> v(static_cast<size_t>(s.N * (s.K / 32)) * bb);
  for (size_t off = 0; off < v.size(); off += bb) {
    for (size_t i = 0; i < bb; ++i) v[off + i] = static_cast<uint8_t>(byte(gen));
    v[off] = 0x00;
    v[off + 1] = 0x20;  // d = 2^-7: finite scales
    if (s.type == BlockQuant::q4_1) {
      v[off + 2] = 0x00;
      v[off + 3] = 0xa0;  // m = -2^-7
    }
  }
  return v;
}

std::vector<float> random_acts(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = normal(gen);
  return v;
}

// Baseline rates per (shape, threads, stream), filled by the baselines for the ratio counters.
std::map<std::tuple<int, int, bool>, double> g_memcpy_gbs;
std::map<std::tuple<int, int, int64_t>, double> g_sgemm_gflops;  // (shape, threads, M)

int copies_for(size_t bytes, bool stream) {
  return stream ? static_cast<int>(std::max<size_t>(1, (kStreamBytes + bytes - 1) / bytes)) : 1;
}

void BM_memcpy(benchmark::State& state, int shape, bool stream) {
  const int threads = static_cast<int>(state.range(0));
  const Shape& s = kShapes[shape];
  const size_t bytes = concord::tensor::pack_quant_weight(s.type, s.N, s.K, random_blocks(s, 1)).bytes();
  const int copies = copies_for(bytes, stream);
  std::vector<uint8_t> src(bytes * copies, 1), dst(bytes * copies, 0);
  int c = 0;
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const uint8_t* from = src.data() + bytes * c;
    uint8_t* to = dst.data() + bytes * c;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
      const size_t part = (bytes + threads - 1) / threads;
      const size_t begin = std::min(bytes, part * omp_get_thread_num());
      std::memcpy(to + begin, from + begin, std::min(bytes, begin + part) - begin);
    }
    benchmark::DoNotOptimize(dst.data());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    c = (c + 1) % copies;
  }
  const double gbs = static_cast<double>(bytes) * static_cast<double>(state.iterations()) / seconds / 1e9;
  g_memcpy_gbs[{shape, threads, stream}] = gbs;
  state.counters["GB/s"] = gbs;
}

void BM_decode(benchmark::State& state, int shape, bool stream) {
  const int threads = static_cast<int>(state.range(0));
  omp_set_num_threads(threads);
  const Shape& s = kShapes[shape];
  const auto blocks = random_blocks(s, 1);
  std::vector<QuantWeight> ws;
  ws.push_back(concord::tensor::pack_quant_weight(s.type, s.N, s.K, blocks));
  const size_t bytes = ws[0].bytes();
  const int copies = copies_for(bytes, stream);
  for (int i = 1; i < copies; ++i) ws.push_back(concord::tensor::pack_quant_weight(s.type, s.N, s.K, blocks));
  const auto x = random_acts(s.K, 2);
  std::vector<float> y(static_cast<size_t>(s.N));
  int c = 0;
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    concord::tensor::quant_gemm(ws[c], x.data(), 1, s.K, y.data(), s.N);
    benchmark::DoNotOptimize(y.data());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    c = (c + 1) % copies;
  }
  const double gbs = static_cast<double>(bytes) * static_cast<double>(state.iterations()) / seconds / 1e9;
  state.counters["GB/s"] = gbs;
  const auto it = g_memcpy_gbs.find({shape, threads, stream});
  if (it != g_memcpy_gbs.end()) state.counters["x_memcpy"] = gbs / it->second;
  state.SetLabel(std::string(concord::tensor::quant_isa_name(concord::tensor::quant_isa())));
}

// OpenBLAS sgemm of X (M x K) · Wᵀ on fp32 weights (the dequantized weights' stand-in: sgemm's
// speed does not depend on the values).
void BM_sgemm(benchmark::State& state, int shape, int64_t M) {
  const int threads = static_cast<int>(state.range(0));
  openblas_set_num_threads(threads);
  const Shape& s = kShapes[shape];
  const auto x = random_acts(M * s.K, 2), w = random_acts(s.N * s.K, 3);
  std::vector<float> y(static_cast<size_t>(M * s.N));
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M),
                static_cast<int>(s.N), static_cast<int>(s.K), 1.0f, x.data(), static_cast<int>(s.K),
                w.data(), static_cast<int>(s.K), 0.0f, y.data(), static_cast<int>(s.N));
    benchmark::DoNotOptimize(y.data());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double gf = 2.0 * static_cast<double>(M * s.N * s.K) * static_cast<double>(state.iterations()) / seconds / 1e9;
  g_sgemm_gflops[{shape, threads, M}] = gf;
  state.counters["GFLOP/s"] = gf;
}

void BM_prefill(benchmark::State& state, int shape) {
  const int threads = static_cast<int>(state.range(0));
  omp_set_num_threads(threads);
  const Shape& s = kShapes[shape];
  const QuantWeight w = concord::tensor::pack_quant_weight(s.type, s.N, s.K, random_blocks(s, 1));
  const auto x = random_acts(kPrefillM * s.K, 2);
  std::vector<float> y(static_cast<size_t>(kPrefillM * s.N));
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    concord::tensor::quant_gemm(w, x.data(), kPrefillM, s.K, y.data(), s.N);
    benchmark::DoNotOptimize(y.data());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double gf = 2.0 * static_cast<double>(kPrefillM * s.N * s.K) * static_cast<double>(state.iterations()) / seconds / 1e9;
  state.counters["GFLOP/s"] = gf;
  const auto it = g_sgemm_gflops.find({shape, threads, kPrefillM});
  if (it != g_sgemm_gflops.end()) state.counters["x_sgemm"] = gf / it->second;
  state.SetLabel(std::string(concord::tensor::quant_isa_name(concord::tensor::quant_isa())));
}

using concord::tensor::QuantIsa;

// The int8 peak: int8 multiply-adds per second of `threads` threads each running the loop.
__attribute__((target("avx2"))) int64_t maddubs_loop(int64_t iters, bool pair) {
  __m256i acc[12];
  const __m256i b = _mm256_set1_epi8(-2);
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi8(static_cast<char>(i + 1));
  if (pair) {
    for (int64_t i = 0; i < iters; ++i)
      for (auto& v : acc) v = _mm256_add_epi16(v, _mm256_maddubs_epi16(v, b));
  } else {
    for (int64_t i = 0; i < iters; ++i)
      for (auto& v : acc) v = _mm256_maddubs_epi16(v, b);
  }
  __m256i t = acc[0];
  for (int i = 1; i < 12; ++i) t = _mm256_xor_si256(t, acc[i]);
  return _mm256_extract_epi64(t, 0);
}
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int64_t dpbusd_loop(int64_t iters) {
  __m512i acc[12];
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (auto& v : acc) v = _mm512_setzero_si512();
  for (int64_t i = 0; i < iters; ++i) {
    for (auto& v : acc) v = _mm512_dpbusd_epi32(v, a, b);
  }
  __m512i t = acc[0];
  for (int i = 1; i < 12; ++i) t = _mm512_xor_si512(t, acc[i]);
  alignas(64) int64_t lanes[8];
  _mm512_store_si512(lanes, t);
  return lanes[0];
}

// (isa, threads) -> G multiply-adds / s: the instruction alone, and AVX2's vpmaddubsw + vpaddw.
std::map<std::pair<int, int>, double> g_peak_gmacs, g_pair_gmacs;

void BM_int8_peak(benchmark::State& state, QuantIsa isa, bool pair) {
  const int threads = static_cast<int>(state.range(0));
  constexpr int64_t kIters = 1 << 20;
  const double macs_per_iter = 12.0 * (isa == QuantIsa::avx512 ? 64 : 32);
  double seconds = 0;
  int64_t sink = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(^ : sink)
    sink ^= isa == QuantIsa::avx512 ? dpbusd_loop(kIters) : maddubs_loop(kIters, pair);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  benchmark::DoNotOptimize(sink);
  const double g = macs_per_iter * kIters * threads * static_cast<double>(state.iterations()) / seconds / 1e9;
  (pair ? g_pair_gmacs : g_peak_gmacs)[{static_cast<int>(isa), threads}] = g;
  state.counters["GMAC/s"] = g;
}

// quant_gemm at M rows with the kernel set named: int8 multiply-adds (M·N·K) per second.
void BM_gemm(benchmark::State& state, QuantIsa isa, int shape, int64_t M) {
  const int threads = static_cast<int>(state.range(0));
  omp_set_num_threads(threads);
  const Shape& s = kShapes[shape];
  const QuantWeight w = concord::tensor::pack_quant_weight(s.type, s.N, s.K, random_blocks(s, 1));
  const auto x = random_acts(M * s.K, 2);
  std::vector<float> y(static_cast<size_t>(M * s.N));
  double seconds = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    concord::tensor::quant_gemm(w, x.data(), M, s.K, y.data(), s.N, isa);
    benchmark::DoNotOptimize(y.data());
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double g = static_cast<double>(M * s.N * s.K) * static_cast<double>(state.iterations()) / seconds / 1e9;
  state.counters["GMAC/s"] = g;
  const auto it = g_peak_gmacs.find({static_cast<int>(isa), threads});
  if (it != g_peak_gmacs.end()) state.counters["x_peak"] = g / it->second;
  const auto pr = g_pair_gmacs.find({static_cast<int>(isa), threads});
  if (pr != g_pair_gmacs.end()) state.counters["x_pair"] = g / pr->second;
  const auto sg = g_sgemm_gflops.find({shape, threads, M});
  if (sg != g_sgemm_gflops.end()) state.counters["x_sgemm"] = 2.0 * g / sg->second;
}

void register_all() {
  for (int i = 0; i < static_cast<int>(std::size(kShapes)); ++i) {
    const std::string shape = kShapes[i].name;
    for (bool stream : {false, true}) {
      const std::string mode = stream ? "/stream" : "/hot";
      benchmark::RegisterBenchmark(("memcpy/" + shape + mode).c_str(), BM_memcpy, i, stream)
          ->Arg(1)->Arg(2)->UseRealTime();
      benchmark::RegisterBenchmark(("decode/" + shape + mode).c_str(), BM_decode, i, stream)
          ->Arg(1)->Arg(2)->UseRealTime();
    }
    for (int64_t M : {int64_t{1}, int64_t{8}, int64_t{64}, kPrefillM})
      benchmark::RegisterBenchmark(("sgemm/" + shape + "/m" + std::to_string(M)).c_str(), BM_sgemm, i, M)
          ->Arg(1)->Arg(2)->UseRealTime();
    benchmark::RegisterBenchmark(("prefill_m512/" + shape).c_str(), BM_prefill, i)
        ->Arg(1)->Arg(2)->UseRealTime();
  }
  for (QuantIsa isa : {QuantIsa::avx2, QuantIsa::avx512}) {
    if (!concord::tensor::quant_isa_supported(isa)) continue;
    const std::string name = concord::tensor::quant_isa_name(isa);
    benchmark::RegisterBenchmark(("int8_peak/" + name).c_str(), BM_int8_peak, isa, false)->Arg(1)->Arg(2)->UseRealTime();
    if (isa == QuantIsa::avx2)
      benchmark::RegisterBenchmark("int8_peak/avx2_pair", BM_int8_peak, isa, true)->Arg(1)->Arg(2)->UseRealTime();
    for (int i = 0; i < static_cast<int>(std::size(kShapes)); ++i) {
      for (int64_t M : {1, 8, 64, 512}) {
        benchmark::RegisterBenchmark(("gemm/" + name + "/" + kShapes[i].name + "/m" + std::to_string(M)).c_str(),
                                     BM_gemm, isa, i, M)
            ->Arg(1)->Arg(2)->UseRealTime();
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
