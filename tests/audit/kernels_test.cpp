// The named kernel variants (audit/kernels.h): the forward-GEMM hook itself (a kernel that calls
// concord's GEMM changes nothing; rows carry their true positions), every variant's GEMM against
// a scalar re-implementation of its documented order written here and a long-double sum, and
// each variant's effect on a model's logits (closeness, batch invariance, the out-of-contract
// drop, fp64 against the independent fp64 reference decoder, switching variants).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "concord/audit/kernels.h"
#include "concord/model/kv_cache.h"
#include "concord/model/model.h"
#include "concord/numerics/check.h"
#include "concord/tensor/gemm.h"
#include "concord/tensor/qgemm.h"
#include "model/model_to_reference.h"

namespace concord::audit {
namespace {

using model::CachedInput;
using model::ForwardGemm;
using model::KvCache;
using model::LogitRows;
using model::Model;
using model::ModelConfig;
using model::PrecisionPolicy;

// K = 96 (q/k/v/gate/up/lm_head), 96 (o_proj: Hq·D), 160 (down): two and three 64-blocks with
// partial last blocks; V = 300 is not a multiple of the kernels' 16-column panels.
ModelConfig test_config() {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 300;
  c.hidden_size = 96;
  c.intermediate_size = 160;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 24;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = false;
  return c;
}

Model make_model(const std::string& preset = "fp32") {
  Model m(test_config(), PrecisionPolicy::preset(preset));
  m.init_random(7, 0.08f);  // logits spread over several nats
  return m;
}

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % 300);
  return t;
}

bool bitwise_equal(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}
bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && bitwise_equal(a.data(), b.data(), a.size());
}

// Σ(a-b)² / Σ b².
template <class A, class B>
double nmse(const std::vector<A>& a, const std::vector<B>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return num / den;
}

std::vector<float> forward_logits(Model& m, const std::vector<int32_t>& tokens, int64_t B,
                                  int64_t T) {
  std::vector<float> logits(static_cast<size_t>(B * T * m.config().vocab_size));
  m.forward(tokens, B, T, logits);
  return logits;
}

// ---- scalar re-implementations of the documented orders (kernels.h) -----------------------
// a (M, K), b (N, K) row-major; each returns the unscaled sum of one output.
float chain_fp32(const float* a, const float* b, int64_t begin, int64_t end) {
  float acc = 0.0f;
  for (int64_t k = begin; k < end; ++k) acc = std::fma(a[k], b[k], acc);
  return acc;
}
float ref_reversed(const float* a, const float* b, int64_t K) {
  float acc = 0.0f;
  for (int64_t k = K - 1; k >= 0; --k) acc = std::fma(a[k], b[k], acc);
  return acc;
}
// Tree: level by level, adjacent pairs added, an odd last element carried up.
float ref_blocked(const float* a, const float* b, int64_t K) {
  std::vector<float> level;
  for (int64_t k = 0; k < K; k += 64) level.push_back(chain_fp32(a, b, k, std::min(K, k + 64)));
  if (level.empty()) return 0.0f;
  while (level.size() > 1) {
    std::vector<float> next;
    for (size_t i = 0; i + 1 < level.size(); i += 2) next.push_back(level[i] + level[i + 1]);
    if (level.size() % 2 == 1) next.push_back(level.back());
    level = next;
  }
  return level[0];
}
float ref_batch_split(const float* a, const float* b, int64_t K, int64_t M) {
  if (K == 0) return 0.0f;
  int64_t parts = std::max<int64_t>(1, std::min<int64_t>(8, M / 4));
  parts = std::min(parts, K);
  float total = chain_fp32(a, b, 0, K / parts);
  for (int64_t i = 1; i < parts; ++i) {
    total = total + chain_fp32(a, b, i * K / parts, (i + 1) * K / parts);
  }
  return total;
}
float ref_drop_late(const float* a, const float* b, int64_t K, int32_t position) {
  const int64_t end = position >= 64 && K > 32 ? K - 32 : K;
  return chain_fp32(a, b, 0, end);
}
double ref_fp64(const float* a, const float* b, int64_t K) {
  double acc = 0.0;
  for (int64_t k = 0; k < K; ++k) acc = std::fma(double(a[k]), double(b[k]), acc);
  return acc;
}

// One random GEMM problem: operands with a spread of magnitudes and both signs (cancellation),
// positions straddling the drop-late threshold.
struct Problem {
  int64_t M, N, K;
  std::vector<float> a, b;
  std::vector<int32_t> positions;
  std::vector<float> y;
  tensor::PreparedOperand pa, pb;
};

