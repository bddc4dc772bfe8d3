// Population gradient flow: the ODE solver, least squares in closed form, and the trajectories
// that depart from the flow (flow.h).
#include "concord/train/flow.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "concord/numerics/check.h"
#include "concord/numerics/philox.h"
#include "concord/train/export.h"

namespace concord::train::flow {

namespace {

double dot(std::span<const double> a, std::span<const double> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
double norm(std::span<const double> a) { return std::sqrt(dot(a, a)); }

// out = A·v for a d×d row-major A.
void matvec(std::span<const double> a, std::span<const double> v, std::span<double> out, int64_t d) {
  for (int64_t i = 0; i < d; ++i) out[i] = dot(a.subspan(i * d, d), v);
}
// C = A·B, d×d row-major.
Vec matmul(std::span<const double> a, std::span<const double> b, int64_t d) {
  Vec c(d * d, 0.0);
  for (int64_t i = 0; i < d; ++i)
    for (int64_t k = 0; k < d; ++k) {
      const double aik = a[i * d + k];
      for (int64_t j = 0; j < d; ++j) c[i * d + j] += aik * b[k * d + j];
    }
  return c;
}

void check_theta(const LeastSquares& p, std::span<const double> theta, const char* what) {
  if (static_cast<int64_t>(theta.size()) != p.d)
    throw InputError(fmt::format("[flow] {}: θ has {} values, the problem {} dimensions", what, theta.size(), p.d));
}

void check_record(std::span<const int64_t> record) {
  for (size_t i = 0; i < record.size(); ++i)
    if (record[i] < 0 || (i > 0 && record[i] < record[i - 1]))
      throw InputError("[flow] recorded steps must be ascending and non-negative");
}

}  // namespace

// ---- ODE integration ----------------------------------------------------------------------

std::vector<Vec> integrate(const OdeRhs& f, double t0, Vec y, std::span<const double> times,
                           const OdeOptions& options, OdeStats* stats) {
  // Dormand–Prince 5(4) tableau.
  static constexpr double c2 = 1.0 / 5, c3 = 3.0 / 10, c4 = 4.0 / 5, c5 = 8.0 / 9;
  static constexpr double a21 = 1.0 / 5;
  static constexpr double a31 = 3.0 / 40, a32 = 9.0 / 40;
  static constexpr double a41 = 44.0 / 45, a42 = -56.0 / 15, a43 = 32.0 / 9;
  static constexpr double a51 = 19372.0 / 6561, a52 = -25360.0 / 2187, a53 = 64448.0 / 6561, a54 = -212.0 / 729;
  static constexpr double a61 = 9017.0 / 3168, a62 = -355.0 / 33, a63 = 46732.0 / 5247, a64 = 49.0 / 176,
                          a65 = -5103.0 / 18656;
  static constexpr double b1 = 35.0 / 384, b3 = 500.0 / 1113, b4 = 125.0 / 192, b5 = -2187.0 / 6784, b6 = 11.0 / 84;
  // b (5th order) − b* (4th order): the embedded error estimate.
  static constexpr double e1 = 71.0 / 57600, e3 = -71.0 / 16695, e4 = 71.0 / 1920, e5 = -17253.0 / 339200,
                          e6 = 22.0 / 525, e7 = -1.0 / 40;

  for (size_t i = 0; i < times.size(); ++i)
    if (times[i] < t0 || (i > 0 && times[i] < times[i - 1]))
      throw InputError("[flow] integrate: the output times must be ascending and not before t0");
  if (!(options.rtol > 0) || !(options.atol >= 0)) throw InputError("[flow] integrate: rtol must be > 0 and atol ≥ 0");

  const size_t n = y.size();
  OdeStats local;
  OdeStats& st = stats ? *stats : local;
  st = {};
  std::vector<Vec> k(7, Vec(n));
  Vec tmp(n), y_new(n);
  auto eval = [&](double t, std::span<const double> at, Vec& out) {
    f(t, at, out);
    ++st.evaluations;
    for (double v : out)
      if (!std::isfinite(v)) throw InputError(fmt::format("[flow] integrate: the derivative is not finite at t = {}", t));
  };

  double t = t0;
  eval(t, y, k[0]);
  // Initial step (Hairer, Nørsett, Wanner, Solving ODEs I, II.4): h = 0.01·‖y‖/‖f‖ in the
  // scaled norm, bounded by the first interval.
  auto scaled_rms = [&](std::span<const double> v, std::span<const double> ref) {
    double s = 0;
    for (size_t i = 0; i < n; ++i) {
      const double sc = options.atol + options.rtol * std::abs(ref[i]);
      s += (v[i] / sc) * (v[i] / sc);
    }
    return n ? std::sqrt(s / static_cast<double>(n)) : 0.0;
  };
  double h = options.initial_step;
  if (h <= 0) {
    const double d0 = scaled_rms(y, y), d1 = scaled_rms(k[0], y);
    h = (d0 < 1e-5 || d1 < 1e-5) ? 1e-6 : 0.01 * d0 / d1;
  }

  std::vector<Vec> out;
  out.reserve(times.size());
  for (double target : times) {
    while (t < target) {
      if (st.accepted + st.rejected >= options.max_steps)
        throw InputError(fmt::format("[flow] integrate: {} steps did not reach t = {} (stopped at {})",
                                     options.max_steps, target, t));
      bool last = false;
      if (t + h >= target || t + 1.0001 * h >= target) {
        h = target - t;
        last = true;
      }
      for (size_t i = 0; i < n; ++i) tmp[i] = y[i] + h * a21 * k[0][i];
      eval(t + c2 * h, tmp, k[1]);
      for (size_t i = 0; i < n; ++i) tmp[i] = y[i] + h * (a31 * k[0][i] + a32 * k[1][i]);
      eval(t + c3 * h, tmp, k[2]);
      for (size_t i = 0; i < n; ++i) tmp[i] = y[i] + h * (a41 * k[0][i] + a42 * k[1][i] + a43 * k[2][i]);
      eval(t + c4 * h, tmp, k[3]);
      for (size_t i = 0; i < n; ++i)
        tmp[i] = y[i] + h * (a51 * k[0][i] + a52 * k[1][i] + a53 * k[2][i] + a54 * k[3][i]);
      eval(t + c5 * h, tmp, k[4]);
      for (size_t i = 0; i < n; ++i)
        tmp[i] = y[i] + h * (a61 * k[0][i] + a62 * k[1][i] + a63 * k[2][i] + a64 * k[3][i] + a65 * k[4][i]);
      eval(t + h, tmp, k[5]);
      for (size_t i = 0; i < n; ++i)
        y_new[i] = y[i] + h * (b1 * k[0][i] + b3 * k[2][i] + b4 * k[3][i] + b5 * k[4][i] + b6 * k[5][i]);
      eval(t + h, y_new, k[6]);
      double err = 0;
      for (size_t i = 0; i < n; ++i) {
        const double e = h * (e1 * k[0][i] + e3 * k[2][i] + e4 * k[3][i] + e5 * k[4][i] + e6 * k[5][i] + e7 * k[6][i]);
        const double sc = options.atol + options.rtol * std::max(std::abs(y[i]), std::abs(y_new[i]));
        err += (e / sc) * (e / sc);
      }
      err = n ? std::sqrt(err / static_cast<double>(n)) : 0.0;
      const double factor = std::clamp(err > 0 ? 0.9 * std::pow(err, -0.2) : 5.0, 0.2, 5.0);
      if (err <= 1) {
        t = last ? target : t + h;
        y.swap(y_new);
        k[0].swap(k[6]);  // first same as last
        ++st.accepted;
        h *= factor;
      } else {
        ++st.rejected;
        h *= std::min(factor, 1.0);
      }
      if (!(h > 0) || t + h == t) throw InputError(fmt::format("[flow] integrate: the step size underflowed at t = {}", t));
    }
    out.push_back(y);
  }
  return out;
}

// ---- linear algebra -------------------------------------------------------------------------

SymmetricEigen symmetric_eigen(std::span<const double> a_in, int64_t d) {
  if (d < 1 || static_cast<int64_t>(a_in.size()) != d * d)
    throw InputError(fmt::format("[flow] symmetric_eigen: {} values are not a {}x{} matrix", a_in.size(), d, d));
  Vec a(a_in.begin(), a_in.end());
  double fro = 0;
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j) {
      fro += a[i * d + j] * a[i * d + j];
      if (std::abs(a[i * d + j] - a[j * d + i]) > 1e-12 * (std::abs(a[i * d + j]) + std::abs(a[j * d + i]) + 1e-300))
        throw InputError(fmt::format("[flow] symmetric_eigen: the matrix is not symmetric at ({}, {})", i, j));
    }
  Vec v(d * d, 0.0);
  for (int64_t i = 0; i < d; ++i) v[i * d + i] = 1;
  const double tol = 1e-15 * std::sqrt(fro);
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t p = 0; p < d; ++p)
      for (int64_t q = p + 1; q < d; ++q) off += a[p * d + q] * a[p * d + q];
    if (std::sqrt(off) <= tol) break;
    for (int64_t p = 0; p < d; ++p)
      for (int64_t q = p + 1; q < d; ++q) {
        const double apq = a[p * d + q];
        if (apq == 0) continue;
        // The rotation that zeroes (p, q) (Golub & Van Loan, Algorithm 8.5.1).
        const double tau = (a[q * d + q] - a[p * d + p]) / (2 * apq);
        const double tn = (tau >= 0 ? 1.0 : -1.0) / (std::abs(tau) + std::sqrt(1 + tau * tau));
        const double c = 1 / std::sqrt(1 + tn * tn), s = tn * c;
        for (int64_t k = 0; k < d; ++k) {  // A ← A·J
          const double akp = a[k * d + p], akq = a[k * d + q];
          a[k * d + p] = c * akp - s * akq;
          a[k * d + q] = s * akp + c * akq;
        }
        for (int64_t k = 0; k < d; ++k) {  // A ← Jᵀ·A
          const double apk = a[p * d + k], aqk = a[q * d + k];
          a[p * d + k] = c * apk - s * aqk;
          a[q * d + k] = s * apk + c * aqk;
        }
        for (int64_t k = 0; k < d; ++k) {  // V ← V·J
          const double vkp = v[k * d + p], vkq = v[k * d + q];
          v[k * d + p] = c * vkp - s * vkq;
          v[k * d + q] = s * vkp + c * vkq;
        }
      }
  }
  std::vector<int64_t> order(d);
  for (int64_t i = 0; i < d; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return a[i * d + i] < a[j * d + j]; });
  SymmetricEigen e;
  e.d = d;
  e.values.resize(d);
  e.vectors.resize(d * d);
  for (int64_t j = 0; j < d; ++j) {
    e.values[j] = a[order[j] * d + order[j]];
    for (int64_t i = 0; i < d; ++i) e.vectors[i * d + j] = v[i * d + order[j]];
  }
  return e;
}

