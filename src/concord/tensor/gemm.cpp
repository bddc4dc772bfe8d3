// The batch-invariant GEMM: the scalar reference, the blocked packing driver (OpenMP over M x N
// tiles), the generic microkernels, and the ISA dispatch. The AVX2 kernels are gemm_avx2.cpp,
// the AVX-512 wide tiles gemm_avx512.cpp.
#include "concord/tensor/gemm.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>

#include "concord/numerics/check.h"

namespace concord::tensor {
namespace {

using detail::kMR;
using detail::kNR;

// Blocking for Zen 3 (32 KiB L1d, 512 KiB L2 per core, 32 MiB L3 shared): a kKC x kNR B
// micropanel (16 KiB fp32) stays in L1 while the kernel sweeps the kMC x kKC A block (144 KiB)
// held in L2; the kKC x kNC B panel (up to 3 MiB) is shared by the threads through L3.
// kKC is even so that bf16 pairs never straddle two K blocks.
constexpr int64_t kKC = 256;
constexpr int64_t kMC = 144;   // multiple of kMR
constexpr int64_t kNC = 3072;  // multiple of kNR
static_assert(kKC % 2 == 0 && kMC % kMR == 0 && kNC % kNR == 0);

// Below this many multiply-adds the OpenMP fork costs more than it saves.
constexpr int64_t kParallelMinFlops = int64_t{1} << 21;

// A grow-only 64-byte aligned buffer (packing space: reused across calls, no per-call malloc).
template <class T>
class AlignedBuffer {
 public:
  T* get(int64_t n) {
    const auto need = static_cast<size_t>(std::max<int64_t>(n, 1));
    if (need > size_) {
      const size_t bytes = (need * sizeof(T) + 63) / 64 * 64;
      data_.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
      if (!data_) throw std::bad_alloc();
      size_ = need;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  size_t size_ = 0;
};

uint32_t bf16_bits(float x) { return std::bit_cast<uint32_t>(x) >> 16; }

// op(A)[i][k] and op(B)[k][j] for the four storage orders.
template <bool kTrans>
float a_at(const float* A, int64_t lda, int64_t i, int64_t k) {
  return kTrans ? A[k * lda + i] : A[i * lda + k];
}
template <bool kTrans>
float b_at(const float* B, int64_t ldb, int64_t k, int64_t j) {
  return kTrans ? B[j * ldb + k] : B[k * ldb + j];
}

// Packs rows [i0, i0 + rows) x steps [k0, k0 + kc) of op(A) into kMR-row micropanels, rows past
// the end zero (padding in M only).
template <bool kTrans>
void pack_a_f32(const float* A, int64_t lda, int64_t i0, int64_t rows, int64_t k0, int64_t kc,
                float* out) {
  for (int64_t p = 0; p < rows; p += kMR) {
    const int64_t mr = std::min<int64_t>(kMR, rows - p);
    float* panel = out + p * kc;
    for (int64_t k = 0; k < kc; ++k) {
      for (int64_t r = 0; r < kMR; ++r) {
        panel[k * kMR + r] = r < mr ? a_at<kTrans>(A, lda, i0 + p + r, k0 + k) : 0.0f;
      }
    }
  }
}

// Packs steps [k0, k0 + kc) x columns [j0, j0 + cols) of op(B) into kNR-column micropanels.
template <bool kTrans>
void pack_b_panel_f32(const float* B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0,
                      int64_t cols, float* panel) {
  if (!kTrans && cols == kNR) {
    for (int64_t k = 0; k < kc; ++k) std::memcpy(panel + k * kNR, B + (k0 + k) * ldb + j0, 64);
    return;
  }
  for (int64_t k = 0; k < kc; ++k) {
    for (int64_t j = 0; j < kNR; ++j) {
      panel[k * kNR + j] = j < cols ? b_at<kTrans>(B, ldb, k0 + k, j0 + j) : 0.0f;
    }
  }
}

// bf16 path, A side: the fp32 layout of pack_a_f32 holding bf16 values (low 16 bits cleared),
// i.e. widened while packing; the broadcast operand stays fp32 so the kernel spends no shifts
// on it. B side: bf16 pairs, word p of a column = bf16(step 2p) | bf16(step 2p + 1) << 16.
template <bool kTrans>
void pack_a_bf16(const float* A, int64_t lda, int64_t i0, int64_t rows, int64_t k0, int64_t kc,
                 float* out) {
  for (int64_t p = 0; p < rows; p += kMR) {
    const int64_t mr = std::min<int64_t>(kMR, rows - p);
    float* panel = out + p * kc;
    for (int64_t k = 0; k < kc; ++k) {
      for (int64_t r = 0; r < kMR; ++r) {
        panel[k * kMR + r] =
            r < mr ? std::bit_cast<float>(bf16_bits(a_at<kTrans>(A, lda, i0 + p + r, k0 + k)) << 16)
                   : 0.0f;
      }
    }
  }
}

template <bool kTrans>
void pack_b_panel_bf16(const float* B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0,
                       int64_t cols, uint32_t* panel) {
  const int64_t pairs = (kc + 1) / 2;
  for (int64_t q = 0; q < pairs; ++q) {
    const int64_t k = k0 + 2 * q;
    const bool has_hi = 2 * q + 1 < kc;
    for (int64_t j = 0; j < kNR; ++j) {
      uint32_t w = 0;
      if (j < cols) {
        w = bf16_bits(b_at<kTrans>(B, ldb, k, j0 + j));
        if (has_hi) w |= bf16_bits(b_at<kTrans>(B, ldb, k + 1, j0 + j)) << 16;
      }
      panel[q * kNR + j] = w;
    }
  }
}

// What differs between the fp32 and the bf16 path: the panel word, its packing, the kernel.
struct F32Panels {
  using AWord = float;
  using BWord = float;
  static int64_t b_words(int64_t kc) { return kc; }
  static void pack_a(Trans t, const float* A, int64_t lda, int64_t i0, int64_t rows, int64_t k0,
                     int64_t kc, AWord* out) {
    t == Trans::yes ? pack_a_f32<true>(A, lda, i0, rows, k0, kc, out)
                    : pack_a_f32<false>(A, lda, i0, rows, k0, kc, out);
  }
  static void pack_b(Trans t, const float* B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0,
                     int64_t cols, BWord* out) {
    t == Trans::yes ? pack_b_panel_f32<true>(B, ldb, k0, kc, j0, cols, out)
                    : pack_b_panel_f32<false>(B, ldb, k0, kc, j0, cols, out);
  }
  static detail::MicroKernelF32 kernel(const detail::MicroKernels& k) { return k.f32; }
  static detail::WideF32 wide(const detail::MicroKernels& k) { return k.wide.f32; }
};
struct Bf16Panels {
  using AWord = float;
  using BWord = uint32_t;
  static int64_t b_words(int64_t kc) { return (kc + 1) / 2; }
  static void pack_a(Trans t, const float* A, int64_t lda, int64_t i0, int64_t rows, int64_t k0,
                     int64_t kc, AWord* out) {
    t == Trans::yes ? pack_a_bf16<true>(A, lda, i0, rows, k0, kc, out)
                    : pack_a_bf16<false>(A, lda, i0, rows, k0, kc, out);
  }
  static void pack_b(Trans t, const float* B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0,
                     int64_t cols, BWord* out) {
    t == Trans::yes ? pack_b_panel_bf16<true>(B, ldb, k0, kc, j0, cols, out)
                    : pack_b_panel_bf16<false>(B, ldb, k0, kc, j0, cols, out);
  }
  static detail::MicroKernelBf16 kernel(const detail::MicroKernels& k) { return k.bf16; }
  static detail::WideBf16 wide(const detail::MicroKernels& k) { return k.wide.bf16; }
};

// Prepacked bf16 B (gemm_packed): A packed as fp32, never truncated — the bf16 panels widen
// exactly, so this is the fp32 product of A and B's (bf16) values. pack_b is never called.
struct Bf16BPanels {
  using AWord = float;
  using BWord = uint32_t;
  static int64_t b_words(int64_t kc) { return (kc + 1) / 2; }
  static void pack_a(Trans t, const float* A, int64_t lda, int64_t i0, int64_t rows, int64_t k0,
                     int64_t kc, AWord* out) {
    F32Panels::pack_a(t, A, lda, i0, rows, k0, kc, out);
  }
  static void pack_b(Trans t, const float* B, int64_t ldb, int64_t k0, int64_t kc, int64_t j0,
                     int64_t cols, BWord* out) {
    Bf16Panels::pack_b(t, B, ldb, k0, kc, j0, cols, out);
  }
  static detail::MicroKernelBf16 kernel(const detail::MicroKernels& k) { return k.bf16; }
  static detail::WideBf16 wide(const detail::MicroKernels& k) { return k.wide.bf16; }
};

void check_args(const char* op, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K,
                int64_t lda, int64_t ldb, int64_t ldc) {
  if (M < 0 || N < 0 || K < 0) {
    throw InputError(std::string("[") + op + "] negative shape M=" + std::to_string(M) +
                     " N=" + std::to_string(N) + " K=" + std::to_string(K));
  }
  const int64_t a_row = ta == Trans::no ? K : M, b_row = tb == Trans::no ? N : K;
  const bool a_used = M > 0 && K > 0, b_used = N > 0 && K > 0;
  if ((a_used && lda < a_row) || (b_used && ldb < b_row) || (M > 0 && N > 0 && ldc < N)) {
    throw InputError(std::string("[") + op + "] leading dimension too small: lda=" +
                     std::to_string(lda) + " (needs >= " + std::to_string(a_row) + "), ldb=" +
                     std::to_string(ldb) + " (needs >= " + std::to_string(b_row) +
                     "), ldc=" + std::to_string(ldc) + " (needs >= " + std::to_string(N) + ")");
  }
}

// The blocked driver. Loop order jc (N by kNC) > pc (K by kKC, in order) > M x N work units;
// every C element is owned by one unit per pc step, so its k loop runs in order on one thread.
// With one M block and one N block, column slices own their tiles for the whole K instead
// (pc inside the unit: no barrier between K steps).
// prepacked (gemm_packed): op(B)'s panels packed for the whole K (PackedB layout); the driver
// reads the kc-step slice of each instead of packing B (B and ldb are then unused).
template <class P>
void gemm_blocked(const detail::MicroKernels& kernels, Trans ta, Trans tb, int64_t M, int64_t N,
                  int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                  int64_t ldc, bool accumulate, const typename P::BWord* prepacked = nullptr) {
  using AWord = typename P::AWord;
  using BWord = typename P::BWord;
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < M; ++i) std::fill_n(C + i * ldc, N, 0.0f);
    }
    return;
  }
  const auto kernel = P::kernel(kernels);
  const auto wide = P::wide(kernels);  // null: every tile on `kernel`
  const int64_t kc_max = std::min(K, kKC);
  const int64_t nc_max = std::min(N, kNC);
  const int64_t nc_panels_max = (nc_max + kNR - 1) / kNR;

