// Transports: the in-process channel, the shared-memory channel between forked processes (several
// versioned rounds checked byte for byte, capacity errors, timeouts, dead and departed peers, the
// learner closing, unlinking), spawning sampler processes, and the MPI availability switches.
// (The MPI transport itself runs under mpirun: channel_mpi_check.cpp.)
#include "concord/rl/channel.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "concord/numerics/check.h"
#include "channel_payloads.h"

namespace concord::rl {
namespace {

using testing::test_bytes;

std::string unique_name(const std::string& tag) {
  static std::atomic<int> counter{0};
  return "/concord-test-" + std::to_string(getpid()) + "-" + tag + "-" + std::to_string(counter++);
}

bool segment_exists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return errno != ENOENT;
  close(fd);
  return true;
}

// Runs `body` in a forked child; its return value (or 90 on an exception) is the exit status.
pid_t fork_child(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid != 0) return pid;
  int code = 0;
  try {
    code = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child %d: %s\n", static_cast<int>(getpid()), e.what());
    code = 90;
  }
  std::fflush(nullptr);
  _exit(code);
}

// The exit status of a child (128 + signal when killed).
int wait_child(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- in-process -------------------------------------------------------------------------

TEST(InProcessChannel, RoundsHandOverExactBytes) {
  auto ch = make_in_process_channel();
  EXPECT_EQ(ch->name(), "in-process");
  EXPECT_EQ(ch->rank(), 0);
  EXPECT_EQ(ch->samplers(), 1);
  uint64_t down = 0, up = 0;
  for (uint64_t v : {3u, 4u, 9u}) {
    const std::vector<uint8_t> weights = test_bytes(0, v, 100 * v);
    ch->publish(v, weights);
    const WeightMessage m = ch->receive();
    EXPECT_EQ(m.version, v);
    EXPECT_EQ(m.payload, weights);
    const std::vector<uint8_t> rollouts = test_bytes(1, v, 7 * v);
    ch->send(rollouts);
    const std::vector<std::vector<uint8_t>> got = ch->gather();
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0], rollouts);
    down += weights.size();
    up += rollouts.size();
  }
  EXPECT_EQ(ch->bytes_down(), down);
  EXPECT_EQ(ch->bytes_up(), up);
}

TEST(InProcessChannel, CallsOutOfOrderAreErrors) {
  auto ch = make_in_process_channel();
  EXPECT_NE(error_of([&] { ch->receive(); }).find("receive before any publish"), std::string::npos);
  EXPECT_NE(error_of([&] { ch->gather(); }).find("gather before"), std::string::npos);
  ch->publish(1, test_bytes(0, 1, 5));
  EXPECT_NE(error_of([&] { ch->publish(2, test_bytes(0, 2, 5)); }).find("before version 1 was received"),
            std::string::npos);
  EXPECT_EQ(ch->receive().version, 1u);
  ch->send(test_bytes(1, 1, 3));
  EXPECT_NE(error_of([&] { ch->send(test_bytes(1, 1, 3)); }).find("send before"), std::string::npos);
  EXPECT_EQ(ch->gather()[0], test_bytes(1, 1, 3));
  // Empty messages are messages.
  ch->publish(2, {});
  WeightMessage m{7, {1, 2}};
  ch->receive_into(m);
  EXPECT_EQ(m.version, 2u);
  EXPECT_TRUE(m.payload.empty());
}

// ---- shm --------------------------------------------------------------------------------

constexpr size_t kCapacity = 4096;
constexpr size_t kRolloutCapacity = 512;
const std::vector<size_t> kWeightSizes = {kCapacity, 0, 1, 1000, kCapacity - 1};
uint64_t version_of(size_t round) { return 100 + 7 * round; }
size_t rollout_size(int rank, size_t round) {
  const size_t sizes[] = {kRolloutCapacity, 0, 3, 61, 100};
  return sizes[round] == 61 ? 61 * static_cast<size_t>(rank) : sizes[round];
}

ShmOptions test_options(double timeout = 20) {
  ShmOptions o;
  o.capacity = kCapacity;
  o.rollout_capacity = kRolloutCapacity;
  o.timeout_seconds = timeout;
  return o;
}