Problem make_problem(int64_t M, int64_t N, int64_t K, uint64_t seed, float scale_a = 1.0f,
                     float scale_b = 1.0f) {
  Problem p{M, N, K, {}, {}, {}, {}, {}, {}};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-6, 6);
  p.a.resize(static_cast<size_t>(M * K));
  p.b.resize(static_cast<size_t>(N * K));
  for (float& x : p.a) x = std::ldexp(normal(rng), exponent(rng));
  for (float& x : p.b) x = normal(rng);
  p.positions.resize(static_cast<size_t>(M));
  for (auto& pos : p.positions) pos = static_cast<int32_t>(rng() % 128);
  p.y.assign(static_cast<size_t>(M * N), std::nanf(""));
  tensor::prepare_operand(p.pa, std::nullopt, tensor::Operand::a, tensor::Trans::no, p.a.data(),
                          M, K);
  tensor::prepare_operand(p.pb, std::nullopt, tensor::Operand::b, tensor::Trans::yes, p.b.data(),
                          N, K);
  p.pa.tensor_scale = scale_a;  // as NVFP4 / per-tensor FP8 operands carry them
  p.pb.tensor_scale = scale_b;
  return p;
}

void run_gemm(const KernelVariant& v, Problem& p) {
  v.gemm(ForwardGemm{"w", p.M, p.N, p.K, &p.pa, &p.pb, p.positions, p.y.data()});
}

// The unscaled sum variant `name` documents for output (m, n).
float documented_sum(const std::string& name, const Problem& p, int64_t m, int64_t n) {
  const float* a = p.a.data() + m * p.K;
  const float* b = p.b.data() + n * p.K;
  if (name == "fp64") return static_cast<float>(ref_fp64(a, b, p.K));
  if (name == "fp32-reversed") return ref_reversed(a, b, p.K);
  if (name == "fp32-blocked") return ref_blocked(a, b, p.K);
  if (name == "fp32-batch-split") return ref_batch_split(a, b, p.K, p.M);
  if (name == "fp32-drop-late") {
    return ref_drop_late(a, b, p.K, p.positions[static_cast<size_t>(m)]);
  }
  ADD_FAILURE() << "no reference for " << name;
  return 0.0f;
}

std::vector<std::string> gemm_variants() {
  std::vector<std::string> out;
  for (const auto& name : kernel_names()) {
    if (kernel_variant(name).gemm) out.push_back(name);
  }
  return out;
}

TEST(KernelVariants, NamesPresetsAndUnknownName) {
  const std::vector<std::string> expected = {
      "fp64",  "fp32",       "native",        "bf16",         "mxfp8",            "mxfp4",
      "nvfp4", "fp8-tensor", "fp32-reversed", "fp32-blocked", "fp32-batch-split", "fp32-drop-late"};
  EXPECT_EQ(kernel_names(), expected);
  for (const auto& name : kernel_names()) {
    const KernelVariant v = kernel_variant(name);
    EXPECT_EQ(v.name, name);
    EXPECT_FALSE(v.description.empty()) << name;
    EXPECT_EQ(v.batch_invariant, name != "fp32-batch-split") << name;
    EXPECT_EQ(v.stored_weights, name == "native") << name;
    if (v.stored_weights) {  // the file's blocks as stored, fp32 for everything else
      EXPECT_FALSE(v.gemm);
      EXPECT_EQ(v.policy.name, "native");
      continue;
    }
    const bool preset = name.find("fp32-") != 0 && name != "fp64";
    EXPECT_EQ(bool(v.gemm), !preset && name != "fp32") << name;
    EXPECT_EQ(v.policy, PrecisionPolicy::preset(preset ? name : "fp32")) << name;
  }
  try {
    kernel_variant("fp16-fast");
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("[audit] unknown kernel 'fp16-fast' (known: fp64, fp32, native, bf16,", 0), 0u)
        << message;
    EXPECT_NE(message.find("fp32-drop-late)"), std::string::npos) << message;
  }
  EXPECT_THROW(kernel_variant(""), InputError);
}

