// The MPI transport (OpenMPI): rank 0 learns, ranks 1..N sample; collectives on MPI_COMM_WORLD
// (wire format in channel.h). Built only when CMake found MPI (CONCORD_HAVE_MPI=1).
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "concord/model/model.h"
#include "concord/numerics/check.h"
#include "concord/rl/channel.h"

#if CONCORD_HAVE_MPI
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace concord::rl {

#if CONCORD_HAVE_MPI

namespace {

// Payloads travel in pieces under MPI's int counts.
constexpr size_t kBroadcastChunk = size_t{1} << 30;

// Set when an MPI channel threw: MPI_Finalize at exit would then wait forever for ranks that
// wait on this one, so the exit handler ends the job instead (mpirun stops every rank).
bool g_failed = false;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (g_failed) {
    std::fflush(nullptr);
    std::_Exit(2);  // a rank leaving without MPI_Finalize makes mpirun end the whole job
  }
  MPI_Finalize();
}

void ensure_mpi_initialised() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) return;
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    throw InputError("[rl] mpi channel: MPI_Init_thread failed (start concord with mpirun)");
  std::atexit(finalize_at_exit);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
}

class MpiChannel final : public Channel {
 public:
  MpiChannel() {
    ensure_mpi_initialised();
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    rank_ = rank;
    samplers_ = size - 1;
    if (size < 2)
      throw InputError(fmt::format("[rl] mpi channel: the MPI world has {} rank; run "
                                   "`mpirun -np 1+N concord rl ...` (rank 0 learns, N sample)",
                                   size));
    gathered_.assign(static_cast<size_t>(samplers_), 0);
  }

  std::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int samplers() const override { return samplers_; }

  void publish(uint64_t version, std::span<const uint8_t> payload) override {
    if (rank_ != 0) usage(fmt::format("publish called on sampler rank {}; only rank 0 publishes", rank_));
    MessageHeader h{kMessageMagic, ++published_, version, payload.size()};
    call(MPI_Bcast(&h, 4, MPI_UINT64_T, 0, MPI_COMM_WORLD), "broadcast of the weights header");
    broadcast_bytes(const_cast<uint8_t*>(payload.data()), payload.size());
    bytes_down_ += payload.size();
    last_version_ = version;
  }

  void receive_into(WeightMessage& m) override {
    if (rank_ == 0) usage("receive called on rank 0; only samplers receive");
    MessageHeader h;
    call(MPI_Bcast(&h, 4, MPI_UINT64_T, 0, MPI_COMM_WORLD), "broadcast of the weights header");
    check_header(h, received_ + 1, "weights from the learner");
    m.version = h.version;
    m.payload.resize(h.size);
    broadcast_bytes(m.payload.data(), m.payload.size());
    ++received_;
    last_version_ = h.version;
    bytes_down_ += h.size;
  }

  void send(std::span<const uint8_t> rollouts) override {
    if (rank_ == 0) usage("send called on rank 0; only samplers send rollouts");
    MessageHeader h{kMessageMagic, ++sent_, last_version_, rollouts.size()};
    call(MPI_Gather(&h, 4, MPI_UINT64_T, nullptr, 4, MPI_UINT64_T, 0, MPI_COMM_WORLD),
         "gather of the rollout headers");
    uint64_t largest = 0;
    call(MPI_Bcast(&largest, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD), "broadcast of the rollout size");
    for (uint64_t offset = 0; offset < largest; offset += chunk()) {
      const uint64_t count = offset < rollouts.size() ? std::min<uint64_t>(chunk(), rollouts.size() - offset) : 0;
      call(MPI_Gatherv(const_cast<uint8_t*>(rollouts.data()) + std::min<uint64_t>(offset, rollouts.size()),
                       static_cast<int>(count), MPI_BYTE, nullptr, nullptr, nullptr, MPI_BYTE, 0,
                       MPI_COMM_WORLD),
           "gather of the rollouts");
    }
    bytes_up_ += rollouts.size();
  }

