// The GPU quantizers (quantize.h): kernels over concord/cuda/codec.h, launched in block.h's layout.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "concord/cuda/codec.h"
#include "concord/cuda/quantize.h"
#include "concord/cuda/runtime.h"
#include "concord/numerics/check.h"

namespace concord::cuda {
namespace {

namespace nm = concord::numerics;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("[cuda] ") + what + ": " + cudaGetErrorString(e));
  }
}
#define CONCORD_CUDA_OK(call) check_cuda((call), #call)
#define CONCORD_CUDA_LAUNCHED(name) check_cuda(cudaGetLastError(), "launching " name)

constexpr unsigned kFullMask = 0xFFFFFFFFu;
constexpr int kThreads = 256;

// What every encoding kernel needs to know besides its data.
struct Params {
  Elem elem;
  Round round;
  Over over;
  uint64_t seed;
  uint32_t stream;
};

// scratch words: [0] tensor amax bits, [1] tensor (decode) scale bits, [2] encode multiplier bits.
constexpr int kScratchWords = 4;

__device__ __forceinline__ Words4 random_words(const Params& p, uint64_t group) {
  if (p.round == Round::sr) return philox_block(p.seed, p.stream, group);
  return {{0u, 0u, 0u, 0u}};
}

// The codes of elements 4g .. 4g+3 (the first `count` of them are real), stored by one thread:
// it owns whole bytes in every storage width (4-bit: 2 bytes; 8-bit: 4; 16-bit: 8).
template <int kStorage>
__device__ __forceinline__ void store4(uint8_t* codes, int64_t g, const uint32_t c[4], int count) {
  if (kStorage == 16) {
    auto* out = reinterpret_cast<uint16_t*>(codes) + 4 * g;
    if (count == 4) {
      *reinterpret_cast<uint2*>(out) = make_uint2(c[0] | (c[1] << 16), c[2] | (c[3] << 16));
    } else {
      for (int k = 0; k < count; ++k) out[k] = static_cast<uint16_t>(c[k]);
    }
  } else if (kStorage == 8) {
    uint8_t* out = codes + 4 * g;
    if (count == 4) {
      *reinterpret_cast<uint32_t*>(out) = c[0] | (c[1] << 8) | (c[2] << 16) | (c[3] << 24);
    } else {
      for (int k = 0; k < count; ++k) out[k] = static_cast<uint8_t>(c[k]);
    }
  } else {
    uint8_t* out = codes + 2 * g;
    const uint32_t lo = (c[0] & 0xFu) | ((count > 1 ? c[1] & 0xFu : 0u) << 4);
    const uint32_t hi = (count > 2 ? c[2] & 0xFu : 0u) | ((count > 3 ? c[3] & 0xFu : 0u) << 4);
    if (count == 4) {
      *reinterpret_cast<uint16_t*>(out) = static_cast<uint16_t>(lo | (hi << 8));
    } else {
      out[0] = static_cast<uint8_t>(lo);
      if (count > 2) out[1] = static_cast<uint8_t>(hi);
    }
  }
}

__device__ __forceinline__ int load4(const float* x, int64_t n, int64_t g, bool aligned, float v[4]) {
  const int64_t i0 = 4 * g;
  const int count = n - i0 >= 4 ? 4 : static_cast<int>(n - i0);
  if (count == 4 && aligned) {
    const float4 q = *reinterpret_cast<const float4*>(x + i0);
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
  } else {
    for (int k = 0; k < 4; ++k) v[k] = k < count ? x[i0 + k] : 0.0f;
  }
  return count;
}

// A block's scale code from its amax, and what its elements are multiplied by before the cast:
// NVFP4's ue4m3 scale under the global scale in scratch (scratch[2] encode, scratch[1] decode), or
// the MX rule's e8m0 scale.
__device__ __forceinline__ uint8_t block_scale(float amax, bool nvfp4, Elem elem, MxRule rule,
                                               const uint32_t* scratch, float& multiplier) {
  if (nvfp4) {
    const uint8_t code = nvfp4_scale_code(amax, float_of(scratch[2]));
    multiplier = nvfp4_multiplier(code, float_of(scratch[1]));
    return code;
  }
  const uint8_t code = mx_scale_code(amax, elem, rule);
  multiplier = mx_multiplier(code);
  return code;
}

