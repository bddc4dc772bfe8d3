// The binary-weight optimizers: latent-adamw, bop, ed (see binary.h).
#include "concord/train/binary.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::train {
namespace {

// A counter-based uniform in [0, 1): splitmix64 of the key words, its top 53 bits.
uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
double uniform01(uint64_t seed, uint64_t param, uint64_t step, uint64_t element) {
  const uint64_t h = mix(mix(mix(mix(seed) ^ param) ^ step) ^ element);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}
uint64_t name_hash(std::string_view name) {  // FNV-1a: a parameter's stream, stable across runs
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

int64_t vector_bytes(const std::vector<float>& v) { return static_cast<int64_t>(v.capacity() * sizeof(float)); }

}  // namespace

PackedInts::PackedInts(int64_t n, int bits) : n_(n), bits_(bits) {
  if (bits < 1 || bits > 32 || n < 0)
    throw InputError(fmt::format("[binary] packed integers need 1..32 bits and n >= 0 (bits {}, n {})", bits, n));
  mask_ = (uint64_t{1} << bits) - 1;
  const auto total_bits = static_cast<uint64_t>(n) * static_cast<uint64_t>(bits);
  words_.assign(static_cast<size_t>((total_bits + 63) / 64), 0);
}

bool is_binary_param(const model::ParamSpec& spec, const BinaryConfig& config) {
  return model::is_binary_weight(spec, binary_classes_text(config));  // "none" names no class
}

void parse_binary_classes(std::string_view text, BinaryConfig& config) {
  if (text == "attention,mlp" || text == "mlp,attention" || text == "all") {
    config.attention = config.mlp = true;
  } else if (text == "attention") {
    config.attention = true, config.mlp = false;
  } else if (text == "mlp") {
    config.attention = false, config.mlp = true;
  } else if (text == "none") {
    config.attention = config.mlp = false;
  } else {
    throw InputError(fmt::format("[binary] binary layers '{}': use attention,mlp | attention | mlp | none", text));
  }
}

std::string binary_classes_text(const BinaryConfig& config) {
  if (config.attention && config.mlp) return "attention,mlp";
  if (config.attention) return "attention";
  if (config.mlp) return "mlp";
  return "none";
}

// The state of one binary parameter.
struct BinaryOptimizer::Binary {
  int64_t rows = 0, cols = 0;
  uint64_t stream = 0;          // the parameter's random stream (ed stochastic)
  PackedInts sign;              // 1: +1, 0: -1
  std::vector<float> alpha;     // per row
  std::vector<float> alpha_exp_avg, alpha_exp_avg_sq;  // alpha's AdamW moments
  std::vector<float> latent, exp_avg, exp_avg_sq;  // latent-adamw
  std::vector<float> bop_ema;                      // bop
  PackedInts residual;                             // ed, bits >= 2: the low b bits of z
  std::vector<float> residual_f32;                 // ed, bits == 0: x - s/2
  std::vector<float> grad_sq;                      // ed rms: one per tensor
  std::vector<float> row_grad_sq, col_grad_sq;     // ed factored: one per row, one per column

