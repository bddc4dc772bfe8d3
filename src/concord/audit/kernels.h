// Named serving-kernel variants over one concord model, for kernel contracts: each is a
// precision policy (which operands are quantized, model/policy.h) plus, optionally, a
// replacement for the linear layers' forward GEMM (Model::set_forward_gemm_kernel) with another
// reduction order or accumulation precision. Applying one to a Model changes how it computes
// logits, never its weights.
//
//   fp64              fp32 operands, every linear GEMM accumulated in double, rounded once
//   fp32              concord's GEMM (the in-order fma chain, gemm.h)
//   bf16, mxfp8, mxfp4, nvfp4, fp8-tensor   the precision presets (model/policy.h)
//   fp32-reversed     fp32, the reduction over K run from the last term to the first
//   fp32-blocked      fp32, K cut into blocks of 64 summed separately, then the partial sums
//                     added pairwise (a split-K / tree-reduction GEMM blocking)
//   fp32-batch-split  fp32, a batch-size-dependent reduction: the number of K splits grows
//                     with the GEMM's row count M (as split-K heuristics in serving kernels do),
//                     so a row's logits depend on how many rows ran with it
//   fp32-drop-late    OUT OF CONTRACT on purpose: like fp32, but rows at positions ≥ 64 drop
//                     the last 32-term block of every reduction (a kernel bug that only long
//                     sequences hit); for showing that `contract check` names the slice
//
// The exact orders (each output y[m][n] = Σ_k a[m][k]·b[n][k] of a forward GEMM; every fp32
// chain is acc = fma(a, b, acc) from +0; the per-tensor scales are applied after the sum as
// gemm_prepared does: s = fl(s_a·s_b), y = Σ if s == 1, else fl(s·Σ)):
//   fp64              one chain over k = 0..K-1 in double (exact products), rounded to fp32 once
//   fp32-reversed     one fp32 chain over k = K-1 down to 0
//   fp32-blocked      fp32 chains over [0, 64), [64, 128), ... (the last block may be short);
//                     the block sums added pairwise: level by level, adjacent pairs summed, an
//                     odd last one carried up unchanged
//   fp32-batch-split  P = min(clamp(M / 4, 1, 8), K) parts [i·K/P, (i+1)·K/P) (integer
//                     division), each an fp32 chain, added in order ((p0 + p1) + p2) + ...;
//                     M < 8 gives P = 1, concord's own order
//   fp32-drop-late    rows with positions[m] < 64: one chain over [0, K) (concord's); rows at
//                     64 or later: over [0, K - 32) when K > 32
// The kernels vectorize across outputs only (each output keeps its own chain), so their bits do
// not depend on the thread count, the ISA (AVX2 or generic) or the tiling.
//
// Batch-invariant variants give each row the same logits in any batch; fp32-batch-split does
// not. The fp64 variant keeps norms, attention and softmax in fp32 (the decoder has one
// implementation; the GEMMs are where the precisions differ); tests/model's independent fp64
// reference checks it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "concord/model/model.h"
#include "concord/model/policy.h"

namespace concord::audit {

struct KernelVariant {
  std::string name;
  std::string description;          // one line, for `concord contract kernels` and reports
  model::PrecisionPolicy policy;
  model::ForwardGemmKernel gemm;    // empty: concord's gemm_prepared
  bool batch_invariant = true;
  // The model's GEMM weights served as their file stores them (model::WeightStorage::native:
  // a GGUF's Q4_0 / Q4_1 / Q8_0 blocks through tensor/quant_gemm.h's W4A8 / W8A8 kernels). Such
  // a variant needs a model loaded with stored weights, every other one a model with fp32 values.
  bool stored_weights = false;
};

std::vector<std::string> kernel_names();
// InputError "[audit] unknown kernel 'x' (known: ...)".
KernelVariant kernel_variant(std::string_view name);
// Sets the model's policy and forward GEMM kernel (its cached quantized weights are rebuilt).
// InputError when the model's weight storage is not the variant's (stored_weights).
void apply_kernel(model::Model& model, const KernelVariant& kernel);

}  // namespace concord::audit
