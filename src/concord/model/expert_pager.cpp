// ExpertPager (expert_pager.h): experts' packed blocks held under a memory cap.
#include "concord/model/expert_pager.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::model {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

ExpertPager::ExpertPager(std::vector<Expert> experts, int64_t num_experts, int64_t cap, Loader loader, bool prefetch)
    : experts_(std::move(experts)), num_experts_(num_experts), loader_(std::move(loader)), prefetch_(prefetch) {
  CONCORD_CHECK(num_experts_ > 0 && loader_, "ExpertPager: no experts per block or no loader");
  int64_t blocks = 0;
  for (const Expert& e : experts_) {
    CONCORD_CHECK(e.block >= 0 && e.expert >= 0 && e.expert < num_experts_ && e.bytes > 0, "ExpertPager: a bad expert entry");
    blocks = std::max(blocks, e.block + 1);
    max_expert_bytes_ = std::max(max_expert_bytes_, e.bytes);
    stats_.expert_bytes += e.bytes;
  }
  index_.assign(static_cast<size_t>(blocks * num_experts_), -1);
  for (size_t i = 0; i < experts_.size(); ++i) {
    int& slot = index_[static_cast<size_t>(experts_[i].block * num_experts_ + experts_[i].expert)];
    CONCORD_CHECK(slot < 0, "ExpertPager: an expert listed twice");
    slot = static_cast<int>(i);
  }
  if (cap < max_expert_bytes_)
    throw InputError(fmt::format("[memory cap] a cap of {} bytes cannot hold one expert ({} bytes: gate, up and down "
                                 "packed); a layer computes one expert at a time, so the cap must be at least that "
                                 "(all experts: {} bytes)",
                                 cap, max_expert_bytes_, stats_.expert_bytes));
  stats_.cap = cap;
  entries_.resize(experts_.size());
  if (prefetch_) thread_ = std::thread([this] { worker(); });
}

ExpertPager::~ExpertPager() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    queue_.clear();
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int ExpertPager::index(int64_t block, int64_t expert) const {
  const int64_t i = block * num_experts_ + expert;
  const int id = (block >= 0 && expert >= 0 && expert < num_experts_ && i < static_cast<int64_t>(index_.size()))
                     ? index_[static_cast<size_t>(i)]
                     : -1;
  CONCORD_CHECK(id >= 0, fmt::format("ExpertPager: expert {} of block {} is not paged", expert, block));
  return id;
}

void ExpertPager::evict(int id) {
  Entry& e = entries_[static_cast<size_t>(id)];
  e.w = {};  // the pager held the only reference (the pass's copies go at release)
  e.state = State::absent;
  e.prefetched = false;
  stats_.held -= experts_[static_cast<size_t>(id)].bytes;
  ++stats_.evictions;
}

bool ExpertPager::reserve(int id, bool for_prefetch) {
  const int64_t need = experts_[static_cast<size_t>(id)].bytes;
  while (stats_.held + need > stats_.cap) {
    // The victim: resident, unlocked, unpinned; the experts the current layer still needs last
    // (never, for the prefetcher); least recently used first.
    int victim = -1;
    for (size_t i = 0; i < entries_.size(); ++i) {
      const Entry& c = entries_[i];
      if (c.state != State::resident || c.locked || c.pinned || (for_prefetch && c.wanted)) continue;
      if (victim < 0) {
        victim = static_cast<int>(i);
        continue;
      }
      const Entry& v = entries_[static_cast<size_t>(victim)];
      if (c.wanted != v.wanted ? !c.wanted : c.tick < v.tick) victim = static_cast<int>(i);
    }
    if (victim < 0) return false;
    evict(victim);
  }
  stats_.held += need;
  stats_.high_water = std::max(stats_.high_water, stats_.held);
  CONCORD_CHECK(stats_.held <= stats_.cap, "ExpertPager: the cap was exceeded");
  entries_[static_cast<size_t>(id)].state = State::loading;
  return true;
}

ExpertPager::Weights ExpertPager::load(int id) {
  Weights w;
  const Expert& x = experts_[static_cast<size_t>(id)];
  int64_t bytes = 0;
  for (size_t j = 0; j < 3; ++j) {
    w[j] = loader_(x.params[j]);
    CONCORD_CHECK(w[j] && w[j]->loaded(), "ExpertPager: the loader returned no blocks");
    bytes += static_cast<int64_t>(w[j]->bytes());
  }
  CONCORD_CHECK(bytes == x.bytes, fmt::format("ExpertPager: expert {} of block {} packed to {} bytes, {} reserved", x.expert,
                                              x.block, bytes, x.bytes));
  return w;
}

