// `concord disagg-plan`: when `concord serve --disaggregate` pays on this machine, before running
// it (issue 25; docs/serve.md "Planning the split"). The engine's costs are measured here on the
// model (serve/split_model.h: prefill per token and per attended row, decode per step and per row,
// the hand-over per byte, how much a prefill worker and a decode engine slow each other on shared
// cores), or read from an earlier --save-rates file; then, for each prompt length and number of
// decoding streams, the prompt's time to first token, the streams' largest gap and the waiting
// saved, with and without the prefill worker.
#include <omp.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/cli/commands.h"
#include "concord/cli/flags.h"
#include "concord/io/atomic_file.h"
#include "concord/io/json_file.h"
#include "concord/model/files.h"
#include "concord/numerics/check.h"
#include "concord/serve/split_model.h"

namespace concord::cli {
namespace {

namespace split = serve::splitmodel;
using nlohmann::ordered_json;

constexpr const char* kRatesFormat = "concord-split-rates-1";

struct Args {
  std::string model, policy = "native", rates, save_rates;
  std::vector<int32_t> prompt_tokens{256, 512, 1024, 2048, 4096}, streams{1, 4};
  int64_t prefill_chunk = 512, calibrate_tokens = 2048, max_sequences = 8, stream_tokens = 0;
  uint64_t seed = 1;
  double step_overhead = 0;
  bool separate_cores = false, json = false;
};

ordered_json rates_json(const split::Rates& r) {
  return {{"prefill_token_s", r.token_s},       {"prefill_pair_s", r.pair_s},
          {"decode_step_s", r.step_s},          {"decode_row_s", r.row_s},
          {"handover_bytes_per_token", r.bytes_per_token},
          {"export_s_per_byte", r.export_s},    {"import_s_per_byte", r.import_s}, {"resume_s_per_byte", r.resume_s},
          {"prefill_slowdown", r.prefill_slowdown}, {"decode_slowdown", r.decode_slowdown}};
}

split::Rates read_rates(const std::string& path) {
  const nlohmann::json doc = io::read_json_file(path, "disagg-plan", "the rates file");
  const io::JsonValue root(doc, "disagg-plan", path);
  root.object();
  if (!root.contains("format") || root["format"].string() != kRatesFormat)
    root.fail(fmt::format("not a rates file of `concord disagg-plan --save-rates` (format '{}')", kRatesFormat));
  const io::JsonValue r = root["rates"];
  split::Rates out;
  out.token_s = r["prefill_token_s"].number_at_least(0);
  out.pair_s = r["prefill_pair_s"].number_at_least(0);
  out.step_s = r["decode_step_s"].number_at_least(0);
  out.row_s = r["decode_row_s"].number_at_least(0);
  out.bytes_per_token = r["handover_bytes_per_token"].number_at_least(0);
  out.export_s = r["export_s_per_byte"].number_at_least(0);
  out.import_s = r["import_s_per_byte"].number_at_least(0);
  out.resume_s = r["resume_s_per_byte"].number_at_least(0);
  out.prefill_slowdown = r["prefill_slowdown"].number_at_least(1);
  out.decode_slowdown = r["decode_slowdown"].number_at_least(1);
  return out;
}

void run(const Args& a) {
  split::Rates rates;
  std::string source;
  if (!a.rates.empty()) {
    rates = read_rates(a.rates);
    source = fmt::format("rates from {}", a.rates);
  } else {
    model::LoadedModel loaded = model::load_model(a.model, a.policy);
    loaded.model.prepare_weights();
    serve::EngineOptions o;
    o.prefill_chunk = a.prefill_chunk;
    o.max_sequences = a.max_sequences;
    std::string first = fmt::format("{} ({}, {} threads): ", a.model, loaded.model.policy().name, omp_get_max_threads());
    const split::Measured m = split::measure(loaded.model, o, a.calibrate_tokens, a.seed, [&first](const std::string& s) {
      std::fprintf(stderr, "[disagg-plan] %s%s\n", first.c_str(), s.c_str());
      first.clear();
    });
    rates = m.rates;
    source = fmt::format("measured on {} ({}, {} threads, prefill chunk {})", a.model, loaded.model.policy().name,
                         omp_get_max_threads(), a.prefill_chunk);
    if (!a.save_rates.empty()) {
      ordered_json prefill = ordered_json::array(), decode = ordered_json::array();
      for (const split::PrefillStep& s : m.prefill)
        prefill.push_back({{"start", s.chunk.start}, {"tokens", s.chunk.tokens}, {"seconds", s.seconds}});
      for (const split::DecodeStep& s : m.decode) decode.push_back({{"rows", s.rows}, {"seconds", s.seconds}});
      const ordered_json doc = {
          {"format", kRatesFormat},
          {"model", a.model},
          {"policy", loaded.model.policy().name},
          {"threads", omp_get_max_threads()},
          {"prefill_chunk", a.prefill_chunk},
          {"calibrate_tokens", a.calibrate_tokens},
          {"seed", a.seed},
          {"rates", rates_json(rates)},
          {"measured",
           {{"prefill_steps", prefill},
            {"decode_steps", decode},
            {"alone_prefill_s", m.alone_prefill_s},
            {"shared_prefill_s", m.shared_prefill_s},
            {"alone_decode_step_s", m.alone_decode_step_s},
            {"shared_decode_step_s", m.shared_decode_step_s},
            {"shared_decode_steps", m.shared_decode_steps},
            {"handover_bytes", m.handover_bytes},
            {"export_s", m.export_seconds},
            {"import_s", m.import_seconds},
            {"resume_step_s", m.resume_step_seconds}}}};
      io::write_file_atomic(a.save_rates, doc.dump(1) + "\n");
    }
  }
  if (a.step_overhead > 0) source += fmt::format("; every engine step {:.2f} ms more (--step-overhead)", 1e3 * a.step_overhead);
  if (a.separate_cores) {
    rates.prefill_slowdown = rates.decode_slowdown = 1;
    source += "; predicted with the worker on cores of its own (--separate-cores)";
  }
  if (!a.json) {
    std::printf("%s\n", source.c_str());
    std::printf("%s\n",
                fmt::format("prefill {:.1f} us/token + {:.3f} ns per attended row; decode {:.2f} ms/step + {:.3f} ms/row; "
                            "hand-over {:.0f} bytes/token, export {:.2f} + import {:.2f} + resume {:.2f} ms/MiB; sharing the "
                            "cores slows prefill {:.2f}x, decode {:.2f}x",
                            1e6 * rates.token_s, 1e9 * rates.pair_s, 1e3 * rates.step_s, 1e3 * rates.row_s,
                            rates.bytes_per_token, 1e3 * rates.export_s * 1048576.0, 1e3 * rates.import_s * 1048576.0,
                            1e3 * rates.resume_s * 1048576.0,
                            rates.prefill_slowdown, rates.decode_slowdown)
                    .c_str());
    std::printf("| prompt tokens | streams | first token s (engine / split) | streams' largest gap s (engine / split) | "
                "stream tokens meanwhile (engine / split) | hand-over MiB | waiting saved, request-s | pays |\n");
    std::printf("|---:|---:|---|---|---|---:|---:|---|\n");
  } else {
    std::printf("%s\n", ordered_json({{"source", source}, {"prefill_chunk", a.prefill_chunk}, {"stream_tokens", a.stream_tokens}, {"step_overhead_s", a.step_overhead}, {"rates", rates_json(rates)}})
                            .dump()
                            .c_str());
  }
  for (const int32_t streams : a.streams) {
    for (const int32_t tokens : a.prompt_tokens) {
      const split::Verdict v = split::predict(rates, {tokens, streams, a.prefill_chunk, a.stream_tokens, a.step_overhead});
      if (a.json) {
        auto outcome = [](const split::Outcome& o) {
          return ordered_json{{"ttft_s", o.ttft_s},
                              {"max_gap_s", o.max_gap_s},
                              {"stream_tokens", o.stream_tokens},
                              {"stream_delay_s", o.stream_delay_s}};
        };
        ordered_json j = {{"prompt_tokens", tokens},         {"streams", streams},
                          {"engine", outcome(v.engine)},     {"disaggregated", outcome(v.split)},
                          {"handover_bytes", v.split.handover_bytes},
                          {"saved_request_s", v.saved_request_s}, {"pays", v.pays}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%s\n", fmt::format("| {} | {} | {:.3f} / {:.3f} | {:.3f} / {:.3f} | {:.0f} / {:.1f} | {:.1f} | {:+.3f} | {} |",
                                        tokens, streams, v.engine.ttft_s, v.split.ttft_s, v.engine.max_gap_s,
                                        v.split.max_gap_s, v.engine.stream_tokens, v.split.stream_tokens,
                                        v.split.handover_bytes / 1048576.0, v.saved_request_s, v.pays ? "yes" : "no")
                                .c_str());
      }
    }
  }
}

}  // namespace