  std::vector<std::vector<uint8_t>> gather() override {
    if (rank_ != 0) usage(fmt::format("gather called on sampler rank {}; only rank 0 gathers", rank_));
    const size_t world = static_cast<size_t>(samplers_) + 1;
    std::vector<MessageHeader> headers(world);
    MessageHeader mine{kMessageMagic, 0, 0, 0};
    call(MPI_Gather(&mine, 4, MPI_UINT64_T, headers.data(), 4, MPI_UINT64_T, 0, MPI_COMM_WORLD),
         "gather of the rollout headers");
    // Every rank finishes the round's collectives before a bad header is reported, so that
    // the others are not left waiting.
    uint64_t largest = 0;
    for (size_t i = 1; i < world; ++i)
      if (headers[i].magic == kMessageMagic) largest = std::max(largest, headers[i].size);
    call(MPI_Bcast(&largest, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD), "broadcast of the rollout size");
    std::vector<std::vector<uint8_t>> out(world - 1);
    for (size_t i = 1; i < world; ++i)
      if (headers[i].magic == kMessageMagic) out[i - 1].resize(headers[i].size);
    std::vector<int> counts(world, 0), displacements(world, 0);
    std::vector<uint8_t> staging;
    for (uint64_t offset = 0; offset < largest; offset += chunk()) {
      int total = 0;
      for (size_t i = 1; i < world; ++i) {
        const uint64_t size = out[i - 1].size();
        counts[i] = static_cast<int>(offset < size ? std::min<uint64_t>(chunk(), size - offset) : 0);
        displacements[i] = total;
        total += counts[i];
      }
      staging.resize(static_cast<size_t>(total));
      call(MPI_Gatherv(nullptr, 0, MPI_BYTE, staging.data(), counts.data(), displacements.data(),
                       MPI_BYTE, 0, MPI_COMM_WORLD),
           "gather of the rollouts");
      for (size_t i = 1; i < world; ++i)
        std::copy_n(staging.data() + displacements[i], counts[i], out[i - 1].data() + offset);
    }
    for (size_t i = 1; i < world; ++i) {
      check_header(headers[i], gathered_[i - 1] + 1, fmt::format("rollouts from sampler {}", i));
      ++gathered_[i - 1];
      bytes_up_ += headers[i].size;
    }
    return out;
  }

  uint64_t bytes_down() const override { return bytes_down_; }
  uint64_t bytes_up() const override { return bytes_up_; }

 private:
  // At most this many bytes per rank in one MPI_Gatherv (the sum of counts must fit an int).
  uint64_t chunk() const {
    return std::min<uint64_t>(kBroadcastChunk, static_cast<uint64_t>(INT_MAX) / samplers_);
  }

  [[noreturn]] void usage(const std::string& what) const {
    throw InputError(fmt::format("[rl] mpi channel (rank {}): {}", rank_, what));
  }
  [[noreturn]] void fail(const std::string& what) const {
    g_failed = true;
    throw InputError(fmt::format("[rl] mpi channel (rank {}): {}", rank_, what));
  }
  void call(int rc, const char* what) const {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(rc, text, &length);
    fail(fmt::format("{} failed: {}", what, std::string(text, static_cast<size_t>(length))));
  }
  void check_header(const MessageHeader& h, uint64_t expected_sequence, const std::string& what) const {
    if (h.magic != kMessageMagic)
      fail(fmt::format("{}: bad magic {:#x} (a torn message, or ranks of another byte order)",
                       what, h.magic));
    if (h.sequence != expected_sequence)
      fail(fmt::format("{}: message {} where {} was expected (ranks out of step)", what,
                       h.sequence, expected_sequence));
  }
  void broadcast_bytes(uint8_t* data, size_t size) const {
    for (size_t offset = 0; offset < size; offset += kBroadcastChunk) {
      const size_t count = std::min(kBroadcastChunk, size - offset);
      call(MPI_Bcast(data + offset, static_cast<int>(count), MPI_BYTE, 0, MPI_COMM_WORLD),
           "broadcast of the weights");
    }
  }