// A sampler process: every round, exact version and bytes, then its own rollouts back.
int sampler_rounds(const std::string& name, int rank, int samplers) {
  ShmOptions o;  // capacities 0: take the learner's
  o.timeout_seconds = 20;
  auto ch = make_shm_channel(name, rank, samplers, o);
  if (ch->rank() != rank || ch->samplers() != samplers || ch->name() != "shm") return 10;
  uint64_t down = 0, up = 0;
  for (size_t r = 0; r < kWeightSizes.size(); ++r) {
    const WeightMessage m = ch->receive();
    if (m.version != version_of(r)) return 11;
    if (m.payload != test_bytes(0, m.version, kWeightSizes[r])) return 12;
    const std::vector<uint8_t> rollouts = test_bytes(rank, m.version, rollout_size(rank, r));
    ch->send(rollouts);
    down += m.payload.size();
    up += rollouts.size();
  }
  if (ch->bytes_down() != down || ch->bytes_up() != up) return 13;
  return 0;
}

TEST(ShmChannel, ForkedSamplersGetEveryVersionByteForByte) {
  const std::string name = unique_name("rounds");
  constexpr int kSamplers = 2;
  // The samplers start before the segment exists: attaching waits for the learner.
  std::vector<pid_t> children;
  for (int rank = 1; rank <= kSamplers; ++rank)
    children.push_back(fork_child([&, rank] { return sampler_rounds(name, rank, kSamplers); }));
  usleep(50'000);
  {
    auto learner = make_shm_channel(name, 0, kSamplers, test_options());
    EXPECT_TRUE(segment_exists(name));
    uint64_t down = 0, up = 0;
    for (size_t r = 0; r < kWeightSizes.size(); ++r) {
      const std::vector<uint8_t> weights = test_bytes(0, version_of(r), kWeightSizes[r]);
      learner->publish(version_of(r), weights);
      down += weights.size();
      const std::vector<std::vector<uint8_t>> rollouts = learner->gather();
      ASSERT_EQ(rollouts.size(), static_cast<size_t>(kSamplers));
      for (int rank = 1; rank <= kSamplers; ++rank) {
        EXPECT_EQ(rollouts[rank - 1], test_bytes(rank, version_of(r), rollout_size(rank, r)))
            << "round " << r << " sampler " << rank;
        up += rollouts[rank - 1].size();
      }
    }
    EXPECT_EQ(learner->bytes_down(), down);
    EXPECT_EQ(learner->bytes_up(), up);
  }
  EXPECT_FALSE(segment_exists(name)) << "the learner must unlink its segment";
  for (pid_t pid : children) EXPECT_EQ(wait_child(pid), 0);
}

TEST(ShmChannel, OneProcessCanPlayBothSides) {
  const std::string name = unique_name("self");
  auto learner = make_shm_channel(name, 0, 1, kCapacity);
  auto sampler = make_shm_channel(name, 1, 1, kCapacity);
  for (uint64_t v = 1; v <= 3; ++v) {
    learner->publish(v, test_bytes(0, v, 64 * v));
    const WeightMessage m = sampler->receive();
    EXPECT_EQ(m.version, v);
    EXPECT_EQ(m.payload, test_bytes(0, v, 64 * v));
    sampler->send(test_bytes(1, v, kCapacity));  // rollout capacity defaults to the capacity
    EXPECT_EQ(learner->gather()[0], test_bytes(1, v, kCapacity));
  }
  // receive_into reuses the caller's buffer (no allocation per sync) and leaves it untouched
  // when the receive fails.
  WeightMessage kept;
  kept.payload.reserve(kCapacity);
  const uint8_t* buffer = kept.payload.data();
  for (uint64_t v = 4; v <= 6; ++v) {
    learner->publish(v, test_bytes(0, v, kCapacity - 10 * v));
    sampler->receive_into(kept);
    EXPECT_EQ(kept.version, v);
    EXPECT_EQ(kept.payload, test_bytes(0, v, kCapacity - 10 * v));
    EXPECT_EQ(kept.payload.data(), buffer);
    sampler->send({});
    EXPECT_TRUE(learner->gather()[0].empty());
  }
}

TEST(ShmChannel, OverCapacityIsAnErrorAndChangesNothing) {
  const std::string name = unique_name("capacity");
  auto learner = make_shm_channel(name, 0, 1, test_options());
  auto sampler = make_shm_channel(name, 1, 1, test_options());
  const std::string e = error_of([&] { learner->publish(1, test_bytes(0, 1, kCapacity + 1)); });
  EXPECT_NE(e.find("[rl] shm channel"), std::string::npos) << e;
  EXPECT_NE(e.find("4097 bytes is over the segment's capacity of 4096"), std::string::npos) << e;
  EXPECT_EQ(learner->bytes_down(), 0u);
  // The refused publish used no sequence number: the next one is message 1.
  learner->publish(2, test_bytes(0, 2, 10));
  EXPECT_EQ(sampler->receive().version, 2u);
  const std::string e2 = error_of([&] { sampler->send(test_bytes(1, 2, kRolloutCapacity + 1)); });
  EXPECT_NE(e2.find("over the segment's rollout capacity of 512"), std::string::npos) << e2;
  sampler->send(test_bytes(1, 2, kRolloutCapacity));
  EXPECT_EQ(learner->gather()[0], test_bytes(1, 2, kRolloutCapacity));
}

TEST(ShmChannel, BadArgumentsAndMismatchedPeersAreErrors) {
  const std::string name = unique_name("args");
  EXPECT_NE(error_of([] { make_shm_channel("no-slash", 0, 1, 16); }).find("segment name"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_shm_channel("/a/b", 0, 1, 16); }).find("segment name"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_shm_channel(name, 0, 1, 0); }).find("capacity 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_shm_channel(name, 3, 2, 16); }).find("rank 3 outside [0, 2]"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_shm_channel(name, 0, 0, 16); }).find("0 samplers"),
            std::string::npos);
  EXPECT_FALSE(segment_exists(name));

  auto learner = make_shm_channel(name, 0, 2, test_options());
  EXPECT_NE(error_of([&] { make_shm_channel(name, 0, 2, test_options()); }).find("already exists"),
            std::string::npos);
  EXPECT_NE(error_of([&] { make_shm_channel(name, 1, 3, test_options()); })
                .find("serves 2 samplers, this process was told 3"),
            std::string::npos);
  ShmOptions other = test_options();
  other.capacity = 8192;
  EXPECT_NE(error_of([&] { make_shm_channel(name, 1, 2, other); }).find("capacity 8192 bytes differs"),
            std::string::npos);
  auto sampler = make_shm_channel(name, 1, 2, test_options());
  EXPECT_NE(error_of([&] { make_shm_channel(name, 1, 2, test_options()); })
                .find("sampler rank 1 is already attached by pid " + std::to_string(getpid())),
            std::string::npos);
  EXPECT_NE(error_of([&] { learner->receive(); }).find("only samplers receive"), std::string::npos);
  EXPECT_NE(error_of([&] { sampler->publish(1, {}); }).find("only rank 0 publishes"),
            std::string::npos);
}