void add_disagg_plan_command(CLI::App& app) {
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "disagg-plan",
      "When `concord serve --disaggregate` pays on this machine, before running it: the engine's costs measured here "
      "on the model (prefill, decode, the hand-over of KV rows, how much a prefill worker and the decode engine slow "
      "each other on shared cores), then for each prompt length and number of decoding streams the prompt's time to "
      "first token, the streams' largest gap and the waiting saved, with and without the prefill worker "
      "(docs/serve.md)");
  cmd->add_option("--model", a->model, "the model folder or GGUF to measure (not with --rates)");
  cmd->add_option("--policy", a->policy, "as serve's --policy (default native)");
  add_integer_flag(cmd, "--prefill-chunk", a->prefill_chunk, at_least(1),
                   "as serve's --prefill-chunk: measured with it and predicted for it (default 512)");
  add_integer_flag(cmd, "--max-sequences", a->max_sequences, between(4, 4096),
                   "as serve's --max-sequences (default 8; the measurement decodes up to 4 rows)");
  add_integer_flag(cmd, "--calibrate-tokens", a->calibrate_tokens, at_least(2),
                   "the measurement's prompt: this many seeded random tokens, prefilled alone twice and once beside "
                   "a decoding stream (default 2048; several chunks, so that attention's share is measured)");
  add_seed_flag(cmd, "--seed", a->seed, "the measurement's prompts (default 1)");
  cmd->add_option("--rates", a->rates, "predict from a rates file of an earlier --save-rates instead of measuring");
  cmd->add_option("--save-rates", a->save_rates, "write the measured rates and every timed step to this JSON file");
  add_integer_list_flag(cmd, "--prompt-tokens", a->prompt_tokens, between(2, 1 << 24),
                        "prompt lengths to predict (default 256,512,1024,2048,4096)");
  add_integer_list_flag(cmd, "--streams", a->streams, between(0, 4096),
                        "requests decoding when the prompt arrives (default 1,4)");
  add_integer_flag(cmd, "--stream-tokens", a->stream_tokens, between(0, 1 << 24),
                   "tokens each stream still generates when the prompt arrives (default 0: more than the prefill "
                   "takes); streams that end sooner leave the machine to the prefill");
  add_real_flag(cmd, "--step-overhead", a->step_overhead, non_negative(),
                "seconds a serving step costs beyond the engine's forward (the server's loop, streaming the "
                "responses, clients on the same cores), added to every engine step (default 0; a server's is its "
                "decode pace alone less the measured decode step)");
  cmd->add_flag("--separate-cores", a->separate_cores,
                "predict for a prefill worker on cores of its own (another machine's rank, a GPU): no slowdowns");
  cmd->add_flag("--json", a->json, "a JSON line of the rates, then one per prediction, instead of the table");
  cmd->callback([a]() {
    if (a->rates.empty() == a->model.empty())
      throw InputError("[disagg-plan] give --model (to measure) or --rates (an earlier --save-rates file)");
    if (!a->rates.empty() && !a->save_rates.empty())
      throw InputError("[disagg-plan] --save-rates writes what a measurement found; with --rates nothing is measured");
    run(*a);
  });
}

}  // namespace concord::cli