void ExpertPager::finish_load(int id, Weights w, double seconds, bool by_prefetcher) {
  Entry& e = entries_[static_cast<size_t>(id)];
  e.w = std::move(w);
  e.state = State::resident;
  e.tick = ++tick_;
  e.prefetched = by_prefetcher;
  ++stats_.loads;
  stats_.loaded_bytes += experts_[static_cast<size_t>(id)].bytes;
  stats_.load_s += seconds;
  if (by_prefetcher) ++stats_.prefetched;
  done_cv_.notify_all();
}

std::vector<std::pair<int64_t, int64_t>> ExpertPager::select_pins(std::span<const std::pair<int64_t, int64_t>> hottest_first,
                                                                  const std::function<int64_t(int64_t, int64_t)>& bytes,
                                                                  int64_t budget, int64_t cap, int64_t largest) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t total = 0;
  for (const auto& x : hottest_first) {
    if (std::find(out.begin(), out.end(), x) != out.end()) continue;
    const int64_t b = bytes(x.first, x.second);
    if (total + b > budget || total + b + largest > cap) break;
    out.push_back(x);
    total += b;
  }
  return out;
}

int64_t ExpertPager::pin(std::span<const std::pair<int64_t, int64_t>> hottest_first, int64_t budget) {
  const auto chosen = select_pins(
      hottest_first, [&](int64_t block, int64_t expert) { return experts_[static_cast<size_t>(index(block, expert))].bytes; },
      budget, stats().cap, max_expert_bytes_);
  int64_t pinned = 0;
  for (const auto& [block, expert] : chosen) {
    const int id = index(block, expert);
    std::unique_lock lk(mu_);
    Entry& e = entries_[static_cast<size_t>(id)];
    if (e.pinned) continue;
    while (e.state == State::loading) done_cv_.wait(lk);
    if (e.state == State::absent) {
      CONCORD_CHECK(reserve(id, false), "ExpertPager: no room for a pinned expert");
      lk.unlock();
      const auto t0 = Clock::now();
      Weights w = load(id);
      const double s = seconds_since(t0);
      lk.lock();
      finish_load(id, std::move(w), s, false);
    }
    e.pinned = true;
    ++stats_.pinned;
    stats_.pinned_bytes += experts_[static_cast<size_t>(id)].bytes;
    ++pinned;
  }
  return pinned;
}

std::vector<int64_t> ExpertPager::expect(int64_t block, std::span<const int64_t> experts, int64_t next_block,
                                         std::span<const int64_t> next) {
  std::vector<int64_t> order, later;
  std::lock_guard lk(mu_);
  for (int id : wanted_) entries_[static_cast<size_t>(id)].wanted = false;
  wanted_.clear();
  std::deque<int> queue;
  for (int64_t x : experts) {
    const int id = index(block, x);
    Entry& e = entries_[static_cast<size_t>(id)];
    e.wanted = true;
    wanted_.push_back(id);
    if (e.state == State::resident) {
      order.push_back(x);
    } else {
      later.push_back(x);
      if (e.state == State::absent) queue.push_back(id);
    }
  }
  order.insert(order.end(), later.begin(), later.end());
  for (int64_t x : next) {
    const int id = index(next_block, x);
    if (entries_[static_cast<size_t>(id)].state == State::absent) queue.push_back(id);
  }
  if (prefetch_) {
    queue_ = std::move(queue);
    if (!queue_.empty()) work_cv_.notify_one();
  }
  return order;
}

bool ExpertPager::all_resident(int64_t block) const {
  std::lock_guard lk(mu_);
  for (int64_t e = 0; e < num_experts_; ++e) {
    const int64_t i = block * num_experts_ + e;
    if (block < 0 || i >= static_cast<int64_t>(index_.size())) return false;
    const int id = index_[static_cast<size_t>(i)];
    if (id >= 0 && entries_[static_cast<size_t>(id)].state != State::resident) return false;
  }
  return true;
}

