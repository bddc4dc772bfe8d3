// The prefix snapshot cache (prefix_cache.h).
#include "concord/serve/prefix_cache.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "concord/model/expert_pager.h"
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
  if (!options_.dir.empty()) {
    namespace fs = std::filesystem;
    dir_ = fs::path(options_.dir) / fmt::format("{:016x}", fingerprint_);
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw InputError(fmt::format("[prefix-cache] cannot create {}: {}", dir_.string(), ec.message()));
    for (const fs::directory_entry& f : fs::directory_iterator(dir_, ec)) {
      if (f.path().extension() != ".kvsnap" || !f.is_regular_file(ec)) continue;
      const size_t size = static_cast<size_t>(f.file_size(ec));
      disk_.emplace(f.last_write_time(ec), std::pair{f.path(), size});
      stats_.disk_bytes += size;
    }
  }
}

namespace {

constexpr char kMagic[8] = {'C', 'C', 'D', 'K', 'V', 'S', '0', '1'};
constexpr uint32_t kFormat = 1;
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8 * 7;

template <class T>
void put_le(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // the formats are little-endian; concord builds for x86-64
  out.insert(out.end(), b, b + sizeof(T));
}
// (8 bytes through a u64: g++ 12 warns falsely on vector::insert of a char array after reserve)
void put_magic(std::vector<uint8_t>& out, const char (&magic)[8]) {
  uint64_t v;
  std::memcpy(&v, magic, 8);
  put_le<uint64_t>(out, v);
}
template <class T>
T get_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

uint64_t payload_hash(std::span<const int32_t> tokens, std::span<const float> rows) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, tokens.data(), tokens.size_bytes());
  XXH3_64bits_update(state, rows.data(), rows.size_bytes());
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

}  // namespace

void PrefixCache::warn(const std::string& message) {
  if (options_.warn) {
    options_.warn(message);
  } else {
    std::fprintf(stderr, "concord: [prefix-cache] %s\n", message.c_str());
  }
}

std::filesystem::path PrefixCache::file_of(uint64_t key) const { return dir_ / fmt::format("{:016x}.kvsnap", key); }

std::vector<uint8_t> PrefixCache::encode(const Entry& e) const {
  std::vector<uint8_t> out;
  out.reserve(kHeaderBytes + e.tokens.size() * 4 + e.rows.size() * 4);
  put_magic(out, kMagic);
  put_le<uint32_t>(out, kFormat);
  put_le<uint32_t>(out, 0);
  put_le<uint64_t>(out, fingerprint_);
  put_le<uint64_t>(out, e.key);
  put_le<int64_t>(out, e.start);
  put_le<int64_t>(out, e.end);
  put_le<int64_t>(out, layers_);
  put_le<int64_t>(out, row_width_);
  put_le<uint64_t>(out, payload_hash(e.tokens, e.rows));
  const auto* t = reinterpret_cast<const uint8_t*>(e.tokens.data());
  out.insert(out.end(), t, t + e.tokens.size() * sizeof(int32_t));
  const auto* r = reinterpret_cast<const uint8_t*>(e.rows.data());
  out.insert(out.end(), r, r + e.rows.size() * sizeof(float));
  return out;
}

void PrefixCache::write_file(const Entry& e) {
  const std::vector<uint8_t> out = encode(e);
  // Atomic (a temporary file renamed over the name: a reader sees the old file or the whole new
  // one), not fsynced: a snapshot is a cache, and one torn by a power loss fails its checksum.
  const std::filesystem::path path = file_of(e.key);
  const std::filesystem::path temp = path.string() + fmt::format(".tmp{}", ::getpid());
  std::error_code ec;
  {
    std::ofstream o(temp, std::ios::binary | std::ios::trunc);
    o.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
    if (!o.good()) {  // a full disk costs the snapshot, not the request
      o.close();
      std::filesystem::remove(temp, ec);
      warn(fmt::format("{}: not written (out of space?)", path.string()));
      return;
    }
  }
  std::filesystem::rename(temp, path, ec);
  if (ec) {
    std::filesystem::remove(temp, ec);
    warn(fmt::format("{}: not written ({})", path.string(), ec.message()));
    return;
  }
  for (auto it = disk_.begin(); it != disk_.end(); ++it)
    if (it->second.first == path) {
      stats_.disk_bytes -= it->second.second;
      disk_.erase(it);
      break;
    }
  disk_.emplace(std::filesystem::last_write_time(path, ec), std::pair{path, out.size()});
  stats_.disk_bytes += out.size();
  ++stats_.disk_writes;
  while (stats_.disk_bytes > options_.max_disk_bytes && disk_.size() > 1) {
    auto oldest = disk_.begin();
    if (oldest->second.first == path) ++oldest;
    std::filesystem::remove(oldest->second.first, ec);
    stats_.disk_bytes -= oldest->second.second;
    disk_.erase(oldest);
    ++stats_.disk_evicted;
  }
}

