// `concord eval`: held-out loss of a trained run (its own validation batches), at several depths
// of a depth-recurrent model, and single-stream decoding at a fixed depth or with adaptive exit.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/cli/commands.h"
#include "concord/cli/flags.h"
#include "concord/io/atomic_file.h"
#include "concord/model/files.h"
#include "concord/numerics/check.h"
#include "concord/train/depth_eval.h"

namespace concord::cli {

void add_eval_command(CLI::App& app) {
  struct Args {
    std::string run, policy = "fp32", json;
    std::vector<int32_t> depths;
    std::vector<double> exit_kl;
    std::vector<int32_t> addition;
    int64_t problems = 200;
    std::optional<int64_t> max_depth, decode_rows;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "eval",
      "Held-out loss (nats/byte) of a `concord train` run's final model on the run's own validation "
      "batches; for a depth-recurrent model at each --depths, and with --exit-kl, single-stream "
      "decoding through the KV cache with adaptive exit against the fixed --max-depth (loss, core "
      "iterations per token, tokens/s). A table on stdout; --json FILE writes the figures.");
  cmd->add_option("--run", a->run, "run directory (config.json and final/)")->required();
  cmd->add_option("--policy", a->policy, "precision preset or policy JSON to run the model under (default fp32)");
  add_integer_list_flag(cmd, "--depths", a->depths, between(1, 4096),
                        "depth-recurrent: test depths (default: 1, 2, 4, ... up to 4 r̄)");
  add_real_list_flag(cmd, "--exit-kl", a->exit_kl, non_negative(),
                     "depth-recurrent: adaptive-exit KL thresholds to decode with");
  add_integer_flag(cmd, "--max-depth", a->max_depth, between(1, 4096),
                   "with --exit-kl: the iteration cap, and the fixed depth decoded against (default 4 r̄)");
  add_integer_flag(cmd, "--decode-rows", a->decode_rows, between(1, 1 << 20),
                   "with --exit-kl: validation rows decoded token by token (default 4)");
  add_integer_list_flag(cmd, "--addition", a->addition, between(1, 18),
                        "exact-match accuracy on additions whose operands have these digit counts (greedy; a "
                        "run trained on an addition:N or addition-reversed:N corpus, the sum written as it was), at every depth");
  add_integer_flag(cmd, "--problems", a->problems, between(1, 100000), "with --addition: problems per digit count (default 200)");
  cmd->add_option("--json", a->json, "write the figures to this JSON file");
  cmd->callback([a]() {
    const train::RunData run = train::load_run_data(a->run);
    model::LoadedModel loaded = model::load_model(std::filesystem::path(a->run) / "final", a->policy);
    model::Model& m = loaded.model;
    const model::ModelConfig& c = m.config();
    nlohmann::ordered_json out;
    out["run"] = a->run;
    out["policy"] = m.policy().name;
    out["tokens"] = static_cast<int64_t>(run.validation.size()) * run.config.batch_size * run.config.seq_len;
    if (!c.recurrent()) {
      if (!a->depths.empty() || !a->exit_kl.empty() || a->max_depth)
        throw InputError(fmt::format("[eval] --depths, --exit-kl and --max-depth are for a depth-recurrent model; "
                                     "{} is a {}", a->run, c.architecture));
      const double loss = train::mean_loss(m, run.validation);
      std::printf("%s\n", fmt::format("{}: {:.4f} nats/byte ({})", a->run, loss, m.policy().name).c_str());
      out["loss"] = loss;
    } else {
      std::vector<int64_t> depths(a->depths.begin(), a->depths.end());
      std::optional<train::AdditionCorpus> add;
      if (!a->addition.empty() && !(add = train::addition_corpus(run.config.corpus)))
        throw InputError(fmt::format("[eval] --addition is for a run trained on an addition corpus; {} was trained on '{}'",
                                     a->run, run.config.corpus));
      const train::SumOrder add_order = add ? add->order : train::SumOrder::msb_first;
      if (depths.empty())
        for (int64_t r = 1; r <= 4 * c.mean_recurrence; r *= 2) depths.push_back(r);
      std::printf("%s\n", fmt::format("{} ({}, r̄ = {}): held-out loss by test depth", a->run, m.policy().name,
                                      c.mean_recurrence).c_str());
      out["mean_recurrence"] = c.mean_recurrence;
      out["depths"] = nlohmann::ordered_json::array();
      for (int64_t r : depths) {
        m.set_depth(r);
        const double loss = train::mean_loss(m, run.validation);
        nlohmann::ordered_json row = {{"depth", r}, {"loss", loss}};
        std::string line = fmt::format("  depth {:>4}: {:.4f} nats/byte", r, loss);
        for (int32_t d : a->addition) {
          const double acc = train::addition_accuracy(m, d, a->problems, 2, add_order);
          line += fmt::format(", {}-digit accuracy {:.3f}", d, acc);
          row["addition"][std::to_string(d)] = acc;
        }
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
        out["depths"].push_back(std::move(row));
      }
      if (!a->exit_kl.empty()) {
        const int64_t cap = a->max_depth.value_or(4 * c.mean_recurrence);
        const int64_t rows = a->decode_rows.value_or(4);
        m.set_depth(cap);
        const train::DecodeEval fixed = train::decode_eval(m, run.validation, rows, std::nullopt);
        std::printf("%s\n", fmt::format("decode, {} tokens: fixed depth {}: {:.4f} nats/byte, {:.0f} tok/s", fixed.tokens,
                                        cap, fixed.loss, fixed.tokens_per_second).c_str());
        out["decode"] = {{"max_depth", cap}, {"tokens", fixed.tokens}, {"fixed_loss", fixed.loss},
                         {"fixed_tokens_per_s", fixed.tokens_per_second}, {"adaptive", nlohmann::ordered_json::array()}};
        for (double kl : a->exit_kl) {
          const train::DecodeEval e = train::decode_eval(m, run.validation, rows, model::Model::AdaptiveExit{kl, cap});
          const double saved = 1 - e.iterations_per_token / static_cast<double>(cap);
          std::printf("%s\n",
                      fmt::format("  exit KL < {:<8g} {:.2f} iterations/token ({:+.1f}%), {:.4f} nats/byte ({:+.2f}%), "
                                  "{:.0f} tok/s", kl, e.iterations_per_token, -100 * saved, e.loss,
                                  100 * (e.loss / fixed.loss - 1), e.tokens_per_second).c_str());
          std::fflush(stdout);
          out["decode"]["adaptive"].push_back({{"exit_kl", kl}, {"iterations_per_token", e.iterations_per_token},
                                               {"loss", e.loss}, {"tokens_per_s", e.tokens_per_second}});
        }
      }
    }
    if (!a->json.empty()) io::write_file_atomic(a->json, out.dump(1) + "\n");
  });
}

}  // namespace concord::cli
