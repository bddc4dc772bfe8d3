// The low-precision quantizers on an NVIDIA GPU (CONCORD_CUDA; sm_90 first): fp32 -> bf16 (RNE,
// and stochastic rounding drawing the CPU's Philox words for the same seed and element index),
// plain casts to the FP8/FP6/FP4 element formats, per-tensor FP8, MX (e8m0 scales under all four
// rules, any block shape and axis) and NVFP4 (the fp32 global scale, 1x16 and 16x16 blocks).
// Each produces exactly numerics::quantize_ref's codes, scales and tensor scale: the arithmetic is
// concord/cuda/codec.h's (checked against the reference on the CPU by tests/cuda/), the layout is
// block.h's, and tools/gpu_check.sh checks the whole on the GPU.
//
// Kernels: 1 x 16 and 1 x 32 blocks along rows (NVFP4 and MX activations and weights) run one
// thread per four elements with the block's amax reduced by warp shuffles — coalesced loads and
// stores; casts run four elements a thread; NVFP4's 16 x 16 blocks one warp a block; blocks down
// columns (MX axis 0) four adjacent columns a thread; every other block shape (partial edge
// blocks, a misaligned x, odd widths) runs one thread per block, 4-bit codes then packed in a
// second pass so no two threads share a byte. Tensor amaxes (NVFP4, per-tensor) are an atomicMax over
// the magnitudes' bits (NaN-propagating, as amax_ref).
//
// This header needs no CUDA headers: pointers are device pointers, streams are opaque.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "concord/numerics/block.h"

namespace concord::cuda {

// Whether a CUDA device can run here; otherwise why not (one line: no driver, no device, ...).
bool device_available(std::string* why = nullptr);
// "NVIDIA H200, driver 570.86, CUDA runtime 13000, sm_90, 132 SMs, 141 GiB".
std::string device_description();
// Whether this build runs its kernels in the host emulation (emulate.h) rather than on a GPU.
bool host_emulation();

// Device memory, freed with the object.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void resize(size_t bytes);  // keeps the allocation when it is large enough
  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  size_t capacity_ = 0;
};

// A quantized tensor in device memory, laid out as numerics::QuantizedTensor.
struct DeviceQuantized {
  numerics::QuantDesc desc;
  int64_t rows = 0, cols = 0;
  DeviceBuffer codes;
  DeviceBuffer scales;   // one byte per block; empty without block scales
  DeviceBuffer scratch;  // [tensor amax bits, tensor scale bits], unpacked 4-bit codes
  float tensor_scale = 1.0f;

  numerics::QuantizedTensor to_host() const;
};

// Whether the GPU quantizers take desc (element bf16, fp16, e4m3, e5m2, e2m3, e3m2, e2m1 or
// ue4m3; int, e8m0 and f32 elements stay on the CPU); otherwise why not.
bool supported(const numerics::QuantDesc& desc, std::string* why = nullptr);

// Quantizes the device fp32 tensor x (rows x cols, row-major) into out. Throws InputError for a
// descriptor numerics::validate rejects or supported() does not take. Synchronous: out's
// tensor_scale is read back before it returns (the codes never leave the device).
void quantize(const numerics::QuantDesc& desc, const float* x, int64_t rows, int64_t cols,
              numerics::RandomStream rng, DeviceQuantized& out);

// The same with the host waiting on nothing: kernels queued on the default stream, tensor_scale
// left on the device (scratch) — what the benchmarks time.
void quantize_async(const numerics::QuantDesc& desc, const float* x, int64_t rows, int64_t cols,
                    numerics::RandomStream rng, DeviceQuantized& out);

// The values of q's elements times their block scales WITHOUT the tensor scale (NVFP4's 1/S_enc
// and per-tensor FP8's 1/S stay apart, as in tensor::PreparedOperand: numerics::dequantize with
// tensor_scale 1), into out (rows x cols, row-major): fp32, or with bf16_out their bf16 codes
// rounded to nearest even — exact whenever the values are bf16-representable, as every MX and
// NVFP4 value with a block scale in the normal range is (tensor/qgemm.h): how a GPU without MX
// tensor cores (Hopper) multiplies MX operands exactly, on its BF16 ones.
void dequantize(const DeviceQuantized& q, void* out, bool bf16_out = false);

// A device-to-device copy of n bytes (the bandwidth baseline), and a wait for the device.
void copy_device(void* dst, const void* src, size_t n);
void copy_to_host(void* host, const void* device, size_t n);  // waits for the device first
void synchronize();

// Device time between start() and stop_ms(), with CUDA events on the default stream.
class DeviceTimer {
 public:
  DeviceTimer();
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;
  void start();
  double stop_ms();  // waits for the device

 private:
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

}  // namespace concord::cuda
