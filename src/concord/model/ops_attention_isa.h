// The float attention kernel of ops_attention_kernel.h built for AVX2 (ops_attention_avx2.cpp);
// ops_attention.cpp picks it or the baseline copy at run time from numerics::active_isa().
#pragma once

#include <cstdint>

namespace concord::model::attention_avx2 {

// attend_one_query<float> of ops_attention_kernel.h, compiled with -mavx2 (no FMA). Same bits.
void attend_one_query_f32(float* out, float* probs, int64_t probs_head_stride, const float* q,
                          const float* k, const float* v, int64_t n_ctx, int64_t kv_stride,
                          int64_t Hq, int64_t Hkv, int64_t D, float* scores);

}  // namespace concord::model::attention_avx2
