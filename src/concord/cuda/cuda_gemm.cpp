// cuda_gemm: the GPU GEMMs (gemm.h) checked and measured.
//
//   cuda_gemm check        the exact-product reference on the GPU against concord's CPU GEMM
//                          (tensor::gemm), bit for bit, on fp32, bf16 and per-tensor FP8 operands
//                          quantized on the GPU, and on MXFP8 / MXFP4 / NVFP4 operands against the
//                          learner's quantized GEMM (tensor::gemm_prepared); cuBLASLt BF16 and FP8
//                          (fast accumulation off and on) and BF16 on MXFP8's bf16-exact values
//                          against it, as the largest |difference| over Σ_k |x_k w_k|
//                          (--quick: the shapes of at most 2^16 outputs, for the host emulation)
//   cuda_gemm bench        the micro-batch claim: BF16 against FP8 (GEMM alone, and with the
//                          activation's per-tensor quantization) for SmolLM2-135M's and Qwen3-8B's
//                          linear shapes at M = 1 .. 16384, each as a fraction of the peak measured
//                          here (8192^3); the crossover M per shape; and MXFP8 the Hopper way
//                          (activation quantized to MXFP8, dequantized to bf16, the BF16 GEMM)
//   cuda_gemm logits --hidden X.npy --q8-0 W.npy [--sums S.json] --out DIR
//                          SmolLM2's lm_head on real hidden states (tools/gpu_inputs.py: X is
//                          P x H float32, W the GGUF's Q8_0 rows): the exact fp32 product checked
//                          against the CPU logits' row checksums (S), then five ways written as
//                          DIR/<name>.npy (P x V float32) for `concord contract measure`:
//                          exact-bf16, cublas-bf16, exact-fp8, cublas-fp8, cublas-fp8-fast
//   cuda_gemm verify-inputs --hidden X.npy --q8-0 W.npy --sums S.json
//                          no GPU needed: concord's CPU GEMM on the same inputs reproduces the
//                          CPU logits' checksums (what the GPU's exact product must meet)
//   --json FILE            also write the results as JSON lines
// Without a usable GPU it prints one line saying why and exits 77.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "concord/cuda/gemm.h"
#include "concord/cuda/quantize.h"
#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/numerics/scalar.h"
#include "concord/tensor/gemm.h"
#include "concord/tensor/qgemm.h"

namespace {

namespace nm = concord::numerics;
namespace cu = concord::cuda;

std::FILE* g_json = nullptr;

std::vector<float> download_floats(const void* device, size_t n) {
  std::vector<float> out(n);
  if (n > 0) cu::copy_to_host(out.data(), device, n * sizeof(float));
  return out;
}

cu::DeviceBuffer upload_floats(const std::vector<float>& v) {
  cu::DeviceBuffer b(std::max<size_t>(v.size(), 1) * sizeof(float));
  if (!v.empty()) b.upload(v.data(), v.size() * sizeof(float));
  return b;
}

// Operand values as the GEMMs see them, dequantized on the device: block scales applied, the
// tensor scale left apart (applied after the sum).
cu::DeviceBuffer decoded(const cu::DeviceQuantized& q) {
  const int64_t n = q.rows * q.cols;
  cu::DeviceBuffer out(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(float));
  cu::dequantize(q, out.data());
  return out;
}

// The bound on cuBLASLt's difference from the fma chain over exactly multiplied operands: the
// chain is within K u Σ|xw| of the true sum (u = 2^-24) and any order of fp32 additions within
// 2 K u even with truncating adders (tensor cores truncate: Fasi et al., PeerJ CS 2021), so the
// two differ by at most 3 K u — a bound from the arithmetic, not a tolerance (4 K u is held).
double accumulation_bound(int64_t K) { return 4.0 * static_cast<double>(K) * 0x1p-24; }

// CPU: the values of a quantized tensor's codes (no scales), through the reference decoder.
std::vector<float> code_values(const nm::QuantizedTensor& q) {
  std::vector<float> out(static_cast<size_t>(q.numel()));
  for (int64_t i = 0; i < q.numel(); ++i) {
    out[static_cast<size_t>(i)] = nm::decode_ref(q.desc.element, nm::get_code(q.desc.element, q.codes, i));
  }
  return out;
}

std::vector<float> cpu_gemm(const std::vector<float>& X, const std::vector<float>& W, int64_t M, int64_t N, int64_t K) {
  std::vector<float> Y(static_cast<size_t>(M * N));
  concord::tensor::gemm(concord::tensor::Trans::no, concord::tensor::Trans::yes, M, N, K, X.data(), K, W.data(), K,
                        Y.data(), N);
  return Y;
}

// "" when bit-identical, else the first difference.
std::string first_difference(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (cu::bits_of(gpu[i]) != cu::bits_of(cpu[i])) {
      char buf[128];
      std::snprintf(buf, sizeof(buf), "output %zu: %a vs %a", i, static_cast<double>(gpu[i]), static_cast<double>(cpu[i]));
      return buf;
    }
  }
  return "";
}

// max over outputs of |y - ref| / Σ_k |x_k w_k| (the scale any fp32 accumulation error is
// relative to), computed in fp64 on the host.
double relative_error(const std::vector<float>& y, const std::vector<float>& ref, const std::vector<float>& X,
                      const std::vector<float>& W, int64_t M, int64_t N, int64_t K, double scale) {
  double worst = 0.0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double mag = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        mag += std::fabs(static_cast<double>(X[static_cast<size_t>(m * K + k)]) * W[static_cast<size_t>(n * K + k)]);
      }
      mag *= scale;
      const double d = std::fabs(static_cast<double>(y[static_cast<size_t>(m * N + n)]) - ref[static_cast<size_t>(m * N + n)]);
      if (mag > 0.0) worst = std::max(worst, d / mag);
      else if (d > 0.0) worst = INFINITY;
    }
  }
  return worst;
}

