// libFuzzer target: audit::LogitDump::from_bytes (the .npy parser, its rows.json sidecar, and the
// logit-dump checks over safetensors) on arbitrary bytes. Bad input may only throw InputError; a
// dump that loads must give every row's logits (as float and as double) and row fields inside
// the ranges the reader promises.
//
// Input layout: byte 0 picks the container (bit 0: safetensors, else .npy) and, for .npy,
// whether a sidecar follows (bit 1); then, with a sidecar, a 16-bit little-endian length n and n
// bytes of sidecar text; the rest is the file image.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "concord/audit/dump.h"
#include "concord/numerics/check.h"

namespace {

void require(bool condition) {
  if (!condition) __builtin_trap();  // a finding: libFuzzer saves the input
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using concord::audit::LogitDump;
  if (size == 0) return 0;
  const bool safetensors = (data[0] & 1) != 0;
  const bool with_sidecar = !safetensors && (data[0] & 2) != 0;
  size_t at = 1;
  std::optional<std::string> sidecar;
  if (with_sidecar) {
    if (size < 3) return 0;
    const size_t n = std::min<size_t>(data[1] | (static_cast<size_t>(data[2]) << 8), size - 3);
    sidecar.emplace(reinterpret_cast<const char*>(data + 3), n);
    at = 3 + n;
  }
  std::vector<uint8_t> image(data + at, data + size);
  try {
    const LogitDump d = LogitDump::from_bytes(std::move(image),
                                              safetensors ? "fuzz.safetensors" : "fuzz.npy", sidecar);
    require(d.vocab() >= 1 && d.vocab() <= INT32_MAX && d.rows() >= 0);
    std::vector<float> f(static_cast<size_t>(d.vocab()));
    std::vector<double> g(static_cast<size_t>(d.vocab()));
    for (int64_t r = 0; r < d.rows(); ++r) {
      d.row(r, std::span<float>(f));
      d.row(r, std::span<double>(g));
      if (d.dtype() != "F64") {
        // Exact conversions: the float and double views agree bit for bit (NaN aside).
        for (size_t i = 0; i < f.size(); ++i) {
          require(std::isnan(g[i]) || static_cast<double>(f[i]) == g[i]);
        }
      }
      const auto& info = d.info(r);
      require(info.sequence >= 0 && info.position >= 0 && info.prompt_length >= 0);
      require(info.token >= -1 && info.token < d.vocab());
      require(info.next >= -1 && info.next < d.vocab());
    }
  } catch (const concord::InputError&) {
  }
  return 0;
}