double philox_normal(uint64_t seed, uint32_t stream, uint64_t index) {
  const numerics::RandomStream rng{seed, stream};
  const numerics::PhiloxBlock b = rng.block(index);
  // Two 53-bit uniforms in (0, 1] and [0, 1) from the block's four words.
  const double u1 = (static_cast<double>((static_cast<uint64_t>(b[0]) << 21) ^ b[1]) + 1.0) / 9007199254740992.0;
  const double u2 = static_cast<double>((static_cast<uint64_t>(b[2]) << 21) ^ b[3]) / 9007199254740992.0;
  return std::sqrt(-2 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
}

// ---- least squares --------------------------------------------------------------------------

LeastSquares LeastSquares::random(int64_t n, int64_t d, double condition, double noise, uint64_t seed) {
  if (n < 1 || d < 1) throw InputError(fmt::format("[flow] a least-squares problem needs n, d ≥ 1 (got {}, {})", n, d));
  if (!(condition >= 1)) throw InputError(fmt::format("[flow] condition must be ≥ 1 (got {})", condition));
  if (!(noise >= 0)) throw InputError(fmt::format("[flow] noise must be ≥ 0 (got {})", noise));
  LeastSquares p;
  p.n = n;
  p.d = d;
  p.x.resize(n * d);
  p.y.resize(n);
  Vec theta_true(d);
  for (int64_t j = 0; j < d; ++j) theta_true[j] = philox_normal(seed, 2, static_cast<uint64_t>(j));
  for (int64_t i = 0; i < n; ++i) {
    double dotv = 0;
    for (int64_t j = 0; j < d; ++j) {
      const double scale = d > 1 ? std::pow(condition, -0.5 * static_cast<double>(j) / static_cast<double>(d - 1)) : 1.0;
      const double v = scale * philox_normal(seed, 0, static_cast<uint64_t>(i * d + j));
      p.x[i * d + j] = v;
      dotv += v * theta_true[j];
    }
    p.y[i] = dotv + noise * philox_normal(seed, 1, static_cast<uint64_t>(i));
  }
  return p;
}

double LeastSquares::loss(std::span<const double> theta) const {
  check_theta(*this, theta, "loss");
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double r = dot(std::span<const double>(x).subspan(i * d, d), theta) - y[i];
    s += r * r;
  }
  return s / (2.0 * static_cast<double>(n));
}