std::vector<float> random_matrix(int64_t rows, int64_t cols, std::mt19937& gen, float spread) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> log_scale(-spread, spread);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float s = std::exp2(log_scale(gen));  // rows of different magnitudes
    for (int64_t c = 0; c < cols; ++c) v[static_cast<size_t>(r * cols + c)] = normal(gen) * s;
  }
  if (rows * cols >= 8) {  // signed zeros: the contract keeps a -0 sum's sign rules
    v[0] = -0.0f;
    v[static_cast<size_t>(rows * cols - 1)] = 0.0f;
  }
  return v;
}

// The block-scaled GEMM operands checked: the precision presets' forward formats.
struct BlockCase {
  const char* name;
  nm::QuantDesc x, w;
  bool bf16_cublas;  // values bf16-exact: also through cuBLASLt's BF16 GEMM
};
std::vector<BlockCase> block_cases() {
  return {{"mxfp8-e4m3", nm::QuantDesc::mx(nm::Format::e4m3), nm::QuantDesc::mx(nm::Format::e4m3), true},
          {"mxfp4", nm::QuantDesc::mx(nm::Format::e2m1), nm::QuantDesc::mx(nm::Format::e2m1), true},
          {"nvfp4 1x16 / 16x16", nm::QuantDesc::nvfp4({1, 16}), nm::QuantDesc::nvfp4({16, 16}), false}};
}

