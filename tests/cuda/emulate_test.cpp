// The CUDA host emulation (src/concord/cuda/emulate.h) itself: thread coordinates, warp shuffles,
// shared memory and barriers give the GPU's results in either thread order, and each undefined
// use the scheduler promises to report is reported rather than hung on or guessed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#define CONCORD_CUDA_EMULATE 1
#include "concord/cuda/runtime.h"

namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;

__global__ void coordinates_kernel(unsigned* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned id = block * blockDim.x * blockDim.y * blockDim.z + thread;
  out[id] = id + 1;
}

// Each lane ends with its warp's sum (a butterfly over the five xor distances).
__global__ void warp_sum_kernel(const unsigned* in, unsigned* out) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  unsigned v = in[i];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  out[i] = v;
}

template <bool kBarrier>
__global__ void reverse_kernel(const float* in, float* out) {
  __shared__ float s[256];
  const unsigned t = threadIdx.x;
  s[t] = in[blockIdx.x * blockDim.x + t];
  if (kBarrier) __syncthreads();
  out[blockIdx.x * blockDim.x + t] = s[blockDim.x - 1 - t];
}

__global__ void exit_before_shuffle_kernel(unsigned* out) {
  if (threadIdx.x == 7) return;
  out[threadIdx.x] = __shfl_xor_sync(kFull, threadIdx.x, 1);
}

__global__ void exit_before_barrier_kernel(unsigned* out) {
  if (threadIdx.x >= 200) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void divergent_kernel(unsigned* out) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    out[threadIdx.x] = __shfl_xor_sync(kFull, 1u, 1);
  }
}

class Emulation : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      setenv("CONCORD_CUDA_EMU_ORDER", "reverse", 1);
    } else {
      unsetenv("CONCORD_CUDA_EMU_ORDER");
    }
  }
  void TearDown() override { unsetenv("CONCORD_CUDA_EMU_ORDER"); }
};

TEST_P(Emulation, EveryThreadOfEveryBlockRunsOnceWithItsCoordinates) {
  const dim3 grid(3, 2, 2), block(4, 2, 3);
  std::vector<unsigned> out(3 * 2 * 2 * 4 * 2 * 3, 0u);
  CONCORD_LAUNCH(coordinates_kernel, grid, block, out.data());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], i + 1) << i;
}

TEST_P(Emulation, XorShufflesExchangeWithinEachWarp) {
  std::vector<unsigned> in(512), out(512, 0u);
  std::iota(in.begin(), in.end(), 0u);
  CONCORD_LAUNCH(warp_sum_kernel, 2, 256, in.data(), out.data());
  for (unsigned i = 0; i < 512; ++i) {
    const unsigned w0 = i / 32 * 32;
    ASSERT_EQ(out[i], 32 * w0 + 31 * 32 / 2) << i;
  }
}

TEST_P(Emulation, SharedMemoryOrderedByTheBarrierIsRightInEitherOrder) {
  std::vector<float> in(512), out(512, -1.0f);
  std::iota(in.begin(), in.end(), 0.0f);
  CONCORD_LAUNCH(reverse_kernel<true>, 2, 256, in.data(), out.data());
  for (int i = 0; i < 512; ++i) ASSERT_EQ(out[i], static_cast<float>(i / 256 * 256 + 255 - i % 256)) << i;
}

TEST_P(Emulation, AMissingBarrierGivesWrongResults) {
  std::vector<float> in(256), out(256, -1.0f);
  std::iota(in.begin(), in.end(), 0.0f);
  // Shared memory keeps the last launch's values (on the GPU it is not cleared either): poison it.
  std::vector<float> poison(256, -7.0f), sink(256);
  CONCORD_LAUNCH(reverse_kernel<false>, 1, 256, poison.data(), sink.data());
  CONCORD_LAUNCH(reverse_kernel<false>, 1, 256, in.data(), out.data());
  int wrong = 0;
  for (int i = 0; i < 256; ++i) wrong += out[i] != static_cast<float>(255 - i);
  EXPECT_GE(wrong, 128);
}

// The error launch() throws ("" when it returns normally).
template <class Launch>
std::string launch_error(Launch&& launch) {
  try {
    launch();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST_P(Emulation, AShuffleNamingAnExitedLaneIsReported) {
  std::vector<unsigned> out(32, 0u);
  const std::string error = launch_error([&] { CONCORD_LAUNCH(exit_before_shuffle_kernel, 1, 32, out.data()); });
  EXPECT_NE(error.find("lane 7 of its warp has exited"), std::string::npos) << error;
}

TEST_P(Emulation, ABarrierSomeThreadsNeverReachIsReported) {
  std::vector<unsigned> out(256, 0u);
  const std::string error = launch_error([&] { CONCORD_LAUNCH(exit_before_barrier_kernel, 1, 256, out.data()); });
  EXPECT_NE(error.find("56 of 256 threads exited before a __syncthreads"), std::string::npos) << error;
}

TEST_P(Emulation, AWarpSplitBetweenABarrierAndAShuffleIsReported) {
  std::vector<unsigned> out(32, 0u);
  EXPECT_THROW(CONCORD_LAUNCH(divergent_kernel, 1, 32, out.data()), std::runtime_error);
  // and the emulation is usable afterwards
  std::vector<unsigned> in(32, 1u), sums(32, 0u);
  CONCORD_LAUNCH(warp_sum_kernel, 1, 32, in.data(), sums.data());
  EXPECT_EQ(sums[0], 32u);
}

TEST_P(Emulation, AnInvalidLaunchIsRefused) {
  std::vector<unsigned> out(4096, 0u);
  EXPECT_THROW(CONCORD_LAUNCH(coordinates_kernel, 1, 2048, out.data()), std::runtime_error);
  EXPECT_THROW(CONCORD_LAUNCH(coordinates_kernel, 0, 32, out.data()), std::runtime_error);
}

INSTANTIATE_TEST_SUITE_P(Order, Emulation, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "reverse" : "forward"; });

}  // namespace