  int64_t numel() const { return rows * cols; }
  float s(int64_t i) const { return sign.get(i) != 0 ? 1.0f : -1.0f; }
  // Rows per group: a group's elements fill whole 64-bit words of every packed buffer.
  int64_t group_rows() const { return 64 / std::gcd<int64_t>(cols, 64); }
};

BinaryOptimizer::BinaryOptimizer(BinaryMethod method, const BinaryConfig& config, const AdamWConfig& adamw)
    : method_(method), config_(config), plain_(adamw) {
  const BinaryConfig& c = config_;
  if (!(c.range > 0.0 && c.range <= 1.0))
    throw InputError(fmt::format("[{}] latent range {} must lie in (0, 1]", name(), c.range));
  if (method_ == BinaryMethod::ed) {
    if (!(c.bits == 0 || (c.bits >= 2 && c.bits <= 8)))
      throw InputError(fmt::format("[ed] residual bits must be 2..8 (or 0: an unbounded fp32 residual), not {}", c.bits));
    if (c.rounding != "stochastic" && c.rounding != "diffused")
      throw InputError(fmt::format("[ed] rounding '{}': use stochastic | diffused", c.rounding));
    if (c.update != "rms" && c.update != "factored" && c.update != "sgd" && c.update != "sign")
      throw InputError(fmt::format("[ed] update '{}': use rms | factored | sign | sgd", c.update));
    if (!(c.beta2 >= 0.0 && c.beta2 < 1.0) || !(c.eps > 0.0))
      throw InputError(fmt::format("[ed] need 0 <= beta2 < 1 and eps > 0 (beta2 {}, eps {})", c.beta2, c.eps));
  }
  if (method_ == BinaryMethod::bop && (!(c.bop_gamma > 0.0 && c.bop_gamma <= 1.0) || !(c.bop_threshold >= 0.0)))
    throw InputError(fmt::format("[bop] need 0 < gamma <= 1 and threshold >= 0 (gamma {}, threshold {})", c.bop_gamma,
                                 c.bop_threshold));
}

BinaryOptimizer::~BinaryOptimizer() = default;

std::string_view BinaryOptimizer::name() const {
  switch (method_) {
    case BinaryMethod::latent_adamw: return "latent-adamw";
    case BinaryMethod::bop: return "bop";
    case BinaryMethod::ed: return "ed";
  }
  return "?";
}

void BinaryOptimizer::make_state(const ParamView& p) {
  auto st = std::make_unique<Binary>();
  Binary& b = *st;
  b.rows = p.binary_rows;
  b.cols = static_cast<int64_t>(p.value.size()) / p.binary_rows;
  b.stream = name_hash(p.name);
  const int64_t n = b.numel();
  b.sign = PackedInts(n, 1);
  b.alpha.assign(static_cast<size_t>(b.rows), 0.0f);
  b.alpha_exp_avg.assign(static_cast<size_t>(b.rows), 0.0f);
  b.alpha_exp_avg_sq.assign(static_cast<size_t>(b.rows), 0.0f);
  switch (method_) {
    case BinaryMethod::latent_adamw:
      b.latent.assign(static_cast<size_t>(n), 0.0f);
      b.exp_avg.assign(static_cast<size_t>(n), 0.0f);
      b.exp_avg_sq.assign(static_cast<size_t>(n), 0.0f);
      break;
    case BinaryMethod::bop: b.bop_ema.assign(static_cast<size_t>(n), 0.0f); break;
    case BinaryMethod::ed:
      if (config_.bits == 0)
        b.residual_f32.assign(static_cast<size_t>(n), 0.0f);
      else
        b.residual = PackedInts(n, config_.bits);
      if (config_.update == "rms") b.grad_sq.assign(1, 0.0f);
      if (config_.update == "factored") {
        b.row_grad_sq.assign(static_cast<size_t>(b.rows), 0.0f);
        b.col_grad_sq.assign(static_cast<size_t>(b.cols), 0.0f);
      }
      break;
  }
  const int64_t K = b.cols;
  const int64_t group = b.group_rows();
  const int64_t groups = (b.rows + group - 1) / group;
  const float* w = p.value.data();
#pragma omp parallel for schedule(static)
  for (int64_t gi = 0; gi < groups; ++gi) {
    for (int64_t r = gi * group; r < std::min(b.rows, (gi + 1) * group); ++r) {
      double abs_sum = 0.0, abs_max = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = std::fabs(static_cast<double>(w[r * K + k]));
        abs_sum += a;
        abs_max = std::max(abs_max, a);
      }
      b.alpha[static_cast<size_t>(r)] = static_cast<float>(abs_sum / static_cast<double>(K));
      // A row that is already binary (a pretrained binary model: every |w| alike) carries no
      // confidence per weight: its latent starts halfway between the threshold and the clip.
      bool binary_row = true;
      for (int64_t k = 0; k < K && binary_row; ++k) binary_row = std::fabs(static_cast<double>(w[r * K + k])) == abs_max;
      const double latent_scale =
          (binary_row ? 0.5 * config_.range : 1.0) / std::max(abs_max, 1e-300);  // binary: x = s R / 2
      for (int64_t k = 0; k < K; ++k) {
        const int64_t i = r * K + k;
        const bool positive = !(w[i] < 0.0f);
        b.sign.set(i, positive ? 1u : 0u);
        const double x = abs_max > 0.0 ? static_cast<double>(w[i]) * latent_scale : 0.0;  // in [-1, 1]
        if (method_ == BinaryMethod::latent_adamw)
          b.latent[static_cast<size_t>(i)] = static_cast<float>(std::clamp(x, -config_.range, config_.range));
        if (method_ == BinaryMethod::ed) {
          if (config_.bits == 0) {
            b.residual_f32[static_cast<size_t>(i)] = static_cast<float>(x - (positive ? 0.5 : -0.5));
          } else {
            const int64_t half = int64_t{1} << config_.bits;
            const double delta = std::ldexp(1.0, -config_.bits);
            // The grid spans latents [-range, range]: x / range on [-1, 1].
            const double xr = std::clamp(x / config_.range, -1.0, 1.0);
            int64_t z = static_cast<int64_t>(std::floor((xr + 1.0) / delta));
            z = std::clamp<int64_t>(z, positive ? half : 0, positive ? 2 * half - 1 : half - 1);
            b.residual.set(i, static_cast<uint32_t>(z - (positive ? half : 0)));
          }
        }
      }
    }
  }
  binary_.insert_or_assign(std::string(p.name), std::move(st));
}