int run_check(bool quick) {
  struct Shape {
    int64_t M, N, K;
  };
  // Odd shapes for the exact kernel's edges; cuBLASLt runs where its layouts allow (FP8: K and
  // N multiples of 16, the "TN" rule; BF16: multiples of 8).
  const Shape shapes[] = {{1, 1, 1},     {3, 5, 7},       {17, 33, 64},  {64, 576, 576}, {37, 192, 576},
                          {5, 49, 1000}, {128, 1536, 576}, {2, 128, 4096}, {16, 576, 1536}, {1, 49152, 576}};
  std::mt19937 gen(39);
  cu::Blas blas;
  int failures = 0, passes = 0;
  auto report = [&](bool ok, const std::string& what, const Shape& s, const std::string& detail) {
    std::printf("%s  %-34s M=%-4lld N=%-5lld K=%-5lld %s\n", ok ? "PASS" : "FAIL", what.c_str(),
                static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K), detail.c_str());
    if (g_json != nullptr) {
      std::fprintf(g_json, "{\"check\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": %lld, \"pass\": %s, \"detail\": \"%s\"}\n",
                   what.c_str(), static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K),
                   ok ? "true" : "false", detail.c_str());
    }
    (ok ? passes : failures) += 1;
  };
  const nm::QuantDesc bf16 = nm::QuantDesc::elementwise(nm::Format::bf16, nm::Rounding::rne, nm::Overflow::ieee);
  const nm::QuantDesc fp8 = nm::QuantDesc::per_tensor(nm::Format::e4m3);
  for (const Shape& s : shapes) {
    // --quick (the host emulation's size): the shapes of at most 2^16 outputs in whole 16 x 16 tiles.
    if (quick && ((s.M + 15) / 16) * ((s.N + 15) / 16) * 256 > 65536) continue;
    const std::vector<float> X = random_matrix(s.M, s.K, gen, 6.0f), W = random_matrix(s.N, s.K, gen, 3.0f);
    cu::DeviceBuffer dx = upload_floats(X), dw = upload_floats(W), dy(static_cast<size_t>(s.M * s.N) * sizeof(float));
    auto* y = static_cast<float*>(dy.data());
    const size_t outputs = static_cast<size_t>(s.M * s.N);

    // (1) fp32 operands.
    cu::exact_gemm(static_cast<float*>(dx.data()), static_cast<float*>(dw.data()), y, s.M, s.N, s.K);
    const std::string d1 = first_difference(download_floats(y, outputs), cpu_gemm(X, W, s.M, s.N, s.K));
    report(d1.empty(), "exact fp32 = tensor::gemm", s, d1);

    // (2) bf16 operands, quantized on the GPU; CPU: quantize_ref + tensor::gemm.
    cu::DeviceQuantized qx, qw;
    cu::quantize(bf16, static_cast<float*>(dx.data()), s.M, s.K, {}, qx);
    cu::quantize(bf16, static_cast<float*>(dw.data()), s.N, s.K, {}, qw);
    cu::DeviceBuffer vx = decoded(qx), vw = decoded(qw);
    cu::exact_gemm(static_cast<float*>(vx.data()), static_cast<float*>(vw.data()), y, s.M, s.N, s.K);
    const std::vector<float> exact_bf16 = download_floats(y, outputs);
    const std::vector<float> cx = code_values(nm::quantize_ref(bf16, X.data(), s.M, s.K));
    const std::vector<float> cw = code_values(nm::quantize_ref(bf16, W.data(), s.N, s.K));
    const std::string d2 = first_difference(exact_bf16, cpu_gemm(cx, cw, s.M, s.N, s.K));
    report(d2.empty(), "exact bf16 = tensor::gemm", s, d2);

    // (3) per-tensor FP8 E4M3 operands with their scales.
    cu::DeviceQuantized fx, fw;
    cu::quantize(fp8, static_cast<float*>(dx.data()), s.M, s.K, {}, fx);
    cu::quantize(fp8, static_cast<float*>(dw.data()), s.N, s.K, {}, fw);
    cu::DeviceBuffer ux = decoded(fx), uw = decoded(fw);
    cu::exact_gemm(static_cast<float*>(ux.data()), static_cast<float*>(uw.data()), y, s.M, s.N, s.K,
                   cu::tensor_scale_of(fx), cu::tensor_scale_of(fw));
    const std::vector<float> exact_fp8 = download_floats(y, outputs);
    const nm::QuantizedTensor rx = nm::quantize_ref(fp8, X.data(), s.M, s.K), rw = nm::quantize_ref(fp8, W.data(), s.N, s.K);
    const std::vector<float> ex = code_values(rx), ew = code_values(rw);
    std::vector<float> cpu_fp8 = cpu_gemm(ex, ew, s.M, s.N, s.K);
    const float scale = rx.tensor_scale * rw.tensor_scale;
    for (float& v : cpu_fp8) v = v * scale;
    const std::string d3 = first_difference(exact_fp8, cpu_fp8);
    report(d3.empty(), "exact fp8-tensor = tensor::gemm", s, d3);

    // (5) block-scaled operands: the learner's quantized GEMM (tensor::gemm_prepared — the values
    // with their block scales, the tensor scales after the sum) against the GPU's quantize,
    // dequantize and exact product; MXFP8 E4M3 and MXFP4 (1x32 along K), NVFP4 (activation 1x16,
    // weight 16x16, the global scales after the sum). On Hopper, which has no MX tensor cores,
    // MXFP8's values are bf16-exact, so cuBLASLt's BF16 GEMM multiplies them exactly: its
    // difference from the exact product is accumulation alone, held to the BF16 bound below.
    for (const BlockCase& bc : block_cases()) {
      namespace ts = concord::tensor;
      ts::PreparedOperand pa, pb;
      ts::prepare_operand(pa, bc.x, ts::Operand::a, ts::Trans::no, X.data(), s.M, s.K);
      ts::prepare_operand(pb, bc.w, ts::Operand::b, ts::Trans::yes, W.data(), s.N, s.K);
      std::vector<float> cpu(outputs);
      ts::gemm_prepared(ts::Trans::no, ts::Trans::yes, s.M, s.N, s.K, pa, pb, cpu.data(), s.N);
      cu::DeviceQuantized gx, gw;
      cu::quantize(*pa.desc, static_cast<float*>(dx.data()), s.M, s.K, {}, gx);
      cu::quantize(*pb.desc, static_cast<float*>(dw.data()), s.N, s.K, {}, gw);
      cu::DeviceBuffer bx = decoded(gx), bw = decoded(gw);
      const bool scaled = gx.desc.is_nvfp4();
      cu::exact_gemm(static_cast<float*>(bx.data()), static_cast<float*>(bw.data()), y, s.M, s.N, s.K,
                     scaled ? cu::tensor_scale_of(gx) : nullptr, scaled ? cu::tensor_scale_of(gw) : nullptr);
      const std::vector<float> exact_block = download_floats(y, outputs);
      const std::string d5 = first_difference(exact_block, cpu);
      report(d5.empty(), std::string("exact ") + bc.name + " = gemm_prepared", s, d5);
      if (!bc.bf16_cublas || cu::host_emulation() || s.K % 16 != 0 || s.N % 16 != 0) continue;
      try {
        cu::dequantize(gx, bx.data(), true);  // bf16 codes of the same values (exact)
        cu::dequantize(gw, bw.data(), true);
        blas.gemm_bf16(static_cast<const uint16_t*>(bx.data()), static_cast<const uint16_t*>(bw.data()), y,
                       cu::OutType::f32, s.M, s.N, s.K);
        const std::vector<float> px(pa.data, pa.data + s.M * s.K), pw(pb.data, pb.data + s.N * s.K);
        const double e = relative_error(download_floats(y, outputs), exact_block, px, pw, s.M, s.N, s.K, 1.0);
        const double order_bound = accumulation_bound(s.K);
        char b5[160];
        std::snprintf(b5, sizeof(b5), "max |d| / sum|xw| = %.3g (any fp32 order: <= %.3g)", e, order_bound);
        report(e <= order_bound, std::string("cublasLt bf16 on ") + bc.name + " ~ exact", s, b5);
      } catch (const std::exception& e) {
        report(false, std::string("cublasLt bf16 on ") + bc.name, s, e.what());
      }
    }

    // (4) cuBLASLt against the exact products of the same operands.
    char buf[160];
    if (cu::host_emulation()) {
      std::printf("SKIP  %-34s M=%-4lld N=%-5lld K=%-5lld (the host emulation has no cuBLASLt)\n", "cublasLt",
                  static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K));
      continue;
    }
    if (s.K % 16 != 0 || s.N % 16 != 0) {
      std::printf("SKIP  %-34s M=%-4lld N=%-5lld K=%-5lld (cuBLASLt layouts need K, N multiples of 16)\n", "cublasLt",
                  static_cast<long long>(s.M), static_cast<long long>(s.N), static_cast<long long>(s.K));
      continue;
    }
    try {
    blas.gemm_bf16(static_cast<const uint16_t*>(qx.codes.data()), static_cast<const uint16_t*>(qw.codes.data()), y,
                   cu::OutType::f32, s.M, s.N, s.K);
    const double e_bf16 = relative_error(download_floats(y, outputs), exact_bf16, cx, cw, s.M, s.N, s.K, 1.0);
    const double order_bound = accumulation_bound(s.K);
    std::snprintf(buf, sizeof(buf), "max |d| / sum|xw| = %.3g (any fp32 order: <= %.3g)", e_bf16, order_bound);
    report(e_bf16 <= order_bound, "cublasLt bf16 ~ exact bf16", s, buf);
    for (bool fast : {false, true}) {
      blas.gemm_fp8(static_cast<const uint8_t*>(fx.codes.data()), cu::tensor_scale_of(fx),
                    static_cast<const uint8_t*>(fw.codes.data()), cu::tensor_scale_of(fw), y, cu::OutType::f32, s.M,
                    s.N, s.K, fast);
      const double e = relative_error(download_floats(y, outputs), exact_fp8, ex, ew, s.M, s.N, s.K, scale);
      std::snprintf(buf, sizeof(buf), "max |d| / sum|xw| = %.3g", e);
      // Hopper's FP8 tensor cores keep fewer bits than fp32 in their partial sums (more with fast
      // accumulation): the figure is the finding; the bound 2^-7 only catches a wrong layout or
      // scale, which gives O(1).
      report(e <= 0x1p-7, fast ? "cublasLt fp8 fast-accum ~ exact" : "cublasLt fp8 ~ exact fp8", s, buf);
    }
    } catch (const std::exception& e) {
      report(false, "cublasLt", s, e.what());
    }
  }
  std::printf("cuda_gemm check: %d passed, %d failed\n", passes, failures);
  return failures == 0 ? 0 : 1;
}

