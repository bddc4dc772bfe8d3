// The concord binary: one thin subcommand per job. Usage and input errors print one line to
// stderr and exit 2; internal errors exit 3.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "concord/cli/commands.h"
#include "concord/cli/flags.h"
#include "concord/cli/runtime.h"
#include "concord/numerics/check.h"

namespace {

// The parse error as one line, naming the command it happened in ("rl --steps: ..."). A word
// that names no command where a command is expected (or an option there, or nothing) is
// "unknown", listed with the commands of that level; so is an argument a command does not take.
std::string usage_message(const CLI::App& app, const CLI::ParseError& e) {
  auto is_option = [](const std::string& word) { return word.size() > 1 && word[0] == '-'; };
  const CLI::App* level = &app;
  std::string where;  // "", "codec", "codec encode"
  auto see = [&] { return fmt::format("(see concord{}{} --help)", where.empty() ? "" : " ", where); };
  auto at = [&] { return where.empty() ? std::string() : where + ": "; };
  while (true) {
    const auto commands =
        level->get_subcommands([](const CLI::App* sub) { return !sub->get_group().empty(); });
    const auto parsed = level->get_subcommands();
    const std::vector<std::string> rest = level->remaining();
    if (!commands.empty() && (parsed.empty() || !rest.empty())) {  // a command was expected here
      std::vector<std::string> names;
      for (const CLI::App* sub : commands) names.push_back(sub->get_name());
      if (rest.empty())
        return fmt::format("{}a command is required: {} {}", at(), fmt::join(names, ", "), see());
      return fmt::format("{}unknown {} '{}'; the commands are {} {}", at(),
                         is_option(rest.front()) ? "option" : "command", rest.front(),
                         fmt::join(names, ", "), see());
    }
    if (parsed.empty()) {  // a leaf command
      if (!rest.empty())
        return fmt::format("{}unknown {} '{}' {}", at(), is_option(rest.front()) ? "option" : "argument",
                           rest.front(), see());
      break;
    }
    level = parsed.front();
    where += (where.empty() ? "" : " ") + level->get_name();
  }
  std::string message = e.what();
  if (message.empty()) message = e.get_name();
  return fmt::format("{}{} {}", where.empty() ? "" : where + " ", message, see());
}

}  // namespace

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
  concord::cli::add_serve_command(app);
  concord::cli::add_contract_command(app);
  concord::cli::add_rl_command(app);
  concord::cli::add_rl_report_command(app);
  concord::cli::add_eval_command(app);
  concord::cli::add_flow_command(app);
  concord::cli::add_sched_command(app);
  concord::cli::add_ep_sim_command(app);
  concord::cli::add_cap_plan_command(app);
  concord::cli::add_disagg_plan_command(app);
  concord::cli::add_task_eval_command(app);
  concord::cli::check_text_values(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version (CallForHelp derives from Success)
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "concord: %s\n", usage_message(app, e).c_str());
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