BinaryOptimizer::Binary& BinaryOptimizer::binary_state(const ParamView& p) {
  auto it = binary_.find(p.name);
  if (it == binary_.end()) {
    make_state(p);
    it = binary_.find(p.name);
  }
  return *it->second;
}

const BinaryOptimizer::Binary& BinaryOptimizer::binary_state(std::string_view name) const {
  const auto it = binary_.find(name);
  if (it == binary_.end()) throw InputError(fmt::format("[{}] '{}' is not a binary parameter of this optimizer", this->name(), name));
  return *it->second;
}

namespace {


// Writes alpha[n] * s[n, k] into the values of rows [r0, r1).
void write_values(const auto& b, std::span<float> value, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t k = 0; k < b.cols; ++k) {
      const int64_t i = r * b.cols + k;
      value[static_cast<size_t>(i)] = b.alpha[static_cast<size_t>(r)] * b.s(i);
    }
}

}  // namespace

void BinaryOptimizer::check_view(const ParamView& p) const {
  if (p.binary_rows < 0 || (p.binary_rows > 0 && p.value.size() % static_cast<size_t>(p.binary_rows) != 0))
    throw InputError(fmt::format("[{}] binary parameter '{}' has {} values, not a whole number of its {} rows", name(),
                                 p.name, p.value.size(), p.binary_rows));
  if (p.binary_rows == 0) return;
  const auto it = binary_.find(p.name);
  if (it != binary_.end() && it->second->numel() != static_cast<int64_t>(p.value.size()))
    throw InputError(fmt::format("[{}] parameter '{}' has {} values but its optimizer state {} (a checkpoint of "
                                 "another model shape?)",
                                 name(), p.name, p.value.size(), it->second->numel()));
}

void BinaryOptimizer::initialize(std::span<const ParamView> params) {
  for (const ParamView& p : params) {
    check_view(p);
    if (p.binary_rows == 0) continue;
    Binary& b = binary_state(p);
    write_values(b, p.value, 0, b.rows);
  }
}