  static thread_local AlignedBuffer<BWord> b_buffer;  // the calling thread's, shared by the team
  BWord* b_pack =
      prepacked != nullptr ? nullptr : b_buffer.get(nc_panels_max * kNR * P::b_words(kc_max));
  const int64_t prepacked_panel_words = P::b_words(K) * kNR;

  const double flops = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  const int threads = (omp_in_parallel() || flops < static_cast<double>(kParallelMinFlops))
                          ? 1
                          : omp_get_max_threads();
  const int64_t m_blocks = (M + kMC - 1) / kMC;

  static thread_local AlignedBuffer<AWord> a_buffer;  // each thread's own

  // Rows [ir0, mc) of panel p (A packed at a_pack) on the kMR x kNR kernel.
  auto run_narrow = [&](const AWord* a_pack, float* edge, int64_t jc, int64_t ic, int64_t mc,
                        int64_t ir0, int64_t p, int64_t p_begin, int64_t kc, bool load_c,
                        const BWord* b_first, int64_t b_stride) {
    const int64_t j = jc + p * kNR;
    const int64_t nr = std::min<int64_t>(kNR, N - j);
    const BWord* b_panel = b_first + (p - p_begin) * b_stride;
    for (int64_t ir = ir0; ir < mc; ir += kMR) {
      const int64_t mr = std::min<int64_t>(kMR, mc - ir);
      const AWord* a_panel = a_pack + ir * kc;
      float* c = C + (ic + ir) * ldc + j;
      if (mr == kMR && nr == kNR) {
        kernel(kc, a_panel, b_panel, c, ldc, load_c);
        continue;
      }
      // Edge tile: run the full tile on a scratch copy, write back the valid part.
      if (load_c) {
        for (int64_t r = 0; r < mr; ++r) std::copy_n(c + r * ldc, nr, edge + r * kNR);
      }
      kernel(kc, a_panel, b_panel, edge, kNR, load_c);
      for (int64_t r = 0; r < mr; ++r) std::copy_n(edge + r * kNR, nr, c + r * ldc);
    }
  };

