// W4A8 / W8A8 GEMM on ggml block-quantized weights kept as stored (no fp32 copy).
//
// Y (M x N) = Q8(X) · Wᵀ for an (N x K) weight in q4_0, q4_1 or q8_0 (ggml blocks of 32 along K)
// and fp32 activations X (M x K), quantized per row in blocks of 32 to int8.
//
// Numerics (the contract; the generic path is its plain statement, the reference):
//   Activation block (32 fp32 values x_i), fp32 with round-to-nearest-even, then the two scales
//   rounded to fp16 exactly as ggml's x86 quantize_row_q8_0 / quantize_row_q8_1 store them:
//     amax = max |x_i|; any x_i Inf/NaN -> d_a = s_a = NaN, q_i = 0 (the row's outputs are NaN);
//     d = amax / 127 (fp32); if d < FLT_MIN (amax < ~1.5e-36, zero included): d_a = s_a = 0, q_i = 0;
//     else q_i = clamp(rint(x_i · (127 / amax)), -127, 127) (ggml's id = 127/amax, from the fp32
//     amax, not from a rounded d);  S_a = Σ q_i (int);
//     d_a = fp16(d), s_a = fp16(d · float(S_a)) (one fp32 multiply, then fp16), both held as the
//     fp32 value of that fp16, where fp16() is F16C's vcvtps2ph with imm 0 (round to nearest
//     even; below 2^-14 to fp16 subnormals, below 2^-25 (ties included) to ±0; |v| >= 65520 to
//     ±Inf). So a block with d >= 65520 (amax >= ~8.32e6) has d_a = +Inf (its outputs become ±Inf
//     or NaN, as in ggml), a q4_1 block with |d·S_a| >= 65520 has s_a = ±Inf, and a block with
//     d <= 2^-25 has d_a = 0 while s_a may be a nonzero fp16 — as llama.cpp's CPU backend has
//     them (only the accumulation below is concord's own: ggml sums q4_1's m_w·s_a apart).
//   Weight block: d_w (fp16, exact in fp32), codes q_w; q4_1 also m_w (fp16).
//   Integer block dot (exact, int32): P = Σ q_a·q_w for q8_0, Σ q_a·(q_w - 8) for q4_0,
//     Σ q_a·q_w (q_w in 0..15) for q4_1.
//   Per output y[m][n]: acc = +0; for blocks b = 0 .. K/32-1 in order:
//       acc = fma(d_w · d_a, float(P), acc);          (d_w · d_a one fp32 multiply)
//       q4_1 only: acc = fma(m_w, s_a, acc);
//     y[m][n] = acc.
// So y[m][n] depends only on row m of X and row n of W: never on M, the other rows, the thread
// count (OpenMP splits output rows of W, static) or the ISA. Every SIMD path runs exactly these
// float operations with one lane per output n (integer dots are exact), so all paths give the
// same bits as the generic (scalar) path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "concord/tensor/gemm.h"