// --- The micro-batch benchmark --------------------------------------------------------------

struct Linear {
  const char* model;
  const char* name;
  int64_t N, K;
};

// SmolLM2-135M: hidden 576, intermediate 1536, 9 query heads and 3 kv heads of 64, vocabulary
// 49152. Qwen3-8B: hidden 4096, intermediate 12288, 32 query heads and 8 kv heads of 128,
// vocabulary 151936. k and v share a shape, as gate and up do.
const Linear kLinears[] = {
    {"SmolLM2-135M", "q_proj/o_proj", 576, 576},   {"SmolLM2-135M", "k_proj/v_proj", 192, 576},
    {"SmolLM2-135M", "gate/up_proj", 1536, 576},   {"SmolLM2-135M", "down_proj", 576, 1536},
    {"SmolLM2-135M", "lm_head", 49152, 576},       {"Qwen3-8B", "q_proj/o_proj", 4096, 4096},
    {"Qwen3-8B", "k_proj/v_proj", 1024, 4096},     {"Qwen3-8B", "gate/up_proj", 12288, 4096},
    {"Qwen3-8B", "down_proj", 4096, 12288},        {"Qwen3-8B", "lm_head", 151936, 4096},
};
const int64_t kTokens[] = {1, 16, 64, 256, 1024, 4096, 16384};

