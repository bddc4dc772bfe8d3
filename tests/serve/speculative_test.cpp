// Speculative decoding's verification rule (serve/speculative.h) is exact: by enumerating every
// random choice — the drafter's draws, each acceptance, each replacement and bonus — over short
// horizons and a small vocabulary, the probability of every emitted sequence equals the target's
// own (the product of its processed next-token probabilities) to 1e-12, for arbitrary p and q,
// p = q, disjoint supports, q = 0 where p > 0, deterministic drafters, top-k / top-p / min-p
// truncation and greedy decoding. The Philox draws are then checked by a chi-square test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "concord/numerics/check.h"
#include "concord/serve/speculative.h"

namespace concord::serve {
namespace {

using Dist = std::vector<double>;
using Seq = std::vector<int32_t>;
using Next = std::function<Dist(const Seq&)>;  // a model: prefix -> processed next-token distribution

struct Pruned {};  // thrown on a path of probability 0: the driver skips to the next path

// Explores every branch of the choices made through it, depth first, with each path's
// probability (the product of the chosen branches' probabilities).
class EnumeratedChoices final : public Choices {
 public:
  bool bernoulli(double prob, uint64_t) override {
    prob = std::clamp(prob, 0.0, 1.0);
    const bool yes = pick(2) == 0;
    weight_ *= yes ? prob : 1.0 - prob;
    if (weight_ == 0.0) throw Pruned{};
    return yes;
  }
  size_t categorical(std::span<const double> w, uint64_t) override {
    double total = 0.0;
    for (double x : w) total += x;
    EXPECT_GT(total, 0.0);
    const size_t i = pick(w.size());
    weight_ *= w[i] / total;
    if (weight_ == 0.0) throw Pruned{};
    return i;
  }
  double weight() const { return weight_; }
  // The next path; false when every path has been run.
  bool next() {
    script_.resize(at_);
    arity_.resize(at_);
    while (!script_.empty()) {
      if (++script_.back() < arity_.back()) {
        at_ = 0;
        weight_ = 1.0;
        return true;
      }
      script_.pop_back();
      arity_.pop_back();
    }
    return false;
  }