double BinaryOptimizer::step(std::span<const ParamView> params, double lr) {
  if (!std::isfinite(lr) || lr < 0.0)
    throw InputError(fmt::format("[{}] learning rate {} must be finite and >= 0", name(), lr));
  std::vector<ParamView> plain;
  for (const ParamView& p : params) {
    if (p.value.size() != p.grad.size())
      throw InputError(fmt::format("[{}] parameter '{}' has {} values but {} gradients", name(), p.name,
                                   p.value.size(), p.grad.size()));
    check_view(p);
    if (p.binary_rows == 0) plain.push_back(p);
  }
  const double norm = global_grad_norm(params);
  if (!std::isfinite(norm)) return norm;  // skipped, as AdamW's
  const AdamWConfig& ac = plain_.config();
  const double clip = (ac.grad_clip > 0.0 && norm > ac.grad_clip) ? ac.grad_clip / norm : 1.0;
  const int64_t t = steps_ + 1;
  plain_.apply(plain, lr, clip, t);

  const AdamWElement adamw_no_decay(ac, lr, t, /*decay=*/false);  // the latents and alpha
  const double gamma = config_.bop_gamma, tau = config_.bop_threshold;
  const int bits = config_.bits;
  const int64_t half = int64_t{1} << std::max(bits, 1);
  const int64_t z_max = 2 * half - 1;
  const double delta = std::ldexp(1.0, -bits);
  const bool stochastic = config_.rounding == "stochastic";
  const bool rms = config_.update == "rms";
  const bool factored = config_.update == "factored";
  const bool sign_update = config_.update == "sign";
  const auto range_f = static_cast<float>(config_.range);
  const double bias2 = 1.0 - std::pow(config_.beta2, static_cast<double>(t));
  int64_t flips = 0;

  for (const ParamView& p : params) {
    if (p.binary_rows == 0) continue;
    Binary& b = binary_state(p);
    std::vector<double> alpha_grad(static_cast<size_t>(b.rows), 0.0);
    const int64_t K = b.cols;
    const float* grad = p.grad.data();
    const int64_t group = b.group_rows();
    const int64_t groups = (b.rows + group - 1) / group;
    // Pass 1, per row: dL/dalpha and (ed rms) the sum of squared dL/ds, in double, index order.
    std::vector<double> row_sq(static_cast<size_t>(b.rows), 0.0);
#pragma omp parallel for schedule(static) if (b.numel() >= (1 << 15))
    for (int64_t r = 0; r < b.rows; ++r) {
      const double a = b.alpha[static_cast<size_t>(r)];
      double ga = 0.0, sq = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double g = static_cast<double>(grad[r * K + k]) * clip;
        ga += g * b.s(r * K + k);
        sq += (g * a) * (g * a);
      }
      alpha_grad[static_cast<size_t>(r)] = ga;
      row_sq[static_cast<size_t>(r)] = sq;
    }
    double scale = 1.0;  // ed: u = -lr * scale * dL/ds
    if (method_ == BinaryMethod::ed && rms) {
      double sum = 0.0;
      for (const double sq : row_sq) sum += sq;  // rows in order
      float& v = b.grad_sq[0];
      const double v_new = config_.beta2 * v + (1.0 - config_.beta2) * (sum / static_cast<double>(b.numel()));
      v = static_cast<float>(v_new);
      scale = 1.0 / (std::sqrt(v_new / bias2) + config_.eps);
    }
    // ed factored (Adafactor's second moment): EMAs of each row's and each column's mean squared
    // dL/ds, R and C; element (r, k) is divided by sqrt(R[r] C[k] / mean(R)) — exact for a
    // gradient of rank one — as bias-corrected. row_factor[r] * col_factor[k] is that root.
    std::vector<double> row_factor, col_factor;
    if (method_ == BinaryMethod::ed && factored) {
      std::vector<double> col_sq(static_cast<size_t>(K), 0.0);
      constexpr int64_t kBlock = 16;  // columns per task; each column's sum runs over rows in order
#pragma omp parallel for schedule(static) if (b.numel() >= (1 << 15))
      for (int64_t k0 = 0; k0 < K; k0 += kBlock) {
        for (int64_t r = 0; r < b.rows; ++r) {
          const double a = b.alpha[static_cast<size_t>(r)];
          for (int64_t k = k0; k < std::min(K, k0 + kBlock); ++k) {
            const double g = static_cast<double>(grad[r * K + k]) * clip * a;
            col_sq[static_cast<size_t>(k)] += g * g;
          }
        }
      }
      const double decay = config_.beta2;
      double row_sum = 0.0;
      row_factor.resize(static_cast<size_t>(b.rows));
      for (int64_t r = 0; r < b.rows; ++r) {
        float& v = b.row_grad_sq[static_cast<size_t>(r)];
        v = static_cast<float>(decay * v + (1.0 - decay) * (row_sq[static_cast<size_t>(r)] / static_cast<double>(K)));
        row_sum += v;
      }
      const double row_mean = row_sum / static_cast<double>(b.rows);
      for (int64_t r = 0; r < b.rows; ++r)
        row_factor[static_cast<size_t>(r)] =
            row_mean > 0.0 ? std::sqrt(b.row_grad_sq[static_cast<size_t>(r)] / (row_mean * bias2)) : 0.0;
      col_factor.resize(static_cast<size_t>(K));
      for (int64_t k = 0; k < K; ++k) {
        float& v = b.col_grad_sq[static_cast<size_t>(k)];
        const double mean_sq = col_sq[static_cast<size_t>(k)] / static_cast<double>(b.rows);
        v = static_cast<float>(decay * v + (1.0 - decay) * mean_sq);
        col_factor[static_cast<size_t>(k)] = std::sqrt(static_cast<double>(v));
      }
    }
    // Pass 2, per group of rows (their packed words are theirs alone): the signs.
#pragma omp parallel for schedule(static) reduction(+ : flips)
    for (int64_t gi = 0; gi < groups; ++gi) {
      for (int64_t r = gi * group; r < std::min(b.rows, (gi + 1) * group); ++r) {
        const double a = b.alpha[static_cast<size_t>(r)];
        double carry = 0.0;  // ed diffused: the rounding error carried along the row
        const double row_f = factored ? row_factor[static_cast<size_t>(r)] : 0.0;
        for (int64_t k = 0; k < K; ++k) {
          const int64_t i = r * K + k;
          const auto ii = static_cast<size_t>(i);
          const double gs = static_cast<double>(grad[i]) * clip * a;  // dL/ds
          const bool positive = b.sign.get(i) != 0;
          bool now_positive = positive;
          switch (method_) {
            case BinaryMethod::latent_adamw: {
              adamw_no_decay(b.latent[ii], b.exp_avg[ii], b.exp_avg_sq[ii], gs);
              b.latent[ii] = std::clamp(b.latent[ii], -range_f, range_f);
              now_positive = !(b.latent[ii] < 0.0f);
              break;
            }
            case BinaryMethod::bop: {
              const double m = b.bop_ema[ii];
              const auto m_new = static_cast<float>(m + gamma * (gs - m));
              b.bop_ema[ii] = m_new;
              if ((positive ? 1.0 : -1.0) * static_cast<double>(m_new) > tau) now_positive = !positive;
              break;
            }
            case BinaryMethod::ed: {
              double u = -lr * scale * gs;
              if (sign_update) u = gs > 0 ? -lr : gs < 0 ? lr : 0.0;
              if (factored) u = -lr * gs / (row_f * col_factor[static_cast<size_t>(k)] + config_.eps);
              const double ug = bits == 0 ? u : u / config_.range;  // in grid units of [-1, 1]
              if (bits == 0) {
                const double x = (positive ? 0.5 : -0.5) + static_cast<double>(b.residual_f32[ii]) + u;
                now_positive = !(x < 0.0);
                b.residual_f32[ii] = static_cast<float>(x - (now_positive ? 0.5 : -0.5));
              } else {
                // Grid steps, bounded so that the integer cannot overflow (a move of more than
                // the whole grid saturates anyway).
                const double steps = std::clamp(ug / delta + carry, -4.0 * static_cast<double>(half), 4.0 * static_cast<double>(half));
                double moved;
                if (stochastic) {
                  moved = std::floor(steps + uniform01(config_.seed, b.stream, static_cast<uint64_t>(t),
                                                       static_cast<uint64_t>(i)));
                } else {
                  moved = std::floor(steps + 0.5);
                  carry = steps - moved;
                }
                const int64_t z0 = (positive ? half : 0) + static_cast<int64_t>(b.residual.get(i));
                const int64_t z = std::clamp<int64_t>(z0 + static_cast<int64_t>(moved), 0, z_max);
                now_positive = z >= half;
                b.residual.set(i, static_cast<uint32_t>(z - (now_positive ? half : 0)));
              }
              break;
            }
          }
          if (now_positive != positive) {
            b.sign.set(i, now_positive ? 1u : 0u);
            ++flips;
          }
        }
      }
    }
    // alpha: AdamW (no decay) on its exact gradient, then the served values.
    for (int64_t r = 0; r < b.rows; ++r) {
      const auto rr = static_cast<size_t>(r);
      adamw_no_decay(b.alpha[rr], b.alpha_exp_avg[rr], b.alpha_exp_avg_sq[rr], alpha_grad[rr]);
    }
#pragma omp parallel for schedule(static)
    for (int64_t gi = 0; gi < groups; ++gi) write_values(b, p.value, gi * group, std::min(b.rows, (gi + 1) * group));
  }
  flips_ += flips;
  steps_ = t;
  return norm;
}