  // The tiles of rows [ic, ic + mc) x panels [p_begin, p_end) of column block jc for one K step
  // of kc: packs the A block, then one kernel call per microtile. Panel p's words for this step
  // are at b_first + (p - p_begin) * b_stride. With wide kernels, two full panels at a time run
  // their 12-row groups as one wide tile each and the rows left (fewer than 12) on the narrow
  // kernel, panel by panel: each C element still gets its kc steps from one kernel call, in order.
  auto run_tiles = [&](AWord* a_pack, float* edge, int64_t jc, int64_t ic, int64_t mc,
                       int64_t p_begin, int64_t p_end, int64_t pc, int64_t kc, bool load_c,
                       const BWord* b_first, int64_t b_stride) {
    P::pack_a(ta, A, lda, ic, mc, pc, kc, a_pack);
    for (int64_t p = p_begin; p < p_end; ++p) {
      const int64_t j = jc + p * kNR;
      int64_t ir0 = 0;  // the first row left for the narrow kernel
      if (wide != nullptr && p + 1 < p_end && j + detail::kWideNR <= N) {
        const BWord* b_pair = b_first + (p - p_begin) * b_stride;
        for (; ir0 + detail::kWideMR <= mc; ir0 += detail::kWideMR) {
          wide(kc, a_pack + ir0 * kc, kMR * kc, b_pair, b_stride, C + (ic + ir0) * ldc + j, ldc,
               load_c);
        }
        if (ir0 == mc) {
          ++p;  // both panels done
          continue;
        }
      }
      // The rows [ir0, mc) of panel p — and, when a wide pair ran, of panel p + 1 too.
      const int64_t last = ir0 > 0 ? p + 1 : p;
      for (int64_t q = p; q <= last; ++q) run_narrow(a_pack, edge, jc, ic, mc, ir0, q, p_begin,
                                                      kc, load_c, b_first, b_stride);
      p = last;
    }
  };

