// Registration of the concord subcommands; each lives in its own <name>_cmd.cpp.
#pragma once

#include <CLI/CLI.hpp>

namespace concord::cli {

void add_codec_command(CLI::App& app);
void add_quant_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_demo_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_contract_command(CLI::App& app);
void add_rl_command(CLI::App& app);
void add_rl_report_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_flow_command(CLI::App& app);
void add_sched_command(CLI::App& app);
void add_ep_sim_command(CLI::App& app);
void add_cap_plan_command(CLI::App& app);
void add_disagg_plan_command(CLI::App& app);
void add_task_eval_command(CLI::App& app);

}  // namespace concord::cli
