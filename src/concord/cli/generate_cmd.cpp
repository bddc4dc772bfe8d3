// placeholder
#include "concord/cli/commands.h"
namespace concord::cli {
void add_generate_command(CLI::App&) {}
}  // namespace concord::cli
