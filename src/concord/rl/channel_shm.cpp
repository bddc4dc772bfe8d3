// The shared-memory transport: one POSIX segment, process-shared semaphores, sequence numbers
// (layout and protocol in channel.h, "Wire format").
#include <fcntl.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <ctime>
#include <fstream>
#include <new>
#include <thread>

#include <fmt/format.h>

#include "concord/numerics/check.h"
#include "concord/rl/channel.h"

namespace concord::rl {

namespace {

constexpr uint64_t kShmMagic = 0x31304d48'53444343ULL;  // "CCDSHM01" little-endian
constexpr uint32_t kShmLayout = 1;
constexpr size_t kAlign = 64;
constexpr auto kSlice = std::chrono::milliseconds(50);  // how often a wait looks at its peer

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<int32_t>::is_always_lock_free);

// A MessageHeader as it sits in the segment; `sequence` is stored last (release).
struct SharedMessage {
  std::atomic<uint64_t> magic{0}, sequence{0}, version{0}, size{0};
};

struct alignas(kAlign) ShmHeader {
  std::atomic<uint64_t> magic{0};  // kShmMagic once every other field is initialised
  uint32_t layout = 0;
  uint32_t samplers = 0;
  uint64_t capacity = 0;
  uint64_t rollout_capacity = 0;
  uint64_t total_size = 0;
  std::atomic<int32_t> learner_pid{0};
  std::atomic<uint32_t> closed{0};
  SharedMessage down;
};

struct alignas(kAlign) SamplerSlot {
  std::atomic<int32_t> pid{0};  // 0: not attached yet; -1: detached
  sem_t down_ready;             // learner → sampler: a whole weight message is in the down area
  sem_t down_acked;             // sampler → learner: copied out; the down area may be reused
  sem_t up_ready;               // sampler → learner: whole rollouts in its up area
  sem_t up_free;                // learner → sampler: its up area was copied out (starts at 1)
  SharedMessage up;
};

struct FdCloser {
  int fd;
  ~FdCloser() { close(fd); }
};

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct Layout {
  size_t slots = 0, down = 0, up = 0, up_stride = 0, total = 0;
};

// Offsets of the parts of a segment; false when the sizes overflow.
bool compute_layout(int samplers, size_t capacity, size_t rollout_capacity, Layout& l) {
  constexpr size_t kMax = size_t{1} << 48;  // far beyond any machine's shared memory
  if (capacity > kMax || rollout_capacity > kMax || samplers > 4096) return false;
  l.slots = align_up(sizeof(ShmHeader));
  l.down = align_up(l.slots + static_cast<size_t>(samplers) * sizeof(SamplerSlot));
  l.up = l.down + align_up(capacity);
  l.up_stride = align_up(rollout_capacity);
  l.total = l.up + static_cast<size_t>(samplers) * l.up_stride;
  return l.total <= kMax * 8;
}

// Whether `pid` is a running process (a zombie — exited, not yet reaped — counts as gone).
bool process_alive(int32_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return true;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X';
}

class ShmChannel final : public Channel {
 public:
  ShmChannel(std::string name, int rank, int samplers, const ShmOptions& options)
      : name_(std::move(name)), rank_(rank), samplers_(samplers), timeout_(options.timeout_seconds) {
    validate(options);
    try {
      if (rank_ == 0)
        create(options);
      else
        attach(options);
    } catch (...) {
      release();
      throw;
    }
  }
  ~ShmChannel() override { release(); }

  std::string_view name() const override { return "shm"; }
  int rank() const override { return rank_; }
  int samplers() const override { return samplers_; }