namespace concord::tensor {

// ggml block formats, 32 elements per block along K (stable numbers), and concord's binary
// block b1: {f16 d; u8 bits[4]}, element i = +d when bit i % 8 of bits[i / 8] is set, else -d —
// the packed signs of a binary-weight model (train/binary.h) with its per-row scale in every
// block. Not a ggml type: it is made from TQ2_0 tensors whose codes are all +-1 (files_gguf.cpp)
// or from +-alpha rows (binary_blocks), never read from a file as such.
// b1's block dot: P = sum q_a * (+-1) = 2 * (sum of q_a where the bit is set) - S_a, exact.
enum class BlockQuant : uint8_t { q4_0 = 0, q4_1 = 1, q8_0 = 2, b1 = 3 };
inline constexpr int kBlockQuants = 4;
inline constexpr uint32_t kNotAGgmlType = 0xffffffffu;

// Everything the packing, dequantization and the generic kernel need to know about a format, in
// one table (quant_gemm.cpp) instead of a switch per question. A ggml block is
// {f16 d; [f16 m;] codes}: q4_0 {d; u8 qs[16]} 18 bytes, q4_1 {d; m; u8 qs[16]} 20, q8_0
// {d; i8 qs[32]} 34; in q4 blocks byte j holds element j (low nibble) and j+16 (high). An
// element is d·(code − code_offset), or d·code + m when the format has a minimum.
struct BlockQuantTraits {
  BlockQuant type;
  const char* name;           // "q4_0", as ggml names it
  uint32_t ggml_type;         // ggml's type id (GGUF tensor type): 2, 3, 8 (b1: kNotAGgmlType)
  size_t ggml_block_bytes;    // 18, 20, 34 (b1: 6)
  size_t ggml_codes_offset;   // where the codes start in a ggml block: after d (and m)
  int code_bits;              // 4 (nibbles), 8 (signed bytes) or 1 (signs)
  int code_offset;            // subtracted from a code: 8 for q4_0, else 0
  bool has_min;               // q4_1's per-block m
  size_t packed_codes_bytes;  // codes of one block across a group of 16 rows: 256, 512 or 64
};
const BlockQuantTraits& block_quant_traits(BlockQuant type);
// The format of a ggml type id, if it is one of the three.
const BlockQuantTraits* block_quant_of_ggml(uint32_t ggml_type);
inline const char* block_quant_name(BlockQuant type) { return block_quant_traits(type).name; }
inline size_t ggml_block_bytes(BlockQuant type) { return block_quant_traits(type).ggml_block_bytes; }

// The packed layout (see quant_gemm.cpp): rows in groups of kQuantGroupRows (the last group padded
// with zero rows); per group the codes of every block (q4: 256 bytes, nibbles arranged so that a
// 64-byte vector's 32-bit lane j holds 4 consecutive elements of row j; q8: 512 bytes, codes
// stored as q + 128; b1: 64 bytes, eight 64-bit masks, mask c's bit 4j + k the sign of row j's
// element 4c + k, so that a mask expanded to bytes lines up with the lanes of the others), then
// the blocks' fp16 d of the 16 rows, then (q4_1) their fp16 m.
inline constexpr int64_t kQuantGroupRows = 16;

// An (N rows x K cols) weight for Y = X·Wᵀ in its ggml block format, repacked once at load.
class QuantWeight {
 public:
  QuantWeight() = default;
  // A weight's type and shape without its blocks: what a model holds for an expert paged out
  // under a memory cap (model/expert_pager.h) until its blocks are read from the file. The
  // kernels refuse it (loaded() false).
  static QuantWeight unloaded(BlockQuant type, int64_t rows, int64_t cols);
  bool loaded() const { return !data_.empty(); }
  BlockQuant type() const { return type_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  size_t bytes() const { return data_.size(); }  // packed bytes held (padding included)
  // Internal layout access (kernels, dequantize_rows).
  int64_t blocks_per_row() const { return cols_ / 32; }
  int64_t groups() const { return (rows_ + kQuantGroupRows - 1) / kQuantGroupRows; }
  size_t group_bytes() const { return group_bytes_; }
  const uint8_t* group(int64_t g) const { return data_.data() + static_cast<size_t>(g) * group_bytes_; }

 private:
  friend QuantWeight pack_quant_weight(BlockQuant, int64_t, int64_t, std::span<const uint8_t>);
  BlockQuant type_ = BlockQuant::q8_0;
  int64_t rows_ = 0, cols_ = 0;
  size_t group_bytes_ = 0;
  std::vector<uint8_t, detail::AlignedAllocator<uint8_t>> data_;
};

// The b1 blocks of an (rows x cols) weight whose every row is +-a (a binary-weight model's served
// values: train/binary.h): d = fp16(a) of the row, a bit per element for its sign (+ set; zero
// counts as +). InputError naming the row when a row holds two magnitudes or is not finite, or
// cols is not a multiple of 32.
std::vector<uint8_t> binary_blocks(std::span<const float> values, int64_t rows, int64_t cols);

// The packed bytes pack_quant_weight holds for an (rows x cols) weight of `type` (padding
// included): what paging one in costs, known before it is read.
size_t packed_quant_bytes(BlockQuant type, int64_t rows, int64_t cols);

// ggml_rows: the tensor's bytes exactly as stored in a GGUF file (row-major, each row K/32
// blocks; a GGUF tensor with dims {ne0, ne1} has rows = ne1, cols = ne0). Throws InputError when K is not a multiple of 32 or the byte count does not match.
QuantWeight pack_quant_weight(BlockQuant type, int64_t rows, int64_t cols,
                              std::span<const uint8_t> ggml_rows);

// Rows [first, first + count) dequantized into out (count x K floats, contiguous), exactly
// ggml's values: d·q (q8_0), d·(q - 8) (q4_0), fp32(d·q + m) (q4_1; d·q is exact, one rounding).
void dequantize_rows(const QuantWeight& w, int64_t first, int64_t count, float* out);

// Kernel sets. avx512: AVX-512 F/BW/VL + VNNI (vpdpbusd); avx2: AVX2 + FMA + F16C.
enum class QuantIsa : uint8_t { generic = 0, avx2 = 1, avx512 = 2 };
const char* quant_isa_name(QuantIsa isa);
bool quant_isa_supported(QuantIsa isa);
// The set in use, from numerics' dispatcher (numerics::active_isa(): CONCORD_ISA and
// set_active_isa): avx512 when it says avx512 and the CPU has AVX512-VNNI, avx2 when it says
// avx2/wide16/avx512, else generic.
QuantIsa quant_isa();

// Y (M x N, row stride ldy) = Q8(X) · Wᵀ, X (M x K, row stride ldx >= K), ldy >= N.
void quant_gemm(const QuantWeight& w, const float* x, int64_t M, int64_t ldx, float* y,
                int64_t ldy);
// The same with the kernel set named (tests, benchmarks); throws InputError if unsupported.
void quant_gemm(const QuantWeight& w, const float* x, int64_t M, int64_t ldx, float* y,
                int64_t ldy, QuantIsa isa);

}  // namespace concord::tensor

// Internal: quantized activations and the per-ISA kernels (quant_gemm_*.cpp).
namespace concord::tensor::detail {

// M rows of quantized activations: row r has q[r*K ..] (int8 codes), and per block b
// d[r*nb + b] (d_a), s[r*nb + b] (s_a = fp16(d·S_a)), sum[r*nb + b] (S_a), as the contract says.
struct QuantActs {
  int64_t K = 0, nb = 0;
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const float* s = nullptr;
  const int32_t* sum = nullptr;
};

// Quantizes one row of K values (K multiple of 32) as the contract above says.
using QuantizeRowFn = void (*)(const float* x, int64_t K, int8_t* q, float* d, float* s,
                               int32_t* sum);
// Output rows [m0, m0 + rows) x columns [16g, 16g + valid) of y for weight group g.
using QuantGroupFn = void (*)(const QuantWeight& w, int64_t g, const QuantActs& a, int64_t m0,
                              int64_t rows, float* y, int64_t ldy, int valid);
struct QuantKernels {
  QuantizeRowFn quantize_row;
  QuantGroupFn group;
  int64_t row_tile;  // activation rows a kernel call handles at once (driver's M step), or
                     // kAllRows: every row in one call per group (the kernel tiles them itself)
  // The most rows one call can take. Up to this many rows (decode, speculative verification of
  // 1 + γ rows) the driver hands all of them to one call, so the weight streams once instead of
  // once per row tile; above it (prefill) it steps by row_tile. Each row's result is the same
  // bits whatever the tiling (rows are accumulated independently).
  int64_t max_rows;
};
inline constexpr int64_t kAllRows = INT64_MAX;
QuantKernels quant_generic_kernels();
QuantKernels quant_avx2_kernels();
QuantKernels quant_avx512_kernels();

// Layout helpers shared by the kernels.
inline size_t quant_codes_bytes(BlockQuant t) { return block_quant_traits(t).packed_codes_bytes; }
inline size_t quant_d_offset(BlockQuant t, int64_t nb) { return quant_codes_bytes(t) * static_cast<size_t>(nb); }
inline size_t quant_m_offset(BlockQuant t, int64_t nb) {
  return quant_d_offset(t, nb) + 32 * static_cast<size_t>(nb);
}
float f16_to_f32(uint16_t h);  // exact
uint16_t f32_to_f16(float f);  // F16C's vcvtps2ph, imm 0 (RNE, overflow -> Inf), bit for bit

}  // namespace concord::tensor::detail
