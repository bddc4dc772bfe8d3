// Process-wide runtime setup that must happen before any work: the OpenMP wait policy.
#pragma once

namespace concord::cli {

// When neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set, sets OMP_WAIT_POLICY=passive and
// re-executes /proc/self/exe with the same argv (libgomp reads both variables once, when it is
// loaded, before main: setting them later has no effect). Returns normally when a variable is
// set (the re-executed image, or the user's own choice) or when the re-exec is not possible.
// Why (issue 26): libgomp's default spins ~300,000 iterations (a few ms) at every barrier; on a
// machine whose cores are shared with other work, the spinning threads take the CPU from the
// one that still has work, and a training step ran 14-19x slower instead of 2x (bench/README.md,
// "Speed under contention"). `concord serve` is the exception: a server owns its cores, and its
// many small decode-step forks are 2.4-2.7x slower with passive waits, so it keeps libgomp's
// default bounded spin (bench/README.md, "concord serve"), as does `concord disagg-plan`, which
// measures the server's engine. Call first thing in main(), before
// anything starts a thread.
void configure_runtime(char** argv);

}  // namespace concord::cli