int run_bench(bool quick) {
  cu::Blas blas;
  cu::DeviceTimer timer;
  auto time_ms = [&](auto&& fn, double budget_ms) {
    fn();
    cu::synchronize();
    timer.start();
    fn();
    const double one = std::max(timer.stop_ms(), 1e-3);
    const int reps = std::clamp(static_cast<int>(budget_ms / one), 3, 50);
    timer.start();
    for (int i = 0; i < reps; ++i) fn();
    return timer.stop_ms() / reps;
  };
  const int64_t largest_m = quick ? 1024 : 16384;
  int64_t max_x = 0, max_w = 0, max_y = 0;
  for (const Linear& l : kLinears) {
    max_w = std::max(max_w, l.N * l.K);
    max_x = std::max(max_x, largest_m * l.K);
    max_y = std::max(max_y, largest_m * l.N);
  }
  constexpr int64_t kPeak = 8192;
  max_x = std::max(max_x, kPeak * kPeak);
  max_w = std::max(max_w, kPeak * kPeak);
  max_y = std::max(max_y, kPeak * kPeak);
  // Operand buffers large enough for every shape (the values do not change a GEMM's time: one
  // fill with Gaussians, reused as bf16 and e4m3 codes of every shape).
  // Filled with one block of 2^22 Gaussians, repeated.
  constexpr int64_t kFill = int64_t{1} << 22;
  std::vector<float> host(static_cast<size_t>(kFill));
  std::mt19937 gen(8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : host) v = normal(gen);
  cu::DeviceBuffer xf(static_cast<size_t>(max_x) * 4), wf(static_cast<size_t>(max_w) * 4);
  cu::DeviceBuffer pattern = upload_floats(host);
  for (cu::DeviceBuffer* b : {&xf, &wf}) {
    const int64_t count = static_cast<int64_t>(b->size() / 4);
    for (int64_t at = 0; at < count; at += kFill) {
      cu::copy_device(static_cast<float*>(b->data()) + at, pattern.data(),
                      static_cast<size_t>(std::min(kFill, count - at)) * 4);
    }
  }
  cu::synchronize();
  cu::DeviceQuantized xb, wb, x8, w8;
  const nm::QuantDesc bf16 = nm::QuantDesc::elementwise(nm::Format::bf16);
  const nm::QuantDesc fp8 = nm::QuantDesc::per_tensor(nm::Format::e4m3);
  const nm::QuantDesc mx8 = nm::QuantDesc::mx(nm::Format::e4m3);
  cu::quantize(bf16, static_cast<float*>(xf.data()), 1, max_x, {}, xb);
  cu::quantize(bf16, static_cast<float*>(wf.data()), 1, max_w, {}, wb);
  cu::quantize(fp8, static_cast<float*>(xf.data()), 1, max_x, {}, x8);
  cu::quantize(fp8, static_cast<float*>(wf.data()), 1, max_w, {}, w8);
  cu::DeviceBuffer y(static_cast<size_t>(max_y) * 2);
  const auto* xbc = static_cast<const uint16_t*>(xb.codes.data());
  const auto* wbc = static_cast<const uint16_t*>(wb.codes.data());
  const auto* x8c = static_cast<const uint8_t*>(x8.codes.data());
  const auto* w8c = static_cast<const uint8_t*>(w8.codes.data());
  const float* sx = cu::tensor_scale_of(x8);
  const float* sw = cu::tensor_scale_of(w8);

  auto tflops = [](int64_t M, int64_t N, int64_t K, double ms) {
    return 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) / (ms * 1e9);
  };
  // The peaks: one 8192^3 GEMM each, bf16 output.
  const double peak_bf16 = tflops(kPeak, kPeak, kPeak, time_ms([&] {
    blas.gemm_bf16(xbc, wbc, y.data(), cu::OutType::bf16, kPeak, kPeak, kPeak);
  }, 300.0));
  const double peak_fp8 = tflops(kPeak, kPeak, kPeak, time_ms([&] {
    blas.gemm_fp8(x8c, sx, w8c, sw, y.data(), cu::OutType::bf16, kPeak, kPeak, kPeak, false);
  }, 300.0));
  const double peak_fp8_fast = tflops(kPeak, kPeak, kPeak, time_ms([&] {
    blas.gemm_fp8(x8c, sx, w8c, sw, y.data(), cu::OutType::bf16, kPeak, kPeak, kPeak, true);
  }, 300.0));
  // The memory side of the roofline: a device-to-device copy of the activation buffer, counting
  // bytes read and written.
  const size_t copy_bytes = xf.size();
  const double bw = 2.0 * static_cast<double>(copy_bytes) /
                    (time_ms([&] { cu::copy_device(y.data(), xf.data(), copy_bytes); }, 200.0) * 1e6);  // GB/s
  std::printf("device: %s\n", cu::device_description().c_str());
  std::printf("measured peaks (8192^3, bf16 out): BF16 %.0f TFLOP/s, FP8 %.0f, FP8 fast-accum %.0f; "
              "device copy %.0f GB/s\n", peak_bf16, peak_fp8, peak_fp8_fast, bw);
  if (g_json != nullptr) {
    std::fprintf(g_json,
                 "{\"peak\": true, \"bf16_tflops\": %.1f, \"fp8_tflops\": %.1f, \"fp8_fast_tflops\": %.1f, "
                 "\"copy_gbs\": %.1f}\n", peak_bf16, peak_fp8, peak_fp8_fast, bw);
  }
  // The roofline of each point from this run's peaks and copy bandwidth: max(FLOPs / peak, bytes /
  // bandwidth), bytes = X and W once in their type + Y in bf16; FP8 with its quantization adds the
  // activation's two fp32 reads (amax, cast) and its e4m3 write.
  auto roof_us = [&](int64_t M, int64_t N, int64_t K, bool fp8_in, bool quant) {
    const double m = static_cast<double>(M), n = static_cast<double>(N), k = static_cast<double>(K);
    const double in = fp8_in ? 1.0 : 2.0;
    const double flops = 2.0 * m * n * k / ((fp8_in ? peak_fp8 : peak_bf16) * 1e12);
    const double bytes = ((m * k + n * k) * in + 2.0 * m * n) / (bw * 1e9);
    const double extra = quant ? (8.0 * m * k + m * k) / (bw * 1e9) : 0.0;
    return (std::max(flops, bytes) + extra) * 1e6;
  };
  std::printf("%-13s %-14s %6s | %9s %9s %9s %9s %9s | %6s %6s %6s | %9s %9s | %s\n", "model", "linear", "M",
              "bf16 us", "fp8 us", "fp8f us", "q+fp8 us", "mx8 us", "bf16%", "fp8%", "fp8f%", "roof bf16", "roof q+8",
              "fp8 (with quant) / bf16 speed");
  for (const Linear& l : kLinears) {
    int64_t crossover = -1;
    for (int64_t M : kTokens) {
      if (M > largest_m) continue;
      try {
      const double budget = 100.0;
      const double t_bf16 = time_ms([&] { blas.gemm_bf16(xbc, wbc, y.data(), cu::OutType::bf16, M, l.N, l.K); }, budget);
      const double t_fp8 = time_ms([&] { blas.gemm_fp8(x8c, sx, w8c, sw, y.data(), cu::OutType::bf16, M, l.N, l.K, false); }, budget);
      const double t_fast = time_ms([&] { blas.gemm_fp8(x8c, sx, w8c, sw, y.data(), cu::OutType::bf16, M, l.N, l.K, true); }, budget);
      // FP8 with the activation's quantization: fp32 X (M x K) -> per-tensor e4m3 (amax pass +
      // cast), then the GEMM; the weight is quantized once, outside.
      cu::DeviceQuantized xq;
      cu::quantize(fp8, static_cast<float*>(xf.data()), M, l.K, {}, xq);
      const double t_q = time_ms([&] {
        cu::quantize_async(fp8, static_cast<float*>(xf.data()), M, l.K, {}, xq);
        blas.gemm_fp8(static_cast<const uint8_t*>(xq.codes.data()), cu::tensor_scale_of(xq), w8c, sw, y.data(),
                      cu::OutType::bf16, M, l.N, l.K, false);
      }, budget);
      // MXFP8 on Hopper (no MX tensor cores): the activation quantized to MXFP8 E4M3 (1x32 along
      // K), its values dequantized to bf16 (exact), then the BF16 GEMM; the weight is dequantized
      // once, outside (its bf16 bytes are what the GEMM reads).
      cu::DeviceQuantized xm;
      cu::DeviceBuffer xm16(static_cast<size_t>(M * l.K) * 2);
      const double t_mx = time_ms([&] {
        cu::quantize_async(mx8, static_cast<float*>(xf.data()), M, l.K, {}, xm);
        cu::dequantize(xm, xm16.data(), true);
        blas.gemm_bf16(static_cast<const uint16_t*>(xm16.data()), wbc, y.data(), cu::OutType::bf16, M, l.N, l.K);
      }, budget);
      const double speed = t_bf16 / t_q;
      if (crossover < 0 && speed > 1.0) crossover = M;
      const double roof_bf16 = roof_us(M, l.N, l.K, false, false), roof_q = roof_us(M, l.N, l.K, true, true);
      std::printf("%-13s %-14s %6lld | %9.1f %9.1f %9.1f %9.1f %9.1f | %5.1f%% %5.1f%% %5.1f%% | %9.1f %9.1f | %.2fx\n",
                  l.model, l.name, static_cast<long long>(M), t_bf16 * 1e3, t_fp8 * 1e3, t_fast * 1e3, t_q * 1e3,
                  t_mx * 1e3,
                  100.0 * tflops(M, l.N, l.K, t_bf16) / peak_bf16, 100.0 * tflops(M, l.N, l.K, t_fp8) / peak_fp8,
                  100.0 * tflops(M, l.N, l.K, t_fast) / peak_fp8_fast, roof_bf16, roof_q, speed);
      if (g_json != nullptr) {
        std::fprintf(g_json,
                     "{\"model\": \"%s\", \"linear\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": %lld, \"bf16_ms\": %.5f, "
                     "\"fp8_ms\": %.5f, \"fp8_fast_ms\": %.5f, \"quant_fp8_ms\": %.5f, \"mxfp8_bf16_ms\": %.5f, "
                     "\"roof_bf16_us\": %.2f, \"roof_quant_fp8_us\": %.2f}\n",
                     l.model, l.name, static_cast<long long>(M), static_cast<long long>(l.N), static_cast<long long>(l.K),
                     t_bf16, t_fp8, t_fast, t_q, t_mx, roof_bf16, roof_q);
      }
      } catch (const std::exception& e) {  // one shape cuBLASLt refuses does not end the table
        std::printf("%-13s %-14s %6lld | failed: %s\n", l.model, l.name, static_cast<long long>(M), e.what());
      }
    }
    std::printf("%-13s %-14s crossover (FP8 with its quantization faster than BF16): %s\n", l.model, l.name,
                crossover < 0 ? "none up to the largest M" : ("M = " + std::to_string(crossover)).c_str());
  }
  return 0;
}

