// cuda_check: the GPU quantizers (quantize.h) against numerics::quantize_ref, bit for bit, and
// (--bench) their speed against a device-to-device copy measured in the same run.
//
//   cuda_check                   every descriptor on random, odd-shaped, misaligned and edge
//                                tensors; one line a case; exit 1 on any mismatch
//   cuda_check --quick           the odd-shaped and misaligned tensors only (compute-sanitizer)
//   cuda_check --bench [--mib N] the quantizers' bandwidth on an N MiB fp32 tensor (default 256)
//   cuda_check --json FILE       also write the results as JSON lines
// Without a usable GPU it prints one line saying why and exits 77 (ctest: skipped).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "concord/cuda/check_cases.h"
#include "concord/cuda/quantize.h"
#include "concord/numerics/block.h"
#include "concord/numerics/check.h"

namespace {

namespace nm = concord::numerics;
namespace cu = concord::cuda;

struct Case {
  std::string name;
  nm::QuantDesc desc;
  nm::RandomStream rng;
};

nm::QuantDesc with_rounding(nm::QuantDesc d, nm::Rounding r) {
  d.rounding = r;
  return d;
}
nm::QuantDesc with_axis(nm::QuantDesc d, int axis) {
  d.axis = axis;
  return d;
}

std::vector<Case> cases() {
  using nm::Format;
  const nm::RandomStream seeded{0x5EED2026u, 7u};
  std::vector<Case> out = {
      {"bf16 rne ieee", nm::QuantDesc::elementwise(Format::bf16, nm::Rounding::rne, nm::Overflow::ieee), {}},
      {"bf16 rne saturate", nm::QuantDesc::elementwise(Format::bf16), {}},
      {"bf16 sr", nm::QuantDesc::elementwise(Format::bf16, nm::Rounding::stochastic, nm::Overflow::ieee), seeded},
      {"fp16 rne ieee", nm::QuantDesc::elementwise(Format::fp16, nm::Rounding::rne, nm::Overflow::ieee), {}},
      {"e4m3 rne", nm::QuantDesc::elementwise(Format::e4m3), {}},
      {"e4m3 sr", nm::QuantDesc::elementwise(Format::e4m3, nm::Rounding::stochastic), seeded},
      {"e5m2 rne ieee", nm::QuantDesc::elementwise(Format::e5m2, nm::Rounding::rne, nm::Overflow::ieee), {}},
      {"e2m1 rtz", nm::QuantDesc::elementwise(Format::e2m1, nm::Rounding::rtz), {}},
      {"fp8-tensor e4m3", nm::QuantDesc::per_tensor(Format::e4m3), {}},
      {"fp8-tensor e5m2", nm::QuantDesc::per_tensor(Format::e5m2), {}},
  };
  const std::pair<Format, const char*> mx_elements[] = {
      {Format::e4m3, "mxfp8-e4m3"}, {Format::e5m2, "mxfp8-e5m2"}, {Format::e2m1, "mxfp4"}};
  const std::pair<nm::ScaleRule, const char*> rules[] = {{nm::ScaleRule::floor, "floor"},
                                                        {nm::ScaleRule::ceil, "ceil"},
                                                        {nm::ScaleRule::even, "even"},
                                                        {nm::ScaleRule::rceil, "rceil"}};
  for (const auto& [element, name] : mx_elements) {
    for (const auto& [rule, rule_name] : rules) {
      out.push_back({std::string(name) + " " + rule_name, nm::QuantDesc::mx(element, rule), {}});
    }
  }
  out.push_back({"mxfp6-e2m3 floor", nm::QuantDesc::mx(Format::e2m3), {}});
  out.push_back({"mxfp6-e3m2 floor", nm::QuantDesc::mx(Format::e3m2), {}});
  out.push_back({"mxfp8-e4m3 floor sr", with_rounding(nm::QuantDesc::mx(Format::e4m3), nm::Rounding::stochastic), seeded});
  out.push_back({"mxfp4 floor sr", with_rounding(nm::QuantDesc::mx(Format::e2m1), nm::Rounding::stochastic), seeded});
  out.push_back({"mxfp8-e4m3 floor axis0", with_axis(nm::QuantDesc::mx(Format::e4m3), 0), {}});
  out.push_back({"mxfp4 rceil axis0", with_axis(nm::QuantDesc::mx(Format::e2m1, nm::ScaleRule::rceil), 0), {}});
  out.push_back({"mxfp8-e5m2 axis0 sr",
                 with_axis(with_rounding(nm::QuantDesc::mx(Format::e5m2), nm::Rounding::stochastic), 0), seeded});
  out.push_back({"nvfp4 1x16", nm::QuantDesc::nvfp4({1, 16}), {}});
  out.push_back({"nvfp4 16x16", nm::QuantDesc::nvfp4({16, 16}), {}});
  out.push_back({"nvfp4 1x16 sr", with_rounding(nm::QuantDesc::nvfp4({1, 16}), nm::Rounding::stochastic), seeded});
  return out;
}

struct Tensor {
  std::string name;
  int64_t rows, cols;
  std::vector<float> values;
  int offset = 0;  // elements the device copy starts past a 256-byte boundary (misaligned loads)
};

// Gaussian values whose scale changes every 16 elements over 2^-40 .. 2^40, so blocks span
// every scale; an odd shape (partial blocks everywhere); the edge values of check_cases.h
// (codes, ties, fp32 edges, scale-rule amaxes) with all-zero, NaN, Inf and subnormal blocks,
// once with the non-finite blocks (they poison NVFP4's and FP8-tensor's tensor amax) and once
// without.
std::vector<Tensor> tensors(bool quick) {
  std::mt19937 gen(2026);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> spread(-40, 40);
  auto gaussian = [&](int64_t rows, int64_t cols) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    float scale = 1.0f;
    for (size_t i = 0; i < v.size(); ++i) {
      if (i % 16 == 0) scale = std::ldexp(1.0f, spread(gen));
      v[i] = normal(gen) * scale;
    }
    return v;
  };
  std::vector<Tensor> out;
  if (!quick) out.push_back({"random 128x2048", 128, 2048, gaussian(128, 2048)});
  out.push_back({"odd 37x101", 37, 101, gaussian(37, 101)});
  out.push_back({"misaligned 64x512", 64, 512, gaussian(64, 512), 1});
  // Launches that end inside a warp (3x96: 72 four-element groups) or a thread block (48x80: 15
  // NVFP4 16x16 blocks, 960 groups): the kernels' idle lanes must still join the warp's shuffles.
  out.push_back({"partial-warp 3x96", 3, 96, gaussian(3, 96)});
  out.push_back({"partial-block 48x80", 48, 80, gaussian(48, 80)});

