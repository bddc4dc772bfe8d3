// The training depth sampler (depth.h).
#include "concord/train/depth.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "concord/numerics/check.h"
#include "concord/numerics/philox.h"

namespace concord::train {

void DepthSampler::validate(const std::string& source) const {
  if (kind != "randomized" && kind != "fixed")
    throw InputError(fmt::format("[train] {}: depth.sampler '{}' is not one of randomized, fixed", source, kind));
  if (!(mean >= 1 && mean <= 256))
    throw InputError(fmt::format("[train] {}: depth.mean must lie in [1, 256] (got {})", source, mean));
  if (!(sigma >= 0 && sigma <= 2))
    throw InputError(fmt::format("[train] {}: depth.sigma must lie in [0, 2] (got {})", source, sigma));
  if (fixed < 0 || fixed > 1024)
    throw InputError(fmt::format("[train] {}: depth.fixed must lie in 0..1024 (got {})", source, fixed));
  if (backprop < 0 || backprop > 1024)
    throw InputError(fmt::format("[train] {}: depth.backprop must lie in 0..1024 (got {})", source, backprop));
}

int64_t poisson_inverse(double lambda, double u) {
  CONCORD_CHECK(lambda >= 0 && lambda <= 700 && u > 0 && u < 1, "poisson_inverse: argument out of range");
  double p = std::exp(-lambda), cdf = p;
  int64_t k = 0;
  // The tail beyond λ + 40√λ + 60 has probability below 1e-300: the loop ends there at the latest.
  const auto last = static_cast<int64_t>(lambda + 40 * std::sqrt(lambda) + 60);
  while (u > cdf && k < last) {
    ++k;
    p *= lambda / static_cast<double>(k);
    cdf += p;
  }
  return k;
}

int64_t DepthSampler::at(uint64_t seed, int64_t step) const {
  if (kind == "fixed") return fixed > 0 ? fixed : static_cast<int64_t>(std::llround(1 + mean));
  // One Philox block per step: a normal (Box-Muller on words 0, 1) for log λ, a 53-bit uniform
  // (words 2, 3) for the Poisson draw.
  const numerics::RandomStream rng{seed ^ 0xD3E7'0000'0000'0001ull, 0x44505448u /* "DPTH" */};
  const numerics::PhiloxBlock w = rng.block(static_cast<uint64_t>(step));
  const double u1 = (static_cast<double>(w[0]) + 1.0) / 4294967297.0;  // (0, 1]
  const double u2 = static_cast<double>(w[1]) / 4294967296.0;
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  const double lambda = std::min(700.0, std::exp(std::log(mean) - sigma * sigma / 2 + sigma * z));
  const uint64_t bits = (static_cast<uint64_t>(w[2]) << 21) ^ (static_cast<uint64_t>(w[3]) >> 11);  // 53 bits
  const double u = (static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) + 0.5) / 9007199254740992.0;  // (0, 1)
  return 1 + poisson_inverse(lambda, u);
}

double DepthSampler::expected_depth() const {
  if (kind == "fixed") return static_cast<double>(at(0, 0));
  return 1 + mean;
}

double DepthSampler::depth_variance() const {
  if (kind == "fixed") return 0;
  return mean + mean * mean * (std::exp(sigma * sigma) - 1);
}

}  // namespace concord::train
