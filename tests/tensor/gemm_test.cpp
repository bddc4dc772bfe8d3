// gemm against its scalar reference bit for bit (shapes, transposes, strides, special values,
// threads, ISAs), batch invariance, the fp64 forward-error bound; gemm_bf16; Tensor and Arena.
#include <gtest/gtest.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "concord/numerics/check.h"
#include "concord/tensor/arena.h"
#include "concord/tensor/gemm.h"
#include "concord/tensor/tensor.h"

namespace concord::tensor {
namespace {

struct Shape {
  int64_t M, N, K;
};

std::vector<float> random_values(size_t n, uint32_t seed, bool specials = false) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> v(n);
  for (float& x : v) {
    x = normal(gen);
    if (!specials) continue;
    switch (pick(gen)) {
      case 0: x = std::numeric_limits<float>::quiet_NaN(); break;
      case 1: x = std::numeric_limits<float>::infinity(); break;
      case 2: x = -std::numeric_limits<float>::infinity(); break;
      case 3: case 4: case 5: x = -0.0f; break;
      case 6: case 7: x = 0.0f; break;
      case 8: x = std::numeric_limits<float>::denorm_min() * 37.0f; break;
      case 9: x = -std::numeric_limits<float>::min() * 0.75f; break;  // subnormal
      case 10: x = 3e38f; break;                                       // overflows when summed
      default: break;
    }
  }
  return v;
}

std::vector<float> to_bf16_values(std::vector<float> v) {
  for (float& x : v) x = std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0xFFFF0000u);
  return v;
}

// Operands with padded leading dimensions (stride = row length + pad) and a C prefilled with
// values, so that accumulate has something to add to and writes past N show up.
struct Problem {
  Trans ta, tb;
  Shape s;
  int64_t lda, ldb, ldc;
  std::vector<float> A, B, C0;
};

Problem make_problem(Trans ta, Trans tb, Shape s, uint32_t seed, int64_t pad, bool specials,
                     bool bf16 = false) {
  Problem p{ta, tb, s, 0, 0, 0, {}, {}, {}};
  const int64_t a_rows = ta == Trans::no ? s.M : s.K, a_cols = ta == Trans::no ? s.K : s.M;
  const int64_t b_rows = tb == Trans::no ? s.K : s.N, b_cols = tb == Trans::no ? s.N : s.K;
  p.lda = a_cols + pad;
  p.ldb = b_cols + pad;
  p.ldc = s.N + pad;
  p.A = random_values(static_cast<size_t>(a_rows * p.lda), seed, specials);
  p.B = random_values(static_cast<size_t>(b_rows * p.ldb), seed + 1, specials);
  p.C0 = random_values(static_cast<size_t>(s.M * p.ldc), seed + 2, specials);
  if (bf16) {
    p.A = to_bf16_values(p.A);
    p.B = to_bf16_values(p.B);
  }
  return p;
}

using GemmFn = decltype(&gemm);

std::vector<float> run(GemmFn fn, const Problem& p, bool accumulate) {
  std::vector<float> C = p.C0;
  fn(p.ta, p.tb, p.s.M, p.s.N, p.s.K, p.A.data(), p.lda, p.B.data(), p.ldb, C.data(), p.ldc,
     accumulate);
  return C;
}

// Index of the first differing bit pattern, or -1.
int64_t first_difference(const std::vector<float>& x, const std::vector<float>& y) {
  if (x.size() != y.size()) return 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::bit_cast<uint32_t>(x[i]) != std::bit_cast<uint32_t>(y[i])) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

std::string describe(const Problem& p, bool accumulate) {
  return "M=" + std::to_string(p.s.M) + " N=" + std::to_string(p.s.N) +
         " K=" + std::to_string(p.s.K) + " ta=" + (p.ta == Trans::yes ? "T" : "N") +
         " tb=" + (p.tb == Trans::yes ? "T" : "N") + " accumulate=" + std::to_string(accumulate);
}

