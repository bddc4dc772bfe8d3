// Arena: chunked bump allocation of 64-byte aligned float buffers (see arena.h).
#include "concord/tensor/arena.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <string>

#include "concord/numerics/check.h"

namespace concord::tensor {
namespace {

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

void Arena::FreeDeleter::operator()(float* p) const { std::free(p); }

Arena::Arena(size_t chunk_bytes)
    : chunk_bytes_(round_up(std::max<size_t>(chunk_bytes, kAlignment), kAlignment)) {}

float* Arena::alloc(int64_t n) {
  if (n < 0) throw InputError("[arena] alloc of " + std::to_string(n) + " floats (pass n >= 0)");
  // Every buffer is a whole number of 64-byte lines, so the next one stays aligned; a zero-size
  // request still gets its own line (a distinct, non-null pointer).
  const size_t bytes = round_up(std::max<size_t>(static_cast<size_t>(n) * sizeof(float), 1),
                                kAlignment);
  if (current_ < chunks_.size()) {
    const Chunk& c = chunks_[current_];
    if (top_ + bytes <= c.begin + c.bytes) {
      float* p = c.memory.get() + (top_ - c.begin) / sizeof(float);
      top_ += bytes;
      high_water_ = std::max(high_water_, top_);
      live_high_water_ = std::max(live_high_water_, bytes_live());
      return p;
    }
  }
  // Move to the next chunk; chunks above the top are unused, so a too-small one is replaced.
  const size_t next = current_ < chunks_.size() ? current_ + 1 : chunks_.size();
  if (next < chunks_.size() && chunks_[next].bytes < bytes) chunks_.resize(next);
  if (next == chunks_.size()) {
    Chunk c;
    c.bytes = std::max(bytes, chunk_bytes_);
    c.begin = next == 0 ? 0 : chunks_[next - 1].begin + chunks_[next - 1].bytes;
    c.memory.reset(static_cast<float*>(std::aligned_alloc(kAlignment, c.bytes)));
    if (!c.memory) throw std::bad_alloc();
    chunks_.push_back(std::move(c));
  }
  current_ = next;
  const Chunk& c = chunks_[current_];
  if (c.begin > top_) {  // the previous chunk's tail, unused
    skips_.push_back({top_, c.begin - top_});
    skipped_ += c.begin - top_;
  }
  top_ = c.begin + bytes;
  high_water_ = std::max(high_water_, top_);
  live_high_water_ = std::max(live_high_water_, bytes_live());
  return c.memory.get();
}

void Arena::rewind(size_t mark) {
  if (mark > top_) {
    throw InputError("[arena] rewind to " + std::to_string(mark) + " above the top " +
                     std::to_string(top_) + " (a mark taken before an earlier rewind or reset)");
  }
  top_ = mark;
  while (!skips_.empty() && skips_.back().start >= mark) {
    skipped_ -= skips_.back().bytes;
    skips_.pop_back();
  }
  // The chunk holding the new top: the last one that begins strictly below it (or the first).
  current_ = 0;
  for (size_t i = 0; i < chunks_.size(); ++i) {
    if (chunks_[i].begin < mark || i == 0) current_ = i;
  }
}

size_t Arena::bytes_reserved() const {
  size_t total = 0;
  for (const Chunk& c : chunks_) total += c.bytes;
  return total;
}

}  // namespace concord::tensor
