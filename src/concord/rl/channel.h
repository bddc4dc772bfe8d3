// Transports between the learner (rank 0) and N samplers (ranks 1..N): weight payloads go down
// (rl/sync.h makes and checks them; a transport moves bytes and never looks inside), rollouts
// come back up. One synchronous round per RL step:
//
//   learner:  publish(version, payload)            sampler:  receive() → (version, payload)
//             ...                                            ... sync checks, generate ...
//             gather() → one message per sampler             send(rollout bytes)
//
// Implementations:
//   in-process  (default) one process plays every role in that order; publish/receive and
//               send/gather hand over buffers in memory (samplers = 1).
//   shm         processes on one machine: a POSIX shared-memory segment (shm_open + mmap) with
//               a header (version, sizes, sequence numbers) and process-shared semaphores; the
//               learner creates it, samplers attach by name. A message is visible only once
//               whole (the sequence number is written last), so a reader never sees half.
//   mpi         OpenMPI: rank 0 learns, ranks 1..N sample (`mpirun -np 1+N concord rl ...`);
//               publish/receive are MPI_Bcast of (version, size) then the bytes, send/gather
//               are MPI_Gatherv. How a user goes past one machine.
// Errors (a peer gone, a size over the segment's capacity, a torn message) throw
// concord::InputError naming the transport and what failed.
//
// Wire format. Every message, in both directions and on every transport, is a MessageHeader
// (four u64 in host byte order, 32 bytes) followed by `size` payload bytes:
//   magic     kMessageMagic ("CCDMSG01"); anything else is a torn or foreign message
//   sequence  1, 2, 3, ... per direction and per sampler: the k-th publish carries k, sampler i's
//             k-th send carries k; a reader checks it is exactly one more than the last it took
//   version   down: the learner step of the weights; up: the version the sampler last received
//   size      payload bytes that follow
// shm segment (name "/concord-<pid>" by default; all offsets 64-byte aligned):
//   ShmHeader      magic (written last, once initialised), layout version, samplers, capacity,
//                  rollout capacity, total size, learner pid, closed flag, the down
//                  MessageHeader
//   SamplerSlot×N  per sampler: its pid (0 not attached, -1 detached), semaphores down_ready
//                  (learner → sampler: message whole), down_acked (sampler → learner: copied
//                  out, the down area may be reused), up_ready (sampler → learner: rollouts
//                  whole), up_free (learner → sampler: rollout area copied out), the up
//                  MessageHeader
//   down area      `capacity` bytes: the weight payload
//   up areas ×N    `rollout_capacity` bytes each: sampler i's rollouts
// The writer fills the area, then version and size, then the sequence (release), then posts the
// semaphore; the reader waits on it, checks magic and sequence (acquire), then copies.
// MPI: publish = MPI_Bcast of the header then of the payload (in chunks under 2^31 bytes);
// gather = MPI_Gather of the headers, then MPI_Gatherv of the payloads (chunked the same way).
// All ranks must share a byte order (concord checks the magic).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace concord::model {
struct ExpertParallel;
}