// Every GEMM variant against the scalar statement of its order (bitwise), against a long-double
// sum (fp64: within 1 float ulp of the correctly rounded sum; fp32 orders: within the standard
// γ_K·Σ|a·b| bound), with and without per-tensor scales; the same bits from the generic and
// AVX2 builds, b packed per call or prepacked.
TEST(KernelVariants, GemmsFollowTheirDocumentedOrder) {
  const tensor::GemmIsa isa = tensor::gemm_isa();
  int shape_index = 0;
  for (const int64_t M : {1, 3, 8, 21, 40}) {
    for (const int64_t N : {1, 16, 37}) {
      for (const int64_t K : {0, 1, 31, 33, 64, 97, 200, 257}) {
        ++shape_index;
        const bool scaled = shape_index % 3 == 0;
        for (const auto& name : gemm_variants()) {
          const KernelVariant v = kernel_variant(name);
          Problem p = make_problem(M, N, K, 1000 + static_cast<uint64_t>(shape_index),
                                   scaled ? 3.0f : 1.0f, scaled ? 0.25f : 1.0f);
          const float s = p.pa.tensor_scale * p.pb.tensor_scale;
          run_gemm(v, p);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              const float sum = documented_sum(name, p, m, n);
              const float expected = s == 1.0f ? sum : s * sum;
              const float got = p.y[static_cast<size_t>(m * N + n)];
              ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expected))
                  << name << " M=" << M << " N=" << N << " K=" << K << " (" << m << "," << n
                  << ") got " << got << " expected " << expected;
              // Against the long-double sum of the terms the order includes.
              const float* a = p.a.data() + m * K;
              const float* b = p.b.data() + n * K;
              const bool dropped = name == "fp32-drop-late" && K > 32 &&
                                   p.positions[static_cast<size_t>(m)] >= 64;
              const int64_t end = dropped ? K - 32 : K;
              long double exact = 0, magnitude = 0;
              for (int64_t k = 0; k < end; ++k) {
                exact += static_cast<long double>(a[k]) * b[k];
                magnitude += std::fabs(static_cast<long double>(a[k]) * b[k]);
              }
              if (name == "fp64" && !scaled) {
                const float rounded = static_cast<float>(exact);
                const float ulp = std::nextafter(std::fabs(rounded), INFINITY) - std::fabs(rounded);
                EXPECT_LE(std::fabs(got - rounded), ulp) << "M=" << M << " N=" << N << " K=" << K;
              } else if (!scaled) {
                const long double gamma = end * 0x1p-24L / (1 - end * 0x1p-24L);
                EXPECT_LE(std::fabs(got - exact), gamma * magnitude + 1e-30L) << name;
              }
            }
          }
          // The same bits with the generic (non-AVX2) build.
          std::vector<float> first = p.y;
          tensor::set_gemm_isa(tensor::GemmIsa::generic);
          run_gemm(v, p);
          tensor::set_gemm_isa(isa);
          EXPECT_TRUE(bitwise_equal(first, p.y)) << name << " generic ISA";
          // b prepacked as the model's weights are (the kernels then read its fp32 panels).
          tensor::prepack_b(p.pb, tensor::Trans::yes);
          ASSERT_TRUE(p.pb.packed.valid);
          std::fill(p.y.begin(), p.y.end(), std::nanf(""));
          run_gemm(v, p);
          EXPECT_TRUE(bitwise_equal(first, p.y)) << name << " prepacked b";
        }
      }
    }
  }
}

// GEMMs large enough to run on several threads: the same bits on one thread.
TEST(KernelVariants, ThreadCountDoesNotChangeBits) {
  const int threads = omp_get_max_threads();
  for (const auto& name : gemm_variants()) {
    const KernelVariant v = kernel_variant(name);
    Problem p = make_problem(70, 131, 300, 9);  // 2.8M multiply-adds: parallel
    omp_set_num_threads(std::max(threads, 2));
    run_gemm(v, p);
    const std::vector<float> parallel = p.y;
    omp_set_num_threads(1);
    run_gemm(v, p);
    omp_set_num_threads(threads);
    EXPECT_TRUE(bitwise_equal(parallel, p.y)) << name;
    for (int64_t m = 0; m < p.M; m += 23) {
      for (int64_t n = 0; n < p.N; n += 17) {
        EXPECT_EQ(p.y[static_cast<size_t>(m * p.N + n)], documented_sum(name, p, m, n)) << name;
      }
    }
  }
}

