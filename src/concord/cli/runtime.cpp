// The OpenMP wait policy of a concord process (runtime.h): passive unless the user chose one.
#include "concord/cli/runtime.h"

#include <unistd.h>

#include <cstdlib>

namespace concord::cli {

void configure_runtime(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  // Set before the exec, so the new image sees it and returns above: the re-exec happens once.
  if (setenv("OMP_WAIT_POLICY", "passive", 0) != 0 || std::getenv("OMP_WAIT_POLICY") == nullptr) return;
  execv("/proc/self/exe", argv);
  unsetenv("OMP_WAIT_POLICY");  // exec failed (no /proc): run on with the default, env as given
}

}  // namespace concord::cli
