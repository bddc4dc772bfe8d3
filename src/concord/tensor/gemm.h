// GEMM: C = op(A)·op(B) (+ C), fp32, row-major — batch-invariant and bit-reproducible.
//
// Contract (gemm_reference is its plain statement): for every output element (i, j)
//   acc = accumulate ? C[i][j] : +0.0f;
//   for k = 0 .. K-1:  acc = fma(op(A)[i][k], op(B)[k][j], acc);
//   C[i][j] = acc;
// gemm() returns exactly these bits for every shape, transpose, leading dimension, thread count
// and ISA. Why: one accumulator per element and k strictly in order make a row's result
// independent of M (batch invariance: a sequence's logits do not depend on what it is batched
// with), of the OpenMP thread count, and of which process runs it (learner = sampler).
//
// How the fast path keeps the contract: K is blocked (the partial sum is stored to C in fp32 and
// reloaded — exact), never split across threads or SIMD lanes; edge tiles are zero-padded in M
// and N only (padding K would run fma(0, 0, -0) = +0 and change a -0 result); OpenMP splits the
// M x N tiles only. Kernels: AVX2+FMA 6x16 (gemm_avx2.cpp) when the CPU has them, with AVX-512
// 12x32 tiles (gemm_avx512.cpp) where it has AVX-512F too, else a generic kernel with the same
// blocking through std::fma (the same operation, so the same bits).
// CONCORD_ISA=generic|avx2 lowers the kernel set (as for the numerics kernels).
//
// Shapes: op(A) is M x K — A is stored (M, K) with row stride lda when ta == no, (K, M) when
// ta == yes; op(B) is K x N — B stored (K, N) with stride ldb when tb == no, (N, K) when yes.
// C is (M, N) with row stride ldc. Leading dimensions must be >= the stored row length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

namespace concord::tensor {

enum class Trans : uint8_t { no, yes };

namespace detail {
// 64-byte aligned storage for std::vector (the kernels load packed panels with aligned loads).
template <class T>
struct AlignedAllocator {
  using value_type = T;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)
  T* allocate(size_t n) {
    const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) noexcept { std::free(p); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const noexcept {
    return true;
  }
};
}  // namespace detail

void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate = false);

// The same product for operands whose every value is bf16-representable (the low 16 bits of
// each fp32 are zero): the packed B panels (the operand each kernel call streams kc x 16 of)
// are bf16 pairs, half the bytes, widened to fp32 in the kernel by a 16-bit shift or a mask;
// the A panels, broadcast one value at a time, are widened while packing. The widening is exact, so the result equals gemm() and
// gemm_reference() bit for bit. Values that are not bf16 are truncated to bf16 when packed.
void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate = false);

// op(B) (K x N) packed once into the panel layout the kernels stream (for an operand reused across
// many GEMMs: a weight). Panel p holds columns [16p, 16p + 16) for every k in order: K groups of
// 16 floats, or with bf16, ceil(K/2) groups of 16 bf16-pair words (step 2q low, 2q + 1 high, an
// odd K's last high half zero and never multiplied); columns past N are zero. gemm_packed then
// skips the per-call packing of B: for M <= 8 (decode) a skinny kernel streams each panel once,
// R <= 4 rows against up to 4 panels, reading op(A) where it lies; larger M run the blocked
// driver on slices of the same panels. Both keep the contract: gemm_packed(A, pack_b(B)) equals
// gemm_reference(A, B) bit for bit — with bf16 panels, when B's values are bf16-representable
// (others are truncated to bf16, as gemm_bf16 does). A is used as it is (never truncated): a
// bf16 panel widens exactly, so the products are those of the fp32 path.
struct PackedB {
  bool valid = false;  // packed (K and N may be 0)
  bool bf16 = false;   // the panels hold bf16 pairs (else fp32)
  Trans tb = Trans::no;  // the storage order it was packed from (for the caller's bookkeeping)
  int64_t K = 0, N = 0;
  std::vector<float, detail::AlignedAllocator<float>> f32;         // when !bf16
  std::vector<uint32_t, detail::AlignedAllocator<uint32_t>> words;  // when bf16
  // Words (floats or bf16 pairs) per panel: 16 per step, or per pair of steps.
  int64_t panel_words() const { return (bf16 ? (K + 1) / 2 : K) * 16; }
  void clear() { valid = false; }  // keeps the storage for the next pack_b
};

// Packs op(B) (B stored (K, N) with stride ldb when tb == no, (N, K) when yes) into out.
void pack_b(PackedB& out, Trans tb, int64_t K, int64_t N, const float* B, int64_t ldb, bool bf16);

// C = op(A)·op(B) (+ C) with op(B) prepacked; the gemm() contract. B.K and B.N must equal K, N.
void gemm_packed(Trans ta, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                 const PackedB& B, float* C, int64_t ldc, bool accumulate = false);

