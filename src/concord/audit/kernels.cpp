// Named serving-kernel variants (kernels.h): precision presets, and forward GEMMs that run each
// output's reduction over K in another documented order or precision.
#include "concord/audit/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include "concord/numerics/check.h"
#include "concord/tensor/gemm.h"
#include "concord/tensor/qgemm.h"

namespace concord::audit {
namespace {

using model::ForwardGemm;
using model::PrecisionPolicy;

// ---- reduction plans ----------------------------------------------------------------------
// One output y[m][n] = Σ_k a[m][k]·b[n][k] is computed as fp32 fma chains over contiguous
// segments of K, each starting from +0, then the segment sums combined. Every fp32 variant is
// one such plan; the fp64 variant is one segment accumulated in double.
struct Segment {
  int64_t begin = 0, end = 0;
};
enum class Combine : uint8_t {
  in_order,  // ((s0 + s1) + s2) + ...
  pairwise,  // adjacent pairs added level by level, an odd last one carried up unchanged
};
struct ReductionPlan {
  std::vector<Segment> segments;  // empty (K = 0): the sum is +0
  bool reverse = false;           // each chain runs k = end-1 down to begin
  Combine combine = Combine::in_order;
};

ReductionPlan in_order_plan(int64_t K) {
  ReductionPlan p;
  if (K > 0) p.segments.push_back({0, K});
  return p;
}

constexpr int64_t kBlockedSegment = 64;  // fp32-blocked's block along K
constexpr int64_t kDropLatePosition = 64;  // fp32-drop-late's first affected position
constexpr int64_t kDropLateTerms = 32;     // ... and the terms it drops at the end of K

// fp32-batch-split's number of K parts for an M-row GEMM (see kernels.h).
int64_t batch_split_parts(int64_t M, int64_t K) {
  return std::min(std::clamp<int64_t>(M / 4, 1, 8), std::max<int64_t>(K, 1));
}

// ---- tile kernel --------------------------------------------------------------------------
constexpr int kPanel = 16;  // columns of b per packed panel (two AVX2 vectors of floats)

// b's fp32 panels when prepack_b made them for this GEMM: gemm.h's PackedB layout (panel p =
// columns [16p, 16p + 16) of op(B), K steps of 16 floats, zero past N) is the one pack_panel
// writes, so the kernels stream them as they are. nullptr: pack per task.
const float* prepacked_panels(const tensor::PreparedOperand& b, int64_t N, int64_t K) {
  const tensor::PackedB& p = b.packed;
  if (!p.valid || p.bf16 || p.tb != tensor::Trans::yes || p.N != N || p.K != K) return nullptr;
  return p.f32.data();
}

// Packs columns [n0, n0 + kPanel) of op(B) = bᵀ: panel[k][j] = b[n0 + j][k] (zero past N), so
// that the chains of kPanel neighbouring outputs advance together, one vector lane each.
void pack_panel(const float* b, int64_t N, int64_t K, int64_t n0, float* panel) {
  for (int j = 0; j < kPanel; ++j) {
    const int64_t n = n0 + j;
    if (n < N) {
      const float* row = b + n * K;
      for (int64_t k = 0; k < K; ++k) panel[k * kPanel + j] = row[k];
    } else {
      for (int64_t k = 0; k < K; ++k) panel[k * kPanel + j] = 0.0f;
    }
  }
}

// out[r][j] = the chain acc = fma(a_r[k], panel[k][j], acc) over k in the segment (in Acc
// precision, from +0), for R rows. Vectorized across j only: every (r, j) keeps its own chain
// in the documented order, so the bits do not depend on the ISA or the tiling.
template <class Acc, int R>
[[gnu::always_inline]] inline void chain_tile(const float* const* a_rows, const float* panel,
                                              Segment seg, bool reverse, Acc* out) {
  Acc acc[R][kPanel];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kPanel; ++j) acc[r][j] = Acc(0);
  const int64_t count = seg.end - seg.begin;
  for (int64_t step = 0; step < count; ++step) {
    const int64_t k = reverse ? seg.end - 1 - step : seg.begin + step;
    const float* p = panel + k * kPanel;
    for (int r = 0; r < R; ++r) {
      const Acc x = static_cast<Acc>(a_rows[r][k]);
#pragma omp simd
      for (int j = 0; j < kPanel; ++j) acc[r][j] = std::fma(x, static_cast<Acc>(p[j]), acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kPanel; ++j) out[r * kPanel + j] = acc[r][j];
}

constexpr int kRowsF32 = 4;  // 4 rows x 16 columns: 8 independent vector chains
constexpr int kRowsF64 = 2;  // 2 x 16 doubles: 8 vectors

using ChainF32 = void (*)(const float* const*, const float*, Segment, bool, float*);
using ChainF64 = void (*)(const float* const*, const float*, Segment, bool, double*);

void chain_f32_generic(const float* const* a, const float* p, Segment s, bool rev,
                       float* out) {
  chain_tile<float, kRowsF32>(a, p, s, rev, out);
}
void chain_f64_generic(const float* const* a, const float* p, Segment s, bool rev,
                       double* out) {
  chain_tile<double, kRowsF64>(a, p, s, rev, out);
}
#if defined(__x86_64__) && defined(__GNUC__)
// The same chains compiled for AVX2+FMA (vfmadd is the fma these chains specify, so the bits
// equal the generic build's); used when concord's GEMM runs its AVX2 kernels.
[[gnu::target("avx2,fma")]] void chain_f32_avx2(const float* const* a, const float* p, Segment s,
                                                bool rev, float* out) {
  chain_tile<float, kRowsF32>(a, p, s, rev, out);
}
[[gnu::target("avx2,fma")]] void chain_f64_avx2(const float* const* a, const float* p, Segment s,
                                                bool rev, double* out) {
  chain_tile<double, kRowsF64>(a, p, s, rev, out);
}
#endif

bool use_avx2() {
#if defined(__x86_64__) && defined(__GNUC__)
  return tensor::gemm_isa() != tensor::GemmIsa::generic;
#else
  return false;
#endif
}
ChainF32 chain_f32() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (use_avx2()) return chain_f32_avx2;
#endif
  return chain_f32_generic;
}
ChainF64 chain_f64() {
#if defined(__x86_64__) && defined(__GNUC__)
  if (use_avx2()) return chain_f64_avx2;
#endif
  return chain_f64_generic;
}

// Combines the segment sums of a tile in place: sums holds `count` blocks of `width` floats
// (segment q's sums of every output of the tile); the total lands in block 0. Each output's
// sums combine exactly as Combine says; the loops run across outputs, never across segments.
void combine_segments(float* sums, size_t count, size_t width, Combine combine) {
  if (combine == Combine::in_order) {
    for (size_t q = 1; q < count; ++q) {
      const float* part = sums + q * width;
#pragma omp simd
      for (size_t i = 0; i < width; ++i) sums[i] = sums[i] + part[i];
    }
    return;
  }
  size_t n = count;
  while (n > 1) {
    const size_t half = n / 2;
    for (size_t q = 0; q < half; ++q) {
      float* out = sums + q * width;
      const float* left = sums + 2 * q * width;
      const float* right = left + width;
      for (size_t i = 0; i < width; ++i) out[i] = left[i] + right[i];
    }
    if (n % 2 == 1) std::copy(sums + (n - 1) * width, sums + n * width, sums + half * width);
    n = half + n % 2;
  }
}

void check_shapes(const ForwardGemm& g) {
  CONCORD_CHECK(g.a != nullptr && g.b != nullptr && (g.y != nullptr || g.M * g.N == 0),
                "a forward GEMM needs both operands and an output");
  CONCORD_CHECK(g.a->rows == g.M && g.a->cols == g.K && g.b->rows == g.N && g.b->cols == g.K,
                fmt::format("forward GEMM '{}': operands {}x{} and {}x{} do not fit M={} N={} K={}",
                            g.weight, g.a->rows, g.a->cols, g.b->rows, g.b->cols, g.M, g.N, g.K));
  CONCORD_CHECK(static_cast<int64_t>(g.positions.size()) == g.M,
                "a forward GEMM needs one position per row");
}

// Runs `plan` (or, with Acc = double, one double chain over K) for the listed rows of g.
// Parallel over (column panel, chunk of rows) tasks; each output is one task's chain.
template <class Acc>
void run_rows(const ForwardGemm& g, const ReductionPlan& plan, const std::vector<int64_t>& rows) {
  constexpr int R = std::is_same_v<Acc, double> ? kRowsF64 : kRowsF32;
  constexpr int64_t kRowChunk = 64;
  const int64_t N = g.N, K = g.K, M = static_cast<int64_t>(rows.size());
  if (M == 0 || N == 0) return;
  const float s = g.a->tensor_scale * g.b->tensor_scale;  // as gemm_prepared: fl(s_a·s_b)
  const int64_t panels = (N + kPanel - 1) / kPanel, chunks = (M + kRowChunk - 1) / kRowChunk;
  const int64_t tasks = panels * chunks;
  const size_t n_segments = plan.segments.size();
  const ChainF32 f32 = chain_f32();
  const ChainF64 f64 = chain_f64();
  const float* prepacked = prepacked_panels(*g.b, N, K);
  // Threads only pay off past ~1M multiply-adds (concord's GEMM draws the line at 2M).
  const bool parallel = M * N * K >= (int64_t{1} << 20) && tasks > 1 && !omp_in_parallel();

#pragma omp parallel if (parallel)
  {
    std::vector<float> panel(prepacked != nullptr ? 0 : static_cast<size_t>(K * kPanel));
    std::vector<float> sums(std::max<size_t>(n_segments, 1) * R * kPanel);  // [seg][r][j]
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t n0 = task % panels * kPanel, chunk = task / panels;
      const int64_t width = std::min<int64_t>(kPanel, N - n0);
      const float* panel_of_task = prepacked != nullptr ? prepacked + n0 * K : panel.data();
      if (prepacked == nullptr) pack_panel(g.b->data, N, K, n0, panel.data());
      const int64_t first = chunk * kRowChunk, last = std::min(M, first + kRowChunk);
      for (int64_t r0 = first; r0 < last; r0 += R) {
        const int live = static_cast<int>(std::min<int64_t>(R, last - r0));
        const float* a_rows[R];
        for (int r = 0; r < R; ++r)  // rows past the end repeat a live one (results unused)
          a_rows[r] = g.a->data + rows[static_cast<size_t>(r0 + std::min(r, live - 1))] * K;
        float result[R * kPanel];  // [r][j]
        if constexpr (std::is_same_v<Acc, double>) {
          double wide[R * kPanel];
          f64(a_rows, panel_of_task, Segment{0, K}, false, wide);
          for (int i = 0; i < R * kPanel; ++i) result[i] = static_cast<float>(wide[i]);
        } else if (n_segments == 1) {
          f32(a_rows, panel_of_task, plan.segments[0], plan.reverse, result);
        } else if (n_segments == 0) {
          std::fill(result, result + R * kPanel, 0.0f);
        } else {
          for (size_t q = 0; q < n_segments; ++q)
            f32(a_rows, panel_of_task, plan.segments[q], plan.reverse,
                sums.data() + q * R * kPanel);
          combine_segments(sums.data(), n_segments, R * kPanel, plan.combine);
          std::copy(sums.begin(), sums.begin() + R * kPanel, result);
        }
        for (int r = 0; r < live; ++r) {
          float* y = g.y + rows[static_cast<size_t>(r0 + r)] * N + n0;
          const float* sum = result + r * kPanel;
          for (int j = 0; j < width; ++j) y[j] = s == 1.0f ? sum[j] : s * sum[j];
        }
      }
    }
  }
}

std::vector<int64_t> all_rows(int64_t M) {
  std::vector<int64_t> rows(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) rows[static_cast<size_t>(m)] = m;
  return rows;
}

// ---- the GEMM variants --------------------------------------------------------------------
void gemm_fp64(const ForwardGemm& g) {
  check_shapes(g);
  run_rows<double>(g, ReductionPlan{}, all_rows(g.M));
}

void gemm_reversed(const ForwardGemm& g) {
  check_shapes(g);
  ReductionPlan plan = in_order_plan(g.K);
  plan.reverse = true;
  run_rows<float>(g, plan, all_rows(g.M));
}

void gemm_blocked(const ForwardGemm& g) {
  check_shapes(g);
  ReductionPlan plan;
  plan.combine = Combine::pairwise;
  for (int64_t k = 0; k < g.K; k += kBlockedSegment)
    plan.segments.push_back({k, std::min(g.K, k + kBlockedSegment)});
  run_rows<float>(g, plan, all_rows(g.M));
}

void gemm_batch_split(const ForwardGemm& g) {
  check_shapes(g);
  ReductionPlan plan;
  if (g.K > 0) {
    const int64_t parts = batch_split_parts(g.M, g.K);
    for (int64_t i = 0; i < parts; ++i)
      plan.segments.push_back({i * g.K / parts, (i + 1) * g.K / parts});
  }
  run_rows<float>(g, plan, all_rows(g.M));
}

void gemm_drop_late(const ForwardGemm& g) {
  check_shapes(g);
  std::vector<int64_t> early, late;
  for (int64_t m = 0; m < g.M; ++m)
    (g.positions[static_cast<size_t>(m)] >= kDropLatePosition ? late : early).push_back(m);
  run_rows<float>(g, in_order_plan(g.K), early);
  ReductionPlan dropped = in_order_plan(g.K);
  if (g.K > kDropLateTerms) dropped.segments[0].end = g.K - kDropLateTerms;
  run_rows<float>(g, dropped, late);
}

struct VariantInfo {
  const char* name;
  const char* description;
  const char* preset;
  model::ForwardGemmKernel (*gemm)();
  bool batch_invariant;
  bool stored_weights = false;
};

const VariantInfo kVariants[] = {
    {"fp64", "fp32 operands, every linear GEMM accumulated in double and rounded once", "fp32",
     [] { return model::ForwardGemmKernel(gemm_fp64); }, true},
    {"fp32", "concord's GEMM: fp32 operands, one in-order fma chain per output", "fp32", nullptr,
     true},
    {"native", "a GGUF's Q4_0/Q4_1/Q8_0 weights as stored; activations in 8-bit blocks of 32, "
     "integer dot products (W4A8/W8A8, tensor/quant_gemm.h)", "fp32", nullptr, true, true},
    {"bf16", "the bf16 precision preset (bf16 weights and activations, fp32 accumulation)",
     "bf16", nullptr, true},
    {"mxfp8", "the mxfp8 precision preset (OCP MX e4m3, 32-element blocks)", "mxfp8", nullptr,
     true},
    {"mxfp4", "the mxfp4 precision preset (OCP MX e2m1, 32-element blocks)", "mxfp4", nullptr,
     true},
    {"nvfp4", "the nvfp4 precision preset (e2m1, 16-element blocks, e4m3 scales)", "nvfp4",
     nullptr, true},
    {"fp8-tensor", "the fp8-tensor precision preset (e4m3, one scale per tensor)", "fp8-tensor",
     nullptr, true},
    {"fp32-reversed", "fp32, every reduction over K run from the last term to the first", "fp32",
     [] { return model::ForwardGemmKernel(gemm_reversed); }, true},
    {"fp32-blocked", "fp32, K in blocks of 64 summed separately, block sums added pairwise",
     "fp32", [] { return model::ForwardGemmKernel(gemm_blocked); }, true},
    {"fp32-batch-split",
     "fp32, K split into clamp(M/4, 1, 8) parts by the GEMM's row count M (not batch-invariant)",
     "fp32", [] { return model::ForwardGemmKernel(gemm_batch_split); }, false},
    {"fp32-drop-late",
     "OUT OF CONTRACT: fp32, but rows at positions >= 64 drop the last 32 terms of K", "fp32",
     [] { return model::ForwardGemmKernel(gemm_drop_late); }, true},
};

}  // namespace

