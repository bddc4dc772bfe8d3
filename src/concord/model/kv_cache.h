// KvCache: the keys and values of every block application (every decoder layer, for the identity
// schedule; ModelConfig::schedule) for a set of sequences, so that a forward
// pass over new tokens (Model::forward_cached) attends to what came before without recomputing it.
//
// One slot per running sequence. A slot's storage grows on demand (doubling, at least 64 rows)
// up to `capacity` tokens and is kept when the slot is released, so a later sequence reuses it
// without allocating. Rows hold what attention reads: k after QK-norm and RoPE, v as projected,
// (Hkv, D) per position, exactly the values the batched forward passes to attention — which is
// why a cached decode step reproduces Model::forward bit for bit (see docs/engine.md).
//
// Errors (InputError "[kv_cache] ..."): a capacity beyond max_position_embeddings, no free slot,
// a slot that is not in use, a sequence that would outgrow its capacity.
#pragma once

#include <cstdint>
#include <vector>

#include "concord/model/config.h"
#include "concord/tensor/arena.h"

namespace concord::model {

class KvCache {
 public:
  // capacity: tokens per sequence, 1..max_position_embeddings (0: max_position_embeddings).
  // A depth-recurrent model's core iterations: `core_slots` row sets per core layer, iteration i
  // in slot i mod core_slots; 0: one per iteration up to max_recurrence (a pass at depth r <=
  // core_slots then equals the full forward bit for bit). Fewer slots is Huginn's fixed-budget
  // cache: iterations share slots, and a token attends to the latest state written there.
  KvCache(const ModelConfig& config, int64_t max_sequences, int64_t capacity = 0, int64_t core_slots = 0);

  int64_t max_sequences() const { return static_cast<int64_t>(slots_.size()); }
  int64_t capacity() const { return capacity_; }
  int64_t sequences_in_use() const;

  // The lowest free slot, now in use with length 0; InputError when every slot is in use.
  int allocate();
  // Frees a slot (its storage is kept for the next allocate()).
  void release(int slot);
  bool in_use(int slot) const;
  // Tokens cached for the slot (the position the next token gets).
  int64_t length(int slot) const;
  // Forgets the tail: keeps the first `length` positions (<= length(slot)).
  void truncate(int slot, int64_t length);
  size_t bytes_reserved() const;

  // ---- used by the forward pass (decode.cpp) -------------------------------------------------
  int64_t num_layers() const { return layers_; }  // row sets: block applications (config.applications()),
                                                  // recurrent: P + core_slots * R + Q
  int64_t core_slots() const { return core_slots_; }  // recurrent; 0 otherwise
  int64_t row_width() const { return row_width_; }  // Hkv * D floats per position
  // Makes room for `length` positions (throws InputError past capacity); pointers returned by
  // keys()/values() before a reserve() may move.
  void reserve(int slot, int64_t length);
  void set_length(int slot, int64_t length);  // after the rows up to `length` are written
  float* keys(int slot, int64_t layer);       // (rows reserved, Hkv * D)
  float* values(int slot, int64_t layer);
  tensor::Arena& workspace() { return workspace_; }  // scratch activations of forward_cached

 private:
  struct Slot {
    bool in_use = false;
    int64_t length = 0;
    int64_t rows = 0;                       // rows reserved in every layer's buffers
    std::vector<std::vector<float>> k, v;   // per layer, rows * row_width
  };
  const Slot& checked(int slot, const char* what) const;
  Slot& checked(int slot, const char* what);

  int64_t layers_ = 0, row_width_ = 0, capacity_ = 0, max_positions_ = 0, core_slots_ = 0;
  std::vector<Slot> slots_;
  tensor::Arena workspace_{size_t{16} << 20};
};

}  // namespace concord::model
