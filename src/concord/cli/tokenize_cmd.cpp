// placeholder
#include "concord/cli/commands.h"
namespace concord::cli {
void add_tokenize_command(CLI::App&) {}
}  // namespace concord::cli
