// The prefix snapshot cache (issue 25): the KV-cache rows of prompt prefixes, kept under a hash of
// their tokens, so that a request whose prompt starts with a stored prefix resumes from it instead
// of prefilling it again.
//
// Snapshots are blocks: for a prompt of n tokens, one entry per `block` tokens, [0, b), [b, 2b), ...
// up to position n - 1, keyed by XXH3-64 of the whole prefix [0, end) (seeded with the model's
// fingerprint), plus a tail entry [⌊(n−1)/b⌋·b, n − 1) — so a repeated prompt recomputes only its
// last token (whose logits are sampled), and prompts sharing a system prompt share its blocks.
// Every entry keeps its own tokens, checked against the prompt on use (a hash collision is a miss,
// not wrong state). Entries are evicted least recently used past `max_bytes`.
//
// Exactness: a cached row is what the prefill wrote for that position, and the engine computes
// each position from the rows before it whatever the chunking, so a resumed request's state,
// logits and tokens equal a full recompute bit for bit (tests/serve/prefix_cache_test.cpp). A
// change of weights makes every entry stale: clear() (concord serve does on a weight update).
// Models whose state is not only KV rows (depth-recurrent) and requests that score their prompt
// (prompt_logprobs needs every prompt row's logits) do not use the cache.
//
// On disk (options.dir), one file per entry, DIR/<fingerprint 16 hex>/<key 16 hex>.kvsnap, written
// atomically; little-endian: "CCDKVS01", u32 format 1, u32 0, u64 fingerprint, u64 key, i64 start,
// i64 end, i64 layers, i64 row_width, u64 XXH3-64 of what follows, then the tokens (i32, end -
// start) and the rows (f32; per layer keys then values, (end - start) * row_width each). Read back
// only after every field and the checksum are checked against this model and the file's name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "concord/model/config.h"
#include "concord/model/kv_cache.h"
#include "concord/model/model.h"

namespace concord::serve {

struct PrefixCacheOptions {
  int64_t block = 64;                  // tokens per snapshot block
  size_t max_bytes = size_t{256} << 20;  // memory budget; least recently used entries go past it
  // Also on disk: every entry is written atomically as DIR/<fingerprint>/<key>.kvsnap and read
  // back (validated) on a memory miss, so snapshots outlive the process. "": memory only.
  std::string dir;
  size_t max_disk_bytes = size_t{4} << 30;  // the oldest files (by modification time) go past it
  // A snapshot file that fails validation (truncated, corrupt, another model's) is a miss: the
  // prefix is recomputed and the file replaced. This is told what was wrong ("FILE: PROBLEM");
  // empty: one line on stderr.
  std::function<void(const std::string&)> warn;
};

struct PrefixCacheStats {
  int64_t lookups = 0;        // restore() calls
  int64_t hits = 0;           // of them resumed from a snapshot
  int64_t tokens_reused = 0;  // prompt tokens not prefilled thanks to a hit
  int64_t stored = 0;         // entries stored
  int64_t evicted = 0;        // entries evicted for room
  size_t bytes = 0;           // held now
  int64_t disk_reads = 0;     // entries read back from the directory
  int64_t disk_rejected = 0;  // snapshot files that failed validation
  int64_t disk_writes = 0, disk_evicted = 0;
  size_t disk_bytes = 0;      // files in this model's directory
};

class PrefixCache {
 public:
  // `fingerprint`: what the rows depend on besides the tokens (the model's config, precision
  // policy and weights: PrefixCache::fingerprint_of); it seeds every key.
  PrefixCache(const model::ModelConfig& config, uint64_t fingerprint, PrefixCacheOptions options = {});

  // The model's fingerprint: XXH3-64 over its config, its policy's name and the content hashes of
  // every weight as its kernels read them.
  static uint64_t fingerprint_of(model::Model& model);

