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
// M x N tiles only. Kernels: AVX2+FMA 6x16 (gemm_avx2.cpp) when the CPU has them, else a generic
// kernel with the same blocking through std::fma (the same operation, so the same bits).
// CONCORD_ISA=generic forces the generic kernel (as for the numerics kernels).
//
// Shapes: op(A) is M x K — A is stored (M, K) with row stride lda when ta == no, (K, M) when
// ta == yes; op(B) is K x N — B stored (K, N) with stride ldb when tb == no, (N, K) when yes.
// C is (M, N) with row stride ldc. Leading dimensions must be >= the stored row length.
#pragma once

#include <cstdint>

namespace concord::tensor {

enum class Trans : uint8_t { no, yes };

void gemm(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate = false);

// The same product for operands whose every value is bf16-representable (the low 16 bits of
// each fp32 are zero): the packed B panels (the operand each kernel call streams kc x 16 of)
// are bf16 pairs, half the bytes, widened to fp32 in the kernel by a 16-bit shift or a mask;
// the A panels, broadcast one value at a time, are widened while packing. The widening is exact, so the result equals gemm() and
// gemm_reference() bit for bit. Values that are not bf16 are truncated to bf16 when packed.
void gemm_bf16(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate = false);

// The plain triple loop that defines the contract (what the tests compare against).
void gemm_reference(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A,
                    int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                    bool accumulate = false);

enum class GemmIsa : uint8_t { generic, avx2 };
// Whether this CPU can run the kernel set (generic: always).
bool gemm_isa_supported(GemmIsa isa);
// The kernel set in use: avx2 when supported unless CONCORD_ISA=generic.
GemmIsa gemm_isa();
const char* gemm_isa_name();  // "avx2" or "generic"
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
struct MicroKernels {
  MicroKernelF32 f32;
  MicroKernelBf16 bf16;
};
MicroKernels generic_kernels();
MicroKernels avx2_kernels();  // only call when gemm_isa_supported(GemmIsa::avx2)

}  // namespace concord::tensor::detail