  std::vector<float> edges;
  for (cu::Elem f : cu::kElems) {
    const std::vector<float> e = cu::edge_inputs(f);
    edges.insert(edges.end(), e.begin(), e.end());
  }
  for (float a : cu::edge_amaxes()) {
    edges.push_back(a);
    edges.push_back(-0.75f * a);
  }
  const int64_t cols = 512;
  const int64_t rows = (static_cast<int64_t>(edges.size()) + 64 * cols + cols - 1) / cols;
  Tensor edge{"edge " + std::to_string(rows) + "x512", rows, cols, std::vector<float>(static_cast<size_t>(rows * cols), 0.0f)};
  std::copy(edges.begin(), edges.end(), edge.values.begin());
  // The last 64 rows: zero blocks (already), subnormal blocks, blocks with one NaN or Inf.
  const int64_t base = rows * cols - 64 * cols;
  for (int64_t i = 0; i < 32 * cols; ++i) {
    if ((i / 32) % 3 == 1) edge.values[static_cast<size_t>(base + i)] = cu::float_of(static_cast<uint32_t>(1 + (i * 2654435761u) % 0x7FFFFFu)) * ((i & 1) ? -1.0f : 1.0f);
  }
  Tensor finite = edge;
  finite.name = "edge-finite " + std::to_string(rows) + "x512";
  for (float& v : finite.values) {
    if (!std::isfinite(v)) v = 0.0f;
  }
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()};
  for (int k = 0; k < 4; ++k) edge.values[static_cast<size_t>(base + 40 * cols + 64 * k + 5)] = specials[k];
  if (!quick) {
    out.push_back(edge);
    out.push_back(finite);
  }
  return out;
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%X", v);
  return buf;
}