// --- lm_head logits of real hidden states ---------------------------------------------------

struct Npy {
  std::string descr;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> data;
};

// A 2-D C-order .npy (format 1.0 / 2.0) of '<f4', '<u2' or '|u1'; throws naming the file.
Npy read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw concord::InputError(path + ": cannot open");
  char magic[8];
  in.read(magic, 8);
  if (!in || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw concord::InputError(path + ": not a .npy file");
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    in.read(reinterpret_cast<char*>(b), 2);
    header_len = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    in.read(reinterpret_cast<char*>(b), 4);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  }
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  Npy out;
  auto field = [&](const std::string& key) {
    const size_t at = header.find("'" + key + "'");
    if (at == std::string::npos) throw concord::InputError(path + ": .npy header has no " + key);
    return header.substr(header.find(':', at) + 1);
  };
  const std::string d = field("descr");
  out.descr = d.substr(d.find('\'') + 1, 3);
  if (field("fortran_order").find("False") == std::string::npos) throw concord::InputError(path + ": Fortran order");
  const std::string shape = field("shape");
  long long r = 0, c = 0;
  if (std::sscanf(shape.c_str(), " (%lld, %lld)", &r, &c) != 2) throw concord::InputError(path + ": not 2-D");
  out.rows = r;
  out.cols = c;
  const size_t elem = out.descr == "<f4" ? 4 : out.descr == "<u2" ? 2 : out.descr == "|u1" ? 1 : 0;
  if (elem == 0) throw concord::InputError(path + ": dtype " + out.descr + " (want <f4, <u2 or |u1)");
  out.data.resize(static_cast<size_t>(r * c) * elem);
  in.read(reinterpret_cast<char*>(out.data.data()), static_cast<std::streamsize>(out.data.size()));
  if (!in) throw concord::InputError(path + ": truncated");
  return out;
}