 private:
  size_t pick(size_t n) {
    if (at_ == script_.size()) {
      script_.push_back(0);
      arity_.push_back(n);
    }
    EXPECT_EQ(arity_[at_], n) << "a replayed path asked a different choice";
    return script_[at_++];
  }
  std::vector<size_t> script_, arity_;
  size_t at_ = 0;
  double weight_ = 1.0;
};

// Speculative generation of n tokens with `gamma` drafts a round: the drafter samples each
// draft from q (through `choices`, as the real drafter samples through its own stream), the
// rule verifies. Returns the first n emitted tokens.
Seq speculate(const Next& p, const Next& q, int n, int gamma, Choices& choices, bool drafter_samples = true) {
  Seq out;
  while (static_cast<int>(out.size()) < n) {
    Seq draft, ctx = out;
    std::vector<Dist> qs, ps;
    for (int i = 0; i < gamma; ++i) {
      Dist qi = q(ctx);
      int32_t d = 0;
      if (drafter_samples) {
        d = static_cast<int32_t>(choices.categorical(qi, 0));
      } else {  // deterministic: the most probable token, q one-hot there
        d = static_cast<int32_t>(std::max_element(qi.begin(), qi.end()) - qi.begin());
        qi = one_hot(static_cast<int64_t>(qi.size()), d);
      }
      qs.push_back(std::move(qi));
      ps.push_back(p(ctx));
      draft.push_back(d);
      ctx.push_back(d);
    }
    ps.push_back(p(ctx));
    const Verdict v = verify_draft(draft, qs, ps, choices, out.size());
    EXPECT_EQ(v.tokens.size(), static_cast<size_t>(v.accepted) + 1);
    out.insert(out.end(), v.tokens.begin(), v.tokens.end());
  }
  out.resize(static_cast<size_t>(n));
  return out;
}

// The exact law of the emitted sequences, by enumeration.
std::map<Seq, double> emitted_law(const Next& p, const Next& q, int n, int gamma, bool drafter_samples = true) {
  std::map<Seq, double> law;
  EnumeratedChoices choices;
  do {
    try {
      const Seq s = speculate(p, q, n, gamma, choices, drafter_samples);
      law[s] += choices.weight();
    } catch (const Pruned&) {
    }
  } while (choices.next());
  return law;
}

// The target's own law of n-token sequences.
std::map<Seq, double> target_law(const Next& p, int n, int64_t V) {
  std::map<Seq, double> law;
  std::function<void(Seq, double)> walk = [&](Seq s, double w) {
    if (static_cast<int>(s.size()) == n) {
      if (w > 0) law[s] += w;
      return;
    }
    const Dist d = p(s);
    for (int32_t t = 0; t < V; ++t) {
      Seq next = s;
      next.push_back(t);
      walk(next, w * d[static_cast<size_t>(t)]);
    }
  };
  walk({}, 1.0);
  return law;
}

void expect_same_law(const std::map<Seq, double>& got, const std::map<Seq, double>& want, double tol = 1e-12) {
  double total = 0.0;
  for (const auto& [s, w] : got) {
    total += w;
    const auto it = want.find(s);
    EXPECT_NEAR(w, it == want.end() ? 0.0 : it->second, tol) << "sequence starting " << s[0];
  }
  for (const auto& [s, w] : want) EXPECT_NEAR(got.contains(s) ? got.at(s) : 0.0, w, tol);
  EXPECT_NEAR(total, 1.0, tol);
}

// Deterministic pseudo-random logits of a prefix (a small model with context).
std::vector<float> logits_of(const Seq& prefix, uint64_t salt, int64_t V, float scale) {
  uint64_t h = 1469598103934665603ull ^ salt;
  for (int32_t t : prefix) h = (h ^ static_cast<uint64_t>(t + 1)) * 1099511628211ull;
  std::mt19937_64 rng(h);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> z(static_cast<size_t>(V));
  for (float& x : z) x = normal(rng);
  return z;
}

Next model(uint64_t salt, int64_t V, SamplingParams params, float scale = 1.5f) {
  return [=](const Seq& s) { return processed_distribution(logits_of(s, salt, V, scale), params); };
}

// Vocabulary 4, sequences of 3 tokens (2 for γ = 3): a few hundred thousand paths at most.
constexpr int64_t kV = 4;

TEST(SpeculativeExact, ArbitraryTargetAndDrafter) {
  const SamplingParams t1{.temperature = 1.0f};
  for (int gamma : {1, 2, 3}) {
    const int n = gamma == 3 ? 2 : 3;
    const Next p = model(1, kV, t1), q = model(2, kV, t1);
    expect_same_law(emitted_law(p, q, n, gamma), target_law(p, n, kV));
  }
}

TEST(SpeculativeExact, DrafterEqualToTheTargetAcceptsEverything) {
  const Next p = model(3, kV, {.temperature = 0.8f});
  expect_same_law(emitted_law(p, p, 3, 2), target_law(p, 3, kV));
  const Dist d = p({});
  EXPECT_NEAR(acceptance_probability(d, d), 1.0, 1e-15);
}

TEST(SpeculativeExact, DisjointSupportsRejectEveryDraft) {
  // p on tokens {0, 1}, q on {2, 3}: α = 0, every token comes from the residual = p.
  const Next p = [](const Seq& s) {
    Dist d = {0.3, 0.7, 0, 0};
    if (!s.empty() && s.back() == 1) d = {0.6, 0.4, 0, 0};
    return d;
  };
  const Next q = [](const Seq& s) { return s.size() % 2 ? Dist{0, 0, 0.5, 0.5} : Dist{0, 0, 0.9, 0.1}; };
  expect_same_law(emitted_law(p, q, 3, 2), target_law(p, 3, kV));
  EXPECT_EQ(acceptance_probability(p({}), q({})), 0.0);
}

TEST(SpeculativeExact, DrafterWithZeroWhereTheTargetIsPositive) {
  const Next p = model(4, kV, {.temperature = 1.0f});
  const Next q = [](const Seq& s) {  // never drafts token 0
    Dist d = {0, 0.5, 0.3, 0.2};
    if (s.size() == 1) d = {0, 0.1, 0.1, 0.8};
    return d;
  };
  expect_same_law(emitted_law(p, q, 3, 2), target_law(p, 3, kV));
}

TEST(SpeculativeExact, TruncatedDistributionsOnBothSides) {
  // top-k, top-p, min-p applied to both sides by the same rules, with different settings.
  const Next p = model(5, kV, {.temperature = 0.7f, .top_k = 3, .top_p = 0.8f}, 2.0f);
  const Next q = model(6, kV, {.temperature = 1.3f, .top_p = 0.8f, .min_p = 0.05f}, 2.0f);
  expect_same_law(emitted_law(p, q, 3, 2), target_law(p, 3, kV));
  const Dist d = p({});
  int kept = 0;
  for (double x : d) kept += x > 0;
  EXPECT_LE(kept, 3);
}

TEST(SpeculativeExact, DeterministicDrafter) {
  const Next p = model(7, kV, {.temperature = 1.0f}), q = model(8, kV, {.temperature = 1.0f});
  expect_same_law(emitted_law(p, q, 3, 3, false), target_law(p, 3, kV));
}

TEST(SpeculativeExact, GreedyEmitsTheGreedySequence) {
  const Next p = model(9, kV, {.temperature = 0.0f});
  for (float tq : {0.0f, 1.0f}) {
    const Next q = model(10, kV, {.temperature = tq});
    const std::map<Seq, double> law = emitted_law(p, q, 3, 2);
    const std::map<Seq, double> greedy = target_law(p, 3, kV);
    ASSERT_EQ(greedy.size(), 1u);
    expect_same_law(law, greedy);
  }
}

// The Philox draws: over many seeds, the first emitted token of a round whose draft is mostly
// rejected follows p (chi-square, 3 degrees of freedom; the bound 21.1 has a false-failure
// probability of 1e-4 under the null), and the accepted fraction matches α.
TEST(SpeculativePhilox, FirstTokenFollowsTheTarget) {
  const SamplingParams t1{.temperature = 1.0f};
  const Dist p = processed_distribution(logits_of({}, 11, kV, 1.5f), t1);
  const Dist q = processed_distribution(logits_of({}, 12, kV, 1.5f), t1);
  const Dist p1 = processed_distribution(logits_of({0}, 11, kV, 1.5f), t1);
  const int kDraws = 40000;
  std::vector<int> counts(kV, 0);
  int accepted = 0;
  for (int s = 0; s < kDraws; ++s) {
    PhiloxChoices choices(static_cast<uint64_t>(s));
    // The draft from q with the drafter's own stream (a different key from the verifier's).
    PhiloxChoices drafter(static_cast<uint64_t>(s) ^ 0x5EEDull);
    const auto d = static_cast<int32_t>(drafter.categorical(q, 0));
    const std::vector<Dist> qs = {q}, ps = {p, p1};
    const Verdict v = verify_draft(std::vector<int32_t>{d}, qs, ps, choices, 0);
    ++counts[static_cast<size_t>(v.tokens[0])];
    accepted += v.accepted;
  }
  double chi2 = 0.0;
  for (int64_t i = 0; i < kV; ++i) {
    const double e = kDraws * p[static_cast<size_t>(i)];
    chi2 += (counts[static_cast<size_t>(i)] - e) * (counts[static_cast<size_t>(i)] - e) / e;
  }
  EXPECT_LT(chi2, 21.1);
  const double alpha = acceptance_probability(p, q);
  // Binomial standard deviation sqrt(α(1−α)/n) <= 0.0025; 5 sd: false failure < 1e-6.
  EXPECT_NEAR(static_cast<double>(accepted) / kDraws, alpha, 0.0125);
}

TEST(SpeculativePhilox, ChoicesDependOnSeedAndPositionOnly) {
  PhiloxChoices a(7), b(7), c(8);
  const Dist w = {0.1, 0.2, 0.3, 0.4};
  int differ = 0;
  for (uint64_t t = 0; t < 64; ++t) {
    EXPECT_EQ(a.categorical(w, t), b.categorical(w, t));
    EXPECT_EQ(a.bernoulli(0.5, t), b.bernoulli(0.5, t));
    differ += a.categorical(w, t) != c.categorical(w, t);
    EXPECT_TRUE(a.bernoulli(1.0, t));
    EXPECT_FALSE(a.bernoulli(0.0, t));
    EXPECT_NE(a.categorical(Dist{0, 0, 1, 0}, t), 1u);
  }
  EXPECT_GT(differ, 10);
}

TEST(SpeculativeTheory, AcceptanceAndSpeedupFormulas) {
  EXPECT_DOUBLE_EQ(acceptance_probability(Dist{0.5, 0.5, 0}, Dist{0.25, 0.25, 0.5}), 0.5);
  EXPECT_DOUBLE_EQ(expected_tokens_per_round(0.5, 3), (1 - 0.0625) / 0.5);
  EXPECT_DOUBLE_EQ(expected_tokens_per_round(1.0, 4), 5.0);
  EXPECT_DOUBLE_EQ(expected_tokens_per_round(0.0, 4), 1.0);
  EXPECT_DOUBLE_EQ(expected_speedup(0.8, 4, 0.05), (1 - std::pow(0.8, 5)) / (0.2 * 1.2));
  // The mean emitted tokens per round of the enumerated law equals the formula for i.i.d. α:
  // one position, p and q fixed (no context dependence).
  const Dist p = {0.1, 0.4, 0.2, 0.3, 0}, q = {0.3, 0.3, 0.1, 0.1, 0.2};
  for (int gamma : {1, 2, 4}) {
    EnumeratedChoices choices;
    double mean = 0.0;
    do {
      Seq draft;
      std::vector<Dist> qs, ps;
      try {
        for (int i = 0; i < gamma; ++i) {
          draft.push_back(static_cast<int32_t>(choices.categorical(q, 0)));
          qs.push_back(q);
          ps.push_back(p);
        }
        ps.push_back(p);
        const size_t emitted = verify_draft(draft, qs, ps, choices, 0).tokens.size();
        mean += choices.weight() * static_cast<double>(emitted);
      } catch (const Pruned&) {
      }
    } while (choices.next());
    EXPECT_NEAR(mean, expected_tokens_per_round(acceptance_probability(p, q), gamma), 1e-12);
  }
}

TEST(SpeculativeErrors, MismatchedRowsAndImpossibleDraftsAreRefused) {
  PhiloxChoices c(1);
  const Dist p = {0.5, 0.5}, q = {1.0, 0.0};
  const std::vector<Dist> qs = {q}, ps = {p, p}, ps_short = {p};
  EXPECT_THROW(verify_draft(std::vector<int32_t>{0}, qs, ps_short, c, 0), InputError);
  EXPECT_THROW(verify_draft(std::vector<int32_t>{1}, qs, ps, c, 0), InputError);  // q(1) = 0
  EXPECT_THROW(verify_draft(std::vector<int32_t>{2}, qs, ps, c, 0), InputError);  // outside V
  const std::vector<Dist> q3 = {Dist{1.0, 0.0, 0.0}};
  EXPECT_THROW(verify_draft(std::vector<int32_t>{0}, q3, ps, c, 0), InputError);
  EXPECT_THROW(one_hot(4, 4), InputError);
}

TEST(PromptLookup, DraftsWhatFollowedTheLatestMatchingNgram) {
  const Seq ctx = {5, 1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3};
  // "1 2 3" last occurred before at index 5: what followed was 7 8 1 2 3.
  EXPECT_EQ(prompt_lookup_draft(ctx, 3), (Seq{7, 8, 1}));
  EXPECT_EQ(prompt_lookup_draft(ctx, 10), (Seq{7, 8, 1, 2, 3}));
  // No 3-gram or 2-gram match: falls back to the 1-gram "4" -> 6.
  EXPECT_EQ(prompt_lookup_draft(Seq{4, 6, 0, 2, 4}, 2), (Seq{6, 0}));
  EXPECT_TRUE(prompt_lookup_draft(Seq{1, 2, 3}, 4).empty());
  EXPECT_TRUE(prompt_lookup_draft(Seq{}, 4).empty());
  EXPECT_EQ(prompt_lookup_draft(Seq{1, 2, 1, 2}, 4, 2, 2), (Seq{1, 2}));
  EXPECT_TRUE(prompt_lookup_draft(Seq{1, 2, 1, 2}, 4, 3, 3).empty());
  EXPECT_THROW(prompt_lookup_draft(ctx, 3, 1, 2), InputError);
}

}  // namespace
}  // namespace concord::serve