ExpertPager::Weights ExpertPager::acquire(int64_t block, int64_t expert) {
  const int id = index(block, expert);
  std::unique_lock lk(mu_);
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  Entry& e = entries_[static_cast<size_t>(id)];
  CONCORD_CHECK(!e.locked, "ExpertPager: an expert acquired twice");
  ++stats_.uses;
  const auto t0 = Clock::now();
  const bool hit = e.state == State::resident;
  if (hit) {
    ++stats_.hits;
  } else if (e.state == State::loading) {
    ++stats_.waits;
    while (e.state == State::loading) done_cv_.wait(lk);
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  if (e.state == State::absent) {
    // Room may be held by loads in flight (they become evictable when they land).
    while (!reserve(id, false)) {
      const bool in_flight = std::any_of(entries_.begin(), entries_.end(), [](const Entry& c) { return c.state == State::loading; });
      CONCORD_CHECK(in_flight, "ExpertPager: no room and nothing to evict");
      done_cv_.wait(lk);
      if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    }
    lk.unlock();
    const auto t1 = Clock::now();
    Weights w;
    try {
      w = load(id);
    } catch (...) {
      lk.lock();
      e.state = State::absent;
      stats_.held -= experts_[static_cast<size_t>(id)].bytes;
      throw;
    }
    const double s = seconds_since(t1);
    lk.lock();
    finish_load(id, std::move(w), s, false);
  }
  if (e.prefetched) {
    ++stats_.prefetch_used;
    e.prefetched = false;
  }
  if (!hit) stats_.stall_s += seconds_since(t0);
  e.locked = true;
  e.wanted = false;
  e.tick = ++tick_;
  return e.w;
}

void ExpertPager::release(int64_t block, int64_t expert) {
  std::lock_guard lk(mu_);
  Entry& e = entries_[static_cast<size_t>(index(block, expert))];
  CONCORD_CHECK(e.locked, "ExpertPager: an expert released that was not acquired");
  e.locked = false;
}

void ExpertPager::worker() {
  std::unique_lock lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const int id = queue_.front();
    queue_.pop_front();
    if (entries_[static_cast<size_t>(id)].state != State::absent) continue;
    if (!reserve(id, true)) {  // no room without evicting what the layer still needs: stop here
      queue_.clear();
      continue;
    }
    lk.unlock();
    const auto t0 = Clock::now();
    Weights w;
    std::exception_ptr failed;
    try {
      w = load(id);
    } catch (...) {
      failed = std::current_exception();
    }
    const double s = seconds_since(t0);
    lk.lock();
    if (failed) {
      entries_[static_cast<size_t>(id)].state = State::absent;
      stats_.held -= experts_[static_cast<size_t>(id)].bytes;
      error_ = failed;
      queue_.clear();
      done_cv_.notify_all();
      continue;
    }
    finish_load(id, std::move(w), s, true);
  }
}

void ExpertPager::drain() {
  std::unique_lock lk(mu_);
  queue_.clear();
  done_cv_.wait(lk, [&] {
    return std::none_of(entries_.begin(), entries_.end(), [](const Entry& e) { return e.state == State::loading; });
  });
}

ExpertPagingStats ExpertPager::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

std::vector<std::pair<int64_t, int64_t>> hottest_experts(const ModelConfig& c, const std::map<int64_t, std::vector<double>>& loads) {
  struct Hot {
    double load;
    int64_t block, expert;
  };
  std::vector<Hot> hot;
  for (int64_t app = 0; app < c.applications(); ++app) {
    const int64_t block = c.block_of(app);
    if (!c.is_moe_layer(block)) continue;
    const auto it = loads.find(app);
    if (it == loads.end() || static_cast<int64_t>(it->second.size()) != c.num_experts)
      throw InputError(fmt::format("[memory cap] the pinning loads have no {} counts for MoE application {}", c.num_experts, app));
    for (int64_t e = 0; e < c.num_experts; ++e) hot.push_back({it->second[static_cast<size_t>(e)], block, e});
  }
  std::stable_sort(hot.begin(), hot.end(), [](const Hot& x, const Hot& y) { return x.load > y.load; });
  std::vector<std::pair<int64_t, int64_t>> order;
  for (const Hot& h : hot)
    if (h.load > 0) order.emplace_back(h.block, h.expert);
  return order;
}

}  // namespace concord::model
