// Speculative decoding (DESIGN.md seed system #8): a drafter proposes γ tokens, the target scores
// them in one cached forward, and the verification rule below keeps a prefix of them and emits
// one more token, so that the emitted tokens follow the target's distribution exactly (Leviathan
// et al. 2023; Chen et al. 2023):
//
//   for i = 0 .. γ−1: accept draft d_i with probability min(1, p_i(d_i) / q_i(d_i));
//     on the first rejection emit a token from norm(max(0, p_i − q_i)) and stop;
//   if all γ are accepted, emit a bonus token from p_γ.
//
// p_i and q_i are the *processed* distributions — temperature, top-k, top-p and min-p applied
// to the target's and the drafter's logits by the same rules (sampling.h), renormalized over the
// kept set. Applying them to one side only is the usual source of silently wrong samplers. At
// temperature 0 both are one-hot at the argmax, and the rule becomes "accept while the draft is
// the target's argmax, then emit the target's argmax" — greedy speculative output is the greedy
// output. A deterministic drafter (prompt lookup) has q_i one-hot at its proposal: d_i is
// accepted with probability p_i(d_i), the replacement comes from p_i without d_i.
//
// Randomness: the choices for the sequence's t-th generated token come from Philox block t of
// RandomStream{seed, kSpeculativeStream} (PhiloxChoices), so a request's output depends on its
// seed, its drafter and its draft lengths — never on the batch or the thread count.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "concord/serve/sampling.h"

namespace concord::serve {

inline constexpr uint32_t kSpeculativeStream = 0x53504543u;  // "SPEC"
inline constexpr uint32_t kDraftStream = 0x44524654u;        // "DRFT": a sampling drafter's draws

// The processed distribution of sampling.h as a dense vector over the vocabulary, summing to 1:
// p_i / P on the kept set (sampling_candidates), 0 elsewhere; greedy: one-hot at the argmax.
std::vector<double> processed_distribution(std::span<const float> logits, const SamplingParams& params);

// One-hot at `token` over `vocab` (a deterministic drafter's q).
std::vector<double> one_hot(int64_t vocab, int32_t token);

// α = Σ_i min(p_i, q_i) = 1 − TV(p, q): the probability that a token drafted from q is accepted.
double acceptance_probability(std::span<const double> p, std::span<const double> q);

// Expected tokens emitted per verification with i.i.d. acceptance α and γ drafts:
// (1 − α^(γ+1)) / (1 − α)  (γ + 1 at α = 1).
double expected_tokens_per_round(double alpha, int gamma);
// Expected speed-up over plain decoding when a draft step costs c target steps (Leviathan et al.
// Theorem 3.8): (1 − α^(γ+1)) / ((1 − α)(γc + 1)).
double expected_speedup(double alpha, int gamma, double cost_ratio);

// The random choices verification makes. PhiloxChoices draws them; a test enumerates them.
class Choices {
 public:
  virtual ~Choices() = default;
  // true with probability `prob` (clamped to [0, 1]; 0 is never true, 1 always), for the
  // sequence's t-th generated token.
  virtual bool bernoulli(double prob, uint64_t t) = 0;
  // index i with probability w_i / Σw (w_i >= 0, Σw > 0), for the t-th generated token.
  virtual size_t categorical(std::span<const double> weights, uint64_t t) = 0;
};

// bernoulli: u < prob with u from words 0-1 of Philox block t of RandomStream{seed, stream}
// (53 bits, [0, 1)); categorical: u from words 2-3, the first index (ascending) whose running
// sum of w exceeds u · Σw. The verifier uses kSpeculativeStream, a sampling drafter kDraftStream.
class PhiloxChoices final : public Choices {
 public:
  explicit PhiloxChoices(uint64_t seed, uint32_t stream = kSpeculativeStream) : seed_(seed), stream_(stream) {}
  bool bernoulli(double prob, uint64_t t) override;
  size_t categorical(std::span<const double> weights, uint64_t t) override;

 private:
  uint64_t seed_;
  uint32_t stream_;
};

struct Verdict {
  int accepted = 0;             // the draft tokens kept (a prefix of the draft)
  std::vector<int32_t> tokens;  // the kept drafts, then the replacement or the bonus token
};

// The verification rule above. draft: γ tokens; q: γ rows, the drafter's processed distribution
// at each drafted position; p: γ + 1 rows, the target's at each position (row i after the
// context and drafts 0 .. i−1); rows are dense over the vocabulary. t0: the index among the
// sequence's generated tokens of the first draft (the choices for draft i are those of t0 + i).
// Throws InputError on mismatched sizes, a token outside the vocabulary, or a draft token its
// own q gives probability 0 (a drafter that did not draft from q).
Verdict verify_draft(std::span<const int32_t> draft, std::span<const std::vector<double>> q,
                     std::span<const std::vector<double>> p, Choices& choices, uint64_t t0);

// Prompt lookup (n-gram) drafting: the tokens that followed the latest earlier occurrence of
// the context's last n tokens, n from max_ngram down to min_ngram (the first n with a match),
// at most `gamma` of them; empty when no n-gram recurs. No model, q one-hot.
std::vector<int32_t> prompt_lookup_draft(std::span<const int32_t> context, int gamma, int max_ngram = 3,
                                         int min_ngram = 1);

}  // namespace concord::serve