// NaN-propagating tensor amax: the max of the magnitudes' bits (codec.h's abs_bits).
__global__ void amax_kernel(const float* x, int64_t n, bool aligned, uint32_t* scratch) {
  uint32_t m = 0;
  const int64_t groups = (n + 3) / 4;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[4];
    const int count = load4(x, n, g, aligned, v);
    for (int k = 0; k < count; ++k) m = max(m, abs_bits(v[k]));
  }
  for (int off = 16; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(kFullMask, m, off));
  if ((threadIdx.x & 31) == 0) atomicMax(scratch, m);
}

// From the tensor amax: the decode scale (scratch[1]) and the encode multiplier (scratch[2]).
__global__ void tensor_scale_kernel(uint32_t* scratch, bool nvfp4, Elem elem) {
  const float amax = float_of(scratch[0]);
  const float encode_scale = nvfp4 ? nvfp4_global_encode(amax) : per_tensor_encode(amax, elem);
  scratch[1] = bits_of(div_rn(1.0f, encode_scale));
  scratch[2] = bits_of(encode_scale);
}

// Plain casts and per-tensor scaling (multiplier from scratch[2] when scaled): four elements a
// thread, SR words from the Philox block of those four.
template <int kStorage>
__global__ void cast_kernel(const float* x, int64_t n, bool aligned, Params p, const uint32_t* scratch,
                            uint8_t* codes) {
  const int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (4 * g >= n) return;
  float v[4];
  const int count = load4(x, n, g, aligned, v);
  const Words4 r = random_words(p, static_cast<uint64_t>(g));
  const float m = scratch != nullptr ? float_of(scratch[2]) : 1.0f;
  uint32_t c[4] = {0u, 0u, 0u, 0u};
  for (int k = 0; k < count; ++k) {
    c[k] = encode(p.elem, scratch != nullptr ? mul_as_cpu(v[k], m) : v[k], p.round, p.over, r.w[k]);
  }
  store4<kStorage>(codes, g, c, count);
}

// 1 x kBlock blocks along rows (cols a multiple of kBlock): kBlock / 4 threads a block, the amax
// reduced across them with shuffles (the groups are aligned within a warp). nvfp4: the block
// scale from scratch's global scale; else the MX rule.
template <int kBlock, int kStorage>
__global__ void row_block_kernel(const float* x, int64_t n, Params p, bool nvfp4, MxRule rule,
                                 const uint32_t* scratch, uint8_t* codes, uint8_t* scales) {
  constexpr int kLanes = kBlock / 4;
  const int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const bool active = 4 * g < n;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (active) load4(x, n, g, true, v);
  uint32_t m = max(max(abs_bits(v[0]), abs_bits(v[1])), max(abs_bits(v[2]), abs_bits(v[3])));
  for (int off = 1; off < kLanes; off <<= 1) m = max(m, __shfl_xor_sync(kFullMask, m, off));
  if (!active) return;
  float multiplier;
  const uint8_t scale = block_scale(float_of(m), nvfp4, p.elem, rule, scratch, multiplier);
  if (g % kLanes == 0) scales[(4 * g) / kBlock] = scale;
  const Words4 r = random_words(p, static_cast<uint64_t>(g));
  uint32_t c[4];
  for (int k = 0; k < 4; ++k) c[k] = encode(p.elem, mul_as_cpu(v[k], multiplier), p.round, p.over, r.w[k]);
  store4<kStorage>(codes, g, c, 4);
}