  void publish(uint64_t version, std::span<const uint8_t> payload) override {
    if (rank_ != 0) fail(fmt::format("publish called on sampler rank {}; only rank 0 publishes", rank_));
    if (payload.size() > header_->capacity)
      fail(fmt::format("weight payload of {} bytes is over the segment's capacity of {} bytes "
                       "(create the channel with a larger capacity)",
                       payload.size(), header_->capacity));
    for (int i = 1; i <= samplers_; ++i) {
      if (!pending_ack_[static_cast<size_t>(i - 1)]) continue;
      wait_for(&slot(i).down_acked, i, fmt::format("receipt of version {}", last_version_));
      pending_ack_[static_cast<size_t>(i - 1)] = false;
    }
    if (!payload.empty()) std::memcpy(down_area(), payload.data(), payload.size());
    SharedMessage& m = header_->down;
    m.magic.store(kMessageMagic, std::memory_order_relaxed);
    m.version.store(version, std::memory_order_relaxed);
    m.size.store(payload.size(), std::memory_order_relaxed);
    m.sequence.store(++published_, std::memory_order_release);
    for (int i = 1; i <= samplers_; ++i) {
      sem_post(&slot(i).down_ready);
      pending_ack_[static_cast<size_t>(i - 1)] = true;
    }
    last_version_ = version;
    bytes_down_ += payload.size();
  }

  std::vector<std::vector<uint8_t>> gather() override {
    if (rank_ != 0) fail(fmt::format("gather called on sampler rank {}; only rank 0 gathers", rank_));
    std::vector<std::vector<uint8_t>> out(static_cast<size_t>(samplers_));
    for (int i = 1; i <= samplers_; ++i) {
      SamplerSlot& s = slot(i);
      uint64_t& gathered = gathered_[static_cast<size_t>(i - 1)];
      wait_for(&s.up_ready, i, fmt::format("rollouts (message {})", gathered + 1));
      const uint64_t size = check_message(s.up, gathered + 1, header_->rollout_capacity,
                                          fmt::format("rollouts from sampler {}", i));
      out[static_cast<size_t>(i - 1)].assign(up_area(i), up_area(i) + size);
      ++gathered;
      bytes_up_ += size;
      sem_post(&s.up_free);
    }
    return out;
  }

  void receive_into(WeightMessage& m) override {
    if (rank_ == 0) fail("receive called on rank 0; only samplers receive");
    SamplerSlot& s = slot(rank_);
    wait_for(&s.down_ready, 0, fmt::format("weights (message {})", received_ + 1));
    if (header_->down.sequence.load(std::memory_order_acquire) != received_ + 1 &&
        header_->closed.load(std::memory_order_acquire))
      fail("the learner closed the channel before sending the next weights");
    const uint64_t size = check_message(header_->down, received_ + 1, header_->capacity, "weights");
    m.version = header_->down.version.load(std::memory_order_relaxed);
    m.payload.assign(down_area(), down_area() + size);
    ++received_;
    last_version_ = m.version;
    bytes_down_ += size;
    sem_post(&s.down_acked);
  }

  void send(std::span<const uint8_t> rollouts) override {
    if (rank_ == 0) fail("send called on rank 0; only samplers send rollouts");
    if (rollouts.size() > header_->rollout_capacity)
      fail(fmt::format("rollouts of {} bytes are over the segment's rollout capacity of {} bytes "
                       "(create the channel with a larger rollout capacity)",
                       rollouts.size(), header_->rollout_capacity));
    SamplerSlot& s = slot(rank_);
    wait_for(&s.up_free, 0, "room for rollouts (the learner gathering the last ones)");
    if (header_->closed.load(std::memory_order_acquire))
      fail("the learner closed the channel; rollouts not sent");
    if (!rollouts.empty()) std::memcpy(up_area(rank_), rollouts.data(), rollouts.size());
    s.up.magic.store(kMessageMagic, std::memory_order_relaxed);
    s.up.version.store(last_version_, std::memory_order_relaxed);
    s.up.size.store(rollouts.size(), std::memory_order_relaxed);
    s.up.sequence.store(++sent_, std::memory_order_release);
    bytes_up_ += rollouts.size();
    sem_post(&s.up_ready);
  }