  // One M block and one N block (the weight-gradient shapes of small models: M = 32..144,
  // K = the batch's tokens): column slices own their C tiles for the whole K, each packing its
  // own B panels, so the K steps need no barrier at all — the same kernel calls in the same
  // order per C element as below, hence the same bits.
  if (m_blocks == 1 && N <= kNC) {
    static thread_local AlignedBuffer<BWord> slice_buffer;  // each thread's own B panels
    const int64_t panels = (N + kNR - 1) / kNR;
    const int64_t n_parts = std::min<int64_t>(panels, 4 * threads);
    const int64_t panels_per_part = (panels + n_parts - 1) / n_parts;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (threads > 1)
    for (int64_t part = 0; part < n_parts; ++part) {
      const int64_t p_begin = part * panels_per_part;
      const int64_t p_end = std::min(panels, p_begin + panels_per_part);
      if (p_begin >= p_end) continue;
      AWord* a_pack = a_buffer.get(kMC * kc_max);
      BWord* b_slice = prepacked != nullptr
                           ? nullptr
                           : slice_buffer.get(panels_per_part * kNR * P::b_words(kc_max));
      alignas(64) float edge[kMR * kNR];
      for (int64_t pc = 0; pc < K; pc += kKC) {
        const int64_t kc = std::min(kKC, K - pc);
        const int64_t words = P::b_words(kc);
        if (prepacked == nullptr) {
          for (int64_t p = p_begin; p < p_end; ++p) {
            P::pack_b(tb, B, ldb, pc, kc, p * kNR, std::min<int64_t>(kNR, N - p * kNR),
                      b_slice + (p - p_begin) * kNR * words);
          }
        }
        const BWord* b_first = prepacked != nullptr
                                   ? prepacked + p_begin * prepacked_panel_words + P::b_words(pc) * kNR
                                   : b_slice;
        run_tiles(a_pack, edge, 0, 0, M, p_begin, p_end, pc, kc, accumulate || pc > 0, b_first,
                  prepacked != nullptr ? prepacked_panel_words : kNR * words);
      }
    }
    return;
  }

#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    AWord* a_pack = a_buffer.get(kMC * kc_max);
    alignas(64) float edge[kMR * kNR];