std::vector<std::string> kernel_names() {
  std::vector<std::string> names;
  for (const VariantInfo& v : kVariants) names.emplace_back(v.name);
  return names;
}

KernelVariant kernel_variant(std::string_view name) {
  for (const VariantInfo& v : kVariants) {
    if (name != v.name) continue;
    KernelVariant k;
    k.name = v.name;
    k.description = v.description;
    k.policy = PrecisionPolicy::preset(v.preset);
    if (v.gemm != nullptr) k.gemm = v.gemm();
    k.batch_invariant = v.batch_invariant;
    k.stored_weights = v.stored_weights;
    if (k.stored_weights) k.policy.name = "native";
    return k;
  }
  throw InputError(fmt::format("[audit] unknown kernel '{}' (known: {})", name,
                               fmt::join(kernel_names(), ", ")));
}

void apply_kernel(model::Model& model, const KernelVariant& kernel) {
  if (kernel.stored_weights && !model.has_stored_weights())
    throw InputError(fmt::format("[audit] kernel '{}' serves a GGUF's Q4_0/Q4_1/Q8_0 blocks as "
                                 "stored; this model has none loaded that way", kernel.name));
  if (!kernel.stored_weights && model.has_stored_weights())
    throw InputError(fmt::format("[audit] kernel '{}' runs on fp32 weights; this model serves its "
                                 "file's blocks as stored (load it dequantized)", kernel.name));
  model.set_policy(kernel.policy);  // invalidates the cached quantized weights
  model.set_forward_gemm_kernel(kernel.gemm);
}

}  // namespace concord::audit