// NVFP4's 16 x 16 blocks (rows and cols multiples of 16, x aligned): one warp a block, lane =
// (row r of 8, column quad q of 4) holding rows r and r + 8 of its quad — each load instruction
// reads 8 rows' 64 contiguous bytes; the amax reduced over the warp with shuffles; whole warps
// are active or not, so the early return keeps every shuffle's warp complete.
__global__ void nvfp4_2d_kernel(const float* x, int64_t rows, int64_t cols, Params p, const uint32_t* scratch,
                                uint8_t* codes, uint8_t* scales) {
  const int64_t block = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) >> 5;
  const int64_t grid_cols = cols / 16;
  if (block >= (rows / 16) * grid_cols) return;
  const int lane = static_cast<int>(threadIdx.x & 31u), r = lane >> 2, q = lane & 3;
  const int64_t i0 = ((block / grid_cols) * 16 + r) * cols + (block % grid_cols) * 16 + 4 * q;
  const int64_t i1 = i0 + 8 * cols;
  const float4 a = *reinterpret_cast<const float4*>(x + i0), b = *reinterpret_cast<const float4*>(x + i1);
  const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  uint32_t m = 0;
  for (float e : v) m = max(m, abs_bits(e));
  for (int off = 16; off > 0; off >>= 1) m = max(m, __shfl_xor_sync(kFullMask, m, off));
  float multiplier;
  const uint8_t scale = block_scale(float_of(m), true, p.elem, MxRule::floor, scratch, multiplier);
  if (lane == 0) scales[block] = scale;
  for (int half = 0; half < 2; ++half) {
    const int64_t g = (half == 0 ? i0 : i1) / 4;
    const Words4 words = random_words(p, static_cast<uint64_t>(g));
    uint32_t c[4];
    for (int k = 0; k < 4; ++k) c[k] = encode(p.elem, mul_as_cpu(v[4 * half + k], multiplier), p.round, p.over, words.w[k]);
    store4<4>(codes, g, c, 4);
  }
}

// Blocks down columns (block_rows x 1: MX's axis-0 blocks, a transposed operand's), cols a
// multiple of 4 and x aligned: a thread takes four adjacent columns of one block row — one float4
// a row (a warp reads 512 contiguous bytes a row), the four blocks' amaxes, one Philox block per
// row's four elements, and whole bytes stored in every storage width (so 4-bit codes need no
// second pass). Rows are read twice (amax, then encode); the second read hits the cache.
template <int kStorage>
__global__ void column_quad_kernel(const float* x, int64_t rows, int64_t cols, int block_rows, Params p, bool nvfp4,
                                   MxRule rule, const uint32_t* scratch, uint8_t* codes, uint8_t* scales) {
  const int64_t quads = cols / 4;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t block_row = t / quads, q = t % quads;
  const int64_t r0 = block_row * block_rows;
  if (r0 >= rows) return;
  const int64_t r1 = min(rows, r0 + block_rows);
  uint32_t m[4] = {0u, 0u, 0u, 0u};
  for (int64_t r = r0; r < r1; ++r) {
    const float4 v = *reinterpret_cast<const float4*>(x + r * cols + 4 * q);
    m[0] = max(m[0], abs_bits(v.x));
    m[1] = max(m[1], abs_bits(v.y));
    m[2] = max(m[2], abs_bits(v.z));
    m[3] = max(m[3], abs_bits(v.w));
  }
  float multiplier[4];
  for (int k = 0; k < 4; ++k) {
    scales[block_row * cols + 4 * q + k] = block_scale(float_of(m[k]), nvfp4, p.elem, rule, scratch, multiplier[k]);
  }
  for (int64_t r = r0; r < r1; ++r) {
    const float4 q4 = *reinterpret_cast<const float4*>(x + r * cols + 4 * q);
    const float v[4] = {q4.x, q4.y, q4.z, q4.w};
    const int64_t g = r * quads + q;
    const Words4 words = random_words(p, static_cast<uint64_t>(g));
    uint32_t c[4];
    for (int k = 0; k < 4; ++k) c[k] = encode(p.elem, mul_as_cpu(v[k], multiplier[k]), p.round, p.over, words.w[k]);
    store4<kStorage>(codes, g, c, 4);
  }
}