    for (int64_t jc = 0; jc < N; jc += kNC) {
      const int64_t nc = std::min(kNC, N - jc);
      const int64_t panels = (nc + kNR - 1) / kNR;
      // With few M blocks (the weight-gradient shapes, M = 512), split N too so both threads
      // get work; each unit packs its own A block.
      const int64_t n_parts =
          threads == 1 ? 1
                       : std::min<int64_t>(panels, std::max<int64_t>(
                                                       1, (4 * threads + m_blocks - 1) / m_blocks));
      const int64_t panels_per_part = (panels + n_parts - 1) / n_parts;
      for (int64_t pc = 0; pc < K; pc += kKC) {
        const int64_t kc = std::min(kKC, K - pc);
        const int64_t words = P::b_words(kc);
        const bool load_c = accumulate || pc > 0;
        const bool last_step = jc + kNC >= N && pc + kKC >= K;
        if (prepacked == nullptr) {
#pragma omp for schedule(static)
          for (int64_t p = 0; p < panels; ++p) {
            P::pack_b(tb, B, ldb, pc, kc, jc + p * kNR, std::min<int64_t>(kNR, nc - p * kNR),
                      b_pack + p * kNR * words);
          }
        }
        // nowait + the barrier below: the next step's packing and tiles wait for this step's
        // tiles; after the last step the region's own join is the only wait (one barrier less
        // per call; under the passive wait policy each barrier is a sleep and a wake-up).
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t unit = 0; unit < m_blocks * n_parts; ++unit) {
          const int64_t ic = (unit / n_parts) * kMC;
          const int64_t p_begin = (unit % n_parts) * panels_per_part;
          const int64_t p_end = std::min(panels, p_begin + panels_per_part);
          if (p_begin >= p_end) continue;
          const BWord* b_first =
              prepacked != nullptr
                  ? prepacked + (jc / kNR + p_begin) * prepacked_panel_words + P::b_words(pc) * kNR
                  : b_pack + p_begin * kNR * words;
          run_tiles(a_pack, edge, jc, ic, std::min(kMC, M - ic), p_begin, p_end, pc, kc, load_c,
                    b_first, prepacked != nullptr ? prepacked_panel_words : kNR * words);
        }
        if (!last_step) {
#pragma omp barrier
        }
      }
    }
  }
}

// ---- gemm_packed's skinny path (M <= kSkinnyMaxM: decode) ------------------------------------
//
// Column blocks of kSkinnyPanels panels (64 columns) are split statically over the threads; in a
// block, the rows run in groups of <= kSkinnyRows, each group against as many panels at once as
// its accumulators allow (1 row: 4 panels = 8 ymm; 2-3 rows: 2; 4 rows: 1), so every k step is
// one fma per accumulator, in order. With two row groups K runs in chunks of kSkinnyKC steps
// (the chunk of the panels stays in L2 for the second group; partial sums go through C in fp32,
// exact). Edge columns (N not a multiple of 16) run on a scratch tile.
constexpr int64_t kSkinnyMaxM = 8;
constexpr int64_t kSkinnyKC = 512;  // even: bf16 pairs never straddle two chunks
static_assert(kSkinnyKC % 2 == 0);
// Below this many weight elements one thread streams them faster than a fork costs.
constexpr int64_t kSkinnyParallelMin = int64_t{1} << 16;

int skinny_panels_per_call(int rows) { return rows == 1 ? 4 : rows <= 3 ? 2 : 1; }

template <class BWord>
int64_t step_words(int64_t k) {
  return std::is_same_v<BWord, float> ? k : (k + 1) / 2;
}