TEST(ShmChannel, WaitsTimeOutNamingTheTransport) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of([] {
    make_shm_channel(unique_name("absent"), 1, 1, test_options(0.2));
  });
  EXPECT_NE(e.find("[rl] shm channel"), std::string::npos) << e;
  EXPECT_NE(e.find("no segment appeared within 0.2 s"), std::string::npos) << e;

  const std::string name = unique_name("silent");
  auto learner = make_shm_channel(name, 0, 1, test_options(0.2));
  auto sampler = make_shm_channel(name, 1, 1, test_options(0.2));
  const std::string e2 = error_of([&] { sampler->receive(); });
  EXPECT_NE(e2.find("no weights (message 1) from the learner within 0.2 s"), std::string::npos) << e2;
  WeightMessage kept{9, {1, 2, 3}};
  EXPECT_THROW(sampler->receive_into(kept), InputError);
  EXPECT_EQ(kept.version, 9u);
  EXPECT_EQ(kept.payload, (std::vector<uint8_t>{1, 2, 3}));
  const std::string e3 = error_of([&] { learner->gather(); });
  EXPECT_NE(e3.find("no rollouts (message 1) from sampler 1 within 0.2 s"), std::string::npos) << e3;
  EXPECT_LT(seconds_since(t0), 3.0);
}