// Any block shape, one thread a block (consecutive threads take consecutive block columns, so
// blocks down columns read coalesced). 16-bit codes go straight to `out`; narrower ones one byte
// an element (4-bit ones are packed by pack_nibbles_kernel afterwards).
__global__ void block_generic_kernel(const float* x, int64_t rows, int64_t cols, int block_rows,
                                     int block_cols, int64_t grid_cols, int64_t blocks, Params p,
                                     bool nvfp4, MxRule rule, const uint32_t* scratch, uint8_t* out,
                                     bool wide, uint8_t* scales) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b >= blocks) return;
  const int64_t r0 = (b / grid_cols) * block_rows, c0 = (b % grid_cols) * block_cols;
  const int64_t r1 = min(rows, r0 + block_rows), c1 = min(cols, c0 + block_cols);
  uint32_t m = 0;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) m = max(m, abs_bits(x[r * cols + c]));
  }
  float multiplier;
  const uint8_t scale = block_scale(float_of(m), nvfp4, p.elem, rule, scratch, multiplier);
  scales[b] = scale;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t i = r * cols + c;
      const uint32_t random =
          p.round == Round::sr ? philox_block(p.seed, p.stream, static_cast<uint64_t>(i) >> 2).w[i & 3] : 0u;
      const uint32_t code = encode(p.elem, mul_as_cpu(x[i], multiplier), p.round, p.over, random);
      if (wide) {
        reinterpret_cast<uint16_t*>(out)[i] = static_cast<uint16_t>(code);
      } else {
        out[i] = static_cast<uint8_t>(code);
      }
    }
  }
}

__global__ void pack_nibbles_kernel(const uint8_t* unpacked, int64_t n, uint8_t* packed) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (2 * j >= n) return;
  const uint32_t lo = unpacked[2 * j] & 0xFu, hi = 2 * j + 1 < n ? unpacked[2 * j + 1] & 0xFu : 0u;
  packed[j] = static_cast<uint8_t>(lo | (hi << 4));
}

// Four elements a thread: each code decoded, times its block's scale value (e8m0 for MX, ue4m3
// for NVFP4; kind 0: no block scale), as numerics::dequantize computes it (NaNs included:
// mul_as_cpu).
template <bool kBf16>
__global__ void dequantize_kernel(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, Elem elem,
                                  int kind, int block_rows, int block_cols, int64_t grid_cols, void* out) {
  const int64_t n = rows * cols;
  const int64_t i0 = 4 * (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x);
  const int bits = storage_bits(elem);
  for (int64_t i = i0; i < i0 + 4 && i < n; ++i) {
    const uint32_t code = bits == 16  ? reinterpret_cast<const uint16_t*>(codes)[i]
                          : bits == 8 ? codes[i]
                                      : (codes[i >> 1] >> (4 * (i & 1))) & 0xFu;
    float v = decode(elem, code);
    if (kind != 0) {
      const uint8_t s = scales[(i / cols) / block_rows * grid_cols + (i % cols) / block_cols];
      v = mul_as_cpu(v, kind == 1 ? e8m0_value(s) : decode(Elem::ue4m3, s));
    }
    if (kBf16) {
      reinterpret_cast<uint16_t*>(out)[i] = static_cast<uint16_t>(encode(Elem::bf16, v, Round::rne, Over::ieee));
    } else {
      reinterpret_cast<float*>(out)[i] = v;
    }
  }
}

unsigned blocks_for(int64_t threads) { return static_cast<unsigned>((threads + kThreads - 1) / kThreads); }

template <int kStorage>
void launch_cast(const float* x, int64_t n, bool aligned, const Params& p, const uint32_t* scratch,
                 uint8_t* codes) {
  CONCORD_LAUNCH(cast_kernel<kStorage>, blocks_for((n + 3) / 4), kThreads, x, n, aligned, p, scratch, codes);
  CONCORD_CUDA_LAUNCHED("cast_kernel");
}

template <int kBlock, int kStorage>
void launch_row_block(const float* x, int64_t n, const Params& p, bool nvfp4, MxRule rule,
                      const uint32_t* scratch, uint8_t* codes, uint8_t* scales) {
  constexpr auto kernel = row_block_kernel<kBlock, kStorage>;
  CONCORD_LAUNCH(kernel, blocks_for(n / 4), kThreads, x, n, p, nvfp4, rule, scratch, codes, scales);
  CONCORD_CUDA_LAUNCHED("row_block_kernel");
}

template <int kBlock>
void launch_row_block(int storage, const float* x, int64_t n, const Params& p, bool nvfp4, MxRule rule,
                      const uint32_t* scratch, uint8_t* codes, uint8_t* scales) {
  if (storage == 4) return launch_row_block<kBlock, 4>(x, n, p, nvfp4, rule, scratch, codes, scales);
  if (storage == 8) return launch_row_block<kBlock, 8>(x, n, p, nvfp4, rule, scratch, codes, scales);
  return launch_row_block<kBlock, 16>(x, n, p, nvfp4, rule, scratch, codes, scales);
}

}  // namespace