// Where a documented order coincides with concord's in-order chain (batch-split with M < 8,
// drop-late's rows before 64), the bits are gemm_prepared's.
TEST(KernelVariants, InOrderCasesEqualConcordsGemm) {
  for (const int64_t M : {1, 7, 30}) {
    Problem p = make_problem(M, 45, 150, 77, 0.5f, 1.5f);
    std::vector<float> concord(static_cast<size_t>(M * p.N));
    tensor::gemm_prepared(tensor::Trans::no, tensor::Trans::yes, M, p.N, p.K, p.pa, p.pb,
                          concord.data(), p.N);
    run_gemm(kernel_variant("fp32-drop-late"), p);
    for (int64_t m = 0; m < M; ++m) {
      const bool late = p.positions[static_cast<size_t>(m)] >= 64;
      const bool same = bitwise_equal(p.y.data() + m * p.N, concord.data() + m * p.N,
                                      static_cast<size_t>(p.N));
      EXPECT_EQ(same, !late) << "row " << m << " position " << p.positions[static_cast<size_t>(m)];
    }
    run_gemm(kernel_variant("fp32-batch-split"), p);
    EXPECT_EQ(bitwise_equal(p.y, concord), M < 8) << "M=" << M;
  }
}

// A kernel that calls concord's own GEMM gives the logits of no kernel, bit for bit, in the
// training forward and the cached forward; every GEMM's rows carry their positions (cached
// decode rows their true ones, lm_head only the rows whose logits were asked for).
TEST(ForwardGemmHook, ConcordGemmKernelChangesNothingAndSeesPositions) {
  Model m = make_model();
  const int64_t V = m.config().vocab_size;
  struct Call {
    std::string weight;
    std::vector<int32_t> positions;
  };
  std::vector<Call> calls;
  const model::ForwardGemmKernel concord_gemm = [&](const ForwardGemm& g) {
    calls.push_back({std::string(g.weight), {g.positions.begin(), g.positions.end()}});
    tensor::gemm_prepared(tensor::Trans::no, tensor::Trans::yes, g.M, g.N, g.K, *g.a, *g.b, g.y,
                          g.N);
  };
  const int64_t B = 2, T = 12;
  const auto tokens = random_tokens(B * T, 5);
  const auto plain = forward_logits(m, tokens, B, T);
  m.set_forward_gemm_kernel(concord_gemm);
  const auto hooked = forward_logits(m, tokens, B, T);
  EXPECT_TRUE(bitwise_equal(plain, hooked));
  const size_t per_layer = 7;  // q, k, v, o, gate, up, down
  ASSERT_EQ(calls.size(), per_layer * 2 + 1);
  EXPECT_EQ(calls.back().weight, "lm_head.weight");
  for (const Call& c : calls) {
    ASSERT_EQ(c.positions.size(), static_cast<size_t>(B * T)) << c.weight;
    for (int64_t r = 0; r < B * T; ++r) {
      EXPECT_EQ(c.positions[static_cast<size_t>(r)], r % T) << c.weight;
    }
  }

  // Cached: b prefills 3 tokens; then one pass with a's 10-token prefill (all logits) and b's
  // next 5 (last logits); then a decode step of both.
  const auto a_tokens = random_tokens(11, 6), b_tokens = random_tokens(9, 7);
  auto cached = [&](bool hook) {
    m.set_forward_gemm_kernel(hook ? concord_gemm : nullptr);
    KvCache cache(m.config(), 2);
    const int sa = cache.allocate(), sb = cache.allocate();
    std::vector<float> out, logits;
    auto pass = [&](std::vector<CachedInput> in) {
      logits.assign(static_cast<size_t>(model::logit_rows(in) * V), 0.0f);
      m.forward_cached(cache, in, logits);
      out.insert(out.end(), logits.begin(), logits.end());
    };
    const std::span<const int32_t> a(a_tokens), b(b_tokens);
    pass({{sb, b.subspan(0, 3), LogitRows::last}});
    calls.clear();
    pass({{sa, a.subspan(0, 10), LogitRows::all}, {sb, b.subspan(3, 5), LogitRows::last}});
    pass({{sa, a.subspan(10, 1), LogitRows::last}, {sb, b.subspan(8, 1), LogitRows::last}});
    return out;
  };
  const auto cached_plain = cached(false);
  calls.clear();
  const auto cached_hooked = cached(true);
  EXPECT_TRUE(bitwise_equal(cached_plain, cached_hooked));
  ASSERT_EQ(calls.size(), 2 * (per_layer * 2 + 1));
  const std::vector<int32_t> prefill_rows = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 4, 5, 6, 7};
  const std::vector<int32_t> prefill_logit_rows = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 7};
  const std::vector<int32_t> decode_rows = {10, 8};
  for (size_t i = 0; i < calls.size(); ++i) {
    const bool lm_head = calls[i].weight == "lm_head.weight";
    EXPECT_EQ(lm_head, i % (per_layer * 2 + 1) == per_layer * 2) << i;
    const auto& expected = i < per_layer * 2 + 1 ? (lm_head ? prefill_logit_rows : prefill_rows)
                                                 : decode_rows;
    EXPECT_EQ(calls[i].positions, expected) << i << " " << calls[i].weight;
  }
  m.set_forward_gemm_kernel(nullptr);
  EXPECT_TRUE(bitwise_equal(forward_logits(m, tokens, B, T), plain));
}