std::vector<TensorView> BinaryOptimizer::state_views(std::span<const TensorView> params) const {
  std::vector<TensorView> views = plain_.state_views(params);
  view_buffers_.clear();
  // Every buffer is made first (views hold spans into them, so the vector must not grow later).
  size_t needed = 0;
  for (const TensorView& param : params)
    if (binary_.contains(param.name)) needed += 2;
  view_buffers_.reserve(needed);
  for (const TensorView& param : params) {
    const auto it = binary_.find(param.name);
    if (it == binary_.end()) continue;
    const Binary& b = *it->second;
    const std::vector<int64_t> row_shape = {b.rows};
    auto unpack = [&](const PackedInts& packed, bool as_sign) -> std::span<const float> {
      std::vector<float>& out = view_buffers_.emplace_back(static_cast<size_t>(b.numel()));
      for (int64_t i = 0; i < b.numel(); ++i) {
        const uint32_t v = packed.get(i);
        out[static_cast<size_t>(i)] = as_sign ? (v != 0 ? 1.0f : -1.0f) : static_cast<float>(v);
      }
      return out;
    };
    views.push_back({param.name + ".sign", param.shape, unpack(b.sign, true)});
    views.push_back({param.name + ".alpha", row_shape, b.alpha});
    views.push_back({param.name + ".alpha_exp_avg", row_shape, b.alpha_exp_avg});
    views.push_back({param.name + ".alpha_exp_avg_sq", row_shape, b.alpha_exp_avg_sq});
    if (!b.latent.empty()) {
      views.push_back({param.name + ".latent", param.shape, b.latent});
      views.push_back({param.name + ".exp_avg", param.shape, b.exp_avg});
      views.push_back({param.name + ".exp_avg_sq", param.shape, b.exp_avg_sq});
    }
    if (!b.bop_ema.empty()) views.push_back({param.name + ".bop_ema", param.shape, b.bop_ema});
    if (b.residual.size() > 0) views.push_back({param.name + ".residual", param.shape, unpack(b.residual, false)});
    if (!b.residual_f32.empty()) views.push_back({param.name + ".residual", param.shape, b.residual_f32});
    if (!b.grad_sq.empty()) views.push_back({param.name + ".grad_sq", {1}, b.grad_sq});
    if (!b.row_grad_sq.empty()) views.push_back({param.name + ".row_grad_sq", row_shape, b.row_grad_sq});
    if (!b.col_grad_sq.empty()) views.push_back({param.name + ".col_grad_sq", {b.cols}, b.col_grad_sq});
  }
  return views;
}

