// GEMMs on the GPU (gemm.h): the exact-product reference kernel and cuBLASLt's BF16 / FP8.
#if !defined(CONCORD_CUDA_EMULATE)
#include <cublasLt.h>
#endif

#include <stdexcept>
#include <string>
#include <utility>

#include "concord/cuda/gemm.h"
#include "concord/cuda/runtime.h"
#include "concord/numerics/check.h"

namespace concord::cuda {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("[cuda] ") + what + ": " + cudaGetErrorString(e));
}
#define CONCORD_CUDA_OK(call) check_cuda((call), #call)
#if !defined(CONCORD_CUDA_EMULATE)
void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw std::runtime_error(std::string("[cublasLt] ") + what + ": status " + std::to_string(static_cast<int>(s)));
  }
}
#define CONCORD_BLAS_OK(call) check_blas((call), #call)
#endif

constexpr int kTile = 16;   // outputs a block: kTile x kTile, one thread each
constexpr int kChunk = 32;  // k values staged in shared memory at a time

// One accumulator per output, k strictly in order, one fma each; K is never padded (fma(0, 0,
// -0) would turn a -0 sum into +0), so the chunk loop stops at K.
__global__ void exact_gemm_kernel(const float* X, const float* W, float* Y, int64_t M, int64_t N, int64_t K,
                                  const float* scale_x, const float* scale_w) {
  __shared__ float xs[kTile][kChunk + 1];
  __shared__ float ws[kTile][kChunk + 1];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const int64_t row = blockIdx.y * static_cast<int64_t>(kTile) + ty;  // of X and Y
  const int64_t col = blockIdx.x * static_cast<int64_t>(kTile) + tx;  // of Y (a row of W)
  const int64_t w_row = blockIdx.x * static_cast<int64_t>(kTile) + ty;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
    for (int kk = tx; kk < kChunk; kk += kTile) {
      const int64_t k = k0 + kk;
      xs[ty][kk] = (row < M && k < K) ? X[row * K + k] : 0.0f;
      ws[ty][kk] = (w_row < N && k < K) ? W[w_row * K + k] : 0.0f;
    }
    __syncthreads();
    const int count = K - k0 < kChunk ? static_cast<int>(K - k0) : kChunk;
    for (int kk = 0; kk < count; ++kk) acc = __fmaf_rn(xs[ty][kk], ws[tx][kk], acc);
    __syncthreads();
  }
  if (row < M && col < N) {
    if (scale_x != nullptr) acc = __fmul_rn(acc, __fmul_rn(*scale_x, *scale_w));
    Y[row * N + col] = acc;
  }
}

}  // namespace

void exact_gemm(const float* X, const float* W, float* Y, int64_t M, int64_t N, int64_t K, const float* scale_x,
                const float* scale_w) {
  CONCORD_CHECK((scale_x == nullptr) == (scale_w == nullptr), "exact_gemm: both scales or neither");
  if (M == 0 || N == 0) return;
  const dim3 block(kTile, kTile);
  const dim3 grid(static_cast<unsigned>((N + kTile - 1) / kTile), static_cast<unsigned>((M + kTile - 1) / kTile));
  CONCORD_LAUNCH(exact_gemm_kernel, grid, block, X, W, Y, M, N, K, scale_x, scale_w);
  CONCORD_CUDA_OK(cudaGetLastError());
}

const float* tensor_scale_of(const DeviceQuantized& q) {
  CONCORD_CHECK(q.desc.is_per_tensor() || q.desc.is_nvfp4(), "tensor_scale_of: no tensor scale");
  return static_cast<const float*>(q.scratch.data()) + 1;
}

// --- cuBLASLt --------------------------------------------------------------------------------

#if defined(CONCORD_CUDA_EMULATE)
// The host emulation has no cuBLASLt: a Blas can be made, and each GEMM says why it cannot run.
struct Blas::Plan {};
Blas::Blas() = default;
Blas::~Blas() = default;
void Blas::gemm_bf16(const uint16_t*, const uint16_t*, void*, OutType, int64_t, int64_t, int64_t) {
  throw std::runtime_error("[cuda emulation] cuBLASLt runs only on a GPU");
}
void Blas::gemm_fp8(const uint8_t*, const float*, const uint8_t*, const float*, void*, OutType, int64_t, int64_t,
                    int64_t, bool) {
  throw std::runtime_error("[cuda emulation] cuBLASLt runs only on a GPU");
}
#else

