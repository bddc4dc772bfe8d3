// The in-process transport, and starting / reaping sampler processes for the shm transport.
#include "concord/rl/channel.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::rl {

namespace {

// One process playing the learner and its single sampler: each call hands a buffer to the
// call that follows it in the round, so a call out of order is a bug in the caller.
class InProcessChannel final : public Channel {
 public:
  std::string_view name() const override { return "in-process"; }
  int rank() const override { return 0; }
  int samplers() const override { return 1; }

  void publish(uint64_t version, std::span<const uint8_t> payload) override {
    if (down_)
      throw InputError(fmt::format("[rl] in-process channel: publish of version {} before "
                                   "version {} was received",
                                   version, down_->version));
    down_ = WeightMessage{version, {payload.begin(), payload.end()}};
    bytes_down_ += payload.size();
  }
  void receive_into(WeightMessage& into) override {
    if (!down_) throw InputError("[rl] in-process channel: receive before any publish");
    into = std::move(*down_);
    down_.reset();
  }
  void send(std::span<const uint8_t> rollouts) override {
    if (up_) throw InputError("[rl] in-process channel: send before the last rollouts were gathered");
    up_.emplace(rollouts.begin(), rollouts.end());
    bytes_up_ += rollouts.size();
  }
  std::vector<std::vector<uint8_t>> gather() override {
    if (!up_) throw InputError("[rl] in-process channel: gather before the sampler sent rollouts");
    std::vector<std::vector<uint8_t>> out;
    out.push_back(std::move(*up_));
    up_.reset();
    return out;
  }
  uint64_t bytes_down() const override { return bytes_down_; }
  uint64_t bytes_up() const override { return bytes_up_; }

 private:
  std::optional<WeightMessage> down_;
  std::optional<std::vector<uint8_t>> up_;
  uint64_t bytes_down_ = 0, bytes_up_ = 0;
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* s = strsignal(WTERMSIG(status));
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status), s ? s : "?");
  }
  return fmt::format("ended with wait status {}", status);
}

}  // namespace

std::unique_ptr<Channel> make_in_process_channel() { return std::make_unique<InProcessChannel>(); }

std::string default_shm_name() { return fmt::format("/concord-{}", static_cast<long>(getpid())); }

bool launched_by_mpirun() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (const char* v = std::getenv(var); v && *v) return true;
  return false;
}

SamplerProcesses::SamplerProcesses(SamplerProcesses&& other) noexcept
    : pids_(std::move(other.pids_)) {
  other.pids_.clear();
}

SamplerProcesses& SamplerProcesses::operator=(SamplerProcesses&& other) noexcept {
  if (this != &other) {
    terminate();
    pids_ = std::move(other.pids_);
    other.pids_.clear();
  }
  return *this;
}

SamplerProcesses::~SamplerProcesses() { terminate(); }

void SamplerProcesses::terminate() {
  for (pid_t pid : pids_) kill(pid, SIGTERM);
  for (pid_t pid : pids_) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  pids_.clear();
}

void SamplerProcesses::wait(double timeout_seconds) {
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(timeout_seconds));
  std::vector<int> statuses(pids_.size(), 0);
  std::vector<bool> done(pids_.size(), false), killed(pids_.size(), false);
  size_t remaining = pids_.size();
  while (remaining > 0) {
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (done[i]) continue;
      const pid_t r = waitpid(pids_[i], &statuses[i], WNOHANG);
      if (r == pids_[i] || (r < 0 && errno == ECHILD)) {
        done[i] = true;
        --remaining;
      }
    }
    if (remaining == 0) break;
    if (Clock::now() > deadline) {
      for (size_t i = 0; i < pids_.size(); ++i) {
        if (done[i]) continue;
        kill(pids_[i], SIGKILL);
        while (waitpid(pids_[i], &statuses[i], 0) < 0 && errno == EINTR) {
        }
        done[i] = killed[i] = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::vector<pid_t> pids = std::move(pids_);
  pids_.clear();
  for (size_t i = 0; i < pids.size(); ++i) {
    if (killed[i])
      throw InputError(fmt::format("[rl] sampler {} (pid {}) still ran after {} s and was killed",
                                   i + 1, static_cast<long>(pids[i]), timeout_seconds));
    if (!WIFEXITED(statuses[i]) || WEXITSTATUS(statuses[i]) != 0)
      throw InputError(fmt::format("[rl] sampler {} (pid {}) {}", i + 1,
                                   static_cast<long>(pids[i]), describe_status(statuses[i])));
  }
}

SamplerProcesses spawn_samplers(const std::vector<std::string>& args, int samplers) {
  if (args.empty()) throw InputError("[rl] spawn samplers: empty argument list (args[0] is the program)");
  if (samplers < 1)
    throw InputError(fmt::format("[rl] spawn samplers: {} samplers; need at least 1", samplers));
  // Everything the child needs is built before fork: between fork and exec only
  // async-signal-safe calls are allowed (the learner may already run OpenMP threads).
  const pid_t parent = getpid();
  std::vector<std::vector<std::string>> argvs;
  for (int i = 1; i <= samplers; ++i) {
    std::vector<std::string> a = args;
    a.push_back("--rank");
    a.push_back(std::to_string(i));
    argvs.push_back(std::move(a));
  }
  std::vector<std::vector<char*>> pointers;
  for (std::vector<std::string>& a : argvs) {
    std::vector<char*> p;
    for (std::string& s : a) p.push_back(s.data());
    p.push_back(nullptr);
    pointers.push_back(std::move(p));
  }
  std::vector<pid_t> pids;
  for (int i = 0; i < samplers; ++i) {
    const pid_t pid = fork();
    if (pid < 0) {
      const int err = errno;
      SamplerProcesses started(std::move(pids));  // terminates the ones already running
      throw InputError(fmt::format("[rl] spawn samplers: fork of sampler {} failed: {}", i + 1,
                                   std::strerror(err)));
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(127);  // the learner died before prctl took effect
      execv("/proc/self/exe", pointers[static_cast<size_t>(i)].data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  return SamplerProcesses(std::move(pids));
}

}  // namespace concord::rl
