// The KV-cache forward (forward_cached) and the KvCache. The blocks it runs (block.h) are the
// training forward's; only attention is its own: append to the cache, one query row at a time.
//
// Why the engine reproduces the training forward bit for bit: every op between the GEMMs is
// row-local (ops.h), the GEMM is batch-invariant (gemm.h), a query's attention is the single
// routine attention_query_row over the same cached k/v rows, and row-local activation quantizers
// (bf16, MX) see the same rows. Quantizers whose scale spans rows (NVFP4's and per-tensor FP8's
// tensor amax, stochastic rounding) are run per sequence here (row_splits), so a sequence's
// results never depend on the other sequences of a batch.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "concord/model/block.h"
#include "concord/model/kv_cache.h"
#include "concord/model/model_impl.h"
#include "concord/numerics/check.h"

namespace concord::model {

// ---- row groups ----------------------------------------------------------------------------

// Whether an activation quantizer treats every row on its own (the result for a row does not
// depend on the other rows of the GEMM).
static bool rows_quantized_independently(const std::optional<numerics::QuantDesc>& d) {
  if (!d) return true;
  if (d->rounding == numerics::Rounding::stochastic) return false;  // element index feeds the rng
  if (!d->has_scale) return true;                                   // plain cast
  if (d->is_nvfp4() || d->is_per_tensor()) return false;            // a tensor-wide amax
  return d->block.rows == 1 || d->block.cols == 1;                  // 1-D blocks along K
}

void Model::Impl::linear_forward_rows(const LayerPrecision& prec, int param, const float* x,
                                      int64_t T, float* y, std::span<const int64_t> row_splits) {
  if (row_splits.size() <= 2 || rows_quantized_independently(prec[GemmRole::forward].a)) {
    linear_forward(prec, param, x, T, y, row_positions);
    return;
  }
  const int64_t N = specs[param].shape[0], K = specs[param].shape[1];
  for (size_t g = 0; g + 1 < row_splits.size(); ++g) {
    const int64_t begin = row_splits[g], rows = row_splits[g + 1] - begin;
    if (rows > 0)
      linear_forward(prec, param, x + begin * K, rows, y + begin * N,
                     row_positions ? row_positions + begin : nullptr);
  }
}

// ---- KvCache ----------------------------------------------------------------------------------

KvCache::KvCache(const ModelConfig& config, int64_t max_sequences, int64_t capacity)
    : layers_(config.applications()),
      row_width_(config.num_key_value_heads * config.head_dim),
      capacity_(capacity == 0 ? config.max_position_embeddings : capacity),
      max_positions_(config.max_position_embeddings) {
  if (max_sequences <= 0)
    throw InputError(fmt::format("[kv_cache] max_sequences must be >= 1, got {}", max_sequences));
  if (capacity_ <= 0 || capacity_ > max_positions_)
    throw InputError(fmt::format("[kv_cache] capacity {} tokens per sequence is outside 1..{} "
                                 "(max_position_embeddings)", capacity, max_positions_));
  slots_.resize(static_cast<size_t>(max_sequences));
}

const KvCache::Slot& KvCache::checked(int slot, const char* what) const {
  if (slot < 0 || slot >= max_sequences())
    throw InputError(fmt::format("[kv_cache] {}: slot {} outside 0..{}", what, slot,
                                 max_sequences() - 1));
  const Slot& s = slots_[static_cast<size_t>(slot)];
  if (!s.in_use) throw InputError(fmt::format("[kv_cache] {}: slot {} is not in use", what, slot));
  return s;
}
KvCache::Slot& KvCache::checked(int slot, const char* what) {
  return const_cast<Slot&>(std::as_const(*this).checked(slot, what));
}

int64_t KvCache::sequences_in_use() const {
  return std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.in_use; });
}

int KvCache::allocate() {
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].in_use) continue;
    slots_[i].in_use = true;
    slots_[i].length = 0;
    return static_cast<int>(i);
  }
  throw InputError(fmt::format("[kv_cache] all {} sequence slots are in use (release one or "
                               "create the cache with more)", slots_.size()));
}

void KvCache::release(int slot) {
  Slot& s = checked(slot, "release");
  s.in_use = false;
  s.length = 0;
}

bool KvCache::in_use(int slot) const {
  return slot >= 0 && slot < max_sequences() && slots_[static_cast<size_t>(slot)].in_use;
}

int64_t KvCache::length(int slot) const { return checked(slot, "length").length; }

void KvCache::truncate(int slot, int64_t length) {
  Slot& s = checked(slot, "truncate");
  if (length < 0 || length > s.length)
    throw InputError(fmt::format("[kv_cache] truncate: length {} outside 0..{} (slot {})", length,
                                 s.length, slot));
  s.length = length;
}

