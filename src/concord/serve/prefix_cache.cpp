// The prefix snapshot cache (prefix_cache.h).
#include "concord/serve/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "concord/model/model.h"
#include "concord/numerics/check.h"
#include "concord/tensor/quant_gemm.h"

namespace concord::serve {

PrefixCache::PrefixCache(const model::ModelConfig& config, uint64_t fingerprint, PrefixCacheOptions options)
    : fingerprint_(fingerprint), options_(options) {
  if (config.recurrent())
    throw InputError("[prefix-cache] a depth-recurrent model's state is not only KV rows: no prefix cache");
  if (options_.block < 1) throw InputError(fmt::format("[prefix-cache] block {} must be at least 1", options_.block));
  layers_ = config.applications();
  row_width_ = config.num_key_value_heads * config.head_dim;
}

uint64_t PrefixCache::fingerprint_of(model::Model& m) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  const std::string config = m.config().to_json().dump();
  XXH3_64bits_update(state, config.data(), config.size());
  const std::string& policy = m.policy().name;
  XXH3_64bits_update(state, policy.data(), policy.size());
  for (const model::ParamSpec& spec : m.params()) {
    XXH3_64bits_update(state, spec.name.data(), spec.name.size());
    if (const tensor::QuantWeight* w = m.stored_weight(spec.name)) {
      for (int64_t g = 0; g < w->groups(); ++g) XXH3_64bits_update(state, w->group(g), w->group_bytes());
    } else {
      const std::span<const float> v = std::as_const(m).param(spec.name);
      XXH3_64bits_update(state, v.data(), v.size_bytes());
    }
  }
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

PrefixCache::PrefixKeys PrefixCache::keys_of(std::span<const int32_t> prompt, int64_t last) const {
  PrefixKeys k;
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset_withSeed(state, fingerprint_);
  int64_t at = 0;
  for (int64_t end = options_.block; end <= last; end += options_.block) {
    XXH3_64bits_update(state, prompt.data() + at, static_cast<size_t>(end - at) * sizeof(int32_t));
    at = end;
    k.blocks.push_back(XXH3_64bits_digest(state));
  }
  XXH3_64bits_update(state, prompt.data() + at, static_cast<size_t>(last - at) * sizeof(int32_t));
  k.tail = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return k;
}

PrefixCache::Entry* PrefixCache::find(uint64_t key, std::span<const int32_t> prompt, int64_t start, int64_t end) {
  const auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  Entry& e = it->second;
  // The same prefix, as far as the hash can tell: the entry's own tokens must be the prompt's.
  if (e.start != start || e.end != end ||
      !std::equal(e.tokens.begin(), e.tokens.end(), prompt.begin() + start, prompt.begin() + end))
    return nullptr;
  return &e;
}

size_t PrefixCache::entry_bytes(const Entry& e) const {
  return e.rows.size() * sizeof(float) + e.tokens.size() * sizeof(int32_t) + sizeof(Entry);
}

int64_t PrefixCache::restore(std::span<const int32_t> prompt, model::KvCache& cache, int slot, int64_t align) {
  ++stats_.lookups;
  if (align < 1) throw InputError(fmt::format("[prefix-cache] alignment {} must be at least 1", align));
  const auto last = static_cast<int64_t>(prompt.size()) - 1;  // the last prompt token is always fed
  if (last < 1 || entries_.empty()) return 0;
  CONCORD_CHECK(cache.length(slot) == 0, "PrefixCache::restore into a slot that holds rows");
  CONCORD_CHECK(cache.num_layers() == layers_ && cache.row_width() == row_width_,
                "PrefixCache::restore into a cache of another model");
  const PrefixKeys keys = keys_of(prompt, last);
  // The chain of blocks from position 0, then the tail when it continues the chain.
  std::vector<Entry*> chain;
  for (size_t b = 0; b < keys.blocks.size(); ++b) {
    const int64_t end = static_cast<int64_t>(b + 1) * options_.block;
    Entry* e = find(keys.blocks[b], prompt, end - options_.block, end);
    if (!e) break;
    chain.push_back(e);
  }
  const int64_t tail_start = static_cast<int64_t>(keys.blocks.size()) * options_.block;
  if (chain.size() == keys.blocks.size() && tail_start < last && last % align == 0)
    if (Entry* e = find(keys.tail, prompt, tail_start, last)) chain.push_back(e);
  while (!chain.empty() && chain.back()->end % align != 0) chain.pop_back();
  if (chain.empty()) return 0;
  const int64_t length = chain.back()->end;
  cache.reserve(slot, length);
  for (Entry* e : chain) {
    const size_t n = static_cast<size_t>((e->end - e->start) * row_width_);
    for (int64_t l = 0; l < layers_; ++l) {
      const float* from = e->rows.data() + static_cast<size_t>(l) * 2 * n;
      std::memcpy(cache.keys(slot, l) + e->start * row_width_, from, n * sizeof(float));
      std::memcpy(cache.values(slot, l) + e->start * row_width_, from + n, n * sizeof(float));
    }
    lru_.splice(lru_.begin(), lru_, e->lru);
  }
  cache.set_length(slot, length);
  ++stats_.hits;
  stats_.tokens_reused += length;
  return length;
}

void PrefixCache::put(uint64_t key, std::span<const int32_t> prompt, int64_t start, int64_t end,
                      model::KvCache& cache, int slot) {
  Entry e;
  e.key = key;
  e.start = start;
  e.end = end;
  e.tokens.assign(prompt.begin() + start, prompt.begin() + end);
  const size_t n = static_cast<size_t>((end - start) * row_width_);
  e.rows.resize(static_cast<size_t>(layers_) * 2 * n);
  for (int64_t l = 0; l < layers_; ++l) {
    float* to = e.rows.data() + static_cast<size_t>(l) * 2 * n;
    std::memcpy(to, cache.keys(slot, l) + start * row_width_, n * sizeof(float));
    std::memcpy(to + n, cache.values(slot, l) + start * row_width_, n * sizeof(float));
  }
  const size_t bytes = entry_bytes(e);
  if (bytes > options_.max_bytes) return;  // larger than the whole budget: not kept
  while (stats_.bytes + bytes > options_.max_bytes && !lru_.empty()) {
    const auto victim = entries_.find(lru_.back());
    stats_.bytes -= entry_bytes(victim->second);
    entries_.erase(victim);
    lru_.pop_back();
    ++stats_.evicted;
  }
  lru_.push_front(key);
  e.lru = lru_.begin();
  stats_.bytes += bytes;
  entries_.insert_or_assign(key, std::move(e));
  ++stats_.stored;
}

void PrefixCache::store(std::span<const int32_t> prompt, model::KvCache& cache, int slot, int64_t align) {
  const auto last = static_cast<int64_t>(prompt.size()) - 1;
  if (last < 1) return;
  CONCORD_CHECK(cache.length(slot) >= last, "PrefixCache::store from a slot without the prompt's rows");
  CONCORD_CHECK(cache.num_layers() == layers_ && cache.row_width() == row_width_,
                "PrefixCache::store from a cache of another model");
  const PrefixKeys keys = keys_of(prompt, last);
  for (size_t b = 0; b < keys.blocks.size(); ++b) {
    const int64_t end = static_cast<int64_t>(b + 1) * options_.block;
    if (Entry* e = find(keys.blocks[b], prompt, end - options_.block, end)) {
      lru_.splice(lru_.begin(), lru_, e->lru);
      continue;
    }
    if (entries_.count(keys.blocks[b])) continue;  // a collision with another prefix: keep that one
    put(keys.blocks[b], prompt, end - options_.block, end, cache, slot);
  }
  const int64_t tail_start = static_cast<int64_t>(keys.blocks.size()) * options_.block;
  if (tail_start < last && last % align == 0 && !entries_.count(keys.tail))
    put(keys.tail, prompt, tail_start, last, cache, slot);
}

void PrefixCache::clear() {
  entries_.clear();
  lru_.clear();
  stats_.bytes = 0;
}

}  // namespace concord::serve