// --- Device and memory ----------------------------------------------------------------------

bool device_available(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    if (why != nullptr) *why = std::string("no usable CUDA device: ") + cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  if (count == 0) {
    if (why != nullptr) *why = "no CUDA device";
    return false;
  }
  return true;
}

bool host_emulation() {
#if defined(CONCORD_CUDA_EMULATE)
  return true;
#else
  return false;
#endif
}

std::string device_description() {
  int device = 0, driver = 0, runtime = 0;
  CONCORD_CUDA_OK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CONCORD_CUDA_OK(cudaGetDeviceProperties(&prop, device));
  if (host_emulation()) return prop.name;
  CONCORD_CUDA_OK(cudaDriverGetVersion(&driver));
  CONCORD_CUDA_OK(cudaRuntimeGetVersion(&runtime));
  return std::string(prop.name) + ", sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
         ", " + std::to_string(prop.multiProcessorCount) + " SMs, " +
         std::to_string(prop.totalGlobalMem >> 30) + " GiB, CUDA driver API " + std::to_string(driver) +
         ", runtime " + std::to_string(runtime);
}

DeviceBuffer::DeviceBuffer(size_t bytes) { resize(bytes); }
DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      capacity_(std::exchange(other.capacity_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}
void DeviceBuffer::resize(size_t bytes) {
  if (bytes > capacity_) {
    if (ptr_ != nullptr) CONCORD_CUDA_OK(cudaFree(ptr_));
    ptr_ = nullptr;
    capacity_ = 0;
    CONCORD_CUDA_OK(cudaMalloc(&ptr_, bytes));
    capacity_ = bytes;
  }
  bytes_ = bytes;
}
void DeviceBuffer::upload(const void* host, size_t bytes) {
  CONCORD_CHECK(bytes <= bytes_, "DeviceBuffer::upload past the buffer");
  CONCORD_CUDA_OK(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice));
}
void DeviceBuffer::download(void* host, size_t bytes) const {
  CONCORD_CHECK(bytes <= bytes_, "DeviceBuffer::download past the buffer");
  CONCORD_CUDA_OK(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost));
}

void copy_device(void* dst, const void* src, size_t n) {
  CONCORD_CUDA_OK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice));
}
void copy_to_host(void* host, const void* device, size_t n) {
  CONCORD_CUDA_OK(cudaMemcpy(host, device, n, cudaMemcpyDeviceToHost));
}
void synchronize() { CONCORD_CUDA_OK(cudaDeviceSynchronize()); }

DeviceTimer::DeviceTimer() {
  cudaEvent_t a = nullptr, b = nullptr;
  CONCORD_CUDA_OK(cudaEventCreate(&a));
  CONCORD_CUDA_OK(cudaEventCreate(&b));
  start_ = a;
  stop_ = b;
}
DeviceTimer::~DeviceTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}
void DeviceTimer::start() { CONCORD_CUDA_OK(cudaEventRecord(static_cast<cudaEvent_t>(start_))); }
double DeviceTimer::stop_ms() {
  CONCORD_CUDA_OK(cudaEventRecord(static_cast<cudaEvent_t>(stop_)));
  CONCORD_CUDA_OK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)));
  float ms = 0.0f;
  CONCORD_CUDA_OK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)));
  return ms;
}

// --- Quantizers ------------------------------------------------------------------------------

bool supported(const nm::QuantDesc& desc, std::string* why) {
  switch (desc.element) {
    case nm::Format::bf16:
    case nm::Format::fp16:
    case nm::Format::e4m3:
    case nm::Format::e5m2:
    case nm::Format::e2m3:
    case nm::Format::e3m2:
    case nm::Format::e2m1:
    case nm::Format::ue4m3:
      return true;
    default:
      if (why != nullptr) {
        *why = "[cuda quantize] " + desc.to_string() + ": element format " +
               std::string(nm::traits(desc.element).name) +
               " is not quantized on the GPU (bf16, fp16, e4m3, e5m2, e2m3, e3m2, e2m1, ue4m3 are)";
      }
      return false;
  }
}

