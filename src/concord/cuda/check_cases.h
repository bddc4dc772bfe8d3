// Inputs that the device codec and the GPU quantizers are checked on (host side, shared by
// tests/cuda/ and tools/gpu_check.sh's cuda_check): each format's codes, their fp32 neighbours
// and the midpoints between consecutive codes (the ties), fp32's own edges (zeros, subnormals,
// FLT_MAX, Inf, NaNs with payloads), and the block amaxes where scale rules turn.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "concord/cuda/codec.h"
#include "concord/numerics/format.h"

namespace concord::cuda {

inline constexpr Elem kElems[] = {Elem::bf16, Elem::fp16, Elem::e4m3, Elem::e5m2,
                                  Elem::e2m3, Elem::e3m2, Elem::e2m1, Elem::ue4m3};
inline constexpr Elem kMxElems[] = {Elem::e4m3, Elem::e5m2, Elem::e2m3, Elem::e3m2, Elem::e2m1};

inline numerics::Format to_numerics(Elem f) { return static_cast<numerics::Format>(f); }

// fp32's own edge values, both signs.
inline std::vector<float> fp32_edges() {
  const float lim[] = {0.0f,
                       std::numeric_limits<float>::denorm_min(),
                       2 * std::numeric_limits<float>::denorm_min(),
                       float_of(0x007FFFFFu),  // largest subnormal
                       std::numeric_limits<float>::min(),
                       float_of(0x00800001u),
                       1.0f,
                       std::numeric_limits<float>::max(),
                       float_of(0x7F7FFFFEu),
                       std::numeric_limits<float>::infinity(),
                       float_of(0x7FC00000u),  // quiet NaN
                       float_of(0x7F800001u),  // signalling NaN, smallest payload
                       float_of(0x7FFFFFFFu)};
  std::vector<float> out;
  for (float v : lim) {
    out.push_back(v);
    out.push_back(-v);
  }
  return out;
}

// Every finite value of format f, its fp32 neighbours, and the midpoint (the tie) between each
// pair of consecutive values with its neighbours; then fp32's edges.
inline std::vector<float> edge_inputs(Elem f) {
  std::vector<double> values;
  const ElemSpec s = spec_of(f);
  for (uint32_t code = 0; code < (1u << s.bits); ++code) {
    const float v = decode(f, code);
    if (std::isfinite(v) && !std::signbit(v)) values.push_back(v);
  }
  std::vector<float> out = fp32_edges();
  if (s.bits > 8) {  // bf16 / fp16: every code would be 2^16 x 6 inputs; take every 61st
    std::vector<double> thin;
    for (size_t i = 0; i < values.size(); i += 61) thin.push_back(values[i]);
    thin.push_back(values.back());
    values = thin;
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  // Past the maximum: where a tie with the next (missing) binade value would sit.
  const double max = values.back(), past = 2 * max - values[values.size() - 2];
  if (past <= std::numeric_limits<float>::max()) values.push_back(past);
  for (size_t i = 0; i < values.size(); ++i) {
    const float v = static_cast<float>(values[i]);
    for (float w : {v, std::nextafter(v, 0.0f), std::nextafter(v, std::numeric_limits<float>::infinity())}) {
      out.push_back(w);
      out.push_back(-w);
    }
    if (i + 1 < values.size()) {
      const float mid = static_cast<float>(0.5 * (values[i] + values[i + 1]));  // exact in fp32
      for (float w : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, std::numeric_limits<float>::infinity())}) {
        out.push_back(w);
        out.push_back(-w);
      }
    }
  }
  return out;
}

// Block (and tensor) amaxes where the scale rules turn: zero, subnormals, powers of two and their
// neighbours across the whole fp32 range, each element format's max times powers of two (the
// RCEIL boundary) and half-up ties of the EVEN rule, FLT_MAX, Inf and NaN.
inline std::vector<float> edge_amaxes() {
  std::vector<float> out;
  for (float v : fp32_edges()) {
    if (!std::signbit(v)) out.push_back(v);
  }
  for (int e = -149; e <= 127; ++e) {
    const float p = std::ldexp(1.0f, e);
    out.push_back(p);
    out.push_back(std::nextafter(p, 0.0f));
    out.push_back(std::nextafter(p, std::numeric_limits<float>::infinity()));
    for (double m : {448.0, 57344.0, 7.5, 28.0, 6.0, 1.5, 1.75, 1.875, 1.9375, 1.25, 1.125}) {
      const double d = std::ldexp(m, e - 8);
      if (d >= std::numeric_limits<float>::denorm_min() && d <= std::numeric_limits<float>::max()) {
        const auto v = static_cast<float>(d);
        out.push_back(v);
        out.push_back(std::nextafter(v, 0.0f));
        out.push_back(std::nextafter(v, std::numeric_limits<float>::infinity()));
      }
    }
  }
  return out;
}

}  // namespace concord::cuda
