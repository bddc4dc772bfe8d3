// Token sampling: greedy, temperature, top-k, top-p, min-p, seeded per sequence.
//
// The procedure, for one row of logits (V) and the sequence's t-th generated token:
//   T == 0 (greedy): argmax of the logits, the lowest index among ties; nothing else applies.
//   Otherwise p_i = exp(logp_i) with logp the log-probability definition of logprob.h (the
//   distribution after temperature, before truncation), and the kept set is cut in this order:
//   1. top_k > 0: the k most probable tokens, ordered by (p descending, index ascending);
//   2. top_p < 1: of those, the shortest prefix in that order whose probability sum (summed in
//      that order) reaches top_p · P, P = the sum of the kept p_i in ascending index order;
//   3. min_p > 0: of those, the tokens with p_i >= min_p · max_i p_i.
//   At least the most probable token is always kept. The draw: u in [0, 1) from the 53 high
//   bits of Philox block t of RandomStream{seed, kSamplingStream}; the kept tokens are scanned in
//   ascending index, accumulating p_i in double; the first whose running sum exceeds u · P wins.
// So a sequence's t-th token depends only on its logits, its parameters, its seed and t — never
// on the batch it ran in or the thread count.
//
// Errors (InputError "[sampling] ..."): a negative or non-finite temperature, top_k < 0,
// top_p outside (0, 1], min_p outside [0, 1], NaN logits.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace concord::serve {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
  bool greedy() const { return temperature == 0.0f; }
  void validate() const;  // InputError naming the bad field
};

inline constexpr uint32_t kSamplingStream = 0x53414D50u;  // "SAMP"

// The uniform draw in [0, 1) for a sequence's t-th token.
double sampling_uniform(uint64_t seed, uint64_t t);

// Argmax with the lowest index among ties.
int32_t greedy_token(std::span<const float> logits);

// The kept set after top-k / top-p / min-p, indices ascending, and their probabilities p_i
// (untruncated, not renormalized). For greedy: the argmax alone with p = 1.
struct Candidates {
  std::vector<int32_t> tokens;
  std::vector<double> probs;
};
Candidates sampling_candidates(std::span<const float> logits, const SamplingParams& params);

// The sequence's t-th token (t = 0 for the first generated token).
int32_t sample_token(std::span<const float> logits, const SamplingParams& params, uint64_t t);

}  // namespace concord::serve
