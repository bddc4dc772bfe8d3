// The vectorized passes of row_divergence (bounds.cpp), written once over GCC vector
// extensions of W doubles and instantiated per ISA in bounds.cpp with target attributes.
// Internal: include only from bounds.cpp (every helper has internal linkage and is always
// inlined into the per-ISA kernels, so no ISA-specific code can be shared by the linker).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

// Vectors wider than the baseline ISA: GCC warns that passing them by value would change the
// ABI; every helper below has internal linkage and is always inlined (and takes references).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace concord::audit {
namespace {

#define CONCORD_AUDIT_INLINE inline __attribute__((always_inline))

// Vectors of W doubles, W native to the ISA (2: SSE2, 4: AVX2, 8: AVX-512). The arithmetic is
// defined on kLanes = 8 logical lanes held as kLanes / W native vectors, so every ISA computes
// the same lanes in the same order.
template <int W>
struct Simd {
  typedef double D __attribute__((vector_size(8 * W)));
  typedef int64_t I __attribute__((vector_size(8 * W)));
  typedef float F __attribute__((vector_size(4 * W)));
};

constexpr int kLanes = 8;
constexpr size_t kBlock = 1024;  // entries summed into per-block partials before the totals

constexpr double kInf = std::numeric_limits<double>::infinity();
// The Taylor polynomials below hold to < 1 ulp for |t| ≤ ln2/2 = 0.3466; rows with osc up to
// this take the polynomial-only path, and entries with |r| up to it the polynomial branch.
constexpr double kTaylorRadius = 0.34;
// Above this gap between the candidate's max and its logit at the reference's top token,
// e^(z_B − z_B[top]) could overflow in pass 2: c is then taken from log S_A − log S_B.
constexpr double kTiltGapLimit = 600.0;

// 1/j! for j = 0..14, each rounded once (j! is exact in double).
constexpr auto kInvFactorial = [] {
  struct Table {
    double v[15];
  } table{};
  double factorial = 1;
  for (int j = 0; j < 15; ++j) {
    if (j > 0) factorial *= j;
    table.v[j] = 1.0 / factorial;
  }
  return table;
}();

// Cody–Waite: ln2 = kLn2Hi + kLn2Lo with kLn2Hi's low 21 bits zero, so k·kLn2Hi is exact for
// |k| < 2^11 (fdlibm's split).
constexpr double kLog2e = 1.4426950408889634;
constexpr double kLn2Hi = 6.93147180369123816490e-01;
constexpr double kLn2Lo = 1.90821492927058770002e-10;
// Adding 1.5·2^52 rounds to an integer held in the low mantissa bits (|k| < 2^51).
constexpr double kShifter = 0x1.8p52;
constexpr int64_t kShifterBits = 0x4338000000000000;
constexpr double kExpLow = -750.0;  // e^x rounds to 0 below −745.13
constexpr double kExpHigh = 709.0;  // e^709.78 overflows

template <class D>
using MaskOf = decltype(D{} < D{});

template <class D>
CONCORD_AUDIT_INLINE D splat(double x) {
  return D{} + x;
}
template <class D>
CONCORD_AUDIT_INLINE D vabs(const D& x) {
  return reinterpret_cast<D>(reinterpret_cast<MaskOf<D>>(x) & INT64_MAX);
}
template <class D>
CONCORD_AUDIT_INLINE D vmax(const D& a, const D& b) {
  return a > b ? a : b;
}
template <class D>
CONCORD_AUDIT_INLINE D vmin(const D& a, const D& b) {
  return a < b ? a : b;
}
template <class D>
CONCORD_AUDIT_INLINE D keep(const MaskOf<D>& mask, const D& x) {
  return mask ? x : splat<D>(0);
}
template <class D>
CONCORD_AUDIT_INLINE D iota(int first) {
  D v{};
  for (int j = 0; j < static_cast<int>(sizeof(D) / 8); ++j) v[j] = first + j;
  return v;
}

// 2^k for the integer k held in y = k + kShifter (k + 1023 in [1, 2046]).
template <class D>
CONCORD_AUDIT_INLINE D pow2(const D& y) {
  return reinterpret_cast<D>((reinterpret_cast<MaskOf<D>>(y) - (kShifterBits - 1023)) << 52);
}

// e^t − 1 − t for |t| ≤ ln2/2: t² Σ_{j=2..14} t^(j−2)/j! (Horner). The first omitted term,
// t^15/15!, is below 2^-60 relative to t²/2.
template <class D>
CONCORD_AUDIT_INLINE D taylor_psi(const D& t) {
  D p = splat<D>(kInvFactorial.v[14]);
  for (int j = 13; j >= 2; --j) p = p * t + kInvFactorial.v[j];
  return (t * t) * p;
}

// The same polynomial split into even and odd halves, giving ψ(t) and ψ(−t) from one pass.
template <class D>
CONCORD_AUDIT_INLINE void taylor_psi_pair(const D& t, D& psi_pos, D& psi_neg) {
  const D u = t * t;
  D even = splat<D>(kInvFactorial.v[14]);  // 1/2! + u/4! + ... + u^6/14!
  for (int j = 12; j >= 2; j -= 2) even = even * u + kInvFactorial.v[j];
  D odd = splat<D>(kInvFactorial.v[13]);  // 1/3! + u/5! + ... + u^5/13!
  for (int j = 11; j >= 3; j -= 2) odd = odd * u + kInvFactorial.v[j];
  const D t_odd = t * odd;
  psi_pos = u * (even + t_odd);
  psi_neg = u * (even - t_odd);
}

// e^x: x = k·ln2 + t, |t| ≤ ln2/2, e^x = 2^k (1 + t + ψ(t)). 2^k is applied as two normal
// factors 2^k1 · 2^k2 so that results down to the subnormals round once, at the last product.
template <class D>
CONCORD_AUDIT_INLINE D vexp(const D& x_in) {
  D x = x_in < kExpLow ? splat<D>(kExpLow) : x_in;
  x = x > kExpHigh ? splat<D>(kExpHigh) : x;
  const D y = x * kLog2e + kShifter;
  const D k = y - kShifter;
  const D t = (x - k * kLn2Hi) - k * kLn2Lo;
  const D e_t = 1.0 + (t + taylor_psi(t));
  const D y1 = k * 0.5 + kShifter;  // k1 = round(k/2)
  const D y2 = (k - (y1 - kShifter)) + kShifter;
  return (e_t * pow2(y1)) * pow2(y2);
}

// W entries of a row, as doubles.
template <int W, class T>
CONCORD_AUDIT_INLINE typename Simd<W>::D load(const T* p) {
  if constexpr (sizeof(T) == 4) {
    typename Simd<W>::F f;
    std::memcpy(&f, p, sizeof f);
    return __builtin_convertvector(f, typename Simd<W>::D);
  } else {
    typename Simd<W>::D d;
    std::memcpy(&d, p, sizeof d);
    return d;
  }
}

// One chunk of kLanes entries, of which the first `count` are real (the rest read as 0).
template <int W, class T>
struct Chunk {
  static constexpr int K = kLanes / W;
  typename Simd<W>::D a[K], b[K], index[K];
  typename Simd<W>::I valid[K];
  size_t first;
  CONCORD_AUDIT_INLINE Chunk(const T* ref, const T* cand, size_t first_entry, size_t count)
      : first(first_entry) {
    T ref_buffer[kLanes] = {}, cand_buffer[kLanes] = {};
    const T* r = ref + first;
    const T* c = cand + first;
    if (count < kLanes) {
      std::memcpy(ref_buffer, r, count * sizeof(T));
      std::memcpy(cand_buffer, c, count * sizeof(T));
      r = ref_buffer;
      c = cand_buffer;
    }
    for (int k = 0; k < K; ++k) {
      a[k] = load<W>(r + k * W);
      b[k] = load<W>(c + k * W);
      index[k] = iota<typename Simd<W>::D>(k * W) + static_cast<double>(first);
      valid[k] = iota<typename Simd<W>::D>(k * W) < static_cast<double>(count);
    }
  }
};

// The 8 logical lanes of K native vectors, summed in a fixed tree.
template <int W>
CONCORD_AUDIT_INLINE double lane_sum(const typename Simd<W>::D (&v)[kLanes / W]) {
  double lane[kLanes];
  for (int k = 0; k < kLanes / W; ++k) {
    for (int j = 0; j < W; ++j) lane[k * W + j] = v[k][j];
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// ---- pass 1: extremes ----

template <int W>
struct ScanLanes {
  using D = typename Simd<W>::D;
  static constexpr int K = kLanes / W;
  D diff_max[K], diff_min[K], diff_error[K];
  D top1[K], top2[K], top1_index[K];  // z_A
  D cand_max[K], cand_index[K];       // z_B
  D finite_probe[K];  // Σ (a − a) + (b − b): 0, or NaN once a value is ±Inf/NaN
  CONCORD_AUDIT_INLINE ScanLanes() {
    for (int k = 0; k < K; ++k) {
      diff_max[k] = top1[k] = top2[k] = cand_max[k] = splat<D>(-kInf);
      diff_min[k] = splat<D>(kInf);
      diff_error[k] = top1_index[k] = cand_index[k] = finite_probe[k] = splat<D>(0);
    }
  }
};

struct Scan {
  double diff_max, diff_min, diff_error;  // max/min of fl(z_A − z_B), max |rounding error|
  double top1, top2;                      // largest and second largest z_A (with multiplicity)
  int64_t top_ref, top_cand;
  double cand_max;
  bool finite;
};

template <int W, bool kTail, class T>
CONCORD_AUDIT_INLINE void scan_chunk(ScanLanes<W>& s, const Chunk<W, T>& c) {
  using D = typename Simd<W>::D;
  for (int k = 0; k < kLanes / W; ++k) {
    const D a = c.a[k], b = c.b[k];
    s.finite_probe[k] += (a - a) + (b - b);
    // TwoSum: d + e = a − b exactly.
    const D d = a - b;
    const D b_virtual = d - a;
    const D a_virtual = d - b_virtual;
    const D e = (a - a_virtual) - (b + b_virtual);
    D d_hi = d, d_lo = d, a_top = a, b_top = b, e_abs = vabs(e);
    if constexpr (kTail) {
      d_hi = c.valid[k] ? d : splat<D>(-kInf);
      d_lo = c.valid[k] ? d : splat<D>(kInf);
      a_top = c.valid[k] ? a : splat<D>(-kInf);
      b_top = c.valid[k] ? b : splat<D>(-kInf);
      e_abs = keep(c.valid[k], e_abs);
    }
    s.diff_max[k] = vmax(s.diff_max[k], d_hi);
    s.diff_min[k] = vmin(s.diff_min[k], d_lo);
    s.diff_error[k] = vmax(s.diff_error[k], e_abs);
    // Strict > keeps the lowest index of each lane; an equal value becomes the lane's second.
    const auto above = a_top > s.top1[k];
    s.top2[k] = above ? s.top1[k] : vmax(s.top2[k], a_top);
    s.top1_index[k] = above ? c.index[k] : s.top1_index[k];
    s.top1[k] = above ? a_top : s.top1[k];
    const auto cand_above = b_top > s.cand_max[k];
    s.cand_index[k] = cand_above ? c.index[k] : s.cand_index[k];
    s.cand_max[k] = cand_above ? b_top : s.cand_max[k];
  }
}

template <int W, class T>
CONCORD_AUDIT_INLINE Scan scan_row(const T* ref, const T* cand, size_t n) {
  ScanLanes<W> s;
  const size_t full = n - n % kLanes;
  for (size_t i = 0; i < full; i += kLanes)
    scan_chunk<W, false>(s, Chunk<W, T>(ref, cand, i, kLanes));
  if (full < n) scan_chunk<W, true>(s, Chunk<W, T>(ref, cand, full, n - full));
  // Logical lane l = k·W + j.
  double diff_max[kLanes], diff_min[kLanes], diff_error[kLanes], top1[kLanes], top2[kLanes],
      top1_index[kLanes], cand_max[kLanes], cand_index[kLanes];
  bool finite = true;
  for (int k = 0; k < kLanes / W; ++k) {
    for (int j = 0; j < W; ++j) {
      const int l = k * W + j;
      diff_max[l] = s.diff_max[k][j];
      diff_min[l] = s.diff_min[k][j];
      diff_error[l] = s.diff_error[k][j];
      top1[l] = s.top1[k][j];
      top2[l] = s.top2[k][j];
      top1_index[l] = s.top1_index[k][j];
      cand_max[l] = s.cand_max[k][j];
      cand_index[l] = s.cand_index[k][j];
      finite = finite && s.finite_probe[k][j] == 0;
    }
  }
  Scan out{};
  out.finite = finite;
  out.diff_max = -kInf;
  out.diff_min = kInf;
  out.diff_error = 0;
  out.top1 = -kInf;
  out.cand_max = -kInf;
  double top_index = kInf, best_cand_index = kInf;
  int top_lane = 0;
  for (int l = 0; l < kLanes; ++l) {
    out.diff_max = std::fmax(out.diff_max, diff_max[l]);
    out.diff_min = std::fmin(out.diff_min, diff_min[l]);
    out.diff_error = std::fmax(out.diff_error, diff_error[l]);
    if (top1[l] > out.top1 || (top1[l] == out.top1 && top1_index[l] < top_index)) {
      out.top1 = top1[l];
      top_index = top1_index[l];
      top_lane = l;
    }
    if (cand_max[l] > out.cand_max ||
        (cand_max[l] == out.cand_max && cand_index[l] < best_cand_index)) {
      out.cand_max = cand_max[l];
      best_cand_index = cand_index[l];
    }
  }
  out.top2 = -kInf;
  for (int l = 0; l < kLanes; ++l)
    out.top2 = std::fmax(out.top2, l == top_lane ? top2[l] : top1[l]);
  out.top_ref = static_cast<int64_t>(top_index);
  out.top_cand = static_cast<int64_t>(best_cand_index);
  return out;
}

// ---- passes 2 and 3: sums ----

enum class Path {
  taylor,   // osc ≤ kTaylorRadius: every entry on the polynomial
  general,  // per entry: polynomial where |Δ − s| or |r| ≤ kTaylorRadius, direct otherwise
  ratio,    // as general, but c from log S_A − log S_B (the candidate's top is far above s)
};

// Per-block accumulators of three sums over the 8 logical lanes.
template <int W>
struct Sums3 {
  using D = typename Simd<W>::D;
  static constexpr int K = kLanes / W;
  D s0[K], s1[K], s2[K];
  CONCORD_AUDIT_INLINE Sums3() {
    for (int k = 0; k < K; ++k) s0[k] = s1[k] = s2[k] = splat<D>(0);
  }
  CONCORD_AUDIT_INLINE void add(const Sums3& o) {
    for (int k = 0; k < K; ++k) {
      s0[k] += o.s0[k];
      s1[k] += o.s1[k];
      s2[k] += o.s2[k];
    }
  }
};

// Runs step(acc, chunk) over the row in blocks of kBlock entries; returns the three totals.
template <int W, class T, class Step>
CONCORD_AUDIT_INLINE void sum_row(const T* ref, const T* cand, size_t n, double (&out)[3],
                                  const Step& step) {
  Sums3<W> total;
  const size_t full = n - n % kLanes;
  for (size_t begin = 0; begin < n; begin += kBlock) {
    Sums3<W> acc;
    const size_t end = begin + kBlock < full ? begin + kBlock : full;
    for (size_t i = begin; i < end; i += kLanes) {
      step.template operator()<false>(acc, Chunk<W, T>(ref, cand, i, kLanes));
    }
    if (begin + kBlock >= n && full < n) {
      step.template operator()<true>(acc, Chunk<W, T>(ref, cand, full, n - full));
    }
    total.add(acc);
  }
  out[0] = lane_sum<W>(total.s0);
  out[1] = lane_sum<W>(total.s1);
  out[2] = lane_sum<W>(total.s2);
}

// Pass 2: S_A = Σ e^(z_A − max z_A); Σ e^(z_A − max z_A)(e^−(Δ−s) − 1) (tilt); S_B (ratio).
// Each e^(z_A − max z_A) is kept in `exps` (padded to whole chunks) for pass 3.
template <int W, Path kPath>
struct Pass2Step {
  double ref_max, cand_max, shift;
  double* exps;
  template <bool kTail, class T>
  CONCORD_AUDIT_INLINE void operator()(Sums3<W>& acc, const Chunk<W, T>& c) const {
    using D = typename Simd<W>::D;
    for (int k = 0; k < kLanes / W; ++k) {
      const D a = c.a[k], b = c.b[k];
      D e_a = vexp(a - ref_max);
      if constexpr (kTail) e_a = keep(c.valid[k], e_a);
      std::memcpy(exps + c.first + k * W, &e_a, sizeof e_a);
      acc.s0[k] += e_a;
      if constexpr (kPath == Path::ratio) {
        D e_b = vexp(b - cand_max);
        if constexpr (kTail) e_b = keep(c.valid[k], e_b);
        acc.s2[k] += e_b;
      } else {
        const D d = (a - b) - shift;
        D psi_pos, psi_neg;
        taylor_psi_pair(d, psi_pos, psi_neg);
        D w = e_a * (psi_neg - d);  // e_A (e^−d − 1)
        if constexpr (kPath == Path::general) {
          // e^(x_A − d) = e^(z_B − z_B[top]) ≤ e^kTiltGapLimit here.
          const D direct = vexp((a - ref_max) - d) - e_a;
          w = vabs(d) <= kTaylorRadius ? w : direct;
        }
        if constexpr (kTail) w = keep(c.valid[k], w);
        acc.s1[k] += w;
      }
    }
  }
};

// Pass 3, with r = Δ − c = log p_A − log p_B: Σ |p_A − p_B|, KL, KL_rev.
template <int W, Path kPath>
struct Pass3Step {
  double ref_max, inv_ref_sum, shift, gap;
  const double* exps;  // pass 2's e^(z_A − max z_A)
  template <bool kTail, class T>
  CONCORD_AUDIT_INLINE void operator()(Sums3<W>& acc, const Chunk<W, T>& c) const {
    using D = typename Simd<W>::D;
    for (int k = 0; k < kLanes / W; ++k) {
      const D a = c.a[k], b = c.b[k];
      const D x_a = a - ref_max;
      const D p_a = load<W>(exps + c.first + k * W) * inv_ref_sum;
      const D r = ((a - b) - shift) - gap;
      D psi_pos, psi_neg;
      taylor_psi_pair(r, psi_pos, psi_neg);
      const D em1 = psi_neg - r;  // e^−r − 1 = p_B/p_A − 1
      const D p_b_taylor = p_a + p_a * em1;
      D tv = p_a * vabs(em1);
      D kl = p_a * psi_neg;
      D klr = p_b_taylor * psi_pos;
      if constexpr (kPath != Path::taylor) {
        // log p_B + log S_A = x_A − r ≤ log V: no overflow.
        const D p_b = vexp(x_a - r) * inv_ref_sum;
        const auto near = vabs(r) <= kTaylorRadius;
        tv = near ? tv : vabs(p_a - p_b);
        kl = near ? kl : (p_b - p_a) + p_a * r;
        klr = near ? klr : (p_a - p_b) - p_b * r;
      }
      if constexpr (kTail) {
        tv = keep(c.valid[k], tv);
        kl = keep(c.valid[k], kl);
        klr = keep(c.valid[k], klr);
      }
      acc.s0[k] += tv;
      acc.s1[k] += kl;
      acc.s2[k] += klr;
    }
  }
};

struct Pass3 {
  double tv2 = 0;  // Σ |p_A − p_B|
  double kl = 0;
  double kl_reverse = 0;
};

// Everything but validation and the token's fields. shift = fl(z_A − z_B) at the top token.
struct Sums {
  double ref_sum;  // S_A
  double gap;      // c − shift, c = log Z_A − log Z_B
  Pass3 pass3;
};

template <int W, Path kPath, class T>
CONCORD_AUDIT_INLINE Sums sums_on_path(const T* ref, const T* cand, size_t n, const Scan& scan,
                                       double shift, double* exps) {
  double p2[3];
  sum_row<W>(ref, cand, n, p2, Pass2Step<W, kPath>{scan.top1, scan.cand_max, shift, exps});
  Sums out{};
  out.ref_sum = p2[0];
  if constexpr (kPath == Path::ratio) {
    out.gap = ((scan.top1 - scan.cand_max) - shift) + std::log(p2[0] / p2[2]);
  } else {
    // c − s = −log E_A[e^−(Δ−s)]; E_A[e^−(Δ−s)] ≥ p_A(top) > 0.
    out.gap = -std::log1p(p2[1] / p2[0]);
  }
  double p3[3];
  sum_row<W>(ref, cand, n, p3, Pass3Step<W, kPath>{scan.top1, 1.0 / p2[0], shift, out.gap, exps});
  out.pass3 = {p3[0], p3[1], p3[2]};
  return out;
}

template <int W, class T>
CONCORD_AUDIT_INLINE Sums sums(const T* ref, const T* cand, size_t n, const Scan& scan, double osc,
                               double shift, double cand_gap, double* exps) {
  if (osc <= kTaylorRadius) return sums_on_path<W, Path::taylor>(ref, cand, n, scan, shift, exps);
  if (cand_gap <= kTiltGapLimit) {
    return sums_on_path<W, Path::general>(ref, cand, n, scan, shift, exps);
  }
  return sums_on_path<W, Path::ratio>(ref, cand, n, scan, shift, exps);
}

template <int W>
CONCORD_AUDIT_INLINE void exp_arrays(const double* x, double* out, size_t n) {
  for (size_t i = 0; i < n; i += W) {
    const size_t count = n - i < W ? n - i : W;
    double buffer[W] = {};
    std::memcpy(buffer, x + i, count * sizeof(double));
    const auto e = vexp(load<W>(buffer));
    std::memcpy(out + i, &e, count * sizeof(double));
  }
}

template <int W>
CONCORD_AUDIT_INLINE void psi_arrays(const double* t, double* pos, double* neg, size_t n) {
  for (size_t i = 0; i < n; i += W) {
    const size_t count = n - i < W ? n - i : W;
    double buffer[W] = {};
    std::memcpy(buffer, t + i, count * sizeof(double));
    typename Simd<W>::D p, q;
    taylor_psi_pair(load<W>(buffer), p, q);
    std::memcpy(pos + i, &p, count * sizeof(double));
    std::memcpy(neg + i, &q, count * sizeof(double));
  }
}

}  // namespace
}  // namespace concord::audit
