// The concord binary: one thin subcommand per job. Usage and input errors print one line to
// stderr and exit 2; internal errors exit 3.
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "concord/cli/commands.h"
#include "concord/cli/runtime.h"
#include "concord/numerics/check.h"

int main(int argc, char** argv) {
  concord::cli::configure_runtime(argv);  // first: may re-exec with OMP_WAIT_POLICY=passive
  CLI::App app{"concord: low-precision training and serving where sampler and learner agree"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "concord 0.1.0");
  concord::cli::add_codec_command(app);
  concord::cli::add_quant_command(app);
  concord::cli::add_inspect_command(app);
  concord::cli::add_demo_command(app);
  concord::cli::add_train_command(app);
  concord::cli::add_export_command(app);
  concord::cli::add_tokenize_command(app);
  concord::cli::add_generate_command(app);
  concord::cli::add_contract_command(app);
  concord::cli::add_rl_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version (CallForHelp derives from Success)
  } catch (const CLI::ParseError& e) {
    std::string message = e.what();
    if (message.empty()) message = e.get_name();
    std::fprintf(stderr, "concord: %s (see --help)\n", message.c_str());
    return 2;
  } catch (const concord::InputError& e) {
    std::fprintf(stderr, "concord: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "concord: %s\n", e.what());
    return 3;
  }
  return 0;
}
