// The float attention kernel compiled for AVX2 (CMakeLists.txt gives this file -mavx2 and nothing
// else: no -mfma, and the build's -ffp-contract=off applies). See ops_attention_kernel.h.
#include "concord/model/ops_attention_isa.h"

#define CONCORD_ATTENTION_NS attention_avx2_impl
#define CONCORD_ATTENTION_VREGS 16
#include "concord/model/ops_attention_kernel.h"

namespace concord::model::attention_avx2 {

void attend_one_query_f32(float* out, float* probs, int64_t probs_head_stride, const float* q,
                          const float* k, const float* v, int64_t n_ctx, int64_t kv_stride,
                          int64_t Hq, int64_t Hkv, int64_t D, float* scores) {
  attention_avx2_impl::attend_one_query<float>(out, probs, probs_head_stride, q, k, v, n_ctx,
                                               kv_stride, Hq, Hkv, D, scores);
}

}  // namespace concord::model::attention_avx2