  uint64_t bytes_down() const override { return bytes_down_; }
  uint64_t bytes_up() const override { return bytes_up_; }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(fmt::format("[rl] shm channel '{}' (rank {}): {}", name_, rank_, what));
  }
  [[noreturn]] void fail_errno(const std::string& what) const {
    fail(fmt::format("{}: {}", what, std::strerror(errno)));
  }

  void validate(const ShmOptions& o) const {
    if (name_.size() < 2 || name_[0] != '/' || name_.find('/', 1) != std::string::npos ||
        name_.size() > NAME_MAX)
      fail("a segment name is '/' followed by 1 to 254 characters without '/' (e.g. /concord-1)");
    if (samplers_ < 1 || samplers_ > 4096)
      fail(fmt::format("{} samplers; need 1 to 4096", samplers_));
    if (rank_ < 0 || rank_ > samplers_)
      fail(fmt::format("rank {} outside [0, {}] (0 is the learner)", rank_, samplers_));
    if (!(timeout_ > 0)) fail(fmt::format("timeout {} s must be > 0", timeout_));
    if (rank_ == 0 && o.capacity == 0)
      fail("capacity 0: the learner must size the weight area (bytes of the largest payload)");
  }

  void create(const ShmOptions& o) {
    const size_t capacity = o.capacity;
    const size_t rollout_capacity = o.rollout_capacity ? o.rollout_capacity : o.capacity;
    Layout l;
    if (!compute_layout(samplers_, capacity, rollout_capacity, l))
      fail(fmt::format("capacities of {} and {} bytes are too large", capacity, rollout_capacity));
    const int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      if (errno == EEXIST)
        fail(fmt::format("the segment already exists (another run, or a crashed one: remove "
                         "/dev/shm{})", name_));
      fail_errno("cannot create the segment");
    }
    owner_ = true;
    const FdCloser closer{fd};
    if (ftruncate(fd, static_cast<off_t>(l.total)) != 0)
      fail_errno(fmt::format("cannot size the segment to {} bytes", l.total));
    // Reserve the pages now: on a full /dev/shm a later write would be a SIGBUS, not an error.
    if (const int err = posix_fallocate(fd, 0, static_cast<off_t>(l.total)); err != 0)
      fail(fmt::format("cannot reserve {} bytes of shared memory (/dev/shm full?): {}", l.total,
                       std::strerror(err)));
    map(fd, l.total);
    layout_ = l;
    header_ = new (base_) ShmHeader();
    header_->layout = kShmLayout;
    header_->samplers = static_cast<uint32_t>(samplers_);
    header_->capacity = capacity;
    header_->rollout_capacity = rollout_capacity;
    header_->total_size = l.total;
    header_->learner_pid.store(static_cast<int32_t>(getpid()), std::memory_order_relaxed);
    for (int i = 1; i <= samplers_; ++i) {
      SamplerSlot* s = new (base() + l.slots + static_cast<size_t>(i - 1) * sizeof(SamplerSlot))
          SamplerSlot();
      if (sem_init(&s->down_ready, 1, 0) != 0 || sem_init(&s->down_acked, 1, 0) != 0 ||
          sem_init(&s->up_ready, 1, 0) != 0 || sem_init(&s->up_free, 1, 1) != 0)
        fail_errno("cannot initialise the process-shared semaphores");
    }
    pending_ack_.assign(static_cast<size_t>(samplers_), false);
    gathered_.assign(static_cast<size_t>(samplers_), 0);
    header_->magic.store(kShmMagic, std::memory_order_release);
  }

  void attach(const ShmOptions& o) {
    const auto deadline = deadline_from_now();
    int fd = -1;
    while ((fd = shm_open(name_.c_str(), O_RDWR, 0)) < 0) {
      if (errno != ENOENT) fail_errno("cannot open the segment");
      if (std::chrono::steady_clock::now() > deadline)
        fail(fmt::format("no segment appeared within {} s (is the learner running?)", timeout_));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const FdCloser closer{fd};
    // The learner sizes the segment, then initialises it, then writes the magic last.
    for (;;) {
      struct stat st {};
      if (fstat(fd, &st) != 0) fail_errno("cannot stat the segment");
      if (static_cast<size_t>(st.st_size) >= sizeof(ShmHeader)) {
        map(fd, static_cast<size_t>(st.st_size));
        header_ = reinterpret_cast<ShmHeader*>(base_);
        const uint64_t magic = header_->magic.load(std::memory_order_acquire);
        if (magic == kShmMagic) break;
        if (magic != 0) fail("not a concord channel segment (wrong magic)");
        unmap();
      }
      if (std::chrono::steady_clock::now() > deadline)
        fail(fmt::format("the learner did not initialise the segment within {} s", timeout_));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (header_->layout != kShmLayout)
      fail(fmt::format("segment layout {}, this concord reads layout {}", header_->layout,
                       kShmLayout));
    if (header_->total_size != mapped_)
      fail(fmt::format("segment is {} bytes, its header says {}", mapped_, header_->total_size));
    if (static_cast<int>(header_->samplers) != samplers_)
      fail(fmt::format("the learner's segment serves {} samplers, this process was told {}",
                       header_->samplers, samplers_));
    if (o.capacity != 0 && o.capacity != header_->capacity)
      fail(fmt::format("capacity {} bytes differs from the learner's {}", o.capacity,
                       header_->capacity));
    if (o.rollout_capacity != 0 && o.rollout_capacity != header_->rollout_capacity)
      fail(fmt::format("rollout capacity {} bytes differs from the learner's {}",
                       o.rollout_capacity, header_->rollout_capacity));
    if (!compute_layout(samplers_, header_->capacity, header_->rollout_capacity, layout_) ||
        layout_.total != mapped_)
      fail("segment size does not match its capacities");
    int32_t expected = 0;
    if (!slot(rank_).pid.compare_exchange_strong(expected, static_cast<int32_t>(getpid())))
      fail(expected < 0 ? "this sampler rank attached before and left; start a new run"
                        : fmt::format("sampler rank {} is already attached by pid {}", rank_,
                                      expected));
    attached_ = true;
  }

  void map(int fd, size_t size) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) fail_errno(fmt::format("cannot map {} bytes", size));
    base_ = p;
    mapped_ = size;
  }
  void unmap() {
    if (base_) munmap(base_, mapped_);
    base_ = nullptr;
    header_ = nullptr;
    mapped_ = 0;
  }

  // Learner: marks the channel closed and wakes every sampler, unmaps, unlinks the name (the
  // memory lives on until the last sampler unmaps). Sampler: marks its slot detached, unmaps.
  void release() noexcept {
    if (header_ && rank_ == 0 && header_->magic.load(std::memory_order_relaxed) == kShmMagic) {
      header_->closed.store(1, std::memory_order_release);
      for (int i = 1; i <= samplers_; ++i) {
        sem_post(&slot(i).down_ready);
        sem_post(&slot(i).up_free);
      }
    }
    if (header_ && attached_) slot(rank_).pid.store(-1, std::memory_order_release);
    unmap();
    if (owner_) shm_unlink(name_.c_str());
    owner_ = attached_ = false;
  }

  std::chrono::steady_clock::time_point deadline_from_now() const {
    return std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
               std::chrono::duration<double>(timeout_));
  }

  std::string peer_name(int peer) const {
    return peer == 0 ? std::string("the learner") : fmt::format("sampler {}", peer);
  }

  // Waits for `sem`, looking every kSlice at whether `peer` (0: learner, i: sampler i) still
  // runs; InputError when it is gone, when a sampler sees the learner closed, or at the timeout.
  void wait_for(sem_t* sem, int peer, const std::string& what) const {
    const auto deadline = deadline_from_now();
    for (;;) {
      timespec ts{};
      clock_gettime(CLOCK_MONOTONIC, &ts);
      const long ns = ts.tv_nsec + std::chrono::nanoseconds(kSlice).count();
      ts.tv_sec += ns / 1'000'000'000L;
      ts.tv_nsec = ns % 1'000'000'000L;
      if (sem_clockwait(sem, CLOCK_MONOTONIC, &ts) == 0) return;
      if (errno != ETIMEDOUT && errno != EINTR) fail_errno(fmt::format("waiting for {}", what));
      const int32_t pid = peer == 0 ? header_->learner_pid.load(std::memory_order_acquire)
                                    : slot(peer).pid.load(std::memory_order_acquire);
      std::string problem;
      if (peer != 0 && pid < 0)
        problem = fmt::format("sampler {} left the channel", peer);
      else if (pid > 0 && !process_alive(pid))
        problem = fmt::format("{} (pid {}) is gone", peer_name(peer), pid);
      else if (peer == 0 && header_->closed.load(std::memory_order_acquire))
        problem = "the learner closed the channel";
      if (!problem.empty()) {
        if (sem_trywait(sem) == 0) return;  // it posted just before it left
        fail(fmt::format("{} while waiting for {}", problem, what));
      }
      if (std::chrono::steady_clock::now() > deadline)
        fail(fmt::format("no {} from {} within {} s (is it running?)", what, peer_name(peer),
                         timeout_));
    }
  }

  // Checks a message the semaphore says is whole; returns its size.
  uint64_t check_message(const SharedMessage& m, uint64_t expected_sequence, uint64_t capacity,
                         const std::string& what) const {
    const uint64_t sequence = m.sequence.load(std::memory_order_acquire);
    if (m.magic.load(std::memory_order_relaxed) != kMessageMagic || sequence != expected_sequence)
      fail(fmt::format("torn or out-of-order {}: message {} where {} was expected", what,
                       sequence, expected_sequence));
    const uint64_t size = m.size.load(std::memory_order_relaxed);
    if (size > capacity)
      fail(fmt::format("torn {}: size {} over the capacity of {} bytes", what, size, capacity));
    return size;
  }

  uint8_t* base() const { return static_cast<uint8_t*>(base_); }
  SamplerSlot& slot(int i) const {
    return *reinterpret_cast<SamplerSlot*>(base() + layout_.slots +
                                           static_cast<size_t>(i - 1) * sizeof(SamplerSlot));
  }
  uint8_t* down_area() const { return base() + layout_.down; }
  uint8_t* up_area(int i) const {
    return base() + layout_.up + static_cast<size_t>(i - 1) * layout_.up_stride;
  }

  std::string name_;
  int rank_ = 0, samplers_ = 0;
  double timeout_ = 300;
  void* base_ = nullptr;
  size_t mapped_ = 0;
  Layout layout_;
  ShmHeader* header_ = nullptr;
  bool owner_ = false, attached_ = false;
  // learner
  uint64_t published_ = 0;
  std::vector<bool> pending_ack_;
  std::vector<uint64_t> gathered_;
  // sampler
  uint64_t received_ = 0, sent_ = 0;
  uint64_t last_version_ = 0;  // learner: last published; sampler: last received
  uint64_t bytes_down_ = 0, bytes_up_ = 0;
};

}  // namespace

std::unique_ptr<Channel> make_shm_channel(const std::string& name, int rank, int samplers,
                                          const ShmOptions& options) {
  return std::make_unique<ShmChannel>(name, rank, samplers, options);
}

std::unique_ptr<Channel> make_shm_channel(const std::string& name, int rank, int samplers,
                                          size_t capacity) {
  ShmOptions options;
  options.capacity = capacity;
  return make_shm_channel(name, rank, samplers, options);
}

}  // namespace concord::rl
