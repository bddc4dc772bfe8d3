// concord quant: (being written)
#include "concord/cli/commands.h"

namespace concord::cli {
void add_quant_command(CLI::App& app) { (void)app; }
}  // namespace concord::cli
