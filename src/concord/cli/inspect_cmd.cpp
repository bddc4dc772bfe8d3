// concord inspect: (being written)
#include "concord/cli/commands.h"

namespace concord::cli {
void add_inspect_command(CLI::App& app) { (void)app; }
}  // namespace concord::cli