std::optional<PrefixCache::Entry> PrefixCache::read_file(uint64_t key) {
  namespace fs = std::filesystem;
  const fs::path path = file_of(key);
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  auto reject = [&](const std::string& problem) -> std::optional<Entry> {
    warn(fmt::format("{}: {}; the prefix is recomputed and the file replaced", path.string(), problem));
    ++stats_.disk_rejected;
    fs::remove(path, ec);
    return std::nullopt;
  };
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) return reject("cannot be read");
  std::string problem;
  std::optional<Entry> e = decode(bytes, key, problem);
  if (!e) return reject(problem);
  ++stats_.disk_reads;
  return e;
}

std::optional<PrefixCache::Entry> PrefixCache::decode(std::span<const uint8_t> bytes, std::optional<uint64_t> expect_key,
                                                      std::string& problem) const {
  auto reject = [&](std::string p) -> std::optional<Entry> {
    problem = std::move(p);
    return std::nullopt;
  };
  if (bytes.size() < kHeaderBytes)
    return reject(fmt::format("{} bytes, shorter than the {}-byte header (truncated)", bytes.size(), kHeaderBytes));
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kMagic, 8) != 0) return reject("not a concord KV snapshot (bad magic)");
  if (get_le<uint32_t>(p + 8) != kFormat) return reject(fmt::format("format {} (this concord reads {})", get_le<uint32_t>(p + 8), kFormat));
  const auto fingerprint = get_le<uint64_t>(p + 16), file_key = get_le<uint64_t>(p + 24);
  const auto start = get_le<int64_t>(p + 32), end = get_le<int64_t>(p + 40);
  const auto layers = get_le<int64_t>(p + 48), width = get_le<int64_t>(p + 56);
  const auto checksum = get_le<uint64_t>(p + 64);
  if (fingerprint != fingerprint_) return reject("written for another model (fingerprint differs)");
  if (expect_key && file_key != *expect_key) return reject(fmt::format("holds key {:016x}, not the one its name says", file_key));
  if (layers != layers_ || width != row_width_)
    return reject(fmt::format("{} layers x {} floats per row, the model has {} x {}", layers, width, layers_, row_width_));
  if (start < 0 || end <= start || end - start > (int64_t{1} << 24))
    return reject(fmt::format("positions [{}, {}) out of range", start, end));
  const auto n = static_cast<size_t>(end - start);
  const size_t rows = static_cast<size_t>(layers_) * 2 * n * static_cast<size_t>(row_width_);
  const size_t want = kHeaderBytes + n * sizeof(int32_t) + rows * sizeof(float);
  if (bytes.size() != want)
    return reject(fmt::format("{} bytes where its header implies {} ({})", bytes.size(), want,
                              bytes.size() < want ? "truncated" : "trailing bytes"));
  Entry e;
  e.key = file_key;
  e.start = start;
  e.end = end;
  e.tokens.resize(n);
  std::memcpy(e.tokens.data(), p + kHeaderBytes, n * sizeof(int32_t));
  e.rows.resize(rows);
  std::memcpy(e.rows.data(), p + kHeaderBytes + n * sizeof(int32_t), rows * sizeof(float));
  if (payload_hash(e.tokens, e.rows) != checksum) return reject("checksum mismatch (corrupt)");
  return e;
}

PrefixCache::Entry* PrefixCache::lookup(uint64_t key) {
  const auto it = entries_.find(key);
  if (it != entries_.end()) return &it->second;
  if (dir_.empty()) return nullptr;
  std::optional<Entry> e = read_file(key);
  return e ? insert(std::move(*e)) : nullptr;
}