void quantize_async(const nm::QuantDesc& desc, const float* x, int64_t rows, int64_t cols,
                    nm::RandomStream rng, DeviceQuantized& out) {
  nm::validate(desc, rows, cols);
  std::string why;
  if (!supported(desc, &why)) throw InputError(why);
  const int64_t n = rows * cols;
  const auto elem = static_cast<Elem>(desc.element);
  const int storage = storage_bits(elem);
  const Params p{elem, static_cast<Round>(desc.rounding), static_cast<Over>(desc.overflow), rng.seed,
                 rng.stream};
  const bool aligned = (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  out.desc = desc;
  out.rows = rows;
  out.cols = cols;
  out.tensor_scale = 1.0f;
  const nm::BlockShape b = nm::effective_block(desc);
  // The row-block kernels take 1 x 16 and 1 x 32 blocks over whole rows from an aligned x, the
  // column-quad kernel blocks down columns (cols a multiple of 4, x aligned); every other scaled
  // layout runs one thread a block, 4-bit codes through scratch (a byte an element).
  const bool row_blocks = (desc.is_mx() || desc.is_nvfp4()) && b.rows == 1 &&
                          (b.cols == 16 || b.cols == 32) && cols % b.cols == 0 && aligned;
  const bool nvfp4_2d = desc.is_nvfp4() && b.rows == 16 && b.cols == 16 && rows % 16 == 0 && cols % 16 == 0 && aligned;
  const bool column_quads = (desc.is_mx() || desc.is_nvfp4()) && b.cols == 1 && cols % 4 == 0 && aligned;
  const bool generic = (desc.is_mx() || desc.is_nvfp4()) && !row_blocks && !nvfp4_2d && !column_quads;
  out.codes.resize(nm::code_bytes(desc.element, n));
  // Sized once, before any kernel writes to it (a resize may reallocate).
  out.scratch.resize(kScratchWords * sizeof(uint32_t) + (generic && storage == 4 ? static_cast<size_t>(n) : 0u));
  auto* scratch = static_cast<uint32_t*>(out.scratch.data());
  auto* codes = static_cast<uint8_t*>(out.codes.data());
  out.scales.resize(0);
  if (n == 0) return;

  const bool nvfp4 = desc.is_nvfp4();
  if (desc.is_per_tensor() || nvfp4) {
    CONCORD_CUDA_OK(cudaMemsetAsync(scratch, 0, kScratchWords * sizeof(uint32_t)));
    const unsigned grid = std::min<unsigned>(blocks_for((n + 3) / 4), 4096u);
    CONCORD_LAUNCH(amax_kernel, grid, kThreads, x, n, aligned, scratch);
    CONCORD_CUDA_LAUNCHED("amax_kernel");
    CONCORD_LAUNCH(tensor_scale_kernel, 1, 1, scratch, nvfp4, elem);
    CONCORD_CUDA_LAUNCHED("tensor_scale_kernel");
  }
  if (!desc.has_scale || desc.is_per_tensor()) {
    const uint32_t* multiplier = desc.has_scale ? scratch : nullptr;
    if (storage == 4) launch_cast<4>(x, n, aligned, p, multiplier, codes);
    else if (storage == 8) launch_cast<8>(x, n, aligned, p, multiplier, codes);
    else launch_cast<16>(x, n, aligned, p, multiplier, codes);
    return;
  }

  const int64_t grid_rows = (rows + b.rows - 1) / b.rows, grid_cols = (cols + b.cols - 1) / b.cols;
  out.scales.resize(static_cast<size_t>(grid_rows * grid_cols));
  auto* scales = static_cast<uint8_t*>(out.scales.data());
  const auto rule = static_cast<MxRule>(desc.scale_rule);
  if (row_blocks) {
    if (b.cols == 16) launch_row_block<16>(storage, x, n, p, nvfp4, rule, scratch, codes, scales);
    else launch_row_block<32>(storage, x, n, p, nvfp4, rule, scratch, codes, scales);
    return;
  }
  if (nvfp4_2d) {
    CONCORD_LAUNCH(nvfp4_2d_kernel, blocks_for(grid_rows * grid_cols * 32), kThreads, x, rows, cols, p, scratch, codes,
                 scales);
    CONCORD_CUDA_LAUNCHED("nvfp4_2d_kernel");
    return;
  }
  if (column_quads) {
    const unsigned grid = blocks_for(grid_rows * (cols / 4));
    if (storage == 4) {
      CONCORD_LAUNCH(column_quad_kernel<4>, grid, kThreads, x, rows, cols, b.rows, p, nvfp4, rule, scratch, codes, scales);
    } else if (storage == 8) {
      CONCORD_LAUNCH(column_quad_kernel<8>, grid, kThreads, x, rows, cols, b.rows, p, nvfp4, rule, scratch, codes, scales);
    } else {
      CONCORD_LAUNCH(column_quad_kernel<16>, grid, kThreads, x, rows, cols, b.rows, p, nvfp4, rule, scratch, codes,
                     scales);
    }
    CONCORD_CUDA_LAUNCHED("column_quad_kernel");
    return;
  }
  // Generic: one thread a block; 4-bit codes one byte each in scratch, then packed.
  uint8_t* target = codes;
  if (storage == 4) target = static_cast<uint8_t*>(out.scratch.data()) + kScratchWords * sizeof(uint32_t);
  const int64_t blocks = grid_rows * grid_cols;
  CONCORD_LAUNCH(block_generic_kernel, blocks_for(blocks), kThreads, x, rows, cols, b.rows, b.cols, grid_cols, blocks,
                 p, nvfp4, rule, scratch, target, storage == 16, scales);
  CONCORD_CUDA_LAUNCHED("block_generic_kernel");
  if (storage == 4) {
    CONCORD_LAUNCH(pack_nibbles_kernel, blocks_for((n + 1) / 2), kThreads, target, n, codes);
    CONCORD_CUDA_LAUNCHED("pack_nibbles_kernel");
  }
}

void quantize(const nm::QuantDesc& desc, const float* x, int64_t rows, int64_t cols,
              nm::RandomStream rng, DeviceQuantized& out) {
  quantize_async(desc, x, rows, cols, rng, out);
  synchronize();
  if (rows * cols > 0 && (desc.is_per_tensor() || desc.is_nvfp4())) {
    uint32_t words[kScratchWords];
    CONCORD_CUDA_OK(cudaMemcpy(words, out.scratch.data(), sizeof(words), cudaMemcpyDeviceToHost));
    out.tensor_scale = float_of(words[1]);
  }
}

void dequantize(const DeviceQuantized& q, void* out, bool bf16_out) {
  const int64_t n = q.rows * q.cols;
  if (n == 0) return;
  const nm::BlockShape b = nm::effective_block(q.desc);
  const bool block_scaled = q.desc.is_mx() || q.desc.is_nvfp4();
  const int kind = !block_scaled ? 0 : q.desc.is_mx() ? 1 : 2;
  const int64_t grid_cols = block_scaled ? (q.cols + b.cols - 1) / b.cols : 1;
  const auto* codes = static_cast<const uint8_t*>(q.codes.data());
  const auto* scales = static_cast<const uint8_t*>(q.scales.data());
  const auto elem = static_cast<Elem>(q.desc.element);
  if (bf16_out) {
    CONCORD_LAUNCH(dequantize_kernel<true>, blocks_for((n + 3) / 4), kThreads, codes, scales, q.rows, q.cols, elem, kind,
                   b.rows, b.cols, grid_cols, out);
  } else {
    CONCORD_LAUNCH(dequantize_kernel<false>, blocks_for((n + 3) / 4), kThreads, codes, scales, q.rows, q.cols, elem, kind,
                   b.rows, b.cols, grid_cols, out);
  }
  CONCORD_CUDA_LAUNCHED("dequantize_kernel");
}

nm::QuantizedTensor DeviceQuantized::to_host() const {
  nm::QuantizedTensor q;
  q.desc = desc;
  q.rows = rows;
  q.cols = cols;
  q.tensor_scale = tensor_scale;
  q.codes.resize(codes.size());
  if (!q.codes.empty()) codes.download(q.codes.data(), q.codes.size());
  q.scales.resize(scales.size());
  if (!q.scales.empty()) scales.download(q.scales.data(), q.scales.size());
  return q;
}

}  // namespace concord::cuda
