// concord task-eval: how well a model does on the verifiable tasks (rl/tasks.h) before any RL —
// the starting reward a GRPO run begins from, per task and difficulty, so that tasks can be chosen
// whose starting reward is neither ~0 (no signal) nor ~1 (nothing to learn) (issue 22). Every
// example is sampled `--group` times with the engine, as a GRPO step samples a group; the table
// reports the mean reward, the share of prompts solved at least once (pass@G) and the share of
// groups whose rewards differ (the ones GRPO's group-relative advantage learns from).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/cli/commands.h"
#include "concord/cli/flags.h"
#include "concord/io/atomic_file.h"
#include "concord/model/files.h"
#include "concord/numerics/check.h"
#include "concord/numerics/philox.h"
#include "concord/rl/tasks.h"
#include "concord/rl/text.h"
#include "concord/serve/engine.h"

namespace concord::cli {
namespace {

struct TaskEvalOptions {
  std::string model, policy = "bf16", json_path;
  std::vector<std::string> tasks;
  std::vector<int32_t> difficulties = {1};
  int64_t prompts = 32, group = 4, max_new = 32, show = 2;
  double temperature = 1.0;
  uint64_t seed = 1;
  bool completion_form = false;
};

// The seed of sample j of example i: independent of batching and thread count.
uint64_t sample_seed(uint64_t seed, int64_t i, int64_t j) {
  const numerics::PhiloxBlock r = numerics::philox4x32_10(
      {static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), static_cast<uint32_t>(j), 0x54455641u},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  return (static_cast<uint64_t>(r[0]) << 32) | r[1];
}

// A JSON string as a quoted line (a byte-level model's reply need not be UTF-8: U+FFFD for those bytes).
std::string quoted(const nlohmann::json& text) {
  return text.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void run_task_eval(const TaskEvalOptions& o) {
  for (const std::string& name : o.tasks) {  // before the model loads: InputError naming the known tasks
    try {
      if (name != rl::kMixedTask) rl::task(name);
      for (int32_t d : o.difficulties) rl::generate_examples(name, o.seed, 0, d);
    } catch (const InputError& e) {
      throw InputError(fmt::format("[task-eval] --task {}: {}", name, e.what()));
    }
  }
  model::LoadedModel loaded = model::load_model(o.model, o.policy);
  if (!loaded.source.tokenizer) throw InputError(fmt::format("[task-eval] {}: the model has no tokenizer", o.model));
  // The prompts, stops and reading of replies of `concord rl --init-from` the same model
  // (rl/text.h): an instruct model (a chat template) is asked the instruction in a chat turn and
  // scored on the last number / word of its reply; --completion-form (or a model without a
  // template) gives it "Q: ..\nA: " and scores the first line.
  const rl::RlText text = rl::RlText::of_model(o.model, !o.completion_form);
  const bool chat = text.kind() == rl::RlText::Kind::chat;
  loaded.model.prepare_weights();
  serve::Engine engine(loaded.model, {.max_sequences = std::clamp<int64_t>(o.prompts * o.group, 1, 64)});
  std::printf("task-eval: %s, policy %s, %s form, %lld prompts x %lld samples per task and difficulty, "
              "temperature %g, max %lld new tokens, seed %llu\n",
              o.model.c_str(), o.policy.c_str(), chat ? "chat (last number / word)" : "completion (first line)",
              static_cast<long long>(o.prompts), static_cast<long long>(o.group), o.temperature,
              static_cast<long long>(o.max_new), static_cast<unsigned long long>(o.seed));
  std::printf("%-8s %4s %8s %8s %8s %8s\n", "task", "d", "reward", "pass@G", "mixed", "tokens");
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& name : o.tasks) {
    for (int32_t d : o.difficulties) {
      const std::vector<rl::TaskExample> examples = rl::generate_examples(name, o.seed, o.prompts, d);
      std::vector<serve::Request> requests;
      for (size_t i = 0; i < examples.size(); ++i) {
        const std::vector<int32_t> prompt = text.prompt(examples[i]);
        for (int64_t j = 0; j < o.group; ++j) {
          serve::Request r;
          r.prompt = prompt;
          r.sampling.temperature = static_cast<float>(o.temperature);
          r.sampling.seed = sample_seed(o.seed, static_cast<int64_t>(i), j);
          r.max_tokens = o.max_new;
          r.stop_tokens = text.stop_tokens();
          requests.push_back(std::move(r));
        }
      }
      const std::vector<serve::Completion> done = engine.generate(std::move(requests));
      double reward_sum = 0;
      int64_t solved = 0, mixed = 0, tokens = 0;
      nlohmann::json shown = nlohmann::json::array();
      for (size_t i = 0; i < examples.size(); ++i) {
        double group_sum = 0;
        for (int64_t j = 0; j < o.group; ++j) {
          const serve::Completion& c = done[i * static_cast<size_t>(o.group) + static_cast<size_t>(j)];
          const std::string reply = text.completion(c.tokens);
          const double r = rl::task(examples[i].task).reward(examples[i], reply, text.form());
          group_sum += r;
          tokens += static_cast<int64_t>(c.tokens.size());
          if (static_cast<int64_t>(shown.size()) < o.show && j == 0)
            shown.push_back({{"question", chat ? examples[i].instruction : examples[i].prompt},
                             {"answer", examples[i].answer}, {"completion", reply}, {"reward", r}});
        }
        reward_sum += group_sum;
        solved += group_sum > 0 ? 1 : 0;
        mixed += group_sum > 0 && group_sum < static_cast<double>(o.group) ? 1 : 0;
      }
      const double n = static_cast<double>(examples.size());
      const double reward = reward_sum / (n * static_cast<double>(o.group));
      std::printf("%-8s %4d %8.3f %8.3f %8.3f %8.1f\n", name.c_str(), d, reward,
                  static_cast<double>(solved) / n, static_cast<double>(mixed) / n,
                  static_cast<double>(tokens) / (n * static_cast<double>(o.group)));
      for (const auto& s : shown)
        std::printf("    e.g. %s -> %s (answer %s, reward %g)\n", quoted(s["question"]).c_str(),
                    quoted(s["completion"]).c_str(),
                    s["answer"].get<std::string>().c_str(), s["reward"].get<double>());
      rows.push_back({{"task", name}, {"difficulty", d}, {"reward", reward},
                      {"pass_at_group", static_cast<double>(solved) / n}, {"mixed_groups", static_cast<double>(mixed) / n},
                      {"tokens_per_completion", static_cast<double>(tokens) / (n * static_cast<double>(o.group))},
                      {"examples", shown}});
    }
  }
  if (!o.json_path.empty()) {
    const nlohmann::json out = {{"model", o.model}, {"policy", o.policy}, {"form", chat ? "last" : "line"},
                                {"prompts", o.prompts}, {"group", o.group}, {"temperature", o.temperature},
                                {"max_new", o.max_new}, {"seed", o.seed}, {"rows", rows}};
    // A byte-level model's reply need not be UTF-8: invalid bytes become U+FFFD in the JSON.
    io::write_file_atomic(o.json_path, out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  }
}

}  // namespace

void add_task_eval_command(CLI::App& app) {
  auto a = std::make_shared<TaskEvalOptions>();
  CLI::App* cmd = app.add_subcommand(
      "task-eval",
      "The reward a model earns on the verifiable tasks before RL (docs/tasks.md): per task and difficulty, "
      "--prompts examples sampled --group times each with the engine, as a GRPO step samples them; prints the "
      "mean reward, pass@G and the share of groups with mixed rewards (what GRPO learns from). An instruct "
      "model (one with a chat template) is asked each task's instruction in a chat turn");
  cmd->add_option("--model", a->model, "model folder (config.json + safetensors + tokenizer) or GGUF file")->required();
  cmd->add_option("--policy", a->policy, "precision preset or policy JSON, or native (default bf16)");
  cmd->add_option("--task", a->tasks, "tasks (add, mul, reverse, sort, count, mixed); repeat or comma-separate")
      ->delimiter(',')
      ->required();
  add_integer_list_flag(cmd, "--difficulty", a->difficulties, between(1, 30),
                        "difficulties, comma-separated (default 1; each within every named task's range)");
  add_integer_flag(cmd, "--prompts", a->prompts, between(1, 100000), "examples per task and difficulty");
  add_integer_flag(cmd, "--group", a->group, between(1, 1024), "samples per example (a GRPO group)");
  add_integer_flag(cmd, "--max-new", a->max_new, between(1, 4096), "tokens generated per sample at most");
  add_integer_flag(cmd, "--show", a->show, between(0, 100), "examples printed per row");
  add_real_flag(cmd, "--temp", a->temperature, non_negative(), "sampling temperature (0: greedy)");
  add_seed_flag(cmd, "--seed", a->seed, "seed of the examples and of the sampling");
  cmd->add_flag("--completion-form", a->completion_form,
                "ask \"Q: ..\\nA: \" and score the first line even when the model has a chat template");
  cmd->add_option("--json", a->json_path, "also write the table (and the shown examples) as JSON");
  cmd->callback([a] { run_task_eval(*a); });
}

}  // namespace concord::cli