// "" when the two are bit-identical, else the first difference.
std::string compare(const nm::QuantizedTensor& gpu, const nm::QuantizedTensor& cpu, const std::vector<float>& x) {
  if (cu::bits_of(gpu.tensor_scale) != cu::bits_of(cpu.tensor_scale)) {
    return "tensor scale " + hex(cu::bits_of(gpu.tensor_scale)) + " vs " + hex(cu::bits_of(cpu.tensor_scale));
  }
  if (gpu.scales != cpu.scales) {
    for (size_t i = 0; i < cpu.scales.size(); ++i) {
      if (gpu.scales[i] != cpu.scales[i]) {
        return "block scale " + std::to_string(i) + ": " + hex(gpu.scales[i]) + " vs " + hex(cpu.scales[i]);
      }
    }
    return "scale count " + std::to_string(gpu.scales.size()) + " vs " + std::to_string(cpu.scales.size());
  }
  if (gpu.codes.size() != cpu.codes.size()) return "code bytes " + std::to_string(gpu.codes.size());
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const uint32_t g = nm::get_code(cpu.desc.element, gpu.codes, i), c = nm::get_code(cpu.desc.element, cpu.codes, i);
    if (g != c) {
      char buf[160];
      std::snprintf(buf, sizeof(buf), "element %lld (x = %a): %s vs %s", static_cast<long long>(i),
                    static_cast<double>(x[static_cast<size_t>(i)]), hex(g).c_str(), hex(c).c_str());
      return buf;
    }
  }
  return "";
}

// The GPU's dequantization of its own (already matching) codes against numerics::dequantize with
// tensor_scale 1 (tensor::PreparedOperand's values), and its bf16 output against those values'
// bf16 codes (quantize_ref, RNE); "" when both are bit-identical.
std::string compare_dequantized(const cu::DeviceQuantized& q, nm::QuantizedTensor cpu) {
  const int64_t n = q.rows * q.cols;
  if (n == 0) return "";
  cpu.tensor_scale = 1.0f;
  std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  nm::dequantize(cpu, want.data());
  cu::DeviceBuffer out(static_cast<size_t>(n) * sizeof(float));
  cu::dequantize(q, out.data());
  out.download(got.data(), got.size() * sizeof(float));
  for (int64_t i = 0; i < n; ++i) {
    if (cu::bits_of(got[static_cast<size_t>(i)]) != cu::bits_of(want[static_cast<size_t>(i)])) {
      return "dequantized element " + std::to_string(i) + ": " + hex(cu::bits_of(got[static_cast<size_t>(i)])) +
             " vs " + hex(cu::bits_of(want[static_cast<size_t>(i)]));
    }
  }
  const nm::QuantizedTensor want16 = nm::quantize_ref(
      nm::QuantDesc::elementwise(nm::Format::bf16, nm::Rounding::rne, nm::Overflow::ieee), want.data(), 1, n);
  std::vector<uint16_t> got16(static_cast<size_t>(n));
  cu::dequantize(q, out.data(), true);
  out.download(got16.data(), got16.size() * sizeof(uint16_t));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t w = nm::get_code(nm::Format::bf16, want16.codes, i);
    if (got16[static_cast<size_t>(i)] != w) {
      return "dequantized bf16 element " + std::to_string(i) + ": " + hex(got16[static_cast<size_t>(i)]) + " vs " +
             hex(w);
    }
  }
  return "";
}