// Restores the ISA and the OpenMP thread count after a test.
class GemmTest : public ::testing::Test {
 protected:
  void TearDown() override {
    set_gemm_isa(saved_isa_);
    omp_set_num_threads(saved_threads_);
  }
  std::vector<GemmIsa> isas() const {
    std::vector<GemmIsa> v{GemmIsa::generic};
    if (gemm_isa_supported(GemmIsa::avx2)) v.push_back(GemmIsa::avx2);
    if (gemm_isa_supported(GemmIsa::avx512)) v.push_back(GemmIsa::avx512);
    return v;
  }
  // Runs fn under every ISA and 1 and 2 threads and expects the reference's bits each time.
  void expect_matches_reference(GemmFn fn, const Problem& p, bool accumulate) {
    const std::vector<float> want = run(gemm_reference, p, accumulate);
    for (GemmIsa isa : isas()) {
      set_gemm_isa(isa);
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        const int64_t at = first_difference(run(fn, p, accumulate), want);
        ASSERT_EQ(at, -1) << describe(p, accumulate) << " isa=" << gemm_isa_name()
                          << " threads=" << threads << " first difference at C index " << at;
      }
    }
  }
  GemmIsa saved_isa_ = gemm_isa();
  int saved_threads_ = omp_get_max_threads();
};

std::vector<Shape> bitwise_shapes() {
  const int64_t sizes[] = {0, 1, 2, 3, 5, 7, 13, 16, 17, 31, 33, 63, 64, 65, 127, 129};
  std::vector<Shape> shapes;
  for (int64_t s : sizes) {
    shapes.push_back({s, s, s});
    shapes.push_back({s, 17, 33});
    shapes.push_back({7, s, 65});
    shapes.push_back({65, 13, s});
  }
  // Across the blockings: M > kMC (144), K > kKC (256, and odd), N > kNC (3072), the M = 512
  // weight-gradient split of N over threads, and large mixed primes.
  shapes.push_back({257, 300, 600});
  shapes.push_back({129, 65, 257});
  shapes.push_back({512, 100, 64});
  shapes.push_back({7, 3100, 9});
  shapes.push_back({149, 31, 1031});
  shapes.push_back({1, 1, 2049});
  // The AVX-512 12 x 32 tiles: 12-row groups with 6 and 7..11 rows left, an odd panel after the
  // pairs, a partial last panel next to a full one.
  shapes.push_back({18, 48, 40});
  shapes.push_back({30, 80, 77});
  shapes.push_back({23, 47, 9});
  return shapes;
}

TEST_F(GemmTest, BitwiseEqualToReferenceOverShapesTransposesStridesThreadsAndIsas) {
  uint32_t seed = 1;
  for (const Shape& s : bitwise_shapes()) {
    for (Trans ta : {Trans::no, Trans::yes}) {
      for (Trans tb : {Trans::no, Trans::yes}) {
        seed += 3;
        const Problem p = make_problem(ta, tb, s, seed, /*pad=*/(seed % 3) * 5, false);
        for (bool accumulate : {false, true}) expect_matches_reference(gemm, p, accumulate);
      }
    }
  }
  // One large mixed-prime shape (every blocking at once), in two orientations to bound the time.
  const Shape big{300, 777, 515};
  expect_matches_reference(gemm, make_problem(Trans::no, Trans::yes, big, 77, 1, false), false);
  expect_matches_reference(gemm, make_problem(Trans::yes, Trans::no, big, 78, 0, false), true);
}

TEST_F(GemmTest, BitwiseEqualToReferenceWithNanInfSignedZeroAndSubnormals) {
  uint32_t seed = 1000;
  for (const Shape& s : {Shape{13, 17, 33}, Shape{65, 129, 300}, Shape{6, 16, 1},
                         Shape{150, 40, 513}}) {
    for (Trans ta : {Trans::no, Trans::yes}) {
      for (Trans tb : {Trans::no, Trans::yes}) {
        const Problem p = make_problem(ta, tb, s, seed += 3, 2, true);
        for (bool accumulate : {false, true}) expect_matches_reference(gemm, p, accumulate);
      }
    }
  }
}