struct Blas::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulHeuristicResult_t heuristic{};
  ~Plan() {
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

constexpr size_t kWorkspaceBytes = size_t{64} << 20;

Blas::Blas() : workspace_(kWorkspaceBytes) {
  cublasLtHandle_t h = nullptr;
  CONCORD_BLAS_OK(cublasLtCreate(&h));
  handle_ = h;
}

Blas::~Blas() {
  plans_.clear();  // their descriptors before the handle
  cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

// Column-major view (cuBLAS's): row-major Y (M x N) is column-major N x M, = op(A) · op(B) with
// A = W stored K x N column-major (W row-major N x K) transposed, and B = X stored K x M
// (X row-major M x K) as is: m = N, n = M, k = K, TRANSA = T, TRANSB = N — the "TN" layout FP8
// requires.
const Blas::Plan& Blas::plan(bool fp8, OutType out, int64_t M, int64_t N, int64_t K, bool fast_accum) {
  const auto key = std::make_tuple(fp8, static_cast<int>(out), M, N, K, fast_accum);
  if (auto it = plans_.find(key); it != plans_.end()) return *it->second;
  auto plan = std::make_unique<Plan>();  // cached only once cuBLASLt has given it an algorithm
  Plan* p = plan.get();
  CONCORD_BLAS_OK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CONCORD_BLAS_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CONCORD_BLAS_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (fp8) {
    const int8_t fast = fast_accum ? 1 : 0;
    CONCORD_BLAS_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  }
  const cudaDataType in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  const cudaDataType dt = out == OutType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  CONCORD_BLAS_OK(cublasLtMatrixLayoutCreate(&p->a, in, static_cast<uint64_t>(K), static_cast<uint64_t>(N), K));
  CONCORD_BLAS_OK(cublasLtMatrixLayoutCreate(&p->b, in, static_cast<uint64_t>(K), static_cast<uint64_t>(M), K));
  CONCORD_BLAS_OK(cublasLtMatrixLayoutCreate(&p->d, dt, static_cast<uint64_t>(N), static_cast<uint64_t>(M), N));
  cublasLtMatmulPreference_t pref = nullptr;
  CONCORD_BLAS_OK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  CONCORD_BLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  int found = 0;
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), p->op, p->a, p->b,
                                                          p->d, p->d, pref, 1, &p->heuristic, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  check_blas(s, "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0) {
    throw std::runtime_error("[cublasLt] no algorithm for " + std::string(fp8 ? "fp8" : "bf16") + " M=" +
                             std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
  }
  return *(plans_[key] = std::move(plan));
}

void Blas::gemm_bf16(const uint16_t* X, const uint16_t* W, void* Y, OutType out, int64_t M, int64_t N, int64_t K) {
  const Plan& p = plan(false, out, M, N, K, false);
  const float alpha = 1.0f, beta = 0.0f;
  CONCORD_BLAS_OK(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.op, &alpha, W, p.a, X, p.b, &beta, Y, p.d, Y,
                                 p.d, &p.heuristic.algo, workspace_.data(), kWorkspaceBytes, nullptr));
}

void Blas::gemm_fp8(const uint8_t* X, const float* scale_x, const uint8_t* W, const float* scale_w, void* Y,
                    OutType out, int64_t M, int64_t N, int64_t K, bool fast_accum) {
  const Plan& p = plan(true, out, M, N, K, fast_accum);
  // A is W, B is X (see plan()).
  CONCORD_BLAS_OK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_w, sizeof(scale_w)));
  CONCORD_BLAS_OK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_x, sizeof(scale_x)));
  const float alpha = 1.0f, beta = 0.0f;
  CONCORD_BLAS_OK(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), p.op, &alpha, W, p.a, X, p.b, &beta, Y, p.d, Y,
                                 p.d, &p.heuristic.algo, workspace_.data(), kWorkspaceBytes, nullptr));
}
#endif  // CONCORD_CUDA_EMULATE

}  // namespace concord::cuda
