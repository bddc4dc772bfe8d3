// The OpenMP wait policy of a concord process (runtime.h): passive unless the user chose one.
#include "concord/cli/runtime.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace concord::cli {

void configure_runtime(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  // A server owns its cores and forks OpenMP teams dozens of times per decode step: there the
  // passive wait's futex wake-ups cost 2.4-2.7x in tokens/s (bench/README.md, "concord serve"),
  // so `serve` keeps libgomp's own bounded spin — and so does `disagg-plan`, which measures the
  // server's engine (how a prefill worker and a decode engine share the cores depends on it).
  if (argv[0] != nullptr && argv[1] != nullptr &&
      (std::strcmp(argv[1], "serve") == 0 || std::strcmp(argv[1], "disagg-plan") == 0))
    return;
  // Set before the exec, so the new image sees it and returns above: the re-exec happens once.
  if (setenv("OMP_WAIT_POLICY", "passive", 0) != 0 || std::getenv("OMP_WAIT_POLICY") == nullptr) return;
  execv("/proc/self/exe", argv);
  unsetenv("OMP_WAIT_POLICY");  // exec failed (no /proc): run on with the default, env as given
}

}  // namespace concord::cli
