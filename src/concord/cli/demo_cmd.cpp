// concord demo: (being written)
#include "concord/cli/commands.h"

namespace concord::cli {
void add_demo_command(CLI::App& app) { (void)app; }
}  // namespace concord::cli