void LeastSquares::gradient(std::span<const double> theta, std::span<double> g) const {
  check_theta(*this, theta, "gradient");
  std::fill(g.begin(), g.end(), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const auto xi = std::span<const double>(x).subspan(i * d, d);
    const double r = dot(xi, theta) - y[i];
    for (int64_t j = 0; j < d; ++j) g[j] += r * xi[j];
  }
  for (double& v : g) v /= static_cast<double>(n);
}

void LeastSquares::batch_gradient(std::span<const int64_t> rows, std::span<const double> theta,
                                  std::span<double> g) const {
  check_theta(*this, theta, "batch_gradient");
  if (rows.empty()) throw InputError("[flow] batch_gradient: an empty batch");
  std::fill(g.begin(), g.end(), 0.0);
  for (int64_t i : rows) {
    if (i < 0 || i >= n) throw InputError(fmt::format("[flow] batch_gradient: row {} of {}", i, n));
    const auto xi = std::span<const double>(x).subspan(i * d, d);
    const double r = dot(xi, theta) - y[i];
    for (int64_t j = 0; j < d; ++j) g[j] += r * xi[j];
  }
  for (double& v : g) v /= static_cast<double>(rows.size());
}

Vec LeastSquares::hessian() const {
  Vec h(d * d, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t a = 0; a < d; ++a)
      for (int64_t b = 0; b < d; ++b) h[a * d + b] += x[i * d + a] * x[i * d + b];
  for (double& v : h) v /= static_cast<double>(n);
  return h;
}