size_t KvCache::bytes_reserved() const {
  size_t bytes = 0;
  for (const Slot& s : slots_)
    bytes += 2 * sizeof(float) * static_cast<size_t>(layers_ * s.rows * row_width_);
  return bytes;
}

void KvCache::reserve(int slot, int64_t length) {
  Slot& s = checked(slot, "reserve");
  if (length > capacity_) {
    throw InputError(fmt::format(
        "[kv_cache] sequence in slot {} would reach {} tokens, beyond the cache capacity of {}{}",
        slot, length, capacity_,
        capacity_ == max_positions_ ? " (max_position_embeddings)" : ""));
  }
  if (length <= s.rows) return;
  const int64_t rows = std::min(capacity_, std::max({length, 2 * s.rows, int64_t{64}}));
  s.k.resize(static_cast<size_t>(layers_));
  s.v.resize(static_cast<size_t>(layers_));
  for (int64_t l = 0; l < layers_; ++l) {
    s.k[l].resize(static_cast<size_t>(rows * row_width_));
    s.v[l].resize(static_cast<size_t>(rows * row_width_));
  }
  s.rows = rows;
}

void KvCache::set_length(int slot, int64_t length) {
  Slot& s = checked(slot, "set_length");
  CONCORD_CHECK(length >= 0 && length <= s.rows, "set_length past the reserved rows");
  s.length = length;
}

float* KvCache::keys(int slot, int64_t layer) {
  return checked(slot, "keys").k[static_cast<size_t>(layer)].data();
}
float* KvCache::values(int slot, int64_t layer) {
  return checked(slot, "values").v[static_cast<size_t>(layer)].data();
}

// ---- the KV-cache forward ---------------------------------------------------------------------

int64_t logit_rows(std::span<const CachedInput> inputs) {
  int64_t rows = 0;
  for (const CachedInput& in : inputs) {
    rows += in.logits == LogitRows::all    ? static_cast<int64_t>(in.tokens.size())
            : in.logits == LogitRows::last ? 1
                                           : 0;
  }
  return rows;
}

void Model::Impl::run_forward_cached(KvCache& cache, std::span<const CachedInput> inputs,
                                     float* out_logits) {
  const ModelConfig& c = config;
  const int64_t C = c.hidden_size, D = c.head_dim;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, W = Hkv * D;
  const int L = static_cast<int>(c.num_hidden_layers);
  const size_t n = inputs.size();

  // Rows: the inputs' tokens concatenated; row_splits[i] is input i's first row.
  std::vector<int64_t> row_splits(n + 1, 0), start(n);
  for (size_t i = 0; i < n; ++i) {
    start[i] = cache.length(inputs[i].slot);
    row_splits[i + 1] = row_splits[i] + static_cast<int64_t>(inputs[i].tokens.size());
  }
  const int64_t T = row_splits[n];
  for (size_t i = 0; i < n; ++i) cache.reserve(inputs[i].slot, start[i] + (row_splits[i + 1] - row_splits[i]));

  std::vector<int32_t> tokens(static_cast<size_t>(T)), pos(static_cast<size_t>(T));
  std::vector<int64_t> row_input(static_cast<size_t>(T));
  for (size_t i = 0; i < n; ++i) {
    for (int64_t r = row_splits[i]; r < row_splits[i + 1]; ++r) {
      tokens[r] = inputs[i].tokens[static_cast<size_t>(r - row_splits[i])];
      pos[r] = static_cast<int32_t>(start[i] + r - row_splits[i]);
      row_input[r] = static_cast<int64_t>(i);
    }
  }

  tensor::Arena& work = cache.workspace();
  work.reset();
  float* x = work.alloc(T * C);
  embed_tokens(x, tokens.data(), T);
  row_positions = pos.data();
  // Attention of one application: append the new keys and values to the cache rows of the
  // application, then attend: row r sees its sequence's positions 0..pos[r] — the n_ctx = s + 1
  // call attention_forward makes for row s.
  const AttentionFn cached_attention = [&](const BlockPass& p, LayerActivations& a) {
    const int64_t app = p.application;
    for (size_t i = 0; i < n; ++i) {
      const int64_t rows = row_splits[i + 1] - row_splits[i];
      const auto bytes = sizeof(float) * static_cast<size_t>(rows * W);
      std::memcpy(cache.keys(inputs[i].slot, app) + start[i] * W, a.k + row_splits[i] * W, bytes);
      std::memcpy(cache.values(inputs[i].slot, app) + start[i] * W, a.v + row_splits[i] * W, bytes);
    }
    std::vector<const float*> k_of(n), v_of(n);
    for (size_t i = 0; i < n; ++i) {
      k_of[i] = cache.keys(inputs[i].slot, app);
      v_of[i] = cache.values(inputs[i].slot, app);
    }
    a.att = work.alloc(T * Hq * D);
#pragma omp parallel for schedule(dynamic, 1) if (T > 1)
    for (int64_t r = 0; r < T; ++r) {
      const auto i = static_cast<size_t>(row_input[r]);
      attention_query_row(a.att + r * Hq * D, nullptr, a.q + r * Hq * D, k_of[i], v_of[i],
                          pos[r] + 1, W, Hq, Hkv, D);
    }
  };
  for (int64_t app = 0; app < c.applications(); ++app) {
    const size_t mark = work.mark();
    LayerActivations a{};
    a.x_in = x;
    const BlockPass pass{static_cast<int>(app), repeat_of[static_cast<size_t>(app)], T, pos.data(), &work, row_splits};
    float* x_next = blocks[static_cast<size_t>(c.block_of(app))]->forward(*this, pass, a, cached_attention);
    // The application is done with x: it takes the output, and the application's scratch is released.
    std::memcpy(x, x_next, sizeof(float) * static_cast<size_t>(T * C));
    work.rewind(mark);
  }
  for (size_t i = 0; i < n; ++i) {
    cache.set_length(inputs[i].slot, start[i] + row_splits[i + 1] - row_splits[i]);
  }

  // Final norm and lm_head on the rows whose logits were asked for (both are row-local, so a
  // row's logits are those of the full pass), grouped per input like the other GEMMs.
  const int64_t R = logit_rows(inputs);
  row_positions = nullptr;
  if (R == 0) return;
  std::vector<int64_t> out_splits(n + 1, 0);
  std::vector<int32_t> selected_pos(static_cast<size_t>(R));
  float* selected = work.alloc(R * C);
  for (size_t i = 0; i < n; ++i) {
    const int64_t rows = row_splits[i + 1] - row_splits[i];
    const int64_t take = inputs[i].logits == LogitRows::all ? rows
                         : inputs[i].logits == LogitRows::last ? 1
                                                               : 0;
    const int64_t first = row_splits[i + 1] - take;
    std::memcpy(selected + out_splits[i] * C, x + first * C,
                sizeof(float) * static_cast<size_t>(take * C));
    std::copy(pos.begin() + first, pos.begin() + first + take,
              selected_pos.begin() + out_splits[i]);
    out_splits[i + 1] = out_splits[i] + take;
  }
  float* rstd = work.alloc(R);
  float* xn = work.alloc(R * C);
  rmsnorm_forward(xn, rstd, selected, values[final_norm].data(), R, C, c.rms_norm_eps);
  row_positions = selected_pos.data();
  linear_forward_rows(policy.for_layer(LayerClass::lm_head, 0, L), lm_head, xn, R, out_logits,
                      out_splits);
  row_positions = nullptr;
}

