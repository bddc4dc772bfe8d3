// The MPI transport across real processes, run by ctest as `mpirun -np 3` (1 learner + 2
// samplers): several rounds of versioned weights down and rollouts up, every byte and version
// checked on the receiving side, and the byte counters. A failed check ends this rank without
// MPI_Finalize, which makes mpirun end the job with a non-zero status.
#include <cstdio>
#include <memory>
#include <cstdlib>
#include <string>
#include <vector>

#include "concord/numerics/check.h"
#include "concord/rl/channel.h"
#include "channel_payloads.h"

namespace {

using concord::rl::testing::test_bytes;

int g_rank = -1;

void check(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "rl_channel_mpi_check rank %d: FAILED: %s\n", g_rank, what.c_str());
  std::fflush(nullptr);
  std::_Exit(1);
}

// Round r: weight and rollout sizes (0 and odd sizes included; sampler 2's rollouts differ in
// size from sampler 1's, so the gather's displacements matter).
const std::vector<size_t> kWeightSizes = {1 << 20, 0, 1, 4099, 3 << 20};
size_t rollout_size(int rank, size_t round) {
  const size_t base[] = {1000, 0, 17, 1 << 16, 5};
  return base[round] * static_cast<size_t>(rank) + static_cast<size_t>(rank % 2);
}
uint64_t version_of(size_t round) { return 1000 + 13 * round; }

}  // namespace

int main() {
  check(concord::rl::launched_by_mpirun(), "launched_by_mpirun() is false under mpirun");
  check(concord::rl::mpi_available(), "mpi_available() is false in an MPI build");
  std::unique_ptr<concord::rl::Channel> ch;
  try {
    ch = concord::rl::make_mpi_channel();
  } catch (const std::exception& e) {
    check(false, e.what());
  }
  g_rank = ch->rank();
  check(ch->name() == "mpi", "name " + std::string(ch->name()));
  check(ch->samplers() == 2, "samplers " + std::to_string(ch->samplers()) + ", expected 2");
  check(g_rank >= 0 && g_rank <= 2, "rank out of range");
  uint64_t down = 0, up = 0;
  concord::rl::WeightMessage kept;  // odd rounds receive into a reused buffer
  for (size_t r = 0; r < kWeightSizes.size(); ++r) {
    const uint64_t v = version_of(r);
    const std::string round = "round " + std::to_string(r) + ": ";
    if (g_rank == 0) {
      const std::vector<uint8_t> weights = test_bytes(0, v, kWeightSizes[r]);
      ch->publish(v, weights);
      down += weights.size();
      const std::vector<std::vector<uint8_t>> rollouts = ch->gather();
      check(rollouts.size() == 2, round + "gather returned " + std::to_string(rollouts.size()));
      for (int s = 1; s <= 2; ++s) {
        check(rollouts[s - 1] == test_bytes(s, v, rollout_size(s, r)),
              round + "rollouts of sampler " + std::to_string(s) + " differ");
        up += rollouts[s - 1].size();
      }
    } else {
      if (r % 2 == 1) ch->receive_into(kept);
      const concord::rl::WeightMessage m = r % 2 == 1 ? kept : ch->receive();
      check(m.version == v, round + "version " + std::to_string(m.version));
      check(m.payload == test_bytes(0, v, kWeightSizes[r]), round + "weights differ");
      down += m.payload.size();
      const std::vector<uint8_t> rollouts = test_bytes(g_rank, m.version, rollout_size(g_rank, r));
      ch->send(rollouts);
      up += rollouts.size();
    }
  }
  check(ch->bytes_down() == down, "bytes_down " + std::to_string(ch->bytes_down()));
  check(ch->bytes_up() == up, "bytes_up " + std::to_string(ch->bytes_up()));
  // A call on the wrong side is refused before any collective starts.
  bool refused = false;
  try {
    if (g_rank == 0)
      ch->receive();
    else
      ch->gather();
  } catch (const concord::InputError&) {
    refused = true;
  }
  check(refused, "a call on the wrong side was not refused");
  std::printf("rl_channel_mpi_check rank %d: %zu rounds ok\n", g_rank, kWeightSizes.size());
  return 0;
}