// The reordered fp32 variants are fp32 rounding noise away from fp32: different bits, NMSE tiny.
TEST(KernelVariants, ReorderedVariantsAreCloseButNotEqual) {
  Model m = make_model();
  const int64_t B = 2, T = 16;
  const auto tokens = random_tokens(B * T, 9);
  const auto fp32 = forward_logits(m, tokens, B, T);
  for (const std::string name : {"fp32-reversed", "fp32-blocked", "fp32-batch-split", "fp64"}) {
    apply_kernel(m, kernel_variant(name));
    const auto got = forward_logits(m, tokens, B, T);
    const double e = nmse(got, fp32);
    EXPECT_FALSE(bitwise_equal(got, fp32)) << name;
    EXPECT_GT(e, 0.0) << name;
    EXPECT_LT(e, 1e-10) << name;
  }
}

// Logits of sequence a (prefill 10 tokens, then 3 decode steps), alone or sharing every pass
// with two others that put 16 more rows into each GEMM.
std::vector<float> sequence_logits(Model& m, bool with_others) {
  const int64_t V = m.config().vocab_size;
  const auto a = random_tokens(13, 21), b = random_tokens(40, 22), c = random_tokens(40, 23);
  KvCache cache(m.config(), 3);
  const int sb = with_others ? cache.allocate() : -1;
  const int sa = cache.allocate();
  const int sc = with_others ? cache.allocate() : -1;
  std::vector<float> out, logits;
  for (int step = 0; step < 4; ++step) {
    std::vector<CachedInput> in;
    if (with_others) {
      in.push_back({sb, std::span<const int32_t>(b).subspan(8 * static_cast<size_t>(step), 8),
                    LogitRows::all});
    }
    const size_t a_from = step == 0 ? 0 : 9 + static_cast<size_t>(step);
    in.push_back({sa, std::span<const int32_t>(a).subspan(a_from, step == 0 ? 10 : 1),
                  LogitRows::last});
    if (with_others) {
      in.push_back({sc, std::span<const int32_t>(c).subspan(8 * static_cast<size_t>(step), 8),
                    LogitRows::last});
    }
    logits.assign(static_cast<size_t>(model::logit_rows(in) * V), 0.0f);
    m.forward_cached(cache, in, logits);
    const int64_t row = with_others ? 8 : 0;  // b's rows come first
    out.insert(out.end(), logits.begin() + row * V, logits.begin() + (row + 1) * V);
  }
  return out;
}

TEST(KernelVariants, BatchInvarianceAsDeclared) {
  Model m = make_model();
  for (const auto& name : kernel_names()) {
    const KernelVariant v = kernel_variant(name);
    if (v.stored_weights) {  // needs a model loaded with stored blocks
      EXPECT_THROW(apply_kernel(m, v), InputError) << name;
      continue;  // its batch invariance: tests/model/files_test.cpp NativeWeights
    }
    apply_kernel(m, v);
    const auto alone = sequence_logits(m, false);
    const auto batched = sequence_logits(m, true);
    EXPECT_EQ(bitwise_equal(alone, batched), v.batch_invariant) << name;
    if (!v.batch_invariant) {
      EXPECT_LT(nmse(batched, alone), 1e-10) << name;
    }
  }
}