  int rank_ = 0, samplers_ = 0;
  uint64_t published_ = 0, received_ = 0, sent_ = 0, last_version_ = 0;
  std::vector<uint64_t> gathered_;
  uint64_t bytes_down_ = 0, bytes_up_ = 0;
};

}  // namespace

std::unique_ptr<Channel> make_mpi_channel() { return std::make_unique<MpiChannel>(); }
bool mpi_available() { return true; }

std::shared_ptr<model::ExpertParallel> make_mpi_expert_parallel() {
  ensure_mpi_initialised();
  auto ep = std::make_shared<model::ExpertParallel>();
  MPI_Comm_rank(MPI_COMM_WORLD, &ep->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ep->ranks);
  // A moved expert's bytes: the size, then the bytes, point to point (every rank walks the moves
  // in the same order, so each send meets its receive).
  ep->send_recv = [rank = ep->rank](int src, int dst, std::vector<uint8_t>& bytes) {
    constexpr int kTag = 23;
    if (rank == src) {
      const auto n = static_cast<uint64_t>(bytes.size());
      if (n > INT_MAX) {
        g_failed = true;
        throw InputError(fmt::format("[ep] an expert of {} bytes exceeds MPI's int counts", n));
      }
      if (MPI_Send(&n, 1, MPI_UINT64_T, dst, kTag, MPI_COMM_WORLD) != MPI_SUCCESS ||
          MPI_Send(bytes.data(), static_cast<int>(n), MPI_BYTE, dst, kTag, MPI_COMM_WORLD) != MPI_SUCCESS) {
        g_failed = true;
        throw InputError(fmt::format("[ep] rank {}: sending an expert to rank {} failed", rank, dst));
      }
      return;
    }
    uint64_t n = 0;
    if (MPI_Recv(&n, 1, MPI_UINT64_T, src, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS || n > INT_MAX) {
      g_failed = true;
      throw InputError(fmt::format("[ep] rank {}: receiving an expert from rank {} failed", rank, src));
    }
    bytes.resize(static_cast<size_t>(n));
    if (MPI_Recv(bytes.data(), static_cast<int>(n), MPI_BYTE, src, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
      g_failed = true;
      throw InputError(fmt::format("[ep] rank {}: receiving an expert from rank {} failed", rank, src));
    }
  };
  // Data-parallel attention's all-to-all: the parcels' sizes with MPI_Alltoall, then the bytes
  // with MPI_Alltoallv (the totals must fit MPI's int counts).
  ep->alltoallv = [ranks = ep->ranks, rank = ep->rank](const model::ExpertParallel::Parcels& to) {
    const auto R = static_cast<size_t>(ranks);
    if (to.size() != R) {
      g_failed = true;
      throw InputError(fmt::format("[ep] rank {}: {} parcels for {} ranks", rank, to.size(), R));
    }
    std::vector<uint64_t> send_n(R), recv_n(R);
    for (size_t q = 0; q < R; ++q) send_n[q] = to[q].size();
    if (MPI_Alltoall(send_n.data(), 1, MPI_UINT64_T, recv_n.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD) != MPI_SUCCESS) {
      g_failed = true;
      throw InputError(fmt::format("[ep] rank {}: MPI_Alltoall of the parcel sizes failed", rank));
    }
    std::vector<int> send_counts(R), send_displs(R), recv_counts(R), recv_displs(R);
    uint64_t send_total = 0, recv_total = 0;
    for (size_t q = 0; q < R; ++q) {
      send_displs[q] = static_cast<int>(send_total);
      recv_displs[q] = static_cast<int>(recv_total);
      send_total += send_n[q];
      recv_total += recv_n[q];
      if (send_total > INT_MAX || recv_total > INT_MAX) {
        g_failed = true;
        throw InputError(fmt::format("[ep] an MoE layer's rows ({} bytes) exceed MPI's int counts: use smaller batches",
                                     std::max(send_total, recv_total)));
      }
      send_counts[q] = static_cast<int>(send_n[q]);
      recv_counts[q] = static_cast<int>(recv_n[q]);
    }
    std::vector<uint8_t> sent(send_total), all(recv_total);
    for (size_t q = 0; q < R; ++q)
      if (!to[q].empty()) std::memcpy(sent.data() + send_displs[q], to[q].data(), to[q].size());
    const int rc = MPI_Alltoallv(sent.data(), send_counts.data(), send_displs.data(), MPI_BYTE, all.data(),
                                 recv_counts.data(), recv_displs.data(), MPI_BYTE, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
      g_failed = true;
      throw InputError(fmt::format("[ep] rank {}: MPI_Alltoallv of an MoE layer's rows failed ({})", rank, rc));
    }
    model::ExpertParallel::Parcels from(R);
    for (size_t q = 0; q < R; ++q)
      from[q].assign(all.begin() + recv_displs[q], all.begin() + recv_displs[q] + recv_counts[q]);
    return from;
  };
  // Each rank's pieces packed in order, gathered with MPI_Allgatherv, unpacked into their rows.
  ep->exchange = [ranks = ep->ranks, rank = ep->rank](float* y, const std::vector<model::ExpertParallel::RowRanges>& pieces,
                                                     int64_t C) {
    std::vector<int> counts(static_cast<size_t>(ranks)), displs(static_cast<size_t>(ranks));
    int64_t total = 0;
    for (int q = 0; q < ranks; ++q) {
      int64_t n = 0;
      for (const auto& [first, last] : pieces[static_cast<size_t>(q)]) n += (last - first) * C;
      if (total + n > INT_MAX) {
        g_failed = true;
        throw InputError(fmt::format("[ep] an MoE layer's expert outputs ({} floats) exceed MPI's int counts: "
                                     "use smaller batches", total + n));
      }
      counts[static_cast<size_t>(q)] = static_cast<int>(n);
      displs[static_cast<size_t>(q)] = static_cast<int>(total);
      total += n;
    }
    std::vector<float> sent(static_cast<size_t>(counts[static_cast<size_t>(rank)])), all(static_cast<size_t>(total));
    size_t at = 0;
    for (const auto& [first, last] : pieces[static_cast<size_t>(rank)]) {
      std::copy(y + first * C, y + last * C, sent.begin() + static_cast<std::ptrdiff_t>(at));
      at += static_cast<size_t>((last - first) * C);
    }
    const int rc = MPI_Allgatherv(sent.data(), counts[static_cast<size_t>(rank)], MPI_FLOAT, all.data(), counts.data(),
                                  displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
      g_failed = true;
      throw InputError(fmt::format("[ep] rank {}: MPI_Allgatherv of the expert outputs failed ({})", rank, rc));
    }
    for (int q = 0; q < ranks; ++q) {
      size_t from = static_cast<size_t>(displs[static_cast<size_t>(q)]);
      for (const auto& [first, last] : pieces[static_cast<size_t>(q)]) {
        std::copy(all.begin() + static_cast<std::ptrdiff_t>(from), all.begin() + static_cast<std::ptrdiff_t>(from + static_cast<size_t>((last - first) * C)),
                  y + first * C);
        from += static_cast<size_t>((last - first) * C);
      }
    }
  };
  return ep;
}

std::vector<double> mpi_gather_doubles(std::span<const double> mine) {
  ensure_mpi_initialised();
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<double> all(rank == 0 ? mine.size() * static_cast<size_t>(size) : 0);
  if (MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(), static_cast<int>(mine.size()),
                 MPI_DOUBLE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
    g_failed = true;
    throw InputError(fmt::format("[ep] rank {}: MPI_Gather of the measurements failed", rank));
  }
  return all;
}

void mpi_broadcast_bytes(std::vector<uint8_t>& bytes) {
  ensure_mpi_initialised();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  uint64_t n = bytes.size();
  if (MPI_Bcast(&n, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD) != MPI_SUCCESS || n > INT_MAX) {
    g_failed = true;
    throw InputError(fmt::format("[ep] rank {}: broadcasting a message of {} bytes failed", rank, n));
  }
  if (rank != 0) bytes.resize(static_cast<size_t>(n));
  if (n > 0 && MPI_Bcast(bytes.data(), static_cast<int>(n), MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
    g_failed = true;
    throw InputError(fmt::format("[ep] rank {}: broadcasting a message of {} bytes failed", rank, n));
  }
}

bool mpi_any(bool mine) {
  ensure_mpi_initialised();
  int in = mine ? 1 : 0, out = 0;
  if (MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD) != MPI_SUCCESS) {
    g_failed = true;
    throw InputError("[ep] MPI_Allreduce of the ranks' work failed");
  }
  return out != 0;
}

std::vector<std::string> mpi_gather_strings(const std::string& mine) {
  ensure_mpi_initialised();
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (mine.size() > INT_MAX) {
    g_failed = true;
    throw InputError(fmt::format("[ep] rank {}: an output of {} bytes exceeds MPI's int counts", rank, mine.size()));
  }
  const int n = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<size_t>(rank == 0 ? size : 0)), displs(counts.size());
  if (MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
    g_failed = true;
    throw InputError(fmt::format("[ep] rank {}: MPI_Gather of the outputs' sizes failed", rank));
  }
  int64_t total = 0;
  for (size_t q = 0; q < counts.size(); ++q) {
    if (total + counts[q] > INT_MAX) {
      g_failed = true;
      throw InputError("[ep] the ranks' outputs exceed MPI's int counts");
    }
    displs[q] = static_cast<int>(total);
    total += counts[q];
  }
  std::string all(static_cast<size_t>(total), '\0');
  if (MPI_Gatherv(mine.data(), n, MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD) !=
      MPI_SUCCESS) {
    g_failed = true;
    throw InputError(fmt::format("[ep] rank {}: MPI_Gatherv of the outputs failed", rank));
  }
  std::vector<std::string> out;
  for (size_t q = 0; q < counts.size(); ++q) out.push_back(all.substr(static_cast<size_t>(displs[q]), static_cast<size_t>(counts[q])));
  return out;
}

void mpi_abort(int exit_code) {
  std::fflush(nullptr);
  int initialised = 0, finalized = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalized);
  if (initialised && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

#else

std::unique_ptr<Channel> make_mpi_channel() {
  throw InputError("[rl] mpi channel: concord was built without MPI (install OpenMPI, e.g. "
                   "libopenmpi-dev, and re-run cmake)");
}
bool mpi_available() { return false; }

std::shared_ptr<model::ExpertParallel> make_mpi_expert_parallel() {
  throw InputError("[ep] expert parallelism runs over MPI, and concord was built without MPI (install OpenMPI, "
                   "e.g. Debian's libopenmpi-dev, and rebuild)");
}

void mpi_broadcast_bytes(std::vector<uint8_t>&) { throw InputError("[ep] concord was built without MPI"); }

bool mpi_any(bool) { throw InputError("[ep] concord was built without MPI"); }

std::vector<std::string> mpi_gather_strings(const std::string&) { throw InputError("[ep] concord was built without MPI"); }

std::vector<double> mpi_gather_doubles(std::span<const double>) {
  throw InputError("[ep] concord was built without MPI");
}

void mpi_abort(int exit_code) {
  std::fflush(nullptr);
  std::_Exit(exit_code);
}

#endif

}  // namespace concord::rl
