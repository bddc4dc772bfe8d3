// Binary-weight training (DESIGN.md system 2): optimizers whose state is not an fp32 master.
//
// A binary GEMM weight W (R output channels x K inputs) is served as W[n,k] = alpha[n] * s[n,k]
// with s in {-1, +1} kept as packed sign bits and alpha a learned fp32 scale per output channel.
// The model computes with those values (the optimizer writes alpha * s into ParamView::value),
// and its backward hands back dL/dW; from it the optimizer takes, per the straight-through
// estimator,
//   dL/dalpha[n] = sum_k dL/dW[n,k] * s[n,k]        (exact: W = alpha * s)
//   dL/ds[n,k]   = dL/dW[n,k] * alpha[n]            (the gradient of the sign, passed straight through)
// alpha is trained by AdamW (its moments: 64 bits per output channel, counted); the parameters
// that are not binary (embeddings, norms, the head, biases) by AdamW over their fp32 master, as
// under "adamw". What differs is how the signs move:
//
//   latent-adamw  the baseline: an fp32 latent x in [-R, R] per weight updated by AdamW on
//                 dL/ds and clipped to [-R, R] (BinaryConnect: R = 1; BinaryConfig::range);
//                 s = sign(x). State per weight: 1 + 32 + 64 = 97 bits.
//   bop           Helwegen et al. 2019, as larq's Bop: m <- m + gamma (dL/ds - m) (fp32 per
//                 weight); s flips when s * m > threshold. 1 + 32 = 33 bits.
//   ed            error diffusion with a b-bit residual (b = 2..8): the sign and the residual are
//                 one (b+1)-bit latent on the grid x(z) = R * ((z + 1/2) * 2^-b - 1), z in
//                 [0, 2^(b+1)) (R = BinaryConfig::range, 1 by default),
//                 whose top bit is the sign (z >= 2^b: +1) and whose low b bits are the residual.
//                 An update u (in latent units) moves z by u / (R 2^-b) grid steps, rounded
//                 stochastically (E[step] = u / (R 2^-b) exactly; the random number is a hash of the
//                 seed, the parameter, the step and the element, so any thread count gives the
//                 same bits) or by diffusion (the rounding error of element k is carried to
//                 element k+1 of the same row, Floyd-Steinberg in one dimension: no per-weight
//                 state). The weight flips when z crosses 2^b, the threshold between the two grid
//                 halves, and what the update carried past it stays in the residual; z saturates
//                 at the grid's ends as BinaryConnect's latent clips at +-R. The update is
//                 u = -lr * dL/ds / (sqrt(v / (1 - beta2^t)) + eps), v an EMA of the tensor's mean
//                 squared dL/ds ("rms": one fp32 per tensor, counted), u = -lr * dL/ds /
//                 (sqrt(R[r] C[k] / mean(R) / (1 - beta2^t)) + eps), R and C EMAs of each row's
//                 and each column's mean squared dL/ds ("factored": Adafactor's second moment, a
//                 per-element scale from rows + cols fp32s, counted), u = -lr * sign(dL/ds)
//                 ("sign": no statistics at all), or u = -lr * dL/ds ("sgd"). State per weight:
//                 1 + b bits (plus the per-row alpha every method has).
//                 bits = 0 keeps the residual as an unbounded fp32 (x = s/2 + r, no grid, no
//                 clip): with "sgd" it is latent-weight SGD, flip for flip — the test that ED's
//                 bookkeeping is exact.
//
// The first step (or initialize()) makes the state from the values a parameter holds (its random
// init or a pretrained model): alpha[n] = mean_k |w[n,k]| (the scale that minimises
// ||w - alpha s||^2 for s = sign(w)), s = sign(w) (+1 for zero), and the latent, for latent-adamw and
// ed, x = w / max_k |w[n,k]| clipped to [-R, R] (ed: the grid point below it) — or x = s R / 2 for
// a row that is already binary (every |w| alike: a pretrained binary model, which carries no
// per-weight confidence).
//
// Checkpoints (optimizer.safetensors): "<param>.sign" (+-1), "<param>.residual" (ed: the b-bit
// integer, or the fp32 residual when bits = 0), "<param>.latent" / ".exp_avg" / ".exp_avg_sq"
// (latent-adamw), "<param>.bop_ema" (bop), "<param>.grad_sq" (ed rms, one value),
// "<param>.row_grad_sq" / ".col_grad_sq" (ed factored, one per row / column),
// "<param>.alpha" / ".alpha_exp_avg" / ".alpha_exp_avg_sq" (one per row), and the AdamW moments of
// the other parameters. Every value is exact in fp32.
//
// Reproducible: per-element updates; every reduction (alpha's gradient, the mean square) runs in
// double over one row in index order (the rows' sums then added in row order); rows are updated
// in groups whose packed words no other group touches, in parallel.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "concord/model/params.h"
#include "concord/train/optimizer.h"

