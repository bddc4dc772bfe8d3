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
#include <array>
#include <cmath>
#include <limits>
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
bool rows_quantized_independently(const std::optional<numerics::QuantDesc>& d) {
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

KvCache::KvCache(const ModelConfig& config, int64_t max_sequences, int64_t capacity, int64_t core_slots)
    : layers_(config.applications()),
      row_width_(config.num_key_value_heads * config.head_dim),
      capacity_(capacity == 0 ? config.max_position_embeddings : capacity),
      max_positions_(config.max_position_embeddings) {
  if (config.recurrent()) {
    if (core_slots < 0 || core_slots > 4096)
      throw InputError(fmt::format("[kv_cache] core_slots {} outside 0..4096", core_slots));
    core_slots_ = core_slots == 0 ? config.max_recurrence : core_slots;
    layers_ = config.n_layers_in_prelude + core_slots_ * config.n_layers_in_recurrent_block + config.n_layers_in_coda;
  } else if (core_slots != 0) {
    throw InputError(fmt::format("[kv_cache] core_slots {} given for a model that is not recurrent", core_slots));
  }
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
  const int64_t slots = cache.core_slots();
  const AttentionFn cached_attention = [&](const BlockPass& p, LayerActivations& a) {
    const int64_t app = cache_row_set(p.application, slots);
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
  // A recurrent model: the prelude's output e and the state s0, kept across the core.
  float* e = c.recurrent() ? work.alloc(T * C) : nullptr;
  float* s0 = c.recurrent() ? work.alloc(T * C) : nullptr;
  for (int64_t app = 0; app < applications(); ++app) {
    const Application& ap = plan[static_cast<size_t>(app)];
    const size_t mark = work.mark();
    if (ap.enters_iteration) {
      if (ap.iteration == 0) {
        std::memcpy(e, x, sizeof(float) * static_cast<size_t>(T * C));
        initial_state(s0, pos.data(), T);
      }
      float* cat = work.alloc(T * 2 * C);
      float* u = work.alloc(T * C);
      adapter_forward(ap.iteration == 0 ? s0 : x, e, T, cat, u, row_splits);
      std::memcpy(x, u, sizeof(float) * static_cast<size_t>(T * C));
      work.rewind(mark);
    }
    LayerActivations a{};
    a.x_in = x;
    const BlockPass pass{static_cast<int>(app), ap.repeat, T, pos.data(), &work, row_splits};
    float* x_next = blocks[static_cast<size_t>(ap.block)]->forward(*this, pass, a, cached_attention);
    // The application is done with x: it takes the output, and the application's scratch is released.
    std::memcpy(x, x_next, sizeof(float) * static_cast<size_t>(T * C));
    work.rewind(mark);
  }
  if (c.recurrent()) {
    // Slots of the iterations these tokens did not run get their last iterate's rows.
    for (size_t i = 0; i < n; ++i) fill_skipped_iterations(cache, inputs[i].slot, start[i], row_splits[i + 1] - row_splits[i], depth);
    iterations_used.assign(n, static_cast<int32_t>(depth));
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

void Model::Impl::fill_skipped_iterations(KvCache& cache, int slot, int64_t first, int64_t rows,
                                          int64_t iterations) {
  const int64_t P = config.n_layers_in_prelude, R = config.n_layers_in_recurrent_block;
  const int64_t slots = cache.core_slots(), W = cache.row_width();
  if (iterations >= slots || rows == 0) return;
  const int64_t last = iterations - 1;
  const auto bytes = sizeof(float) * static_cast<size_t>(rows * W);
  for (int64_t j = 0; j < R; ++j) {
    const int64_t from = P + last * R + j;
    for (int64_t it = iterations; it < slots; ++it) {
      const int64_t to = P + it * R + j;
      std::memcpy(cache.keys(slot, to) + first * W, cache.keys(slot, from) + first * W, bytes);
      std::memcpy(cache.values(slot, to) + first * W, cache.values(slot, from) + first * W, bytes);
    }
  }
}

// Adaptive exit (Model::set_adaptive_exit): one input at a time, one token each; the core
// iterates until successive iterates' next-token distributions agree within the threshold.
void Model::Impl::run_forward_cached_adaptive(KvCache& cache, std::span<const CachedInput> inputs,
                                              float* out_logits) {
  const ModelConfig& c = config;
  const int64_t C = c.hidden_size, D = c.head_dim, V = c.vocab_size;
  const int64_t Hq = c.num_attention_heads, Hkv = c.num_key_value_heads, W = Hkv * D;
  const int64_t P = c.n_layers_in_prelude, R = c.n_layers_in_recurrent_block, Q = c.n_layers_in_coda;
  const int L = static_cast<int>(c.num_hidden_layers);
  const int64_t slots = cache.core_slots();
  const int64_t cap = adaptive_exit->max_iterations > 0 ? adaptive_exit->max_iterations : depth;
  iterations_used.assign(inputs.size(), 0);
  tensor::Arena& work = cache.workspace();
  int64_t out_row = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const CachedInput& in = inputs[i];
    if (in.tokens.size() != 1)
      throw InputError(fmt::format("[model] forward_cached: adaptive exit runs one token per input (a decode "
                                   "step), slot {} has {}; feed a prompt token by token", in.slot, in.tokens.size()));
    const int64_t start = cache.length(in.slot);
    cache.reserve(in.slot, start + 1);
    int32_t pos = static_cast<int32_t>(start);
    const std::array<int64_t, 2> splits = {0, 1};
    work.reset();
    float* x = work.alloc(C);
    embed_tokens(x, in.tokens.data(), 1);
    row_positions = &pos;
    int64_t row_set = 0;
    const AttentionFn attention = [&](const BlockPass&, LayerActivations& a) {
      std::memcpy(cache.keys(in.slot, row_set) + start * W, a.k, sizeof(float) * static_cast<size_t>(W));
      std::memcpy(cache.values(in.slot, row_set) + start * W, a.v, sizeof(float) * static_cast<size_t>(W));
      a.att = work.alloc(Hq * D);
      attention_query_row(a.att, nullptr, a.q, cache.keys(in.slot, row_set), cache.values(in.slot, row_set),
                          start + 1, W, Hq, Hkv, D);
    };
    // Runs block `block` on the row in x (in place) reading and writing cache row set `set`.
    auto apply = [&](int64_t block, int64_t set, float* row) {
      const size_t mark = work.mark();
      row_set = set;
      LayerActivations a{};
      a.x_in = row;
      const BlockPass pass{static_cast<int>(set), 0, 1, &pos, &work, splits};
      const float* out = blocks[static_cast<size_t>(block)]->forward(*this, pass, a, attention);
      std::memcpy(row, out, sizeof(float) * static_cast<size_t>(C));
      work.rewind(mark);
    };
    for (int64_t p = 0; p < P; ++p) apply(p, p, x);
    float* e = work.alloc(C);
    float* s = work.alloc(C);
    float* cat = work.alloc(2 * C);
    float* xn = work.alloc(C);
    float rstd = 0;
    std::vector<float> row_logits(static_cast<size_t>(V));
    std::vector<double> logp(static_cast<size_t>(V)), prev(static_cast<size_t>(V));
    std::memcpy(e, x, sizeof(float) * static_cast<size_t>(C));
    initial_state(s, &pos, 1);
    int64_t it = 0;
    for (;; ++it) {
      adapter_forward(s, e, 1, cat, x, splits);
      for (int64_t j = 0; j < R; ++j) apply(P + j, P + (it % slots) * R + j, x);
      std::memcpy(s, x, sizeof(float) * static_cast<size_t>(C));
      for (int64_t q = 0; q < Q; ++q) apply(P + R + q, P + slots * R + q, x);
      rmsnorm_forward(xn, &rstd, x, values[final_norm].data(), 1, C, c.rms_norm_eps);
      linear_forward_rows(policy.for_layer(LayerClass::lm_head, 0, L), lm_head, xn, 1, row_logits.data(), splits);
      // log-softmax in double, then KL(p_it || p_it-1) = Σ p (log p − log q).
      double mx = -std::numeric_limits<double>::infinity(), sum = 0;
      for (float v : row_logits) mx = std::max(mx, static_cast<double>(v));
      for (float v : row_logits) sum += std::exp(static_cast<double>(v) - mx);
      const double lse = mx + std::log(sum);
      for (int64_t v = 0; v < V; ++v) logp[static_cast<size_t>(v)] = static_cast<double>(row_logits[static_cast<size_t>(v)]) - lse;
      bool done = it + 1 >= cap;
      if (it > 0 && !done) {
        double kl = 0;
        for (int64_t v = 0; v < V; ++v) {
          const double lp = logp[static_cast<size_t>(v)];
          if (std::isfinite(lp)) kl += std::exp(lp) * (lp - prev[static_cast<size_t>(v)]);
        }
        done = kl < adaptive_exit->kl_threshold;
      }
      if (done) break;
      std::swap(logp, prev);
      std::memcpy(x, s, sizeof(float) * static_cast<size_t>(C));
    }
    row_positions = nullptr;
    fill_skipped_iterations(cache, in.slot, start, 1, it + 1);
    cache.set_length(in.slot, start + 1);
    iterations_used[i] = static_cast<int32_t>(it + 1);
    if (in.logits != LogitRows::none) {
      std::memcpy(out_logits + out_row * V, row_logits.data(), sizeof(float) * static_cast<size_t>(V));
      ++out_row;
    }
  }
}

void Model::forward_cached(KvCache& cache, std::span<const CachedInput> inputs,
                           std::span<float> logits) {
  const ModelConfig& c = impl_->config;
  const int64_t row_sets = c.recurrent() ? c.n_layers_in_prelude +
                                               cache.core_slots() * c.n_layers_in_recurrent_block +
                                               c.n_layers_in_coda
                                         : c.applications();
  if (cache.num_layers() != row_sets || cache.row_width() != c.num_key_value_heads * c.head_dim)
    throw InputError(fmt::format("[model] forward_cached: the cache was made for {} layers of "
                                 "{}-float rows, this model has {} layers of {}",
                                 cache.num_layers(), cache.row_width(), row_sets,
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
  if (impl_->adaptive_exit && c.recurrent())
    impl_->run_forward_cached_adaptive(cache, inputs, logits.data());
  else
    impl_->run_forward_cached(cache, inputs, logits.data());
}

}  // namespace concord::model