// The plain triple loop that defines the contract (what the tests compare against).
void gemm_reference(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                    bool accumulate = false);

// avx512: the AVX2 kernels plus 12 x 32 AVX-512 tiles for the blocked driver's full tiles (the
// same per-element steps in the same order, so the same bits).
enum class GemmIsa : uint8_t { generic, avx2, avx512 };
// Whether this CPU can run the kernel set (generic: always; avx512 needs AVX-512F and AVX2+FMA).
bool gemm_isa_supported(GemmIsa isa);
// The kernel set in use: the best the CPU supports — avx512 where it has AVX-512F, except AMD
// family 19h (Zen 4 splits 512-bit FMAs in two: avx2 measured faster there) — lowered by
// CONCORD_ISA=generic|avx2 (wide16 counts as avx2), or avx512 wherever supported with
// CONCORD_ISA=avx512.
GemmIsa gemm_isa();
const char* gemm_isa_name();  // "avx512", "avx2" or "generic"
// Switches the kernels (tests, benchmarks). Throws InputError if the CPU lacks the ISA. Not
// meant to race with GEMMs running at the same time.
void set_gemm_isa(GemmIsa isa);

}  // namespace concord::tensor

// Internal: the microkernels the blocked driver (gemm.cpp) calls, one set per ISA.
namespace concord::tensor::detail {

inline constexpr int kMR = 6;   // rows of a microtile (broadcast from the packed A panel)
inline constexpr int kNR = 16;  // columns of a microtile (two 8-float vectors of packed B)

// C tile (kMR x kNR at c, row stride ldc) = [C +] Σ_k a[k] ⊗ b[k], k in order, one fma each.
// fp32 panels: a holds kc groups of kMR floats, b kc groups of kNR floats.
// bf16 panels: a as for fp32 (values already bf16, widened when packed); b holds ceil(kc/2)
// groups of kNR words, word = (lo 16 bits, hi 16 bits) = (bf16 of step 2p, bf16 of step 2p+1);
// an odd kc leaves the last hi half unused (never multiplied: K is not padded).
using MicroKernelF32 = void (*)(int64_t kc, const float* a, const float* b, float* c,
                                int64_t ldc, bool load_c);
using MicroKernelBf16 = void (*)(int64_t kc, const float* a, const uint32_t* b, float* c,
                                 int64_t ldc, bool load_c);
// Skinny kernels (gemm_packed, M <= 8): C rows [0, rows) x columns [0, 16·panels) at c, row
// stride ldc, = [C +] Σ_k op(A)[r][k] · panel[k], k = 0 .. kc-1 in order, one fma each.
// rows 1..kSkinnyRows, panels 1..kSkinnyPanels; op(A)[r][k] = a[r·a_rs + k·a_ks]; panel i
// starts at b + i·panel_stride (64-byte aligned), laid out as PackedB's (fp32 or bf16 pairs;
// kc may be odd only for the last K chunk).
inline constexpr int kSkinnyRows = 4;
inline constexpr int kSkinnyPanels = 4;
using SkinnyF32 = void (*)(int rows, int panels, int64_t kc, const float* a, int64_t a_rs,
                           int64_t a_ks, const float* b, int64_t panel_stride, float* c,
                           int64_t ldc, bool load_c);
using SkinnyBf16 = void (*)(int rows, int panels, int64_t kc, const float* a, int64_t a_rs,
                            int64_t a_ks, const uint32_t* b, int64_t panel_stride, float* c,
                            int64_t ldc, bool load_c);
// Wide kernels (optional, AVX-512): a kWideMR x kWideNR tile = two kMR-row A panels (the second
// at a + a_stride) against two kNR-column B panels (the second at b + b_stride), the panel layouts
// above; per C element the same steps in the same order as the kMR x kNR kernels.
inline constexpr int kWideMR = 2 * kMR;
inline constexpr int kWideNR = 2 * kNR;
using WideF32 = void (*)(int64_t kc, const float* a, int64_t a_stride, const float* b,
                         int64_t b_stride, float* c, int64_t ldc, bool load_c);
using WideBf16 = void (*)(int64_t kc, const float* a, int64_t a_stride, const uint32_t* b,
                          int64_t b_stride, float* c, int64_t ldc, bool load_c);
struct WideKernels {
  WideF32 f32;
  WideBf16 bf16;
};
struct MicroKernels {
  MicroKernelF32 f32;
  MicroKernelBf16 bf16;
  SkinnyF32 skinny_f32;
  SkinnyBf16 skinny_bf16;
  WideKernels wide;  // null pointers: the driver uses the kMR x kNR kernels for every tile
};
MicroKernels generic_kernels();
MicroKernels avx2_kernels();  // only call when gemm_isa_supported(GemmIsa::avx2)
WideKernels avx512_wide_kernels();  // only call when gemm_isa_supported(GemmIsa::avx512)

}  // namespace concord::tensor::detail