TEST(ShmChannel, ADeadSamplerIsNoticedLongBeforeTheTimeout) {
  const std::string name = unique_name("dead");
  auto learner = make_shm_channel(name, 0, 1, test_options(60));
  // The child attaches and dies without detaching (as a crash would); the learner is told.
  const pid_t child = fork_child([&] {
    auto s = make_shm_channel(name, 1, 1, test_options());
    _exit(0);  // no destructor runs: the slot still names this pid
    return 0;
  });
  const auto t0 = std::chrono::steady_clock::now();
  learner->publish(1, test_bytes(0, 1, 10));
  const std::string e = error_of([&] { learner->gather(); });
  EXPECT_NE(e.find("sampler 1 (pid " + std::to_string(child) + ") is gone while waiting for rollouts"),
            std::string::npos)
      << e;
  EXPECT_LT(seconds_since(t0), 10.0);
  EXPECT_EQ(wait_child(child), 0);
}

TEST(ShmChannel, ASamplerThatLeftIsReported) {
  const std::string name = unique_name("left");
  auto learner = make_shm_channel(name, 0, 1, test_options(60));
  const pid_t child = fork_child([&] {
    auto s = make_shm_channel(name, 1, 1, test_options());
    return s->receive().version == 1 ? 0 : 1;  // takes one message and detaches
  });
  learner->publish(1, test_bytes(0, 1, 10));
  EXPECT_EQ(wait_child(child), 0);
  const std::string e = error_of([&] { learner->gather(); });
  EXPECT_NE(e.find("sampler 1 left the channel while waiting for rollouts"), std::string::npos) << e;
  // A rank that left cannot come back into the same run.
  EXPECT_NE(error_of([&] { make_shm_channel(name, 1, 1, test_options()); }).find("attached before and left"),
            std::string::npos);
}

TEST(ShmChannel, ClosingTheLearnerWakesAWaitingSampler) {
  const std::string name = unique_name("close");
  auto learner = make_shm_channel(name, 0, 1, test_options(60));
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork_child([&] {
    auto s = make_shm_channel(name, 1, 1, test_options(60));
    const char byte = 1;
    if (write(ready[1], &byte, 1) != 1) return 2;
    // The last weights published before the close are still delivered...
    if (s->receive().payload != test_bytes(0, 5, 33)) return 3;
    // ...then the close ends the wait at once rather than at the timeout.
    const std::string e = error_of([&] { s->receive(); });
    return e.find("the learner closed the channel") != std::string::npos ? 0 : 4;
  });
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1);
  learner->publish(5, test_bytes(0, 5, 33));
  const auto t0 = std::chrono::steady_clock::now();
  learner.reset();
  EXPECT_FALSE(segment_exists(name));
  EXPECT_EQ(wait_child(child), 0);
  EXPECT_LT(seconds_since(t0), 10.0);
  close(ready[0]);
  close(ready[1]);
}

TEST(ShmChannel, DefaultNameCarriesThePid) {
  EXPECT_EQ(default_shm_name(), "/concord-" + std::to_string(getpid()));
}

// ---- spawning samplers --------------------------------------------------------------------

// The body of a spawned sampler: this test binary re-executed with --gtest_filter naming this
// test and "--rank <i>" appended by spawn_samplers. Skipped when run directly.
int rank_from_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--rank") return std::stoi(args[i + 1]);
  return -1;
}

TEST(SpawnedSampler, Body) {
  const char* name = std::getenv("CONCORD_TEST_SHM_NAME");
  if (!name) GTEST_SKIP() << "runs only inside ChannelSpawn tests";
  if (std::getenv("CONCORD_TEST_SPAWN_FAIL")) std::_Exit(3);  // a sampler that fails
  const int rank = rank_from_command_line();
  ASSERT_GE(rank, 1);
  auto ch = make_shm_channel(name, rank, 2, test_options());
  const WeightMessage m = ch->receive();
  EXPECT_EQ(m.payload, test_bytes(0, m.version, 77));
  ch->send(test_bytes(rank, m.version, 5 + rank));
}