namespace concord::train {

// `n` unsigned integers of `bits` bits (1..32) packed back to back into 64-bit words: element i
// is bits [i*bits, (i+1)*bits) of the little-endian bit stream (it may straddle two words); n
// elements take ceil(n * bits / 64) words, nothing else. Writes to elements in different words
// may run concurrently; elements sharing a word may not (64 consecutive elements always fill
// exactly `bits` whole words).
class PackedInts {
 public:
  PackedInts() = default;
  // All zero. InputError for bits outside 1..32 or a negative n.
  PackedInts(int64_t n, int bits);

  int64_t size() const { return n_; }
  int bits() const { return bits_; }
  uint32_t get(int64_t i) const {
    const auto bit = static_cast<uint64_t>(i) * static_cast<uint64_t>(bits_);
    const uint64_t word = bit >> 6, shift = bit & 63;
    uint64_t v = words_[word] >> shift;
    if (shift + static_cast<uint64_t>(bits_) > 64) v |= words_[word + 1] << (64 - shift);
    return static_cast<uint32_t>(v & mask_);
  }
  // v must be < 2^bits (masked otherwise).
  void set(int64_t i, uint32_t value) {
    const auto bit = static_cast<uint64_t>(i) * static_cast<uint64_t>(bits_);
    const uint64_t word = bit >> 6, shift = bit & 63;
    const uint64_t v = value & mask_;
    words_[word] = (words_[word] & ~(mask_ << shift)) | (v << shift);
    if (shift + static_cast<uint64_t>(bits_) > 64) {
      const uint64_t high = 64 - shift;
      words_[word + 1] = (words_[word + 1] & ~(mask_ >> high)) | (v >> high);
    }
  }
  std::span<const uint64_t> words() const { return words_; }
  // The bytes the words' allocation holds (its capacity).
  int64_t allocated_bytes() const { return static_cast<int64_t>(words_.capacity() * sizeof(uint64_t)); }

 private:
  std::vector<uint64_t> words_;
  int64_t n_ = 0;
  int bits_ = 1;
  uint64_t mask_ = 1;
};

enum class BinaryMethod : uint8_t { latent_adamw, bop, ed };

// Whether `spec` is trained as binary signs under `config`: a GEMM weight (matrix) of the
// attention or MLP class (experts included) when that class is selected; never the embedding, the
// head, a norm, a bias or an MoE router.
bool is_binary_param(const model::ParamSpec& spec, const BinaryConfig& config);
// "attention,mlp" / "attention" / "mlp" / "none" <-> the two flags. InputError for anything else.
void parse_binary_classes(std::string_view text, BinaryConfig& config);
std::string binary_classes_text(const BinaryConfig& config);

class BinaryOptimizer final : public Optimizer {
 public:
  // `adamw` trains alpha and the parameters that are not binary; InputError for bad settings.
  BinaryOptimizer(BinaryMethod method, const BinaryConfig& config, const AdamWConfig& adamw);
  ~BinaryOptimizer() override;

  std::string_view name() const override;
  BinaryMethod method() const { return method_; }
  const BinaryConfig& config() const { return config_; }

  void initialize(std::span<const ParamView> params) override;
  double step(std::span<const ParamView> params, double lr) override;
  int64_t steps_taken() const override { return steps_; }
  std::vector<TensorView> state_views(std::span<const TensorView> params) const override;
  void restore_state(std::span<const NamedTensor> tensors, std::span<const TensorView> params,
                     int64_t steps_taken) override;
  OptimizerMemory memory() const override;

  // For tests: the signs (+-1) and alpha of a binary parameter, the ed grid index z of element i.
  std::vector<float> signs(std::string_view param) const;
  std::span<const float> alpha(std::string_view param) const;
  uint32_t ed_grid_index(std::string_view param, int64_t i) const;
  // Sign flips of each binary parameter over every step so far (not state: a statistic).
  int64_t flips() const { return flips_; }

 private:
  struct Binary;
  Binary& binary_state(const ParamView& p);
  const Binary& binary_state(std::string_view name) const;
  void make_state(const ParamView& p);
  // InputError for a binary view whose size is not whole rows or not its state's.
  void check_view(const ParamView& p) const;

  BinaryMethod method_;
  BinaryConfig config_;
  AdamW plain_;  // the parameters that are not binary
  int64_t steps_ = 0;
  int64_t flips_ = 0;
  std::map<std::string, std::unique_ptr<Binary>, std::less<>> binary_;
  mutable std::vector<std::vector<float>> view_buffers_;  // state_views' unpacked copies
};

}  // namespace concord::train