Vec LeastSquares::b() const {
  Vec out(d, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < d; ++j) out[j] += x[i * d + j] * y[i];
  for (double& v : out) v /= static_cast<double>(n);
  return out;
}

Vec LeastSquares::noise_covariance(std::span<const double> theta) const {
  check_theta(*this, theta, "noise_covariance");
  Vec mean(d, 0.0), second(d * d, 0.0), gi(d);
  for (int64_t i = 0; i < n; ++i) {
    const auto xi = std::span<const double>(x).subspan(i * d, d);
    const double r = dot(xi, theta) - y[i];
    for (int64_t j = 0; j < d; ++j) {
      gi[j] = r * xi[j];
      mean[j] += gi[j];
    }
    for (int64_t a = 0; a < d; ++a)
      for (int64_t b = 0; b < d; ++b) second[a * d + b] += gi[a] * gi[b];
  }
  const double inv = 1.0 / static_cast<double>(n);
  for (double& v : mean) v *= inv;
  for (int64_t a = 0; a < d; ++a)
    for (int64_t b = 0; b < d; ++b) second[a * d + b] = second[a * d + b] * inv - mean[a] * mean[b];
  return second;
}

LeastSquaresFlow::LeastSquaresFlow(const LeastSquares& p) : eigen_(symmetric_eigen(p.hessian(), p.d)) {
  if (eigen_.values.front() <= 1e-12 * eigen_.values.back())
    throw InputError(fmt::format("[flow] the least-squares Hessian is singular (eigenvalues {} .. {}): the flow's "
                                 "limit is not unique; use more rows than dimensions",
                                 eigen_.values.front(), eigen_.values.back()));
  // θ* = V Λ⁻¹ Vᵀ b
  const int64_t d = p.d;
  const Vec b = p.b();
  theta_star_.assign(d, 0.0);
  for (int64_t j = 0; j < d; ++j) {
    double c = 0;
    for (int64_t i = 0; i < d; ++i) c += eigen_.vectors[i * d + j] * b[i];
    c /= eigen_.values[j];
    for (int64_t i = 0; i < d; ++i) theta_star_[i] += eigen_.vectors[i * d + j] * c;
  }
}

