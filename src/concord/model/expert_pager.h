// Experts under a memory cap (issue 25; seed system #10 of DESIGN.md: a 4-bit MoE served with its
// experts streamed from host memory because they did not fit the device).
//
// A model serving a GGUF's quantized experts (Q4_0 / Q4_1 / Q8_0) holds at most `cap` bytes of
// their packed blocks. The model keeps each paged expert's weights as tensor::QuantWeight::
// unloaded placeholders; an MoE layer asks the pager for each expert it computes (acquire), which
// hands back the packed blocks — resident already, being read by the prefetcher, or read now from
// the file (load_model_paged's loader: `pread` into a buffer of its own, packed, the buffer
// freed — no page of the file stays mapped for it) — and lets it go after (release). What is held:
//   - a pinned hot set: the experts routing statistics say are used most, loaded once and never
//     evicted, up to a share of the cap;
//   - the rest least recently used: to make room, the expert unused longest (and not locked by the
//     pass, not pinned; the prefetcher also spares the experts the current layer still needs) goes.
// Prefetch: a background thread reads, in order, (1) the current layer's experts that are not
// resident, while the layer computes the resident ones first, and (2) the experts the next MoE
// layer's router is predicted to pick (block_moe.cpp: the next router applied to this layer's
// input — the residual stream changes little from one layer to the next), as far as they fit
// without evicting what the current layer still needs.
//
// The bytes held — resident experts, and every load in flight from the moment it is reserved,
// before it allocates — never exceed the cap: each reservation is checked (CONCORD_CHECK) and the
// high-water mark is reported. (Beside it, a reading thread holds one slab of the file — a third of
// an expert, in its file layout — for the moment it packs it.) An expert's blocks are the same bytes however it got there, and the
// order in which a layer computes its experts changes no bit (each writes its own rows), so the
// outputs are the uncapped model's bit for bit (tests/model/expert_pager_test.cpp).
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "concord/model/config.h"
#include "concord/tensor/quant_gemm.h"

namespace concord::model {

struct ExpertPagingStats {
  int64_t cap = 0;            // bytes of expert blocks the pager may hold
  int64_t expert_bytes = 0;   // every expert's packed bytes: what an uncapped model holds
  int64_t held = 0;           // bytes held now (loads in flight included)
  int64_t high_water = 0;     // the most bytes held at once
  int64_t pinned = 0, pinned_bytes = 0;
  int64_t uses = 0;           // acquires (an expert computed by a layer)
  int64_t hits = 0;           // ... whose expert was resident
  int64_t waits = 0;          // ... that waited for the prefetcher's load in flight
  int64_t loads = 0, loaded_bytes = 0;  // experts read and packed (both threads, pins included)
  int64_t prefetched = 0;     // loads by the prefetcher
  int64_t prefetch_used = 0;  // ... of experts acquired before they were evicted
  int64_t evictions = 0;
  double load_s = 0;          // seconds reading and packing (both threads)
  double stall_s = 0;         // seconds the pass waited for an expert (its own loads and waits)
};

class ExpertPager {
 public:
  // One expert of one MoE block: its gate, up and down parameters (Model::params() indices) and
  // their packed bytes.
  struct Expert {
    int64_t block = -1, expert = -1;
    std::array<int, 3> params{-1, -1, -1};
    int64_t bytes = 0;
  };
  using Weights = std::array<std::shared_ptr<const tensor::QuantWeight>, 3>;
  // Reads one parameter's packed blocks; called from the pass's thread and the prefetcher at
  // once (it must be thread-safe).
  using Loader = std::function<std::shared_ptr<const tensor::QuantWeight>(int param)>;

  // `experts`: every paged expert; `num_experts` per MoE block. InputError when the cap cannot
  // hold the largest expert (a layer computes one expert at a time, so that is the least it needs).
  ExpertPager(std::vector<Expert> experts, int64_t num_experts, int64_t cap, Loader loader, bool prefetch);
  ~ExpertPager();
  ExpertPager(const ExpertPager&) = delete;
  ExpertPager& operator=(const ExpertPager&) = delete;

  // Pins (loads now, never evicts) the experts select_pins picks. Returns how many.
  int64_t pin(std::span<const std::pair<int64_t, int64_t>> hottest_first, int64_t budget);
  // The experts of `hottest_first` (block, expert), in order, while their bytes stay within
  // `budget` and the cap keeps room for the largest expert; stops at the first that does not fit.
  static std::vector<std::pair<int64_t, int64_t>> select_pins(std::span<const std::pair<int64_t, int64_t>> hottest_first,
                                                              const std::function<int64_t(int64_t, int64_t)>& bytes,
                                                              int64_t budget, int64_t cap, int64_t largest);

  // The pass's side (one thread). `expect`: the experts `block` is about to compute; returns them
  // in the order to compute them (resident first, then the rest in the order given, which the
  // prefetcher reads in that order), and queues `next` (the predicted experts of the next MoE
  // block, most likely first) behind them.
  std::vector<int64_t> expect(int64_t block, std::span<const int64_t> experts, int64_t next_block,
                              std::span<const int64_t> next);
  // Whether every paged expert of `block` is resident (the prefetcher has nothing to read there).
  bool all_resident(int64_t block) const;
  // The expert's blocks, locked (never evicted) until release.
  Weights acquire(int64_t block, int64_t expert);
  void release(int64_t block, int64_t expert);

  // Drops the prefetcher's queue and waits for its load in flight: what is held is then resident.
  void drain();

  const std::vector<Expert>& experts() const { return experts_; }
  bool prefetch() const { return prefetch_; }
  ExpertPagingStats stats() const;

 private:
  enum class State : uint8_t { absent, loading, resident };
  struct Entry {
    State state = State::absent;
    bool locked = false, pinned = false, wanted = false, prefetched = false;
    uint64_t tick = 0;
    Weights w;
  };
  int index(int64_t block, int64_t expert) const;
  bool reserve(int id, bool for_prefetch);  // mu_ held; evicts to make room; false if it cannot
  void evict(int id);                       // mu_ held
  Weights load(int id);                     // mu_ not held
  void finish_load(int id, Weights w, double seconds, bool by_prefetcher);  // mu_ held
  void worker();

  std::vector<Expert> experts_;
  std::vector<int> index_;  // block * num_experts + expert -> experts_ index, or -1
  int64_t num_experts_ = 0, max_expert_bytes_ = 0;
  Loader loader_;
  bool prefetch_ = true;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the prefetcher: queue or stop
  std::condition_variable done_cv_;  // a load finished
  std::vector<Entry> entries_;
  std::deque<int> queue_;
  std::vector<int> wanted_;  // the entries expect() marked wanted (cleared by the next expect)
  uint64_t tick_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;  // the prefetcher's failed load, rethrown by the next acquire
  ExpertPagingStats stats_;
  std::thread thread_;
};

// Every MoE expert of the model with tokens in `loads` (application -> tokens per expert, as
// `concord generate --router-stats` writes them), most tokens first (ties: earlier application, lower
// expert); an application's block is c.block_of(application). InputError for an MoE application
// without E counts.
std::vector<std::pair<int64_t, int64_t>> hottest_experts(const ModelConfig& c, const std::map<int64_t, std::vector<double>>& loads);

}  // namespace concord::model