TEST_F(GemmTest, NegativeZeroResultsSurviveKBlocking) {
  // Every product is -0: the sum is fma(-0·x, ..., acc) from +0, which stays +0; accumulating
  // onto C = -0 gives -0 exactly when no +0 is ever added. Padding K would break the second.
  const int64_t M = 7, N = 19, K = 600;
  std::vector<float> A(M * K, -0.0f), B(K * N, 1.5f), C(M * N, -0.0f);
  for (GemmIsa isa : isas()) {
    set_gemm_isa(isa);
    std::fill(C.begin(), C.end(), -0.0f);
    gemm(Trans::no, Trans::no, M, N, K, A.data(), K, B.data(), N, C.data(), N, true);
    for (float c : C) ASSERT_TRUE(c == 0.0f && std::signbit(c)) << gemm_isa_name();
    gemm(Trans::no, Trans::no, M, N, K, A.data(), K, B.data(), N, C.data(), N, false);
    for (float c : C) ASSERT_TRUE(c == 0.0f && !std::signbit(c)) << gemm_isa_name();
  }
}

TEST_F(GemmTest, KZeroWritesZeroOrKeepsC) {
  std::vector<float> C(6, 5.0f);
  gemm(Trans::no, Trans::no, 2, 3, 0, nullptr, 1, nullptr, 3, C.data(), 3, true);
  for (float c : C) EXPECT_EQ(c, 5.0f);
  gemm(Trans::no, Trans::no, 2, 3, 0, nullptr, 1, nullptr, 3, C.data(), 3, false);
  for (float c : C) EXPECT_TRUE(c == 0.0f && !std::signbit(c));
}

TEST_F(GemmTest, BatchInvariantRowDoesNotDependOnMOrPosition) {
  const int64_t N = 37, K = 300;
  const std::vector<float> x = random_values(K, 7);
  for (Trans tb : {Trans::no, Trans::yes}) {
    const std::vector<float> W = random_values(K * N, 8);
    const int64_t ldb = tb == Trans::no ? N : K;
    for (GemmIsa isa : isas()) {
      set_gemm_isa(isa);
      std::vector<float> alone(N);
      gemm(Trans::no, tb, 1, N, K, x.data(), K, W.data(), ldb, alone.data(), N);
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        // Every M on the fast kernel with one thread; the slow generic kernel checks the tile
        // edges and a few more; two threads only split the large M (the rest runs on one).
        for (int64_t M = 1; M <= 300;
             M += threads == 2 ? (M < 150 ? 149 : 7) : (isa != GemmIsa::generic || M < 13) ? 1 : 37) {
          std::vector<float> A = random_values(M * K, static_cast<uint32_t>(M));
          std::vector<float> C(M * N);
          for (int64_t pos : {int64_t{0}, M / 2, M - 1}) {
            std::copy(x.begin(), x.end(), A.begin() + pos * K);
            gemm(Trans::no, tb, M, N, K, A.data(), K, W.data(), ldb, C.data(), N);
            ASSERT_EQ(0, std::memcmp(C.data() + pos * N, alone.data(), N * sizeof(float)))
                << "M=" << M << " row " << pos << " isa=" << gemm_isa_name()
                << " threads=" << threads;
          }
        }
      }
    }
  }
}

TEST_F(GemmTest, WithinForwardErrorBoundOfFp64Product) {
  // |C - C64| <= γ_K · Σ|a||b|, γ_K = K·u / (1 - K·u), u = 2^-24 (Higham, Thm 3.5).
  for (const Shape& s : {Shape{33, 47, 1000}, Shape{200, 64, 4096}, Shape{5, 300, 17}}) {
    const Problem p = make_problem(Trans::no, Trans::yes, s, 99, 0, false);
    const std::vector<float> C = run(gemm, p, false);
    const double u = std::ldexp(1.0, -24), k = static_cast<double>(s.K);
    const double gamma = k * u / (1.0 - k * u);
    for (int64_t i = 0; i < s.M; ++i) {
      for (int64_t j = 0; j < s.N; ++j) {
        double exact = 0.0, magnitude = 0.0;
        for (int64_t kk = 0; kk < s.K; ++kk) {
          const double a = p.A[i * p.lda + kk], b = p.B[j * p.ldb + kk];
          exact += a * b;
          magnitude += std::fabs(a * b);
        }
        ASSERT_LE(std::fabs(C[i * p.ldc + j] - exact), gamma * magnitude)
            << "M=" << s.M << " N=" << s.N << " K=" << s.K << " at " << i << "," << j;
      }
    }
  }
}