void BinaryOptimizer::restore_state(std::span<const NamedTensor> tensors, std::span<const TensorView> params,
                                    int64_t steps_taken) {
  if (steps_taken < 0) throw InputError(fmt::format("[checkpoint] optimizer step count {} is negative", steps_taken));
  // Split "<param>.<key>" by the parameters given: binary ones have a sign.
  std::map<std::string, std::map<std::string, const NamedTensor*>, std::less<>> by_param;
  std::vector<NamedTensor> plain;
  const std::vector<std::string> keys = optimizer_state_keys();
  for (const NamedTensor& t : tensors) {
    bool matched = false;
    for (const std::string& key : keys) {
      if (t.name.size() > key.size() + 1 && t.name.ends_with(key) && t.name[t.name.size() - key.size() - 1] == '.') {
        by_param[t.name.substr(0, t.name.size() - key.size() - 1)][key] = &t;
        matched = true;
        break;
      }
    }
    if (!matched) throw InputError(fmt::format("[checkpoint] optimizer tensor '{}' is no {} state", t.name, name()));
  }
  std::map<std::string, std::unique_ptr<Binary>, std::less<>> restored;
  for (const auto& [pname, parts] : by_param) {
    if (!parts.contains("sign")) {  // a plain parameter: AdamW's moments only
      for (const auto& [key, t] : parts) {
        if (key != "exp_avg" && key != "exp_avg_sq")
          throw InputError(fmt::format("[checkpoint] optimizer tensor '{}' belongs to a binary parameter without its "
                                       "signs",
                                       t->name));
        plain.push_back(*t);
      }
      continue;
    }
    const auto param = std::find_if(params.begin(), params.end(), [&](const TensorView& v) { return v.name == pname; });
    if (param == params.end() || param->shape.size() != 2)
      throw InputError(fmt::format("[checkpoint] binary optimizer state of '{}' matches no matrix parameter", pname));
    auto st = std::make_unique<Binary>();
    Binary& b = *st;
    b.rows = param->shape[0];
    b.cols = param->shape[1];
    b.stream = name_hash(pname);
    const int64_t n = b.numel();
    auto need = [&](const std::string& key, int64_t size) -> const std::vector<float>& {
      const auto it = parts.find(key);
      if (it == parts.end())
        throw InputError(fmt::format("[checkpoint] binary parameter '{}' lacks its '{}' state ({})", pname, key, name()));
      if (static_cast<int64_t>(it->second->values.size()) != size)
        throw InputError(fmt::format("[checkpoint] '{}' has {} values, not {}", it->second->name,
                                     it->second->values.size(), size));
      return it->second->values;
    };
    std::vector<std::string> expected = {"sign", "alpha", "alpha_exp_avg", "alpha_exp_avg_sq"};
    b.sign = PackedInts(n, 1);
    const std::vector<float>& sign = need("sign", n);
    for (int64_t i = 0; i < n; ++i) {
      const float v = sign[static_cast<size_t>(i)];
      if (v != 1.0f && v != -1.0f)
        throw InputError(fmt::format("[checkpoint] '{}.sign' holds {} at {} (not +-1)", pname, v, i));
      b.sign.set(i, v > 0 ? 1u : 0u);
    }
    b.alpha = need("alpha", b.rows);
    b.alpha_exp_avg = need("alpha_exp_avg", b.rows);
    b.alpha_exp_avg_sq = need("alpha_exp_avg_sq", b.rows);
    switch (method_) {
      case BinaryMethod::latent_adamw:
        b.latent = need("latent", n);
        b.exp_avg = need("exp_avg", n);
        b.exp_avg_sq = need("exp_avg_sq", n);
        expected.insert(expected.end(), {"latent", "exp_avg", "exp_avg_sq"});
        for (int64_t i = 0; i < n; ++i)
          if ((b.latent[static_cast<size_t>(i)] < 0.0f) != (sign[static_cast<size_t>(i)] < 0.0f))
            throw InputError(fmt::format("[checkpoint] '{}': latent and sign disagree at {}", pname, i));
        break;
      case BinaryMethod::bop:
        b.bop_ema = need("bop_ema", n);
        expected.emplace_back("bop_ema");
        break;
      case BinaryMethod::ed: {
        const std::vector<float>& residual = need("residual", n);
        expected.emplace_back("residual");
        if (config_.bits == 0) {
          b.residual_f32 = residual;
        } else {
          b.residual = PackedInts(n, config_.bits);
          const double limit = std::ldexp(1.0, config_.bits);
          for (int64_t i = 0; i < n; ++i) {
            const float v = residual[static_cast<size_t>(i)];
            if (!(v >= 0.0f && v < limit && v == std::floor(v)))
              throw InputError(fmt::format("[checkpoint] '{}.residual' holds {} at {}: not a {}-bit integer (a "
                                           "checkpoint of another --ed-bits?)",
                                           pname, v, i, config_.bits));
            b.residual.set(i, static_cast<uint32_t>(v));
          }
        }
        if (config_.update == "rms") {
          b.grad_sq = need("grad_sq", 1);
          expected.emplace_back("grad_sq");
        }
        if (config_.update == "factored") {
          b.row_grad_sq = need("row_grad_sq", b.rows);
          b.col_grad_sq = need("col_grad_sq", b.cols);
          expected.insert(expected.end(), {"row_grad_sq", "col_grad_sq"});
        }
        break;
      }
    }
    for (const auto& [key, t] : parts)
      if (std::find(expected.begin(), expected.end(), key) == expected.end())
        throw InputError(fmt::format("[checkpoint] optimizer tensor '{}' is not kept by {}", t->name, name()));
    restored.insert_or_assign(pname, std::move(st));
  }
  plain_.restore_state(plain, params, steps_taken);
  binary_ = std::move(restored);
  steps_ = steps_taken;
}

