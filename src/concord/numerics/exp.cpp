// exp_shifted's dispatch, libm path and first-call check (exp.h); the vector path: exp_avx2.cpp.
#include "concord/numerics/exp.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "concord/numerics/convert.h"

namespace concord::numerics {
namespace detail {

void exp_shifted_libm(float* p, int64_t n, float shift) {
  for (int64_t j = 0; j < n; ++j) p[j] = std::exp(p[j] - shift);
}

namespace {

// The vector path against std::exp on ~200k inputs: every 2^-10 step of [-104, 90] (the whole main
// path and both edges of the |x| >= 88 fallback), ties of the k rounding near small |x|, ±0,
// ±Inf, NaN, subnormals. Any difference means this C library's expf is not glibc's algorithm.
bool vector_path_matches_libm() {
  std::vector<float> in;
  for (int i = -104 * 1024; i <= 90 * 1024; ++i)
    in.push_back(static_cast<float>(i) / 1024.0f + static_cast<float>(i % 7) * 1e-4f);
  const float edge[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                        std::numeric_limits<float>::quiet_NaN(), 1e-45f, -1e-45f, 1e-38f, 88.0f, -88.0f,
                        88.72283f, 88.72284f, -103.97207f, -103.97208f, -103.27892f, 0x1p-26f, -0x1p-26f};
  in.insert(in.end(), std::begin(edge), std::end(edge));
  while (in.size() % 8 != 3) in.push_back(0.5f);  // a tail the scalar remainder takes
  std::vector<float> want(in), got(in);
  exp_shifted_libm(want.data(), static_cast<int64_t>(want.size()), 0.0f);
  exp_shifted_avx2_fma(got.data(), static_cast<int64_t>(got.size()), 0.0f);
  return std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0;
}

bool vector_path_usable() {
  static const bool ok = exp_avx2_fma_supported() && vector_path_matches_libm();
  return ok;
}

}  // namespace
}  // namespace detail

void exp_shifted(float* p, int64_t n, float shift) {
  if (n >= 8 && active_isa() != Isa::generic && detail::vector_path_usable()) {
    detail::exp_shifted_avx2_fma(p, n, shift);
  } else {
    detail::exp_shifted_libm(p, n, shift);
  }
}

const char* exp_path() {
  return active_isa() != Isa::generic && detail::vector_path_usable() ? "avx2-fma" : "libm";
}

}  // namespace concord::numerics