Vec LeastSquaresFlow::at(double t, std::span<const double> theta0) const {
  const int64_t d = eigen_.d;
  if (static_cast<int64_t>(theta0.size()) != d)
    throw InputError(fmt::format("[flow] θ₀ has {} values, the problem {} dimensions", theta0.size(), d));
  Vec out = theta_star_;
  for (int64_t j = 0; j < d; ++j) {
    double c = 0;
    for (int64_t i = 0; i < d; ++i) c += eigen_.vectors[i * d + j] * (theta0[i] - theta_star_[i]);
    c *= std::exp(-t * eigen_.values[j]);
    for (int64_t i = 0; i < d; ++i) out[i] += eigen_.vectors[i * d + j] * c;
  }
  return out;
}

std::vector<Vec> gradient_descent(const LeastSquares& p, std::span<const double> theta0, double eta,
                                  std::span<const int64_t> record) {
  check_theta(p, theta0, "gradient_descent");
  check_record(record);
  Vec theta(theta0.begin(), theta0.end()), g(p.d);
  std::vector<Vec> out;
  int64_t step = 0;
  for (int64_t target : record) {
    for (; step < target; ++step) {
      p.gradient(theta, g);
      for (int64_t j = 0; j < p.d; ++j) theta[j] -= eta * g[j];
    }
    out.push_back(theta);
  }
  return out;
}

std::vector<int64_t> sgd_batch(int64_t n, int64_t batch, uint64_t seed, int64_t step) {
  if (n < 1 || batch < 1) throw InputError(fmt::format("[flow] sgd: batch {} of {} rows", batch, n));
  const numerics::RandomStream rng{seed, 0x5347u};
  std::vector<int64_t> rows(batch);
  for (int64_t j = 0; j < batch; ++j) {
    // One 64-bit word per draw, reduced modulo n (bias < n / 2^64: nil for any real n).
    const numerics::PhiloxBlock b = rng.block(static_cast<uint64_t>(step) * static_cast<uint64_t>(batch) + j);
    const uint64_t w = (static_cast<uint64_t>(b[0]) << 32) | b[1];
    rows[j] = static_cast<int64_t>(w % static_cast<uint64_t>(n));
  }
  return rows;
}

std::vector<Vec> sgd(const LeastSquares& p, std::span<const double> theta0, double eta, int64_t batch, uint64_t seed,
                     std::span<const int64_t> record) {
  check_theta(p, theta0, "sgd");
  check_record(record);
  Vec theta(theta0.begin(), theta0.end()), g(p.d);
  std::vector<Vec> out;
  int64_t step = 0;
  for (int64_t target : record) {
    for (; step < target; ++step) {
      const std::vector<int64_t> rows = sgd_batch(p.n, batch, seed, step);
      p.batch_gradient(rows, theta, g);
      for (int64_t j = 0; j < p.d; ++j) theta[j] -= eta * g[j];
    }
    out.push_back(theta);
  }
  return out;
}

