// The numerics showcase of `concord demo --numerics` (demo_numerics.cpp): every block format and
// scale rule on a generated transformer-shaped checkpoint, and the export rules in miniature.
#pragma once

#include <cstdint>
#include <string>

namespace concord::cli {

struct NumericsShowcaseOptions {
  std::string out = "demo-out";
  uint64_t seed = 20261202;
  bool quick = false;
};

void run_numerics_showcase(const NumericsShowcaseOptions& options);

}  // namespace concord::cli
