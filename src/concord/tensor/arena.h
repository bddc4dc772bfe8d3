// Arena: the workspace for activations — a bump allocator of 64-byte aligned float buffers.
//
// Memory comes in chunks that are never freed or moved until the Arena dies, so a pointer stays
// valid until a rewind()/reset() passes below it. mark() names the current top; rewind(mark)
// releases everything allocated after it (stack discipline: a forward pass marks, the backward
// pass rewinds). reset() releases all and keeps the chunks for the next step, so a training
// loop reaches a steady state with no allocation at all. bytes_high_water() is the largest
// top ever reached (what sched's peak-memory model predicts).
//
// Positions are logical byte offsets over the chunks laid end to end: an allocation that does
// not fit in the rest of a chunk starts at the next chunk, and the unused tail counts as used.
// Buffers are uninitialised. Not thread-safe: one Arena per thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace concord::tensor {

class Arena {
 public:
  static constexpr size_t kDefaultChunkBytes = size_t{64} << 20;
  static constexpr size_t kAlignment = 64;

  // chunk_bytes: the size of each new chunk (a larger single allocation gets a chunk of its
  // own size). Rounded up to a multiple of kAlignment.
  explicit Arena(size_t chunk_bytes = kDefaultChunkBytes);

  // n floats (n >= 0), 64-byte aligned, never null. Throws InputError for n < 0.
  float* alloc(int64_t n);
  std::span<float> alloc_span(int64_t n) { return {alloc(n), static_cast<size_t>(n)}; }

  size_t mark() const { return top_; }
  // Releases every allocation made after mark() returned `mark`. Throws InputError if `mark`
  // lies above the current top (a stale mark from before an earlier rewind or reset).
  void rewind(size_t mark);
  void reset() { rewind(0); }

  size_t bytes_in_use() const { return top_; }
  size_t bytes_high_water() const { return high_water_; }
  // The bytes of the live allocations (each rounded up to kAlignment), without the tails of chunks
  // an allocation too large for them skipped; its high-water mark is what a pass needs of memory
  // whatever the chunk size (what sched::training_memory predicts).
  size_t bytes_live() const { return top_ - skipped_; }
  size_t bytes_live_high_water() const { return live_high_water_; }
  // Both marks start again from the current top.
  void reset_high_water() {
    high_water_ = top_;
    live_high_water_ = bytes_live();
  }
  size_t bytes_reserved() const;  // the sum of the chunks' sizes

 private:
  struct FreeDeleter {
    void operator()(float* p) const;
  };
  struct Chunk {
    std::unique_ptr<float[], FreeDeleter> memory;
    size_t bytes = 0;
    size_t begin = 0;  // logical offset of the chunk's first byte
  };
  std::vector<Chunk> chunks_;
  size_t chunk_bytes_;
  size_t current_ = 0;  // index of the chunk holding the top (== chunks_.size() when none)
  size_t top_ = 0;
  size_t high_water_ = 0;
  struct Skip {
    size_t start, bytes;  // a chunk's unused tail [start, start + bytes) below the top
  };
  std::vector<Skip> skips_;  // ascending
  size_t skipped_ = 0;       // their total
  size_t live_high_water_ = 0;
};

}  // namespace concord::tensor