// The out-of-contract kernel: rows before position 64 are fp32's bit for bit, every row from 64
// on differs — in the training forward and in cached decode.
TEST(KernelVariants, DropLateChangesOnlyLatePositions) {
  Model m = make_model();
  const int64_t V = m.config().vocab_size, T = 80;
  const auto tokens = random_tokens(T, 31);
  const auto fp32 = forward_logits(m, tokens, 1, T);
  apply_kernel(m, kernel_variant("fp32-drop-late"));
  const auto dropped = forward_logits(m, tokens, 1, T);
  for (int64_t t = 0; t < T; ++t) {
    const bool same = bitwise_equal(fp32.data() + t * V, dropped.data() + t * V,
                                    static_cast<size_t>(V));
    EXPECT_EQ(same, t < 64) << "position " << t;
  }
  // Cached: prefill 60, then decode to 70, one token at a time; logits of every position.
  KvCache cache(m.config(), 1);
  const int slot = cache.allocate();
  std::vector<float> logits(static_cast<size_t>(60 * V));
  const std::span<const int32_t> all(tokens);
  const CachedInput prefill{slot, all.subspan(0, 60), LogitRows::all};
  m.forward_cached(cache, {&prefill, 1}, logits);
  EXPECT_TRUE(bitwise_equal(logits.data(), dropped.data(), static_cast<size_t>(60 * V)));
  for (int64_t t = 60; t < 70; ++t) {
    const CachedInput step{slot, all.subspan(static_cast<size_t>(t), 1), LogitRows::last};
    m.forward_cached(cache, {&step, 1},
                     std::span<float>(logits).subspan(0, static_cast<size_t>(V)));
    EXPECT_TRUE(bitwise_equal(logits.data(), dropped.data() + t * V, static_cast<size_t>(V)))
        << "position " << t;
  }
}

// fp64 accumulation moves the logits towards the independent fp64 reference decoder: its error
// is at most fp32's (it is smaller on these sequences), and both are small.
TEST(KernelVariants, Fp64IsCloserToTheFp64ReferenceThanFp32) {
  Model m = make_model();
  const reference::Config rc = concord_test::reference_config(m.config());
  const reference::Weights rw = concord_test::reference_weights(m);
  const int64_t B = 3, T = 24;
  const auto tokens = random_tokens(B * T, 41);
  const auto exact = reference::forward_logits(rc, rw, tokens, B, T);
  auto errors = [&](const std::string& name) {
    apply_kernel(m, kernel_variant(name));
    const auto got = forward_logits(m, tokens, B, T);
    double max_abs = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      max_abs = std::max(max_abs, std::fabs(got[i] - exact[i]));
    }
    return std::pair<double, double>{nmse(got, exact), max_abs};
  };
  const auto [nmse64, max64] = errors("fp64");
  const auto [nmse32, max32] = errors("fp32");
  std::printf("vs fp64 reference decoder: fp64 kernel NMSE %.3g max|err| %.3g; fp32 NMSE %.3g "
              "max|err| %.3g\n", nmse64, max64, nmse32, max32);
  EXPECT_LE(nmse64, nmse32);
  EXPECT_LE(max64, max32);
  EXPECT_LT(nmse32, 1e-10);
  EXPECT_LT(max32, 1e-4);
}

// Switching variants leaves nothing stale: fp32 → nvfp4 → fp32 gives the first fp32 logits,
// nvfp4 after fp32 equals a model built at nvfp4, and a GEMM kernel is dropped by a variant
// without one.
TEST(KernelVariants, ApplyingAnotherVariantLeavesNothingStale) {
  Model m = make_model();
  const int64_t B = 2, T = 10;
  const auto tokens = random_tokens(B * T, 51);
  const auto fp32 = forward_logits(m, tokens, B, T);
  Model fresh = make_model("nvfp4");
  const auto nvfp4_fresh = forward_logits(fresh, tokens, B, T);
  apply_kernel(m, kernel_variant("nvfp4"));
  const auto nvfp4 = forward_logits(m, tokens, B, T);
  EXPECT_TRUE(bitwise_equal(nvfp4, nvfp4_fresh));
  EXPECT_FALSE(bitwise_equal(nvfp4, fp32));
  apply_kernel(m, kernel_variant("fp32"));
  EXPECT_TRUE(bitwise_equal(forward_logits(m, tokens, B, T), fp32));
  apply_kernel(m, kernel_variant("fp32-reversed"));
  EXPECT_FALSE(bitwise_equal(forward_logits(m, tokens, B, T), fp32));
  apply_kernel(m, kernel_variant("fp32"));
  EXPECT_TRUE(bitwise_equal(forward_logits(m, tokens, B, T), fp32));
  // Every preset variant equals a model built with that preset.
  for (const std::string name : {"bf16", "mxfp8", "mxfp4", "fp8-tensor"}) {
    apply_kernel(m, kernel_variant(name));
    Model built = make_model(name);
    EXPECT_TRUE(bitwise_equal(forward_logits(m, tokens, B, T), forward_logits(built, tokens, B, T)))
        << name;
  }
}

}  // namespace
}  // namespace concord::audit
