// placeholder
#include "concord/cli/commands.h"
namespace concord::cli {
void add_export_command(CLI::App&) {}
}  // namespace concord::cli