TEST_F(GemmTest, Bf16PanelsEqualReferenceOnBf16Values) {
  uint32_t seed = 5000;
  for (const Shape& s : {Shape{1, 1, 1}, Shape{7, 17, 3}, Shape{13, 33, 257}, Shape{150, 40, 513},
                         Shape{65, 129, 300}, Shape{512, 100, 64}}) {
    for (Trans ta : {Trans::no, Trans::yes}) {
      for (Trans tb : {Trans::no, Trans::yes}) {
        const Problem p = make_problem(ta, tb, s, seed += 3, 3, false, /*bf16=*/true);
        for (bool accumulate : {false, true}) {
          expect_matches_reference(gemm_bf16, p, accumulate);
          // And hence equal to the fp32 path.
          ASSERT_EQ(-1, first_difference(run(gemm_bf16, p, accumulate), run(gemm, p, accumulate)));
        }
      }
    }
  }
}

// ---- gemm_packed: B packed once (PackedB), the skinny M <= 8 path and the blocked path ----

// gemm's signature over gemm_packed: packs op(B) (fp32 or bf16 panels), then multiplies.
template <bool kBf16>
void gemm_via_packed(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, const float* A,
                     int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc,
                     bool accumulate) {
  PackedB packed;
  pack_b(packed, tb, K, N, B, ldb, kBf16);
  gemm_packed(ta, M, N, K, A, lda, packed, C, ldc, accumulate);
}

std::vector<Shape> packed_shapes() {
  std::vector<Shape> shapes;
  // Every skinny M (1..8) and the first blocked one (9): tiny, a partial last panel and a
  // partial last 4-panel block, K past one 512-step chunk (odd: a bf16 tail), and enough
  // weight (N·K >= 2^16) for the N split over two threads.
  for (int64_t M = 1; M <= 9; ++M) {
    shapes.push_back({M, 17, 33});
    shapes.push_back({M, 65, 1031});
    shapes.push_back({M, 1000, 301});
  }
  for (const Shape& s : {Shape{1, 1, 1}, Shape{2, 16, 2}, Shape{4, 64, 512}, Shape{3, 3100, 9},
                         Shape{13, 129, 300}, Shape{150, 40, 513}, Shape{0, 5, 5}, Shape{5, 0, 5},
                         Shape{5, 5, 0}}) {
    shapes.push_back(s);
  }
  return shapes;
}

TEST_F(GemmTest, PackedBEqualsReferenceForEveryMTransposeStrideThreadsAndIsa) {
  uint32_t seed = 9000;
  for (const Shape& s : packed_shapes()) {
    for (Trans ta : {Trans::no, Trans::yes}) {
      for (Trans tb : {Trans::no, Trans::yes}) {
        seed += 3;
        // Padded leading dimensions (ld != row length) on two of three problems.
        const Problem p = make_problem(ta, tb, s, seed, (seed % 3) * 3, false);
        // bf16 panels: B's values bf16, A's arbitrary fp32 (A is never truncated).
        Problem q = make_problem(ta, tb, s, seed + 1, (seed % 2) * 5, false);
        q.B = to_bf16_values(q.B);
        for (bool accumulate : {false, true}) {
          expect_matches_reference(gemm_via_packed<false>, p, accumulate);
          expect_matches_reference(gemm_via_packed<true>, q, accumulate);
        }
      }
    }
  }
}

TEST_F(GemmTest, PackedBEqualsReferenceWithNanInfSignedZeroAndSubnormals) {
  uint32_t seed = 9500;
  for (const Shape& s : {Shape{1, 70, 515}, Shape{3, 33, 17}, Shape{6, 40, 600},
                         Shape{8, 17, 1030}, Shape{20, 33, 40}}) {
    for (Trans ta : {Trans::no, Trans::yes}) {
      for (Trans tb : {Trans::no, Trans::yes}) {
        const Problem p = make_problem(ta, tb, s, seed += 3, 1, true);
        Problem q = p;
        q.B = to_bf16_values(q.B);
        for (bool accumulate : {false, true}) {
          expect_matches_reference(gemm_via_packed<false>, p, accumulate);
          expect_matches_reference(gemm_via_packed<true>, q, accumulate);
        }
      }
    }
  }
}