SgdMoments sgd_moments(const LeastSquares& p, std::span<const double> theta0, double eta, int64_t batch,
                       std::span<const int64_t> record) {
  check_theta(p, theta0, "sgd_moments");
  check_record(record);
  if (batch < 1) throw InputError("[flow] sgd_moments: batch must be ≥ 1");
  const int64_t d = p.d;
  const Vec h = p.hessian(), b = p.b();
  Vec m_mat(d * d);  // I − ηH
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j) m_mat[i * d + j] = (i == j ? 1.0 : 0.0) - eta * h[i * d + j];
  Vec mean(theta0.begin(), theta0.end()), cov(d * d, 0.0), g(d);
  SgdMoments out;
  int64_t step = 0;
  const double scale = eta * eta / static_cast<double>(batch);
  for (int64_t target : record) {
    for (; step < target; ++step) {
      // The noise term's expectation over θ_k: Σ(mean) + (1/n)Σ A_i Cov A_i − H Cov H.
      Vec noise = p.noise_covariance(mean);
      if (step > 0) {
        const Vec hch = matmul(matmul(h, cov, d), h, d);
        Vec cx(d);
        for (int64_t i = 0; i < p.n; ++i) {
          const auto xi = std::span<const double>(p.x).subspan(i * d, d);
          matvec(cov, xi, cx, d);  // Cov x_i; A_i Cov A_i = x_i (x_iᵀ Cov x_i) x_iᵀ
          const double q = dot(xi, cx) / static_cast<double>(p.n);
          for (int64_t a = 0; a < d; ++a)
            for (int64_t c = 0; c < d; ++c) noise[a * d + c] += q * xi[a] * xi[c];
        }
        for (int64_t k = 0; k < d * d; ++k) noise[k] -= hch[k];
      }
      Vec next = matmul(matmul(m_mat, cov, d), m_mat, d);
      for (int64_t k = 0; k < d * d; ++k) next[k] += scale * noise[k];
      cov.swap(next);
      matvec(h, mean, g, d);
      for (int64_t j = 0; j < d; ++j) mean[j] -= eta * (g[j] - b[j]);
    }
    out.mean.push_back(mean);
    out.covariance.push_back(cov);
  }
  return out;
}

std::vector<Vec> sgd_diffusion_covariance(const LeastSquares& p, std::span<const double> theta0,
                                          std::span<const double> times) {
  check_theta(p, theta0, "sgd_diffusion_covariance");
  const int64_t d = p.d;
  const LeastSquaresFlow flow(p);
  const Vec h = p.hessian();
  const Vec start(theta0.begin(), theta0.end());
  const OdeRhs rhs = [&](double t, std::span<const double> c, std::span<double> dc) {
    const Vec theta = flow.at(t, start);
    const Vec sigma = p.noise_covariance(theta);
    const Vec hc = matmul(h, c, d);
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j) dc[i * d + j] = -hc[i * d + j] - hc[j * d + i] + sigma[i * d + j];  // CH = (HC)ᵀ
  };
  OdeOptions opt;
  opt.rtol = 1e-10;
  opt.atol = 1e-14;
  return integrate(rhs, 0.0, Vec(d * d, 0.0), times, opt);
}

double served_ulp(numerics::Format served, double x) {
  const numerics::FormatTraits& tr = numerics::traits(served);
  if (tr.is_integer()) return 1.0;
  const double ax = std::abs(x);
  int e = ax > 0 ? std::ilogb(ax) : tr.emin;
  e = std::max(e, tr.emin);
  return std::ldexp(1.0, e - tr.mantissa_bits);
}

std::vector<Vec> served_gradient_descent(const LeastSquares& p, std::span<const double> theta0, double eta,
                                         const std::string& rule_name, numerics::Format served, uint64_t seed,
                                         int64_t steps, std::span<const int64_t> record,
                                         std::vector<int64_t>* first_move) {
  check_theta(p, theta0, "served_gradient_descent");
  check_record(record);
  if (!record.empty() && record.back() > steps)
    throw InputError(fmt::format("[flow] recorded step {} is past the run's {} steps", record.back(), steps));
  const std::unique_ptr<ExportRule> rule = make_export_rule(rule_name, served, seed);
  const int64_t d = p.d;
  std::vector<float> master(d), served_f(d);
  for (int64_t j = 0; j < d; ++j) master[j] = static_cast<float>(theta0[j]);
  // rows = d, cols = 1: the ExportRule contract serves rows == 1 (a norm vector) in fp32.
  rule->apply(0, master, served_f, d, 1, 0);
  const std::vector<float> served0 = served_f;
  if (first_move) first_move->assign(d, -1);
  Vec s(d), g(d);
  std::vector<Vec> out;
  size_t next = 0;
  auto take = [&](int64_t step) {
    while (next < record.size() && record[next] == step) {
      out.emplace_back(served_f.begin(), served_f.end());
      ++next;
    }
  };
  take(0);
  for (int64_t step = 1; step <= steps; ++step) {
    for (int64_t j = 0; j < d; ++j) s[j] = served_f[j];
    p.gradient(s, g);
    for (int64_t j = 0; j < d; ++j) master[j] = static_cast<float>(master[j] - eta * g[j]);
    rule->apply(0, master, served_f, d, 1, static_cast<uint64_t>(step));
    if (first_move)
      for (int64_t j = 0; j < d; ++j)
        if ((*first_move)[j] < 0 && served_f[j] != served0[j]) (*first_move)[j] = step;
    take(step);
  }
  return out;
}