OptimizerMemory BinaryOptimizer::memory() const {
  OptimizerMemory out = plain_.memory();
  for (const auto& [pname, st] : binary_) {
    const Binary& b = *st;
    out.binary_weights += b.numel();
    out.binary_bytes += b.sign.allocated_bytes() + b.residual.allocated_bytes() + vector_bytes(b.latent) +
                        vector_bytes(b.exp_avg) + vector_bytes(b.exp_avg_sq) + vector_bytes(b.bop_ema) +
                        vector_bytes(b.residual_f32) + vector_bytes(b.grad_sq) + vector_bytes(b.row_grad_sq) +
                        vector_bytes(b.col_grad_sq);
    out.scale_bytes += vector_bytes(b.alpha) + vector_bytes(b.alpha_exp_avg) + vector_bytes(b.alpha_exp_avg_sq);
  }
  return out;
}

std::vector<float> BinaryOptimizer::signs(std::string_view param) const {
  const Binary& b = binary_state(param);
  std::vector<float> out(static_cast<size_t>(b.numel()));
  for (int64_t i = 0; i < b.numel(); ++i) out[static_cast<size_t>(i)] = b.s(i);
  return out;
}

std::span<const float> BinaryOptimizer::alpha(std::string_view param) const { return binary_state(param).alpha; }

uint32_t BinaryOptimizer::ed_grid_index(std::string_view param, int64_t i) const {
  const Binary& b = binary_state(param);
  if (method_ != BinaryMethod::ed || config_.bits == 0 || i < 0 || i >= b.numel())
    throw InputError(fmt::format("[{}] no grid index {} of '{}'", name(), i, param));
  return (b.sign.get(i) != 0 ? (1u << config_.bits) : 0u) + b.residual.get(i);
}

}  // namespace concord::train