template <class BWord, class Kernel>
void gemm_skinny(Kernel kernel, Trans ta, int64_t M, int64_t N, int64_t K, const float* A,
                 int64_t lda, const BWord* packed, int64_t panel_words, float* C, int64_t ldc,
                 bool accumulate) {
  using detail::kSkinnyPanels;
  using detail::kSkinnyRows;
  const int groups = static_cast<int>((M + kSkinnyRows - 1) / kSkinnyRows);
  const int64_t chunk = groups == 1 ? K : kSkinnyKC;
  const int64_t panels = (N + kNR - 1) / kNR;
  const int64_t blocks = (panels + kSkinnyPanels - 1) / kSkinnyPanels;
  const int64_t a_rs = ta == Trans::no ? lda : 1, a_ks = ta == Trans::no ? 1 : lda;
  const int threads = (omp_in_parallel() || N * K < kSkinnyParallelMin)
                          ? 1
                          : static_cast<int>(std::min<int64_t>(omp_get_max_threads(), blocks));
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    alignas(64) float edge[kSkinnyRows * kSkinnyPanels * kNR];
    constexpr int64_t kEdgeLd = kSkinnyPanels * kNR;
    const int64_t p0 = blk * kSkinnyPanels;
    const int64_t p_end = std::min(panels, p0 + kSkinnyPanels);
    for (int64_t pc = 0; pc < K; pc += chunk) {
      const int64_t kc = std::min(chunk, K - pc);
      const bool load_c = accumulate || pc > 0;
      int64_t r0 = 0;
      for (int g = 0; g < groups; ++g) {
        const int rows = static_cast<int>(M / groups + (g < M % groups ? 1 : 0));
        const float* a = A + r0 * a_rs + pc * a_ks;
        const int per_call = skinny_panels_per_call(rows);
        for (int64_t p = p0; p < p_end; p += per_call) {
          const int np = static_cast<int>(std::min<int64_t>(per_call, p_end - p));
          const int64_t j = p * kNR, cols = std::min<int64_t>(np * kNR, N - j);
          const BWord* b = packed + p * panel_words + step_words<BWord>(pc) * kNR;
          float* c = C + r0 * ldc + j;
          if (cols == np * kNR) {
            kernel(rows, np, kc, a, a_rs, a_ks, b, panel_words, c, ldc, load_c);
            continue;
          }
          if (load_c) {
            for (int r = 0; r < rows; ++r) std::copy_n(c + r * ldc, cols, edge + r * kEdgeLd);
          }
          kernel(rows, np, kc, a, a_rs, a_ks, b, panel_words, edge, kEdgeLd, load_c);
          for (int r = 0; r < rows; ++r) std::copy_n(edge + r * kEdgeLd, cols, c + r * ldc);
        }
        r0 += rows;
      }
    }
  }
}

float widen_lo(uint32_t w) { return std::bit_cast<float>(w << 16); }
float widen_hi(uint32_t w) { return std::bit_cast<float>(w & 0xFFFF0000u); }

// Generic skinny kernel: one std::fma per (row, column, step), k in order. `b_at(panel, k, j)`
// reads element j of step k of a panel (fp32 panels, or bf16 pairs widened).
template <class BAt>
void generic_skinny(int rows, int panels, int64_t kc, const float* a, int64_t a_rs, int64_t a_ks,
                    BAt b_at, float* c, int64_t ldc, bool load_c) {
  float acc[detail::kSkinnyRows][detail::kSkinnyPanels * kNR];
  const int cols = panels * kNR;
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j) acc[r][j] = load_c ? c[r * ldc + j] : 0.0f;
  }
  for (int64_t k = 0; k < kc; ++k) {
    for (int r = 0; r < rows; ++r) {
      const float av = a[r * a_rs + k * a_ks];
      for (int p = 0; p < panels; ++p) {
        for (int j = 0; j < kNR; ++j)
          acc[r][p * kNR + j] = std::fma(av, b_at(p, k, j), acc[r][p * kNR + j]);
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j) c[r * ldc + j] = acc[r][j];
  }
}

void generic_skinny_f32(int rows, int panels, int64_t kc, const float* a, int64_t a_rs,
                        int64_t a_ks, const float* b, int64_t panel_stride, float* c,
                        int64_t ldc, bool load_c) {
  generic_skinny(rows, panels, kc, a, a_rs, a_ks,
                 [&](int p, int64_t k, int j) { return b[p * panel_stride + k * kNR + j]; }, c,
                 ldc, load_c);
}

void generic_skinny_bf16(int rows, int panels, int64_t kc, const float* a, int64_t a_rs,
                         int64_t a_ks, const uint32_t* b, int64_t panel_stride, float* c,
                         int64_t ldc, bool load_c) {
  generic_skinny(rows, panels, kc, a, a_rs, a_ks,
                 [&](int p, int64_t k, int j) {
                   const uint32_t w = b[p * panel_stride + (k / 2) * kNR + j];
                   return (k & 1) != 0 ? widen_hi(w) : widen_lo(w);
                 },
                 c, ldc, load_c);
}