std::vector<std::string> spawned_body_args() {
  return {"rl_channel_test", "--gtest_filter=SpawnedSampler.Body"};
}

TEST(ChannelSpawn, SamplersRunThisExecutableWithTheirRank) {
  const std::string name = unique_name("spawn");
  setenv("CONCORD_TEST_SHM_NAME", name.c_str(), 1);
  auto learner = make_shm_channel(name, 0, 2, test_options());
  SamplerProcesses children = spawn_samplers(spawned_body_args(), 2);
  unsetenv("CONCORD_TEST_SHM_NAME");
  ASSERT_EQ(children.pids().size(), 2u);
  learner->publish(42, test_bytes(0, 42, 77));
  const std::vector<std::vector<uint8_t>> got = learner->gather();
  EXPECT_EQ(got[0], test_bytes(1, 42, 6));
  EXPECT_EQ(got[1], test_bytes(2, 42, 7));
  EXPECT_NO_THROW(children.wait(30));
  EXPECT_TRUE(children.pids().empty());
}

TEST(ChannelSpawn, AFailingSamplerIsReportedByWait) {
  const std::string name = unique_name("spawnfail");
  setenv("CONCORD_TEST_SHM_NAME", name.c_str(), 1);
  setenv("CONCORD_TEST_SPAWN_FAIL", "1", 1);
  SamplerProcesses children = spawn_samplers(spawned_body_args(), 1);
  unsetenv("CONCORD_TEST_SHM_NAME");
  unsetenv("CONCORD_TEST_SPAWN_FAIL");
  const pid_t pid = children.pids().at(0);
  const std::string e = error_of([&] { children.wait(30); });
  EXPECT_NE(e.find("[rl] sampler 1 (pid " + std::to_string(pid) + ") exited with status 3"),
            std::string::npos)
      << e;
}

TEST(ChannelSpawn, DestroyingUnwaitedSamplersKillsAndReapsThem) {
  const std::string name = unique_name("spawnkill");
  setenv("CONCORD_TEST_SHM_NAME", name.c_str(), 1);
  auto learner = make_shm_channel(name, 0, 2, test_options());
  std::vector<pid_t> pids;
  {
    SamplerProcesses children = spawn_samplers(spawned_body_args(), 2);
    unsetenv("CONCORD_TEST_SHM_NAME");
    pids = children.pids();
    usleep(100'000);  // they attach and wait for weights that never come
  }
  for (pid_t pid : pids) {
    EXPECT_EQ(kill(pid, 0), -1);
    EXPECT_EQ(errno, ESRCH) << "pid " << pid << " was not reaped";
  }
  EXPECT_NE(error_of([] { spawn_samplers({}, 1); }).find("empty argument list"), std::string::npos);
  EXPECT_NE(error_of([] { spawn_samplers({"x"}, 0); }).find("0 samplers"), std::string::npos);
}

// ---- mpi switches -------------------------------------------------------------------------

TEST(MpiChannel, LaunchedByMpirunReadsTheEnvironment) {
  const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
  std::vector<std::string> saved;
  std::vector<bool> had;
  for (const char* v : vars) {
    const char* value = std::getenv(v);
    had.push_back(value != nullptr);
    saved.push_back(value ? value : "");
    unsetenv(v);
  }
  EXPECT_FALSE(launched_by_mpirun());
  for (const char* v : vars) {
    setenv(v, "3", 1);
    EXPECT_TRUE(launched_by_mpirun()) << v;
    unsetenv(v);
  }
  for (size_t i = 0; i < 3; ++i) {
    if (had[i]) setenv(vars[i], saved[i].c_str(), 1);
  }
}

TEST(MpiChannel, WithoutMpiTheChannelSaysSo) {
  if (mpi_available()) GTEST_SKIP() << "built with MPI: rl_channel_mpi runs it under mpirun";
  EXPECT_NE(error_of([] { make_mpi_channel(); }).find("built without MPI"), std::string::npos);
}

}  // namespace
}  // namespace concord::rl