TEST_F(GemmTest, PackedNegativeZeroResultsSurviveKChunks) {
  // As NegativeZeroResultsSurviveKBlocking, through the skinny path's K chunks (two row groups
  // at M = 7) and the bf16 panels' odd tail.
  const int64_t N = 19, K = 1031;
  std::vector<float> B(K * N, 1.5f);
  for (bool bf16 : {false, true}) {
    PackedB packed;
    pack_b(packed, Trans::no, K, N, B.data(), N, bf16);
    for (int64_t M : {1, 7, 12}) {
      std::vector<float> A(M * K, -0.0f), C(M * N, -0.0f);
      for (GemmIsa isa : isas()) {
        set_gemm_isa(isa);
        std::fill(C.begin(), C.end(), -0.0f);
        gemm_packed(Trans::no, M, N, K, A.data(), K, packed, C.data(), N, true);
        for (float c : C) ASSERT_TRUE(c == 0.0f && std::signbit(c)) << gemm_isa_name() << M;
        gemm_packed(Trans::no, M, N, K, A.data(), K, packed, C.data(), N, false);
        for (float c : C) ASSERT_TRUE(c == 0.0f && !std::signbit(c)) << gemm_isa_name() << M;
      }
    }
  }
}

TEST_F(GemmTest, PackedRowDoesNotDependOnMAcrossTheSkinnyAndBlockedPaths) {
  // Decode (M = 1) and prefill (M large) rows of the same input must agree bit for bit.
  const int64_t N = 200, K = 700;
  const std::vector<float> x = random_values(K, 17);
  const std::vector<float> W = to_bf16_values(random_values(N * K, 18));
  for (bool bf16 : {false, true}) {
    PackedB packed;
    pack_b(packed, Trans::yes, K, N, W.data(), K, bf16);
    for (GemmIsa isa : isas()) {
      set_gemm_isa(isa);
      std::vector<float> alone(N);
      gemm_packed(Trans::no, 1, N, K, x.data(), K, packed, alone.data(), N);
      std::vector<float> want(N);
      gemm_reference(Trans::no, Trans::yes, 1, N, K, x.data(), K, W.data(), K, want.data(), N);
      ASSERT_EQ(0, std::memcmp(alone.data(), want.data(), N * sizeof(float)));
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        for (int64_t M : {2, 3, 4, 5, 6, 7, 8, 9, 16, 31, 150}) {
          std::vector<float> A = random_values(M * K, static_cast<uint32_t>(M));
          std::vector<float> C(M * N);
          for (int64_t pos : {int64_t{0}, M / 2, M - 1}) {
            std::copy(x.begin(), x.end(), A.begin() + pos * K);
            gemm_packed(Trans::no, M, N, K, A.data(), K, packed, C.data(), N);
            ASSERT_EQ(0, std::memcmp(C.data() + pos * N, alone.data(), N * sizeof(float)))
                << "M=" << M << " row " << pos << " bf16=" << bf16
                << " isa=" << gemm_isa_name() << " threads=" << threads;
          }
        }
      }
    }
  }
}

TEST_F(GemmTest, PackedRejectsAMismatchedOrMissingPacking) {
  std::vector<float> buf(64, 1.0f);
  PackedB packed;
  EXPECT_THROW(gemm_packed(Trans::no, 1, 4, 4, buf.data(), 4, packed, buf.data(), 4),
               InputError);  // not packed
  pack_b(packed, Trans::no, 4, 4, buf.data(), 4, false);
  EXPECT_THROW(gemm_packed(Trans::no, 1, 4, 5, buf.data(), 5, packed, buf.data(), 4),
               InputError);
  EXPECT_THROW(gemm_packed(Trans::no, 2, 4, 4, buf.data(), 3, packed, buf.data(), 4),
               InputError);  // lda too small
  EXPECT_THROW(pack_b(packed, Trans::yes, 4, 4, buf.data(), 3, false), InputError);
}

TEST_F(GemmTest, RejectsBadShapesAndStrides) {
  std::vector<float> buf(64);
  EXPECT_THROW(gemm(Trans::no, Trans::no, -1, 2, 2, buf.data(), 2, buf.data(), 2, buf.data(), 2),
               InputError);
  EXPECT_THROW(gemm(Trans::no, Trans::no, 2, 2, 4, buf.data(), 3, buf.data(), 2, buf.data(), 2),
               InputError);
  EXPECT_THROW(gemm(Trans::no, Trans::yes, 2, 2, 4, buf.data(), 4, buf.data(), 3, buf.data(), 2),
               InputError);
  EXPECT_THROW(gemm(Trans::no, Trans::no, 2, 5, 2, buf.data(), 2, buf.data(), 5, buf.data(), 4),
               InputError);
}