PrefixCache::Entry* PrefixCache::insert(Entry e) {
  const size_t bytes = entry_bytes(e);
  if (bytes > options_.max_bytes) return nullptr;  // larger than the whole budget: not kept
  while (stats_.bytes + bytes > options_.max_bytes && !lru_.empty()) {
    const auto victim = entries_.find(lru_.back());
    stats_.bytes -= entry_bytes(victim->second);
    entries_.erase(victim);
    lru_.pop_back();
    ++stats_.evicted;
  }
  const uint64_t key = e.key;
  lru_.push_front(key);
  e.lru = lru_.begin();
  stats_.bytes += bytes;
  return &entries_.insert_or_assign(key, std::move(e)).first->second;
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
      if (w->loaded()) {
        for (int64_t g = 0; g < w->groups(); ++g) XXH3_64bits_update(state, w->group(g), w->group_bytes());
      } else {  // an expert paged under a memory cap: its blocks read through the pager, within the cap
        model::ExpertPager* pager = m.expert_pager();
        CONCORD_CHECK(pager != nullptr && spec.expert >= 0, "an unloaded stored weight that is no paged expert");
        const model::ExpertPager::Weights held = pager->acquire(spec.layer, spec.expert);
        const size_t j = spec.kind == model::ParamKind::expert_gate ? 0 : spec.kind == model::ParamKind::expert_up ? 1 : 2;
        const tensor::QuantWeight& q = *held[j];
        for (int64_t g = 0; g < q.groups(); ++g) XXH3_64bits_update(state, q.group(g), q.group_bytes());
        pager->release(spec.layer, spec.expert);
      }
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
  Entry* found = lookup(key);
  if (!found) return nullptr;
  Entry& e = *found;
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
  if (last < 1 || (entries_.empty() && dir_.empty())) return 0;
  CONCORD_CHECK(cache.length(slot) == 0, "PrefixCache::restore into a slot that holds rows");
  CONCORD_CHECK(cache.num_layers() == layers_ && cache.row_width() == row_width_,
                "PrefixCache::restore into a cache of another model");
  std::vector<Entry*> chain = chain_of(prompt, align);
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

std::vector<PrefixCache::Entry*> PrefixCache::chain_of(std::span<const int32_t> prompt, int64_t align) {
  const auto last = static_cast<int64_t>(prompt.size()) - 1;
  std::vector<Entry*> chain;
  if (last < 1) return chain;
  const PrefixKeys keys = keys_of(prompt, last);
  // The chain of blocks from position 0, then the tail when it continues the chain.
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
  return chain;
}

namespace {
constexpr char kHandOverMagic[8] = {'C', 'C', 'D', 'K', 'V', 'H', '0', '1'};
}  // namespace

std::vector<uint8_t> PrefixCache::export_prompt(std::span<const int32_t> prompt, int64_t align) {
  if (align < 1) throw InputError(fmt::format("[prefix-cache] alignment {} must be at least 1", align));
  const std::vector<Entry*> chain = chain_of(prompt, align);
  size_t total = 16;
  for (const Entry* e : chain) total += 8 + kHeaderBytes + (e->tokens.size() + e->rows.size()) * 4;
  std::vector<uint8_t> out;
  out.reserve(total);
  put_magic(out, kHandOverMagic);
  put_le<uint64_t>(out, chain.size());
  for (const Entry* e : chain) {
    const std::vector<uint8_t> record = encode(*e);
    put_le<uint64_t>(out, record.size());
    out.insert(out.end(), record.begin(), record.end());
  }
  return out;
}

int64_t PrefixCache::import_prompt(std::span<const uint8_t> message, const std::string& what) {
  if (message.size() < 16 || std::memcmp(message.data(), kHandOverMagic, 8) != 0)
    throw InputError(fmt::format("[prefix-cache] {}: not a concord KV hand-over ({} bytes, bad magic)", what, message.size()));
  const auto records = get_le<uint64_t>(message.data() + 8);
  size_t at = 16;
  int64_t taken = 0;
  for (uint64_t i = 0; i < records; ++i) {
    if (message.size() - at < 8)
      throw InputError(fmt::format("[prefix-cache] {}: record {} of {} is missing (truncated message)", what, i + 1, records));
    const auto bytes = get_le<uint64_t>(message.data() + at);
    at += 8;
    if (bytes > message.size() - at)
      throw InputError(fmt::format("[prefix-cache] {}: record {} of {} runs {} bytes past the message's end (truncated)",
                                   what, i + 1, records, bytes - (message.size() - at)));
    std::string problem;
    std::optional<Entry> e = decode(message.subspan(at, bytes), std::nullopt, problem);
    at += bytes;
    if (!e) {
      warn(fmt::format("{}: record {} of {}: {}; its positions are prefilled again", what, i + 1, records, problem));
      continue;
    }
    if (entries_.count(e->key)) continue;  // held already (or a collision: keep that one)
    if (insert(std::move(*e))) ++taken;
  }
  if (at != message.size())
    throw InputError(fmt::format("[prefix-cache] {}: {} bytes after the last record", what, message.size() - at));
  return taken;
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
  if (!dir_.empty()) write_file(e);
  if (insert(std::move(e))) ++stats_.stored;
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

void PrefixCache::clear() {  // the directory is per fingerprint: another model's files stay
  entries_.clear();
  lru_.clear();
  stats_.bytes = 0;
}

}  // namespace concord::serve
