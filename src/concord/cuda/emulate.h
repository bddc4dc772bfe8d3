// CUDA on the CPU, for the part of CUDA that quantize.cu and gemm.cu use: those files compiled by
// g++ with CONCORD_CUDA_EMULATE run their kernels here, every GPU thread a fiber, so that
// cuda_check and cuda_gemm check run the real kernel code — launch geometry, indexing, packing,
// warp-shuffle reductions, shared memory and __syncthreads, the host-side orchestration — on a
// machine without a GPU, against the same CPU references as on the GPU.
//
// The scheduler runs one block at a time; in it, each ready thread runs until it finishes or
// waits: at a __shfl_xor_sync until every lane of its warp waits there (then the values are
// exchanged), at a __syncthreads until every thread of the block does. It reports, instead of
// hanging or guessing, what the GPU leaves undefined: a shuffle whose mask names a lane that has
// exited or waits elsewhere, a __syncthreads some threads never reach, a mask that is not the
// warp's full set. CONCORD_CUDA_EMU_ORDER=reverse runs the threads of a block in the reverse
// order (a kernel that reads shared memory without the barrier that orders it gives other
// results). float4 and uint2 carry their device alignment, so UBSan's alignment check (the
// sanitizer build) catches a vector load the GPU would fault on; device memory is heap memory of
// exactly the size asked, so ASan catches a kernel reading or writing past a buffer.
//
// What it cannot show: the GPU's own arithmetic (codec.h's host branch runs instead — that is the
// code tests/cuda/codec_test.cpp checks; the device branch differs only in the intrinsics), its
// code generation, races between threads that a sequential schedule hides, timing, and
// cuBLASLt (not emulated: its calls throw). Those are tools/gpu_check.sh's.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// One block runs at a time, all its threads on one OS thread: a function-local static is the
// block's shared memory.
#define __shared__ static

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }

// The running thread's coordinates, set by the scheduler before it resumes a thread.
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

namespace concord::cuda::emu {
// Runs body as grid x block threads; throws std::runtime_error for what the GPU leaves undefined
// (see above). Synchronous: the launch is complete when it returns.
void launch(dim3 grid, dim3 block, const std::function<void()>& body);
uint32_t shfl_xor(unsigned mask, uint32_t value, int lane_mask);
void syncthreads();
}  // namespace concord::cuda::emu

#define CONCORD_LAUNCH(kernel, grid, block, ...) \
  ::concord::cuda::emu::launch((grid), (block), [&] { kernel(__VA_ARGS__); })

template <class T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
  static_assert(sizeof(T) == 4, "the emulation shuffles 32-bit values");
  return std::bit_cast<T>(concord::cuda::emu::shfl_xor(mask, std::bit_cast<uint32_t>(value), lane_mask));
}
inline void __syncthreads() { concord::cuda::emu::syncthreads(); }
// Threads run one at a time: a plain read-modify-write is atomic.
inline unsigned atomicMax(unsigned* address, unsigned value) {
  const unsigned old = *address;
  *address = std::max(old, value);
  return old;
}
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }  // -ffp-contract=off: one rounding

namespace concord::cuda {
using std::max;  // the device's min/max overloads
using std::min;
}  // namespace concord::cuda

// --- The runtime API, as far as concord uses it ----------------------------------------------

enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3
};
struct cudaDeviceProp {
  char name[256];
  int major, minor, multiProcessorCount;
  size_t totalGlobalMem;
};
using cudaStream_t = void*;
using cudaEvent_t = struct EmuEvent*;

const char* cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDriverGetVersion(int* version);
cudaError_t cudaRuntimeGetVersion(int* version);
cudaError_t cudaGetLastError();
cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop);