TEST_F(GemmTest, IsaSelection) {
  set_gemm_isa(GemmIsa::generic);
  EXPECT_STREQ(gemm_isa_name(), "generic");
  if (gemm_isa_supported(GemmIsa::avx2)) {
    set_gemm_isa(GemmIsa::avx2);
    EXPECT_STREQ(gemm_isa_name(), "avx2");
  } else {
    EXPECT_THROW(set_gemm_isa(GemmIsa::avx2), InputError);
  }
  if (gemm_isa_supported(GemmIsa::avx512)) {
    EXPECT_TRUE(gemm_isa_supported(GemmIsa::avx2));
    set_gemm_isa(GemmIsa::avx512);
    EXPECT_STREQ(gemm_isa_name(), "avx512");
  } else {
    EXPECT_THROW(set_gemm_isa(GemmIsa::avx512), InputError);
  }
}

// ---- Tensor and Arena (tensor.h, arena.h) ----

TEST(TensorTest, ShapeNumelDimAndZeroFill) {
  Tensor t({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dim(0), 2);
  EXPECT_EQ(t.dim(-1), 4);
  EXPECT_THROW(t.dim(3), InputError);
  for (float v : t.span()) EXPECT_EQ(v, 0.0f);
  EXPECT_THROW(Tensor({2, -1}), InputError);
  const std::vector<float> values{1, 2, 3, 4, 5, 6};
  Tensor u({2, 3}, values);
  EXPECT_EQ(u.data()[5], 6.0f);
  EXPECT_THROW(Tensor({2, 2}, values), InputError);
  EXPECT_EQ(Tensor().numel(), 0);
}

TEST(ArenaTest, AlignedNonOverlappingStableMarkRewindHighWater) {
  Arena arena(4096);
  float* a = arena.alloc(10);
  float* b = arena.alloc(0);
  float* c = arena.alloc(3000);  // larger than a chunk: a chunk of its own
  for (float* p : {a, b, c}) EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_NE(a, b);
  std::fill_n(a, 10, 1.0f);
  std::fill_n(c, 3000, 2.0f);
  EXPECT_EQ(a[9], 1.0f);  // allocations never move or overlap
  const size_t m = arena.mark();
  float* d = arena.alloc(100);
  const size_t high = arena.bytes_high_water();
  EXPECT_GE(high, m + 400);
  arena.rewind(m);
  EXPECT_EQ(arena.alloc(100), d);  // the same memory again after a rewind
  EXPECT_THROW(arena.rewind(arena.mark() + 64), InputError);
  arena.reset();
  EXPECT_EQ(arena.mark(), 0u);
  EXPECT_EQ(arena.alloc(10), a);  // chunks are kept
  EXPECT_EQ(arena.bytes_high_water(), high);
  EXPECT_THROW(arena.alloc(-1), InputError);
}

// The live bytes leave out the chunk tails a large allocation skipped, through rewinds.
TEST(ArenaTest, LiveBytesCountAllocationsNotSkippedChunkTails) {
  Arena arena(4096);
  arena.alloc(10);                       // 64 B in chunk 0
  EXPECT_EQ(arena.bytes_live(), 64u);
  const size_t m = arena.mark();
  arena.alloc(2000);                     // 8000 B: a chunk of its own, chunk 0's tail skipped
  EXPECT_EQ(arena.bytes_live(), 64u + 8000u);
  EXPECT_GT(arena.mark(), arena.bytes_live());
  arena.alloc(16);                       // 64 B more: a third chunk, the second's tail is 0
  EXPECT_EQ(arena.bytes_live(), 64u + 8000u + 64u);
  EXPECT_EQ(arena.bytes_live_high_water(), 8128u);
  arena.rewind(m);
  EXPECT_EQ(arena.bytes_live(), 64u);
  arena.alloc(100);                      // 448 B: fits in chunk 0 again
  EXPECT_EQ(arena.bytes_live(), 512u);
  arena.reset_high_water();
  EXPECT_EQ(arena.bytes_live_high_water(), 512u);
  arena.reset();
  EXPECT_EQ(arena.bytes_live(), 0u);
}

}  // namespace
}  // namespace concord::tensor