void write_npy_f32(const std::string& path, const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                       std::to_string(cols) + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  const unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xFF), static_cast<unsigned char>(header.size() >> 8)};
  out.write(reinterpret_cast<const char*>(len), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  out.close();
  if (!out || std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error(path + ": cannot write");
}

// The tied lm_head of the GGUF as stored (Q8_0 rows: per 32 values an fp16 scale d and 32 int8
// codes q), decoded to fp32 d·q — exact (11 significant bits times 8), so these are the values
// concord's fp32 kernel multiplies by.
std::vector<float> decode_q8_0(const Npy& blocks, int64_t hidden, const std::string& path) {
  if (blocks.descr != "|u1" || blocks.cols != hidden / 32 * 34 || hidden % 32 != 0) {
    throw concord::InputError(path + ": want (vocab, " + std::to_string(hidden / 32 * 34) +
                              ") uint8 Q8_0 rows for hidden size " + std::to_string(hidden));
  }
  std::vector<float> w(static_cast<size_t>(blocks.rows * hidden));
  for (int64_t r = 0; r < blocks.rows; ++r) {
    for (int64_t b = 0; b < hidden / 32; ++b) {
      const uint8_t* block = blocks.data.data() + r * blocks.cols + b * 34;
      const float d = nm::decode_ref(nm::Format::fp16, static_cast<uint32_t>(block[0] | (block[1] << 8)));
      for (int j = 0; j < 32; ++j) {
        const auto q = static_cast<float>(static_cast<int8_t>(block[2 + j]));
        w[static_cast<size_t>(r * hidden + b * 32 + j)] = d * q;
      }
    }
  }
  return w;
}

// Per row: sum_i bits_i * (2i + 1) mod 2^64 (tools/gpu_inputs.py's checksum).
uint64_t row_checksum(const float* row, int64_t n) {
  uint64_t sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<uint64_t>(cu::bits_of(row[i])) * static_cast<uint64_t>(2 * i + 1);
  return sum;
}

// The "sums" array of tools/gpu_inputs.py's cpu-fp32.sums.json (decimal strings).
std::vector<uint64_t> read_sums(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw concord::InputError(path + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find("\"sums\"");
  if (at == std::string::npos) throw concord::InputError(path + ": no \"sums\"");
  std::vector<uint64_t> out;
  for (size_t i = text.find('[', at); i != std::string::npos && i < text.size() && text[i] != ']'; ++i) {
    if (text[i] >= '0' && text[i] <= '9') {
      size_t end = i;
      while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
      out.push_back(std::stoull(text.substr(i, end - i)));
      i = end;
    }
  }
  return out;
}

// "" when every row's checksum matches the CPU's, else which rows do not.
std::string compare_sums(const std::vector<float>& logits, int64_t P, int64_t V, const std::vector<uint64_t>& sums) {
  if (static_cast<int64_t>(sums.size()) != P) return std::to_string(sums.size()) + " checksums for " + std::to_string(P) + " rows";
  int64_t bad = 0, first = -1;
  for (int64_t r = 0; r < P; ++r) {
    if (row_checksum(logits.data() + r * V, V) != sums[static_cast<size_t>(r)]) {
      if (bad++ == 0) first = r;
    }
  }
  return bad == 0 ? "" : std::to_string(bad) + " of " + std::to_string(P) + " rows differ (first: row " + std::to_string(first) + ")";
}

struct LogitsInputs {
  int64_t P = 0, V = 0, H = 0;
  std::vector<float> X, W;
  std::vector<uint64_t> sums;
};

LogitsInputs read_logits_inputs(const std::string& hidden_path, const std::string& weight_path, const std::string& sums_path) {
  const Npy x = read_npy(hidden_path);
  if (x.descr != "<f4") throw concord::InputError(hidden_path + ": hidden states must be <f4");
  LogitsInputs in;
  in.P = x.rows;
  in.H = x.cols;
  in.X.resize(static_cast<size_t>(in.P * in.H));
  std::memcpy(in.X.data(), x.data.data(), in.X.size() * 4);
  const Npy w = read_npy(weight_path);
  in.W = decode_q8_0(w, in.H, weight_path);
  in.V = w.rows;
  if (!sums_path.empty()) in.sums = read_sums(sums_path);
  return in;
}

// Without a GPU: concord's CPU GEMM on the same inputs reproduces the dump's logits (so the GPU's
// exact product has a target it can meet bit for bit).
int run_verify_inputs(const std::string& hidden_path, const std::string& weight_path, const std::string& sums_path) {
  const LogitsInputs in = read_logits_inputs(hidden_path, weight_path, sums_path);
  const std::vector<float> z = cpu_gemm(in.X, in.W, in.P, in.V, in.H);
  const std::string diff = compare_sums(z, in.P, in.V, in.sums);
  std::printf("%s  tensor::gemm(hidden, lm_head) = the CPU dump's logits, %lld rows x %lld %s\n", diff.empty() ? "PASS" : "FAIL",
              static_cast<long long>(in.P), static_cast<long long>(in.V), diff.c_str());
  return diff.empty() ? 0 : 1;
}

int run_logits(const std::string& hidden_path, const std::string& weight_path, const std::string& sums_path,
               const std::string& out_dir) {
  const LogitsInputs in = read_logits_inputs(hidden_path, weight_path, sums_path);
  std::error_code made;
  std::filesystem::create_directories(out_dir, made);
  if (made) throw concord::InputError(out_dir + ": cannot create the output folder: " + made.message());
  const int64_t P = in.P, V = in.V, H = in.H;
  cu::DeviceBuffer dx = upload_floats(in.X), dw = upload_floats(in.W), dy(static_cast<size_t>(P * V) * 4);
  auto* y = static_cast<float*>(dy.data());
  const size_t n = static_cast<size_t>(P * V);
  int rc = 0;
  // The exact fp32 product on the GPU against the CPU's logits (checksums of every row's bits).
  cu::exact_gemm(static_cast<float*>(dx.data()), static_cast<float*>(dw.data()), y, P, V, H);
  if (!in.sums.empty()) {
    const std::string diff = compare_sums(download_floats(y, n), P, V, in.sums);
    std::printf("%s  GPU exact fp32 lm_head = concord's CPU logits (SmolLM2-135M, %lld rows x %lld) %s\n",
                diff.empty() ? "PASS" : "FAIL", static_cast<long long>(P), static_cast<long long>(V), diff.c_str());
    if (g_json != nullptr) {
      std::fprintf(g_json, "{\"check\": \"gpu exact fp32 lm_head = cpu logits\", \"rows\": %lld, \"pass\": %s}\n",
                   static_cast<long long>(P), diff.empty() ? "true" : "false");
    }
    if (!diff.empty()) rc = 1;
  }
  const nm::QuantDesc bf16 = nm::QuantDesc::elementwise(nm::Format::bf16, nm::Rounding::rne, nm::Overflow::ieee);
  const nm::QuantDesc fp8 = nm::QuantDesc::per_tensor(nm::Format::e4m3);
  cu::DeviceQuantized qx, qw, fx, fw;
  cu::quantize(bf16, static_cast<float*>(dx.data()), P, H, {}, qx);
  cu::quantize(bf16, static_cast<float*>(dw.data()), V, H, {}, qw);
  cu::quantize(fp8, static_cast<float*>(dx.data()), P, H, {}, fx);
  cu::quantize(fp8, static_cast<float*>(dw.data()), V, H, {}, fw);
  cu::Blas blas;
  auto save = [&](const char* name) {
    const std::string path = out_dir + "/" + name + ".npy";
    write_npy_f32(path, download_floats(y, n), P, V);
    std::printf("wrote %s (%lld x %lld)\n", path.c_str(), static_cast<long long>(P), static_cast<long long>(V));
  };
  cu::DeviceBuffer vx = decoded(qx), vw = decoded(qw), ux = decoded(fx), uw = decoded(fw);
  cu::exact_gemm(static_cast<float*>(vx.data()), static_cast<float*>(vw.data()), y, P, V, H);
  save("exact-bf16");
  if (cu::host_emulation()) {  // the pipeline without cuBLASLt: the exact products alone
    cu::exact_gemm(static_cast<float*>(ux.data()), static_cast<float*>(uw.data()), y, P, V, H, cu::tensor_scale_of(fx),
                   cu::tensor_scale_of(fw));
    save("exact-fp8");
    std::printf("SKIP  cublas-bf16, cublas-fp8, cublas-fp8-fast (the host emulation has no cuBLASLt)\n");
    return rc;
  }
  blas.gemm_bf16(static_cast<const uint16_t*>(qx.codes.data()), static_cast<const uint16_t*>(qw.codes.data()), y,
                 cu::OutType::f32, P, V, H);
  save("cublas-bf16");
  cu::exact_gemm(static_cast<float*>(ux.data()), static_cast<float*>(uw.data()), y, P, V, H, cu::tensor_scale_of(fx),
                 cu::tensor_scale_of(fw));
  save("exact-fp8");
  for (bool fast : {false, true}) {
    blas.gemm_fp8(static_cast<const uint8_t*>(fx.codes.data()), cu::tensor_scale_of(fx),
                  static_cast<const uint8_t*>(fw.codes.data()), cu::tensor_scale_of(fw), y, cu::OutType::f32, P, V, H, fast);
    save(fast ? "cublas-fp8-fast" : "cublas-fp8");
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: cuda_gemm check [--quick] | bench [--quick] | logits --hidden X.npy --q8-0 W.npy [--sums S.json] --out DIR\n"
                 "       | verify-inputs --hidden X.npy --q8-0 W.npy --sums S.json   [--json FILE]\n");
    return 2;
  }
  const std::string mode = argv[1];
  std::string json_path, hidden, weight, out_dir, sums;
  bool quick = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cuda_gemm: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json") json_path = value();
    else if (a == "--hidden") hidden = value();
    else if (a == "--q8-0") weight = value();
    else if (a == "--sums") sums = value();
    else if (a == "--out") out_dir = value();
    else if (a == "--quick") quick = true;
    else {
      std::fprintf(stderr, "cuda_gemm: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (mode != "check" && mode != "bench" && mode != "logits" && mode != "verify-inputs") {
    std::fprintf(stderr, "cuda_gemm: unknown mode %s (check, bench, logits, verify-inputs)\n", mode.c_str());
    return 2;
  }
  if ((mode == "logits" || mode == "verify-inputs") && (hidden.empty() || weight.empty())) {
    std::fprintf(stderr, "cuda_gemm %s: --hidden and --q8-0 are required\n", mode.c_str());
    return 2;
  }
  if (mode == "logits" && out_dir.empty()) {
    std::fprintf(stderr, "cuda_gemm logits: --out is required\n");
    return 2;
  }
  if (mode == "verify-inputs") {  // the CPU side alone: no device needed
    if (sums.empty()) {
      std::fprintf(stderr, "cuda_gemm verify-inputs: --sums is required\n");
      return 2;
    }
    try {
      return run_verify_inputs(hidden, weight, sums);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cuda_gemm: %s\n", e.what());
      return 2;
    }
  }
  std::string why;
  if (!cu::device_available(&why)) {
    std::printf("cuda_gemm: skipped: %s\n", why.c_str());
    return 77;
  }
  if (!json_path.empty()) {
    g_json = std::fopen(json_path.c_str(), "w");
    if (g_json == nullptr) {
      std::fprintf(stderr, "cuda_gemm: cannot write %s\n", json_path.c_str());
      return 2;
    }
  }
  int rc = 0;
  try {
    std::printf("device: %s\n", cu::device_description().c_str());
    rc = mode == "check" ? run_check(quick) : mode == "bench" ? run_bench(quick) : run_logits(hidden, weight, sums, out_dir);
  } catch (const concord::InputError& e) {
    std::fprintf(stderr, "cuda_gemm: %s\n", e.what());
    rc = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_gemm: %s\n", e.what());
    rc = 1;
  }
  if (g_json != nullptr) std::fclose(g_json);
  return rc;
}