  // The longest stored prefix of `prompt` shorter than it whose length is a multiple of `align`,
  // its rows copied into `slot` of `cache` (an empty, allocated slot; its length is set): the
  // prompt tokens resumed, 0 when none. align: 1, or the engine's prefill_chunk where the
  // precision policy quantizes activations with a scale shared by a GEMM's rows (NVFP4,
  // per-tensor FP8: docs/engine.md) — a row then depends on every row of its chunk, so a
  // snapshot is whole chunks and a resumed prefill cuts the chunks a full one would.
  int64_t restore(std::span<const int32_t> prompt, model::KvCache& cache, int slot, int64_t align = 1);
  // Stores the entries of `prompt` not yet held, from `slot`, which holds at least its first
  // prompt.size() - 1 positions; the tail entry only when its end is a multiple of `align` (as
  // restore()).
  void store(std::span<const int32_t> prompt, model::KvCache& cache, int slot, int64_t align = 1);
  // Drops every entry (the weights changed).
  void clear();

  // The hand-over of a prompt's state to another process (concord generate --disaggregate: a
  // prefill worker's rows to a decode worker). export_prompt: the entries restore() would resume
  // `prompt` from (its stored blocks from position 0 and the tail), as one message: "CCDKVH01",
  // u64 records, then per record u64 bytes and the record, byte for byte a .kvsnap file. Empty
  // records when nothing of the prompt is held.
  std::vector<uint8_t> export_prompt(std::span<const int32_t> prompt, int64_t align = 1);
  // Takes such a message into this cache: every record checked as a snapshot file is read back
  // (this model's fingerprint and sizes, positions, checksum); a record that fails is left out,
  // named through options.warn (its positions are then prefilled again, so the result is the
  // same bits either way). InputError when the message itself is malformed (bad magic, a record
  // past its end). Returns the records taken.
  int64_t import_prompt(std::span<const uint8_t> message, const std::string& what);

  const PrefixCacheStats& stats() const { return stats_; }
  const PrefixCacheOptions& options() const { return options_; }

 private:
  struct Entry {
    uint64_t key = 0;
    int64_t start = 0, end = 0;
    std::vector<int32_t> tokens;  // [start, end)
    std::vector<float> rows;      // per layer: keys then values, (end - start) * row_width each
    std::list<uint64_t>::iterator lru;
  };
  // Keys of [0, b·block) for b = 1.. while b·block <= last, and of [0, last).
  struct PrefixKeys {
    std::vector<uint64_t> blocks;
    uint64_t tail = 0;
  };
  PrefixKeys keys_of(std::span<const int32_t> prompt, int64_t last) const;
  Entry* find(uint64_t key, std::span<const int32_t> prompt, int64_t start, int64_t end);
  // The entry in memory, or read back from the directory (nullptr: neither).
  Entry* lookup(uint64_t key);
  Entry* insert(Entry e);
  std::filesystem::path file_of(uint64_t key) const;
  void write_file(const Entry& e);
  std::optional<Entry> read_file(uint64_t key);
  // An entry as a .kvsnap record, and back (nullopt with the problem; expect_key: the key the
  // record must hold, when its name says).
  std::vector<uint8_t> encode(const Entry& e) const;
  std::optional<Entry> decode(std::span<const uint8_t> bytes, std::optional<uint64_t> expect_key, std::string& problem) const;
  // The entries restore() resumes `prompt` from, in position order.
  std::vector<Entry*> chain_of(std::span<const int32_t> prompt, int64_t align);
  void warn(const std::string& message);
  void put(uint64_t key, std::span<const int32_t> prompt, int64_t start, int64_t end, model::KvCache& cache, int slot);
  size_t entry_bytes(const Entry& e) const;

  int64_t layers_ = 0, row_width_ = 0;
  uint64_t fingerprint_ = 0;
  PrefixCacheOptions options_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // front: most recently used
  std::filesystem::path dir_;  // DIR/<fingerprint>, "" when memory only
  std::multimap<std::filesystem::file_time_type, std::pair<std::filesystem::path, size_t>> disk_;  // oldest first
  PrefixCacheStats stats_;
};

}  // namespace concord::serve
