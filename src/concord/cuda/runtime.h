// The CUDA runtime for quantize.cu and gemm.cu: <cuda_runtime.h> under nvcc, or the host
// emulation (emulate.h) when g++ compiles them with CONCORD_CUDA_EMULATE. Kernels are launched with
// CONCORD_LAUNCH(kernel, grid, block, args...) — `kernel<<<grid, block>>>(args...)` on the GPU — and
// a kernel named with template arguments that hold a comma is launched through a constexpr
// pointer to it.
#pragma once

#if defined(CONCORD_CUDA_EMULATE)
#include "concord/cuda/emulate.h"
#else
#include <cuda_runtime.h>
#define CONCORD_LAUNCH(kernel, grid, block, ...) kernel<<<(grid), (block)>>>(__VA_ARGS__)
#endif