// Generic microkernels: the same loop nest as the AVX2 ones, one std::fma per step.
void generic_f32(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, bool load_c) {
  float acc[kMR][kNR];
  for (int r = 0; r < kMR; ++r) {
    for (int j = 0; j < kNR; ++j) acc[r][j] = load_c ? c[r * ldc + j] : 0.0f;
  }
  for (int64_t k = 0; k < kc; ++k) {
    for (int r = 0; r < kMR; ++r) {
      for (int j = 0; j < kNR; ++j) acc[r][j] = std::fma(a[k * kMR + r], b[k * kNR + j], acc[r][j]);
    }
  }
  for (int r = 0; r < kMR; ++r) {
    for (int j = 0; j < kNR; ++j) c[r * ldc + j] = acc[r][j];
  }
}


void generic_bf16(int64_t kc, const float* a, const uint32_t* b, float* c, int64_t ldc,
                  bool load_c) {
  float acc[kMR][kNR];
  for (int r = 0; r < kMR; ++r) {
    for (int j = 0; j < kNR; ++j) acc[r][j] = load_c ? c[r * ldc + j] : 0.0f;
  }
  for (int64_t k = 0; k < kc; ++k) {
    const int64_t q = k / 2;
    const bool hi = (k & 1) != 0;
    for (int r = 0; r < kMR; ++r) {
      const float av = a[k * kMR + r];
      for (int j = 0; j < kNR; ++j) {
        const uint32_t bw = b[q * kNR + j];
        acc[r][j] = std::fma(av, hi ? widen_hi(bw) : widen_lo(bw), acc[r][j]);
      }
    }
  }
  for (int r = 0; r < kMR; ++r) {
    for (int j = 0; j < kNR; ++j) c[r * ldc + j] = acc[r][j];
  }
}

// AMD family 19h (Zen 3, Zen 4) executes a 512-bit FMA as two 256-bit halves: the wide tiles
// gain nothing there and measured up to 11% slower than the AVX2 ones on one Zen 4 core
// (bench/README.md, "GEMM"), so it keeps avx2 unless CONCORD_ISA=avx512 asks for them.
bool wide_fma_pays() {
  __builtin_cpu_init();
  return !__builtin_cpu_is("amdfam19h");
}

// The best kernel set the CPU supports (avx512 only where wide_fma_pays), lowered by
// CONCORD_ISA=generic|avx2 (wide16, the numerics kernels' AVX2 build, counts as avx2) or set to
// avx512 by CONCORD_ISA=avx512 where the CPU has it; the numerics kernels validate the value.
GemmIsa initial_isa() {
  const bool avx512 = gemm_isa_supported(GemmIsa::avx512);
  GemmIsa best = avx512 && wide_fma_pays()            ? GemmIsa::avx512
                 : gemm_isa_supported(GemmIsa::avx2) ? GemmIsa::avx2
                                                     : GemmIsa::generic;
  const char* forced = std::getenv("CONCORD_ISA");
  if (forced != nullptr) {
    const std::string_view f(forced);
    if (f == "generic") best = GemmIsa::generic;
    if ((f == "avx2" || f == "wide16") && best == GemmIsa::avx512) best = GemmIsa::avx2;
    if (f == "avx512" && avx512) best = GemmIsa::avx512;
  }
  return best;
}

std::atomic<GemmIsa>& isa_state() {
  static std::atomic<GemmIsa> isa{initial_isa()};
  return isa;
}

detail::MicroKernels active_kernels() {
  switch (isa_state().load(std::memory_order_relaxed)) {
    case GemmIsa::avx512: {
      detail::MicroKernels k = detail::avx2_kernels();
      k.wide = detail::avx512_wide_kernels();
      return k;
    }
    case GemmIsa::avx2:
      return detail::avx2_kernels();
    case GemmIsa::generic:
      break;
  }
  return detail::generic_kernels();
}

}  // namespace

namespace detail {
MicroKernels generic_kernels() {
  return {generic_f32, generic_bf16, generic_skinny_f32, generic_skinny_bf16, {nullptr, nullptr}};
}
}  // namespace detail

void gemm_reference(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                    bool accumulate) {
  check_args("gemm_reference", ta, tb, M, N, K, lda, ldb, ldc);
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      float acc = accumulate ? C[i * ldc + j] : 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        const float a = ta == Trans::no ? A[i * lda + k] : A[k * lda + i];
        const float b = tb == Trans::no ? B[k * ldb + j] : B[j * ldb + k];
        acc = std::fma(a, b, acc);
      }
      C[i * ldc + j] = acc;
    }
  }
}

