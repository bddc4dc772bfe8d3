// Experts under a memory cap, planned (issue 25; docs/serve.md "Experts under a memory cap"): what a
// cap costs before running under it.
//
// replay() plays a routing trace (`concord generate --routing-trace`: every token's top-k experts
// per MoE application, pass by pass) through the rules model/expert_pager.h documents for a pass
// without prefetch — per pass, per MoE application in order, the experts with rows, resident ones
// first and then the missing ones in ascending order; a missing expert read into the room that
// evicting the least recently used unpinned experts makes — and counts the reads of each phase. It
// shares no code with the pager, so a `--no-prefetch` run's measured reads equal to its count
// check both (tests/serve/cap_model_test.cpp, bench/expert_cap_bench.py).
//
// The time model: a phase (prefill, decode) lasts its compute plus a read's cost per read,
//   seconds(cap) = compute_s + reads(cap) · read_s,
// with compute_s and read_s measured by one run under any cap (calibrate(): its phase seconds
// minus its stalls, and its seconds per read — per phase where the phase read anything: a prefill
// read competes with the batched GEMMs for the caches, a decode read mostly does not), so a run at
// one cap predicts every other.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "concord/serve/ep_sim.h"

namespace concord::serve::capmodel {

struct Experts {
  int64_t num_experts = 0;
  std::vector<int64_t> block_of_application;  // per application (the trace's ids): its block
  std::vector<int64_t> bytes;                 // per block · num_experts + expert: packed bytes (0: not paged)
};

struct Replay {
  int64_t prefill_tokens = 0, decode_tokens = 0;
  int64_t prefill_uses = 0, prefill_reads = 0;
  int64_t decode_uses = 0, decode_reads = 0;
  int64_t evictions = 0, high_water = 0, pinned = 0;
};

// `prefill_passes`: the trace's first passes that are the prefill (the rest decode). InputError when
// the cap cannot hold the largest expert, or the trace names an application the model has not.
Replay replay(const epsim::Trace& trace, const Experts& experts, int64_t cap,
              std::span<const std::pair<int64_t, int64_t>> pinned, int64_t prefill_passes);

// What one run measured of a phase: its seconds, its stalls (seconds waiting for reads) and its
// reads with their seconds.
struct PhaseRun {
  int64_t tokens = 0, reads = 0;
  double seconds = 0, stall_s = 0, read_s = 0;
};
struct Cost {
  double prefill_compute_s = 0, decode_compute_s = 0;  // the phases without reads
  double prefill_read_s = 0, decode_read_s = 0;        // seconds per expert read
};
// From a run without prefetch (its stalls are its reads): compute = seconds - stalls per phase,
// a phase's read_s = its reads' seconds over their count, or both phases' when it read nothing.
// InputError for a run without reads.
Cost calibrate(const PhaseRun& prefill, const PhaseRun& decode);
// From several runs (other caps, any prefetch setting) of the same workload: per phase, the line
// seconds = compute + reads · read_s through their (reads, seconds) by least squares, both
// coefficients >= 0 — a read's whole cost, its stall and what it costs the computation after it
// (the caches it evicted), not only its stall. A phase whose runs all read as many experts (every
// cap reads each expert the prompt routes to once) falls back to calibrate()'s rule, averaged.
// InputError with fewer than two runs.
Cost fit(std::span<const std::pair<PhaseRun, PhaseRun>> runs);
// Predicted seconds of each phase under a replay's reads.
std::pair<double, double> predict_seconds(const Cost& cost, const Replay& replay);

}  // namespace concord::serve::capmodel
