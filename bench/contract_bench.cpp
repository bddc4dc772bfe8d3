// Kernel-contract measurement throughput: row_divergence over fp32 rows of the Qwen3 vocabulary
// (151,936 logits) against memcpy of the same bytes in the same run (bench/README.md).
//
// 16 row pairs (19 MiB, beyond L2) are visited in turn. items = rows (positions); bytes = the
// two fp32 rows read per position, 2·V·4. Cases: in contract (candidate = reference + N(0,
// 0.01²): osc ≈ 0.1, the Taylor-only path) and far (N(0, 1²): osc ≈ 10, the general path), on
// each ISA the CPU has (the results are bit-identical across ISAs; only the speed differs).
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "concord/audit/bounds.h"
#include "concord/numerics/convert.h"

namespace concord::audit {
namespace {

constexpr size_t kVocab = 151936;
constexpr size_t kPairs = 16;
constexpr int64_t kRowBytes = 2 * static_cast<int64_t>(kVocab) * 4;

struct Rows {
  std::vector<float> ref, cand;  // kPairs rows of kVocab each
};

Rows make_rows(double noise) {
  Rows r;
  r.ref.resize(kPairs * kVocab);
  r.cand.resize(kPairs * kVocab);
  std::mt19937_64 gen(11);
  std::normal_distribution<double> logit(0, 3), delta(0, noise);
  for (size_t i = 0; i < r.ref.size(); ++i) {
    const double z = logit(gen);
    r.ref[i] = static_cast<float>(z);
    r.cand[i] = static_cast<float>(z + delta(gen));
  }
  return r;
}

const Rows& rows(double noise) {
  static const Rows near = make_rows(0.01);
  static const Rows far = make_rows(1.0);
  return noise < 0.5 ? near : far;
}

bool use_isa(benchmark::State& state, int64_t isa_arg) {
  const auto isa = static_cast<numerics::Isa>(isa_arg);
  if (!numerics::isa_supported(isa)) {
    state.SkipWithError("ISA not supported by this CPU");
    return false;
  }
  numerics::set_active_isa(isa);
  state.SetLabel(std::string(numerics::isa_name(isa)));
  return true;
}

// range(0): 0 = in contract (noise 0.01), 1 = far (noise 1); range(1): Isa (0 generic, 1 avx2,
// 2 avx512).
void BM_row_divergence(benchmark::State& state) {
  const Rows& r = rows(state.range(0) == 0 ? 0.01 : 1.0);
  if (!use_isa(state, state.range(1))) return;
  size_t pair = 0;
  double osc = 0;
  for (auto _ : state) {
    const std::span<const float> ref(r.ref.data() + pair * kVocab, kVocab);
    const std::span<const float> cand(r.cand.data() + pair * kVocab, kVocab);
    const RowDivergence d = row_divergence(ref, cand, 17);
    benchmark::DoNotOptimize(d);
    osc = d.osc;
    pair = (pair + 1) % kPairs;
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * kRowBytes);
  state.counters["osc"] = osc;
}

// The same bytes per position, copied: both rows of a pair into one destination buffer.
void BM_memcpy(benchmark::State& state) {
  const Rows& r = rows(0.01);
  std::vector<float> out(2 * kVocab);
  size_t pair = 0;
  for (auto _ : state) {
    std::memcpy(out.data(), r.ref.data() + pair * kVocab, kVocab * 4);
    std::memcpy(out.data() + kVocab, r.cand.data() + pair * kVocab, kVocab * 4);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    pair = (pair + 1) % kPairs;
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * kRowBytes);
}

BENCHMARK(BM_memcpy)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_row_divergence)
    ->ArgNames({"far", "isa"})
    ->ArgsProduct({{0, 1}, {0, 1, 2}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace concord::audit

BENCHMARK_MAIN();