int run_checks(std::FILE* json, bool quick) {
  int failures = 0, passes = 0;
  const std::vector<Case> all = cases();
  for (const Tensor& t : tensors(quick)) {
    const size_t n = t.values.size();
    cu::DeviceBuffer x((n + static_cast<size_t>(t.offset)) * sizeof(float));
    auto* device_x = static_cast<float*>(x.data()) + t.offset;
    if (n > 0) {
      std::vector<float> staged(static_cast<size_t>(t.offset), 0.0f);
      staged.insert(staged.end(), t.values.begin(), t.values.end());
      x.upload(staged.data(), staged.size() * sizeof(float));
    }
    cu::DeviceQuantized q;
    for (const Case& c : all) {
      const nm::QuantizedTensor cpu = nm::quantize_ref(c.desc, t.values.data(), t.rows, t.cols, c.rng);
      cu::quantize(c.desc, device_x, t.rows, t.cols, c.rng, q);
      std::string diff = compare(q.to_host(), cpu, t.values);
      if (diff.empty()) diff = compare_dequantized(q, cpu);
      std::printf("%s  %-24s %-22s %s\n", diff.empty() ? "PASS" : "FAIL", c.name.c_str(), t.name.c_str(),
                  diff.c_str());
      if (json != nullptr) {
        std::fprintf(json, "{\"check\": \"%s\", \"tensor\": \"%s\", \"pass\": %s, \"detail\": \"%s\"}\n",
                     c.name.c_str(), t.name.c_str(), diff.empty() ? "true" : "false", diff.c_str());
      }
      (diff.empty() ? passes : failures) += 1;
    }
  }
  std::printf("cuda_check: %d passed, %d failed (every GPU quantizer against numerics::quantize_ref and its "
              "dequantization against numerics::dequantize, bit for bit)\n",
              passes, failures);
  return failures == 0 ? 0 : 1;
}