namespace concord::rl {

// A weight message: the learner step that made the payload. The RL loop (loop.cpp) uses version
// 0 with an empty payload to tell samplers that no step follows (a resumed run that had already
// finished); transports carry it like any other message.
struct WeightMessage {
  uint64_t version = 0;
  std::vector<uint8_t> payload;
};

// The header in front of every message (see "Wire format" above).
struct MessageHeader {
  uint64_t magic = 0;
  uint64_t sequence = 0;
  uint64_t version = 0;
  uint64_t size = 0;
};
static_assert(sizeof(MessageHeader) == 32);
inline constexpr uint64_t kMessageMagic = 0x31304753'4d444343ULL;  // "CCDMSG01" little-endian

class Channel {
 public:
  virtual ~Channel() = default;
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;      // 0: learner; 1..samplers(): a sampler
  virtual int samplers() const = 0;  // N
  // learner
  virtual void publish(uint64_t version, std::span<const uint8_t> payload) = 0;
  virtual std::vector<std::vector<uint8_t>> gather() = 0;  // index i: sampler i + 1
  // sampler
  // The next message into `into`, reusing its buffer: a sampler that keeps one WeightMessage
  // across steps saves allocating (and page-faulting) a payload-sized buffer per sync.
  virtual void receive_into(WeightMessage& into) = 0;
  WeightMessage receive() {
    WeightMessage m;
    receive_into(m);
    return m;
  }
  virtual void send(std::span<const uint8_t> rollouts) = 0;
  // Bytes moved so far in each direction (for the time/bandwidth split): payload bytes this
  // process handed over or took (the learner counts a publish once, not once per sampler).
  virtual uint64_t bytes_down() const = 0;
  virtual uint64_t bytes_up() const = 0;
};

// rank 0 playing sampler 1 too: publish then receive, send then gather (InputError when a
// call comes out of that order).
std::unique_ptr<Channel> make_in_process_channel();

struct ShmOptions {
  size_t capacity = 0;           // bytes of the largest weight payload (required, rank 0)
  size_t rollout_capacity = 0;   // bytes of one sampler's rollouts; 0: same as capacity
  double timeout_seconds = 300;  // longest wait for a peer before InputError ("is it running?")
};
// shm: `name` is the segment name ("/concord-<pid>" by default in the CLI); capacity in bytes
// for one weight message (rollouts use a separate area of the same size per sampler).
// rank 0 creates (and at destruction unlinks) the segment; ranks 1..samplers attach, waiting up
// to the timeout for it to appear. A sampler's capacities may be 0 (take the learner's) or must
// equal them. A dead peer (its pid gone) is noticed within ~0.1 s, a silent one at the timeout.
std::unique_ptr<Channel> make_shm_channel(const std::string& name, int rank, int samplers,
                                          size_t capacity);
std::unique_ptr<Channel> make_shm_channel(const std::string& name, int rank, int samplers,
                                          const ShmOptions& options);
std::string default_shm_name();  // "/concord-<pid of this process>"

// mpi: MPI_Init_thread on first use (MPI_Finalize at exit); rank/samplers from MPI_COMM_WORLD.
// InputError when concord was built without MPI or the world has fewer than 2 ranks. A rank
// that dies makes mpirun end the job (MPI has no timeout of its own).
std::unique_ptr<Channel> make_mpi_channel();
bool mpi_available();
// Whether this process was started by mpirun (OMPI_COMM_WORLD_SIZE / PMI env set).
bool launched_by_mpirun();
// The CLI's error path on the mpi transport: ends every rank of the job with exit_code
// (MPI_Abort) — returning from main instead would hang in MPI_Finalize while the other ranks
// wait in a collective for this one. Without MPI (or before MPI_Init) it just exits.
[[noreturn]] void mpi_abort(int exit_code);

// Expert parallelism over MPI_COMM_WORLD (model::ExpertParallel, issue 23): rank and ranks from the
// world, exchange = MPI_Allgatherv of each rank's rows of the expert outputs (rows * C floats; the
// counts must fit MPI's int); alltoallv (data-parallel attention) = MPI_Alltoall of the parcels'
// sizes, then MPI_Alltoallv of their bytes. InputError when concord was built without MPI.
std::shared_ptr<model::ExpertParallel> make_mpi_expert_parallel();
// Every rank's `mine` (the same length on every rank) gathered at rank 0, rank after rank; empty on
// the other ranks. Collective: every rank calls it.
std::vector<double> mpi_gather_doubles(std::span<const double> mine);
// Rank 0's `bytes` to every rank (MPI_Bcast of the size, then the bytes): the others' `bytes`
// become them. Collective.
void mpi_broadcast_bytes(std::vector<uint8_t>& bytes);
// Whether any rank's `mine` is true (MPI_Allreduce, logical or). Collective.
bool mpi_any(bool mine);
// Every rank's `mine` gathered at rank 0 in rank order; empty on the other ranks. Collective.
std::vector<std::string> mpi_gather_strings(const std::string& mine);

// Sampler processes for `concord rl --transport shm --samplers N`: the learner creates the
// channel (rank 0) first, then starts N copies of this executable (/proc/self/exe), child i
// with `args` followed by "--rank" "<i>" (args[0] is the program name; the rest should name the
// segment, e.g. "--shm-name" with default_shm_name() of the learner). A child gets SIGTERM when
// the learner dies. Destroying a SamplerProcesses that was not waited for terminates and reaps
// the children (the learner failed).
class SamplerProcesses {
 public:
  SamplerProcesses() = default;
  explicit SamplerProcesses(std::vector<pid_t> pids) : pids_(std::move(pids)) {}
  SamplerProcesses(SamplerProcesses&& other) noexcept;
  SamplerProcesses& operator=(SamplerProcesses&& other) noexcept;
  SamplerProcesses(const SamplerProcesses&) = delete;
  SamplerProcesses& operator=(const SamplerProcesses&) = delete;
  ~SamplerProcesses();

  const std::vector<pid_t>& pids() const { return pids_; }
  // Reaps every child (waiting up to timeout_seconds in all, then killing the rest); InputError
  // naming the first that exited non-zero, was killed by a signal or had to be killed.
  void wait(double timeout_seconds = 300);
  void terminate();  // SIGTERM to each child still running, then reap them

 private:
  std::vector<pid_t> pids_;
};
SamplerProcesses spawn_samplers(const std::vector<std::string>& args, int samplers);

}  // namespace concord::rl
