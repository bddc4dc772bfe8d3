// gemm.cu compiled by g++ for the CUDA host emulation (emulate.h; the target defines
// CONCORD_CUDA_EMULATE): the same kernels, run as fibers on the CPU.
#include "gemm.cu"