void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  check_args("gemm", ta, tb, M, N, K, lda, ldb, ldc);
  gemm_blocked<F32Panels>(active_kernels(), ta, tb, M, N, K, A, lda, B, ldb, C, ldc, accumulate);
}

void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  check_args("gemm_bf16", ta, tb, M, N, K, lda, ldb, ldc);
  gemm_blocked<Bf16Panels>(active_kernels(), ta, tb, M, N, K, A, lda, B, ldb, C, ldc,
                           accumulate);
}

void pack_b(PackedB& out, Trans tb, int64_t K, int64_t N, const float* B, int64_t ldb,
            bool bf16) {
  check_args("pack_b", Trans::no, tb, 0, N, K, 0, ldb, 0);
  if (N > 0 && K > 0 && B == nullptr) throw InputError("[pack_b] null B for a non-empty shape");
  out.clear();
  out.bf16 = bf16;
  out.tb = tb;
  out.K = K;
  out.N = N;
  const int64_t panels = (N + kNR - 1) / kNR, words = out.panel_words();
  const auto total = static_cast<size_t>(panels * words);
  if (bf16) {
    out.f32 = {};
    out.words.resize(total);
  } else {
    out.words = {};
    out.f32.resize(total);
  }
  const bool parallel = !omp_in_parallel() && N * K >= kSkinnyParallelMin;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t cols = std::min<int64_t>(kNR, N - p * kNR);
    if (bf16) {
      Bf16Panels::pack_b(tb, B, ldb, 0, K, p * kNR, cols, out.words.data() + p * words);
    } else {
      F32Panels::pack_b(tb, B, ldb, 0, K, p * kNR, cols, out.f32.data() + p * words);
    }
  }
  out.valid = true;
}

void gemm_packed(Trans ta, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                 const PackedB& B, float* C, int64_t ldc, bool accumulate) {
  if (!B.valid || B.K != K || B.N != N) {
    throw InputError("[gemm_packed] packed B is " +
                     (B.valid ? std::to_string(B.K) + "x" + std::to_string(B.N)
                              : std::string("not packed")) +
                     ", the GEMM needs K=" + std::to_string(K) + " N=" + std::to_string(N));
  }
  check_args("gemm_packed", ta, Trans::no, M, N, K, lda, N, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < M; ++i) std::fill_n(C + i * ldc, N, 0.0f);
    }
    return;
  }
  const detail::MicroKernels kernels = active_kernels();
  const int64_t words = B.panel_words();
  if (M <= kSkinnyMaxM) {
    if (B.bf16) {
      gemm_skinny<uint32_t>(kernels.skinny_bf16, ta, M, N, K, A, lda, B.words.data(), words, C,
                            ldc, accumulate);
    } else {
      gemm_skinny<float>(kernels.skinny_f32, ta, M, N, K, A, lda, B.f32.data(), words, C, ldc,
                         accumulate);
    }
    return;
  }
  if (B.bf16) {
    gemm_blocked<Bf16BPanels>(kernels, ta, Trans::no, M, N, K, A, lda, nullptr, 0, C, ldc,
                              accumulate, B.words.data());
  } else {
    gemm_blocked<F32Panels>(kernels, ta, Trans::no, M, N, K, A, lda, nullptr, 0, C, ldc,
                            accumulate, B.f32.data());
  }
}

bool gemm_isa_supported(GemmIsa isa) {
  if (isa == GemmIsa::generic) return true;
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return isa == GemmIsa::avx2 ? avx2 : avx2 && __builtin_cpu_supports("avx512f");
}

GemmIsa gemm_isa() { return isa_state().load(std::memory_order_relaxed); }

const char* gemm_isa_name() {
  switch (gemm_isa()) {
    case GemmIsa::avx512:
      return "avx512";
    case GemmIsa::avx2:
      return "avx2";
    case GemmIsa::generic:
      break;
  }
  return "generic";
}

void set_gemm_isa(GemmIsa isa) {
  if (!gemm_isa_supported(isa)) {
    throw InputError(isa == GemmIsa::avx512
                         ? "[gemm] this CPU lacks AVX-512F (or AVX2+FMA); use GemmIsa::avx2 or generic"
                         : "[gemm] this CPU lacks AVX2+FMA; use GemmIsa::generic");
  }
  isa_state().store(isa, std::memory_order_relaxed);
}

}  // namespace concord::tensor