void Model::forward_cached(KvCache& cache, std::span<const CachedInput> inputs,
                           std::span<float> logits) {
  const ModelConfig& c = impl_->config;
  if (cache.num_layers() != c.applications() ||
      cache.row_width() != c.num_key_value_heads * c.head_dim)
    throw InputError(fmt::format("[model] forward_cached: the cache was made for {} layers of "
                                 "{}-float rows, this model has {} layers of {}",
                                 cache.num_layers(), cache.row_width(), c.applications(),
                                 c.num_key_value_heads * c.head_dim));
  if (inputs.empty()) throw InputError("[model] forward_cached: no inputs");
  std::vector<int> slots;
  for (const CachedInput& in : inputs) {
    const int64_t length = cache.length(in.slot);  // throws for a slot not in use
    if (in.tokens.empty())
      throw InputError(fmt::format("[model] forward_cached: no tokens for slot {}", in.slot));
    if (std::find(slots.begin(), slots.end(), in.slot) != slots.end())
      throw InputError(fmt::format("[model] forward_cached: slot {} appears twice", in.slot));
    slots.push_back(in.slot);
    const int64_t end = length + static_cast<int64_t>(in.tokens.size());
    if (end > cache.capacity())
      throw InputError(fmt::format("[model] forward_cached: slot {} would reach {} tokens, beyond "
                                   "{} ({})", in.slot, end, cache.capacity(),
                                   cache.capacity() == c.max_position_embeddings
                                       ? "max_position_embeddings"
                                       : "the KV cache capacity"));
    for (int32_t t : in.tokens)
      if (t < 0 || t >= c.vocab_size)
        throw InputError(fmt::format("[model] forward_cached: token id {} outside the vocabulary "
                                     "[0, {})", t, c.vocab_size));
  }
  const int64_t rows = logit_rows(inputs);
  if (static_cast<int64_t>(logits.size()) != rows * c.vocab_size)
    throw InputError(fmt::format("[model] forward_cached: logits buffer holds {} floats, needs {}",
                                 logits.size(), rows * c.vocab_size));
  impl_->run_forward_cached(cache, inputs, logits.data());
}

}  // namespace concord::model