int run_bench(std::FILE* json, int64_t mib) {
  const int64_t cols = 4096, rows = mib * (1 << 20) / 4 / cols, n = rows * cols;
  std::vector<float> host(static_cast<size_t>(n));
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : host) v = normal(gen);
  cu::DeviceBuffer x(static_cast<size_t>(n) * sizeof(float)), copy(static_cast<size_t>(n) * sizeof(float));
  x.upload(host.data(), host.size() * sizeof(float));
  cu::DeviceTimer timer;
  constexpr int kReps = 20;
  auto time_ms = [&](auto&& fn) {
    fn();
    fn();
    cu::synchronize();
    timer.start();
    for (int i = 0; i < kReps; ++i) fn();
    return timer.stop_ms() / kReps;
  };
  const size_t in_bytes = static_cast<size_t>(n) * sizeof(float);
  const double copy_ms = time_ms([&] { cu::copy_device(copy.data(), x.data(), in_bytes); });
  const double copy_gbs = 2.0 * static_cast<double>(in_bytes) / (copy_ms * 1e6);
  std::printf("tensor %lld x %lld fp32 (%lld MiB); device-to-device copy %.3f ms = %.0f GB/s (read + write)\n",
              static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(mib), copy_ms, copy_gbs);
  std::printf("%-26s %10s %10s %10s\n", "quantizer", "ms", "GB/s", "vs copy");
  const nm::RandomStream seeded{1, 2};
  const std::vector<Case> benched = {
      {"bf16 rne", nm::QuantDesc::elementwise(nm::Format::bf16, nm::Rounding::rne, nm::Overflow::ieee), {}},
      {"bf16 sr", nm::QuantDesc::elementwise(nm::Format::bf16, nm::Rounding::stochastic, nm::Overflow::ieee), seeded},
      {"fp8-tensor e4m3", nm::QuantDesc::per_tensor(nm::Format::e4m3), {}},
      {"mxfp8-e4m3 floor 1x32", nm::QuantDesc::mx(nm::Format::e4m3), {}},
      {"mxfp8-e4m3 rceil 1x32", nm::QuantDesc::mx(nm::Format::e4m3, nm::ScaleRule::rceil), {}},
      {"mxfp8-e4m3 floor axis0", with_axis(nm::QuantDesc::mx(nm::Format::e4m3), 0), {}},
      {"mxfp4 floor axis0", with_axis(nm::QuantDesc::mx(nm::Format::e2m1), 0), {}},
      {"mxfp4 floor 1x32", nm::QuantDesc::mx(nm::Format::e2m1), {}},
      {"mxfp4 floor 1x32 sr", with_rounding(nm::QuantDesc::mx(nm::Format::e2m1), nm::Rounding::stochastic), seeded},
      {"nvfp4 1x16", nm::QuantDesc::nvfp4({1, 16}), {}},
      {"nvfp4 16x16", nm::QuantDesc::nvfp4({16, 16}), {}},
  };
  cu::DeviceQuantized q;
  for (const Case& c : benched) {
    const double ms = time_ms([&] { cu::quantize_async(c.desc, static_cast<const float*>(x.data()), rows, cols, c.rng, q); });
    const size_t out_bytes = q.codes.size() + q.scales.size();
    const double gbs = static_cast<double>(in_bytes + out_bytes) / (ms * 1e6);
    std::printf("%-26s %10.3f %10.0f %9.2fx\n", c.name.c_str(), ms, gbs, gbs / copy_gbs);
    if (json != nullptr) {
      std::fprintf(json, "{\"bench\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"ms\": %.5f, \"gbs\": %.1f, \"copy_gbs\": %.1f}\n",
                   c.name.c_str(), static_cast<long long>(rows), static_cast<long long>(cols), ms, gbs, copy_gbs);
    }
  }
  // Dequantization (MX on Hopper: back to bf16 for the BF16 GEMM; fp32 for the exact product):
  // codes and scales read, fp32 or bf16 values written.
  cu::DeviceBuffer values(static_cast<size_t>(n) * sizeof(float));
  for (const std::string wanted : {"mxfp8-e4m3 floor 1x32", "mxfp4 floor 1x32", "nvfp4 1x16"}) {
    const Case& c = *std::find_if(benched.begin(), benched.end(), [&](const Case& k) { return k.name == wanted; });
    cu::quantize(c.desc, static_cast<const float*>(x.data()), rows, cols, c.rng, q);
    for (bool bf16_out : {true, false}) {
      const double ms = time_ms([&] { cu::dequantize(q, values.data(), bf16_out); });
      const size_t bytes = q.codes.size() + q.scales.size() + static_cast<size_t>(n) * (bf16_out ? 2u : 4u);
      const double gbs = static_cast<double>(bytes) / (ms * 1e6);
      const std::string name = "dequant " + c.name.substr(0, c.name.find(' ')) + (bf16_out ? " -> bf16" : " -> fp32");
      std::printf("%-26s %10.3f %10.0f %9.2fx\n", name.c_str(), ms, gbs, gbs / copy_gbs);
      if (json != nullptr) {
        std::fprintf(json, "{\"bench\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"ms\": %.5f, \"gbs\": %.1f, \"copy_gbs\": %.1f}\n",
                     name.c_str(), static_cast<long long>(rows), static_cast<long long>(cols), ms, gbs, copy_gbs);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool bench = false, quick = false;
  int64_t mib = 256;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--bench") {
      bench = true;
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--mib" && i + 1 < argc) {
      mib = std::atoll(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: cuda_check [--quick] [--bench [--mib N]] [--json FILE]\n");
      return 2;
    }
  }
  std::string why;
  if (!cu::device_available(&why)) {
    std::printf("cuda_check: skipped: %s\n", why.c_str());
    return 77;
  }
  std::FILE* json = nullptr;
  if (!json_path.empty()) {
    json = std::fopen(json_path.c_str(), "w");
    if (json == nullptr) {
      std::fprintf(stderr, "cuda_check: cannot write %s\n", json_path.c_str());
      return 2;
    }
  }
  int rc = 0;
  try {
    std::printf("device: %s\n", cu::device_description().c_str());
    rc = bench ? run_bench(json, mib) : run_checks(json, quick);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_check: %s\n", e.what());
    rc = 1;
  }
  if (json != nullptr) std::fclose(json);
  return rc;
}
