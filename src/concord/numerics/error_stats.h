// Quantization error statistics of one tensor (x vs its dequantized copy y), accumulated in
// fp64 so that totals over many tensors are exact to report.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace concord::numerics {

struct ErrorStats {
  double signal_energy = 0;   // sum x^2
  double error_energy = 0;    // sum (x - y)^2
  double max_abs_error = 0;   // max |x - y|
  double error_sum = 0;       // sum (y - x): the bias
  int64_t count = 0;
  int64_t nonfinite = 0;      // positions where x or y is NaN/Inf (excluded from the sums)

  void add(const float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const double a = x[i], b = y[i];
      if (!std::isfinite(a) || !std::isfinite(b)) {
        ++nonfinite;
        continue;
      }
      const double e = b - a;
      signal_energy += a * a;
      error_energy += e * e;
      error_sum += e;
      max_abs_error = std::fmax(max_abs_error, std::fabs(e));
      ++count;
    }
  }
  void merge(const ErrorStats& o) {
    signal_energy += o.signal_energy;
    error_energy += o.error_energy;
    error_sum += o.error_sum;
    max_abs_error = std::fmax(max_abs_error, o.max_abs_error);
    count += o.count;
    nonfinite += o.nonfinite;
  }
  // Signal-to-quantization-noise ratio in dB; +inf when the copy is exact.
  double sqnr_db() const {
    if (error_energy == 0) return std::numeric_limits<double>::infinity();
    return 10.0 * std::log10(signal_energy / error_energy);
  }
  // ||x - y|| / ||x||
  double relative_error() const {
    return signal_energy == 0 ? (error_energy == 0 ? 0.0 : std::numeric_limits<double>::infinity())
                              : std::sqrt(error_energy / signal_energy);
  }
  double mean_error() const { return count == 0 ? 0.0 : error_sum / static_cast<double>(count); }
};

}  // namespace concord::numerics