// ---- curvature ------------------------------------------------------------------------------

void hvp_central(const GradientFn& gradient, std::span<const double> theta, std::span<const double> v, double eps,
                 std::span<double> out) {
  const size_t d = theta.size();
  if (v.size() != d || out.size() != d) throw InputError("[flow] hvp: θ, v and out sizes differ");
  if (!(eps > 0)) throw InputError("[flow] hvp: the step must be > 0");
  const double nv = norm(v);
  if (nv == 0) {
    std::fill(out.begin(), out.end(), 0.0);
    return;
  }
  Vec plus(d), minus(d), gp(d), gm(d);
  for (size_t i = 0; i < d; ++i) {
    plus[i] = theta[i] + eps * v[i] / nv;
    minus[i] = theta[i] - eps * v[i] / nv;
  }
  gradient(plus, gp);
  gradient(minus, gm);
  for (size_t i = 0; i < d; ++i) out[i] = (gp[i] - gm[i]) / (2 * eps) * nv;
}

PowerResult top_eigenvalue(const HvpFn& hvp, int64_t d, uint64_t seed, int max_iterations, double tol) {
  if (d < 1) throw InputError("[flow] top_eigenvalue: d must be ≥ 1");
  Vec v(d), hv(d);
  for (int64_t i = 0; i < d; ++i) v[i] = philox_normal(seed, 7, static_cast<uint64_t>(i));
  double nv = norm(v);
  for (double& x : v) x /= nv;
  PowerResult r;
  double lambda = 0;
  for (int it = 1; it <= max_iterations; ++it) {
    hvp(v, hv);
    const double next = dot(v, hv);
    r.iterations = it;
    const double nh = norm(hv);
    if (nh == 0) {
      lambda = 0;
      break;
    }
    const bool done = it > 1 && std::abs(next - lambda) <= tol * std::abs(next);
    lambda = next;
    if (done) break;
    for (int64_t i = 0; i < d; ++i) v[i] = hv[i] / nh;
  }
  hvp(v, hv);
  lambda = dot(v, hv);
  double res = 0;
  for (int64_t i = 0; i < d; ++i) res += (hv[i] - lambda * v[i]) * (hv[i] - lambda * v[i]);
  r.value = lambda;
  r.vector = v;
  r.residual = std::sqrt(res);
  return r;
}

PowerResult largest_eigenvalue(const HvpFn& hvp, int64_t d, uint64_t seed, int max_iterations, double tol) {
  PowerResult first = top_eigenvalue(hvp, d, seed, max_iterations, tol);
  if (first.value >= 0) return first;
  const double shift = first.value;
  const HvpFn shifted = [&](std::span<const double> v, std::span<double> out) {
    hvp(v, out);
    for (size_t i = 0; i < v.size(); ++i) out[i] -= shift * v[i];
  };
  PowerResult r = top_eigenvalue(shifted, d, seed + 1, max_iterations, tol);
  r.value += shift;
  r.iterations += first.iterations;
  return r;
}

double log_log_slope(std::span<const double> x, std::span<const double> y) {
  if (x.size() != y.size() || x.size() < 2) throw InputError("[flow] log_log_slope: needs two or more (x, y) pairs");
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double n = static_cast<double>(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (!(x[i] > 0) || !(y[i] > 0)) throw InputError("[flow] log_log_slope: the values must be > 0");
    const double lx = std::log(x[i]), ly = std::log(y[i]);
    sx += lx;
    sy += ly;
    sxx += lx * lx;
    sxy += lx * ly;
  }
  const double den = n * sxx - sx * sx;
  if (den == 0) throw InputError("[flow] log_log_slope: the x values are all equal");
  return (n * sxy - sx * sy) / den;
}

}  // namespace concord::train::flow
