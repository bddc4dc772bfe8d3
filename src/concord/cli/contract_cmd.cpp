// `concord contract`: kernel contracts (docs/contracts.md). `kernels` lists the named kernel
// variants; `dump` writes one kernel's teacher-forced logits as a logit dump; `measure` compares
// two sides (kernels or dumps) per slice and fits a contract; `check` compares two sides against
// a contract. Exit 0 on success, 1 when a guarantee or the contract is broken, 2 on bad input.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "concord/audit/contract.h"
#include "concord/audit/dump.h"
#include "concord/audit/kernels.h"
#include "concord/audit/measure.h"
#include "concord/audit/report.h"
#include "concord/cli/commands.h"
#include "concord/cli/flags.h"
#include "concord/io/atomic_file.h"
#include "concord/io/gguf.h"
#include "concord/io/utf8.h"
#include "concord/model/files.h"
#include "concord/numerics/check.h"
#include "concord/rl/tasks.h"

namespace concord::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Where the compared sequences come from, and how they are completed and scored.
struct SourceArgs {
  std::string prompts, task;
  int64_t count = 32;
  int difficulty = 3;
  uint64_t seed = 0;
  int64_t max_new = 32, batch = 8;
  bool quiet = false;
  bool given() const { return !prompts.empty() || !task.empty(); }
};

struct MeasureArgs {
  std::string ref, cand, model, out, contract;
  SourceArgs source;
  double headroom = 2.0, quantile = 0.99, decided_margin = 1.0;
  std::vector<int32_t> position_edges{16, 64}, prompt_length_edges{16, 64};
  std::vector<int32_t> depths;  // a depth-recurrent model: measure at each (the depth:R slices)
};

void add_source_options(CLI::App* cmd, SourceArgs& s) {
  cmd->add_option(
      "--prompts", s.prompts,
      "prompts file: one prompt per line, or JSON lines {\"prompt\", \"label\", \"task\"}");
  cmd->add_option("--task", s.task,
                  fmt::format("generate prompts of a verifiable task ({}; docs/tasks.md)",
                              fmt::join(rl::task_choices(), ", ")));
  add_integer_flag(cmd, "--count", s.count, at_least(1), "prompts generated with --task (default 32)");
  add_integer_flag(cmd, "--difficulty", s.difficulty, at_least(1),
                   "--task difficulty (default 3; each task has its maximum, docs/tasks.md)");
  add_seed_flag(cmd, "--seed", s.seed, "--task seed (default 0)");
  add_integer_flag(cmd, "--max-new", s.max_new, at_least(0),
                   "tokens generated after each prompt, greedy (default 32; 0: the prompts alone)");
  add_integer_flag(cmd, "--batch", s.batch, at_least(1), "sequences per forward pass (default 8)");
  cmd->add_flag("--quiet", s.quiet, "no progress on stderr");
}

bool is_dump_path(const std::string& side) {
  const std::string ext = fs::path(side).extension().string();
  return ext == ".npy" || ext == ".safetensors";
}

// Progress on stderr, one update per batch: redrawn in place on a terminal; elsewhere (logs) a
// line at most every 10 s, so short runs stay quiet.
class Progress {
 public:
  Progress(std::string what, bool quiet)
      : what_(std::move(what)),
        quiet_(quiet),
        tty_(::isatty(::fileno(stderr)) != 0),
        last_(std::chrono::steady_clock::now()) {}
  ~Progress() {
    if (drawn_) std::fputc('\n', stderr);
  }
  void operator()(int64_t done, int64_t total) {
    if (quiet_) return;
    const auto now = std::chrono::steady_clock::now();
    const std::string line = fmt::format("[contract] {} {}/{} sequences", what_, done, total);
    if (tty_) {
      std::fprintf(stderr, "\r%s", line.c_str());
      drawn_ = true;
    } else if (now - last_ > std::chrono::seconds(10)) {
      std::fprintf(stderr, "%s\n", line.c_str());
      last_ = now;
    }
    std::fflush(stderr);
  }

 private:
  std::string what_;
  bool quiet_, tty_, drawn_ = false;
  std::chrono::steady_clock::time_point last_;
};

std::vector<audit::EvalSequence> read_prompts_file(const std::string& path,
                                                   const io::Tokenizer& tokenizer) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("[contract] {}: cannot open the prompts file", path));
  std::vector<audit::EvalSequence> out;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    audit::EvalSequence s;
    std::string text = line;
    if (line[0] == '{') {
      const std::string where = fmt::format("{}:{}", path, number);
      json j;
      try {
        j = json::parse(line);
      } catch (const json::exception& e) {
        throw InputError(fmt::format("[contract] {}: not valid JSON ({})", where, e.what()));
      }
      if (!j.is_object()) throw InputError(fmt::format("[contract] {}: not a JSON object", where));
      for (const auto& [key, value] : j.items()) {
        if (key != "prompt" && key != "label" && key != "task")
          throw InputError(fmt::format(
              "[contract] {}: unknown key '{}' (a prompt line has \"prompt\", \"label\", \"task\")",
              where, key));
        if (!value.is_string())
          throw InputError(fmt::format("[contract] {}: \"{}\" must be a string", where, key));
      }
      if (!j.contains("prompt"))
        throw InputError(fmt::format("[contract] {}: a JSON prompt line needs \"prompt\"", where));
      text = j["prompt"].get<std::string>();
      s.label = j.value("label", "");
      s.task = j.value("task", "");
    }
    if (const size_t bad = io::invalid_utf8_offset(line); bad != std::string::npos)
      throw InputError(fmt::format("[contract] {}:{}: not valid UTF-8 (byte {} of the line); prompts "
                                   "are UTF-8 text", path, number, bad));
    s.tokens = tokenizer.encode(text);
    if (s.tokens.empty())
      throw InputError(
          fmt::format("[contract] {}:{}: the prompt encodes to no tokens", path, number));
    out.push_back(std::move(s));
  }
  if (out.empty()) throw InputError(fmt::format("[contract] {}: no prompts", path));
  return out;
}

std::vector<audit::EvalSequence> source_prompts(const SourceArgs& s, const model::LoadedModel& m,
                                                const std::string& model_path) {
  if (s.prompts.empty() == s.task.empty())
    throw InputError("[contract] give one source of prompts: --prompts FILE or --task T");
  if (!m.source.tokenizer)
    throw InputError(fmt::format("[contract] {}: the model has no tokenizer", model_path));
  if (!s.prompts.empty()) return read_prompts_file(s.prompts, *m.source.tokenizer);
  if (s.count < 1)
    throw InputError(fmt::format("[contract] --count must be >= 1, got {}", s.count));
  std::vector<audit::EvalSequence> out;
  for (const rl::TaskExample& e : rl::generate_examples(s.task, s.seed, s.count, s.difficulty)) {
    audit::EvalSequence seq;
    seq.tokens = m.source.tokenizer->encode(e.prompt);
    seq.task = e.task;
    out.push_back(std::move(seq));
  }
  return out;
}

// Prompts completed greedily by `model` as configured now.
std::vector<audit::EvalSequence> completed_sequences(model::LoadedModel& m, const SourceArgs& s,
                                                     const std::string& model_path) {
  std::vector<audit::EvalSequence> prompts = source_prompts(s, m, model_path);
  audit::CompletionOptions options;
  options.max_new_tokens = s.max_new;
  options.batch = s.batch;
  options.stop_tokens = m.source.stop_token_ids;
  // Completion runs in chunks so that long runs show progress.
  Progress progress("completing", s.quiet);
  std::vector<audit::EvalSequence> out;
  const auto total = static_cast<int64_t>(prompts.size());
  const int64_t chunk = std::max<int64_t>(s.batch, 1) * 4;
  for (int64_t first = 0; first < total; first += chunk) {
    const int64_t last = std::min(total, first + chunk);
    std::vector<audit::EvalSequence> part(prompts.begin() + first, prompts.begin() + last);
    for (audit::EvalSequence& e : audit::complete(m.model, std::move(part), options))
      out.push_back(std::move(e));
    progress(last, total);
  }
  return out;
}

// The model as `kernel` needs it: its file's blocks as stored (the native kernel) or fp32 values.
model::LoadedModel load(const std::string& path, const char* why, const audit::KernelVariant& kernel) {
  if (path.empty()) throw InputError(fmt::format("[contract] {} needs --model PATH", why));
  return model::load_model(path, model::PrecisionPolicy::preset("fp32"),
                           kernel.stored_weights ? model::WeightStorage::native
                                                 : model::WeightStorage::fp32);
}

// A second Model with the same weights (kernels change how a model computes, never its weights).
model::Model copy_weights(const model::Model& from) {
  model::Model to(from.config());
  for (const model::ParamSpec& p : from.params()) {
    const std::span<const float> src = from.param(p.name);
    std::copy(src.begin(), src.end(), to.param(p.name).begin());
  }
  to.weights_changed();
  return to;
}

// The compared rows of ref vs cand, each a kernel name or a dump path.
audit::Measurement measure_sides(const MeasureArgs& a) {
  audit::SliceOptions slices;
  slices.position_edges = a.position_edges;
  slices.prompt_length_edges = a.prompt_length_edges;
  slices.decided_margin = a.decided_margin;
  for (const auto& [flag, side] : {std::pair{"--ref", &a.ref}, std::pair{"--cand", &a.cand}})
    if (io::is_gguf_path(*side))
      throw InputError(fmt::format("[contract] {} {}: a GGUF file is a model (give it as --model); a "
                                   "side is a kernel name or a logit dump (.npy, .safetensors)",
                                   flag, *side));
  const bool ref_dump = is_dump_path(a.ref), cand_dump = is_dump_path(a.cand);
  if ((ref_dump || cand_dump) && !a.depths.empty())
    throw InputError("[contract] --depths needs two kernel sides (a dump holds logits of one depth)");
  std::vector<audit::RowRecord> rows;
  int64_t vocab = 0;
  if (ref_dump && cand_dump) {
    if (!a.model.empty() || a.source.given())
      throw InputError(
          "[contract] --model, --prompts and --task are not used when both sides "
          "are dumps (the dumps hold the rows)");
    const audit::LogitDump ref = audit::LogitDump::open(a.ref),
                           cand = audit::LogitDump::open(a.cand);
    rows = audit::compare_dumps(ref, cand);
    vocab = ref.vocab();
  } else if (ref_dump || cand_dump) {
    if (a.source.given())
      throw InputError(
          "[contract] --prompts and --task are not used with a dump side (the "
          "dump's rows define the sequences)");
    const std::string& kernel = ref_dump ? a.cand : a.ref;
    const audit::KernelVariant variant = audit::kernel_variant(kernel);
    const audit::LogitDump dump = audit::LogitDump::open(ref_dump ? a.ref : a.cand);
    model::LoadedModel m = load(a.model, "a kernel side", variant);
    audit::apply_kernel(m.model, variant);
    Progress progress("scoring", a.source.quiet);
    rows = audit::compare_model_dump(m.model, dump, !ref_dump, a.source.batch, std::ref(progress));
    vocab = dump.vocab();
  } else {
    const audit::KernelVariant ref_kernel = audit::kernel_variant(a.ref);
    const audit::KernelVariant cand_kernel = audit::kernel_variant(a.cand);
    model::LoadedModel m = load(a.model, "comparing two kernels", ref_kernel);
    audit::apply_kernel(m.model, ref_kernel);
    const std::vector<audit::EvalSequence> sequences = completed_sequences(m, a.source, a.model);
    // The candidate's weights: a copy of the reference's fp32 values, or the file loaded again
    // when one side serves the stored blocks.
    model::Model cand = ref_kernel.stored_weights || cand_kernel.stored_weights
                            ? load(a.model, "comparing two kernels", cand_kernel).model
                            : copy_weights(m.model);
    audit::apply_kernel(cand, cand_kernel);
    Progress progress("scoring", a.source.quiet);
    if (!a.depths.empty() && !m.model.config().recurrent())
      throw InputError(fmt::format("[contract] --depths: {} is a {}, not a depth-recurrent model", a.model,
                                   m.model.config().architecture));
    // A depth-recurrent model: the sequences completed at its mean depth, scored at each depth.
    const std::vector<int32_t> depths =
        a.depths.empty() ? std::vector<int32_t>{0} : a.depths;
    for (int32_t depth : depths) {
      if (depth > 0) {
        m.model.set_depth(depth);
        cand.set_depth(depth);
      }
      std::vector<audit::RowRecord> at = audit::compare_models(m.model, cand, sequences, a.source.batch, std::ref(progress));
      rows.insert(rows.end(), std::make_move_iterator(at.begin()), std::make_move_iterator(at.end()));
    }
    vocab = m.model.config().vocab_size;
  }
  return audit::measure(rows, slices, a.ref, a.cand, vocab);
}

void print_table(const audit::Measurement& m) {
  size_t width = 5;
  for (const audit::SliceStats& s : m.slices) width = std::max(width, s.slice.size());
  std::printf("%s\n",
              fmt::format("{:<{}}  {:>7}  {:>10}  {:>10}  {:>10}  {:>10}  {:>6}  {:>9}  {:>6}",
                          "slice", width, "rows", "osc p99", "osc max", "TV max", "KL max", "flips",
                          "predicted", "missed")
                  .c_str());
  for (const audit::SliceStats& s : m.slices) {
    std::printf("%s\n", fmt::format("{:<{}}  {:>7}  {:>10.4g}  {:>10.4g}  {:>10.4g}  {:>10.4g}  "
                                    "{:>6}  {:>9}  {:>6}",
                                    s.slice, width, s.rows, s.osc_p99, s.osc_max, s.tv_max,
                                    s.kl_max, s.flips, s.predicted_flips, s.missed_flips)
                            .c_str());
  }
}

// A broken guarantee (a bounds.h bound that failed on a row, or a flip the predictor missed):
// a bug in the bounds or in the arithmetic, reported and turned into exit status 1.
bool guarantees_held(const audit::Measurement& m) {
  const audit::SliceStats* all = m.find("all");
  if (all == nullptr) return true;
  if (all->bound_violations == 0 && all->missed_flips == 0) return true;
  std::printf("BROKEN GUARANTEE: %lld row(s) violate a bound, %lld flip(s) were not predicted\n",
              static_cast<long long>(all->bound_violations),
              static_cast<long long>(all->missed_flips));
  return false;
}

void write_json(const fs::path& path, const json& j) {
  io::write_file_atomic(path, j.dump(2) + "\n");
}

fs::path output_dir(const std::string& out) {
  fs::path dir(out);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw InputError(fmt::format("[contract] {}: cannot create the output folder", out));
  return dir;
}

int run_measure(const MeasureArgs& a) {
  const audit::Measurement m = measure_sides(a);
  const audit::Contract contract = audit::fit_contract(m, a.headroom, a.quantile);
  const fs::path dir = output_dir(a.out);
  print_table(m);
  write_json(dir / "measurement.json", m.to_json());
  contract.save((dir / "contract.json").string());
  audit::write_contract_report((dir / "report.html").string(), m, &contract, nullptr);
  std::printf("wrote %s, %s, %s\n", (dir / "measurement.json").c_str(),
              (dir / "contract.json").c_str(), (dir / "report.html").c_str());
  return guarantees_held(m) ? 0 : 1;
}

int run_check(const MeasureArgs& a) {
  const audit::Contract contract = audit::Contract::load(a.contract);
  const audit::Measurement m = measure_sides(a);
  const audit::CheckResult check = audit::check_contract(contract, m);
  std::printf("contract %s (fitted on %s vs %s), checking %s vs %s\n", a.contract.c_str(),
              contract.ref.c_str(), contract.cand.c_str(), a.ref.c_str(), a.cand.c_str());
  size_t width = 5;
  for (const audit::SliceContract& sc : contract.slices) width = std::max(width, sc.slice.size());
  for (const audit::SliceContract& sc : contract.slices) {
    const audit::SliceStats* s = m.find(sc.slice);
    if (s == nullptr || s->rows == 0) {
      std::printf(
          "%s\n",
          fmt::format("{:<{}}  SKIP  no rows in this measurement", sc.slice, width).c_str());
      continue;
    }
    const double q = s->osc_quantile(sc.quantile);
    const bool ok = q <= sc.osc_quantile && s->osc_max <= sc.osc_max;
    std::printf("%s\n", fmt::format("{:<{}}  {}  rows {:>6}  osc p{:g} {:.4g} (allowed {:.4g})  "
                                    "osc max {:.4g} (allowed {:.4g})",
                                    sc.slice, width, ok ? "PASS" : "FAIL", s->rows,
                                    sc.quantile * 100, q, sc.osc_quantile, s->osc_max, sc.osc_max)
                            .c_str());
  }
  const bool held = guarantees_held(m);
  if (check.pass) {
    std::printf("PASS: every exercised slice is within the contract\n");
  } else {
    std::vector<std::string> names;
    for (const audit::Violation& v : check.violations) {
      if (names.empty() || names.back() != v.slice) names.push_back(v.slice);
    }
    std::printf("FAIL: %zu violation(s) in slice(s) %s\n", check.violations.size(),
                fmt::format("{}", fmt::join(names, ", ")).c_str());
    for (const audit::Violation& v : check.violations) {
      std::printf("  %s: %s %.6g > allowed %.6g (%lld row(s) over the allowed max)\n",
                  v.slice.c_str(), v.what.c_str(), v.measured, v.allowed,
                  static_cast<long long>(v.rows_over));
    }
  }
  if (!a.out.empty()) {
    const fs::path dir = output_dir(a.out);
    json j = check.to_json();
    j["contract"] = a.contract;
    j["ref"] = a.ref;
    j["cand"] = a.cand;
    j["guarantees_held"] = held;
    j["measurement"] = m.to_json();
    write_json(dir / "check.json", j);
    audit::write_contract_report((dir / "report.html").string(), m, &contract, &check);
    std::printf("wrote %s, %s\n", (dir / "check.json").c_str(), (dir / "report.html").c_str());
  }
  return check.pass && held ? 0 : 1;
}

// `dump --hidden`: each dumped row's lm_head input (Model::forward's pass per sequence, teacher
// forcing over prompt + completion) in the dump's row order, as a C-order (rows, hidden_size)
// float32 .npy (version 1.0), written atomically — for the GPU contract (docs/cuda.md). (The
// logit-dump writer does not fit: it checks each row's tokens against the row's width.)
void write_hidden(model::LoadedModel& m, std::span<const audit::EvalSequence> sequences,
                  const std::vector<audit::RowInfo>& rows, const std::string& path) {
  const int64_t C = m.model.config().hidden_size;
  std::string dict = fmt::format("{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}",
                                 rows.size(), C);
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += {'\x01', '\x00', static_cast<char>(dict.size() & 0xFF), static_cast<char>(dict.size() >> 8)};
  bytes += dict;
  std::vector<float> hidden;
  int64_t cached = -1;
  for (const audit::RowInfo& info : rows) {
    const audit::EvalSequence& seq = sequences[static_cast<size_t>(info.sequence)];
    const auto T = static_cast<int64_t>(seq.tokens.size());
    if (info.sequence != cached) {
      hidden.assign(static_cast<size_t>(T * C), 0.0f);
      m.model.forward_lm_head_input(seq.tokens, 1, T, hidden);
      cached = info.sequence;
    }
    CONCORD_CHECK(info.position >= 0 && info.position < T, "dump row position inside its sequence");
    bytes.append(reinterpret_cast<const char*>(hidden.data() + info.position * C), sizeof(float) * static_cast<size_t>(C));
  }
  io::write_file_atomic(path, std::string_view(bytes));
  std::printf("wrote %s: %zu rows x %lld (the lm_head's input of each dumped row)\n", path.c_str(), rows.size(),
              static_cast<long long>(C));
}

void run_dump(const std::string& model_path, const std::string& kernel,
              const std::string& complete_with, const SourceArgs& s, const std::string& out,
              const std::string& hidden = {}) {
  if (!is_dump_path(out))
    throw InputError(
        fmt::format("[contract] --out {}: a dump is a .safetensors or .npy file", out));
  if (!hidden.empty() && std::filesystem::path(hidden).extension() != ".npy")
    throw InputError(fmt::format("[contract] --hidden {}: a .npy file", hidden));
  const audit::KernelVariant scorer = audit::kernel_variant(kernel);
  const audit::KernelVariant completer = audit::kernel_variant(complete_with);
  model::LoadedModel m = load(model_path, "dump", completer);
  audit::apply_kernel(m.model, completer);
  const std::vector<audit::EvalSequence> sequences = completed_sequences(m, s, model_path);
  if (scorer.stored_weights != completer.stored_weights) m = load(model_path, "dump", scorer);
  audit::apply_kernel(m.model, scorer);
  audit::LogitDumpWriter writer(m.model.config().vocab_size);
  std::vector<audit::RowInfo> rows;  // each dumped row's (for --hidden)
  // teacher_forced_logits hands rows out per batch; report progress as sequences complete.
  Progress progress("scoring", s.quiet);
  const auto total = static_cast<int64_t>(sequences.size());
  const int64_t batch = std::max<int64_t>(s.batch, 1);
  for (int64_t first = 0; first < total; first += batch) {
    const int64_t count = std::min(batch, total - first);
    const std::span<const audit::EvalSequence> part(sequences.data() + first,
                                                    static_cast<size_t>(count));
    audit::teacher_forced_logits(m.model, part, s.batch,
                                 [&](const audit::RowInfo& info, std::span<const float> z) {
                                   audit::RowInfo global = info;
                                   global.sequence += first;
                                   writer.add(global, z);
                                   if (!hidden.empty()) rows.push_back(global);
                                 });
    progress(first + count, total);
  }
  writer.write(out);
  std::printf("wrote %s: %lld rows x %lld logits (%s, %lld sequences completed by %s)\n",
              out.c_str(), static_cast<long long>(writer.rows()),
              static_cast<long long>(m.model.config().vocab_size), kernel.c_str(),
              static_cast<long long>(total), complete_with.c_str());
  if (!hidden.empty()) write_hidden(m, sequences, rows, hidden);
}

void add_measure_options(CLI::App* cmd, MeasureArgs& a) {
  cmd->add_option("--ref", a.ref, "reference: a kernel name or a dump (.npy / .safetensors)")
      ->required();
  cmd->add_option("--cand", a.cand, "candidate: a kernel name or a dump")->required();
  cmd->add_option("--model", a.model, "model folder or .gguf (needed for a kernel side)");
  add_source_options(cmd, a.source);
  add_real_flag(cmd, "--decided-margin", a.decided_margin, non_negative(),
                "top-1 margin (nats) above which a token counts as decided (default 1)");
  add_integer_list_flag(cmd, "--position-edges", a.position_edges, at_least(1),
                        "position slice edges, ascending (default 16,64)");
  add_integer_list_flag(cmd, "--depths", a.depths, between(1, 4096),
                        "a depth-recurrent model: score at each of these depths (slices depth:R; two "
                        "kernel sides only)");
  add_integer_list_flag(cmd, "--prompt-length-edges", a.prompt_length_edges, at_least(1),
                        "prompt-length slice edges, ascending (default 16,64)");
}

}  // namespace

void add_contract_command(CLI::App& app) {
  CLI::App* contract = app.add_subcommand(
      "contract",
      "Kernel contracts: per traffic slice, how far a candidate kernel's logits may deviate from "
      "a reference's, and the guarantees that implies (docs/contracts.md).");
  contract->require_subcommand(1);

  CLI::App* kernels = contract->add_subcommand("kernels", "List the named kernel variants.");
  kernels->callback([]() {
    for (const std::string& name : audit::kernel_names()) {
      std::printf("%s\n",
                  fmt::format("{:<18} {}", name, audit::kernel_variant(name).description).c_str());
    }
  });

  struct DumpArgs {
    std::string model, kernel, complete_with = "fp32", out;
    SourceArgs source;
    std::string hidden;
  };
  auto d = std::make_shared<DumpArgs>();
  CLI::App* dump = contract->add_subcommand(
      "dump",
      "Write one kernel's teacher-forced logits over completed prompts as a logit dump "
      "(.safetensors or .npy + .rows.json; src/concord/audit/dump.h).");
  dump->add_option("--model", d->model, "model folder or .gguf file")->required();
  dump->add_option("--kernel", d->kernel, "kernel that computes the dumped logits")->required();
  dump->add_option("--complete-with", d->complete_with,
                   "kernel that completes the prompts, greedy (default fp32)");
  dump->add_option("--out", d->out, "output file (.safetensors or .npy)")->required();
  dump->add_option("--hidden", d->hidden,
                   "also write each dumped row's lm_head input (the final norm's output) as a "
                   "(rows, hidden) float32 .npy in the dump's row order");
  add_source_options(dump, d->source);
  dump->callback([d]() { run_dump(d->model, d->kernel, d->complete_with, d->source, d->out, d->hidden); });

  auto m = std::make_shared<MeasureArgs>();
  CLI::App* measure = contract->add_subcommand(
      "measure",
      "Compare --cand with --ref per slice; print the table and write "
      "DIR/measurement.json, DIR/contract.json (fitted) and DIR/report.html. Exit 1 "
      "when a guarantee broke.");
  add_measure_options(measure, *m);
  add_real_flag(measure, "--headroom", m->headroom, real_at_least(1),
                "fitted budgets = headroom x measured (default 2)");
  add_real_flag(measure, "--quantile", m->quantile, real_in(0, 1, true, false),
                "contract quantile of osc (default 0.99)");
  measure->add_option("--out", m->out, "output folder")->required();
  measure->callback([m]() {
    const int rc = run_measure(*m);
    std::fflush(stdout);
    if (rc != 0) std::exit(rc);
  });

  auto c = std::make_shared<MeasureArgs>();
  CLI::App* check = contract->add_subcommand(
      "check",
      "Measure --cand against --ref and check it against a contract: PASS/FAIL per "
      "slice, exit 1 naming every violating slice.");
  check->add_option("--contract", c->contract, "contract JSON (from `contract measure`)")
      ->required();
  add_measure_options(check, *c);
  check->add_option("--out", c->out, "write DIR/check.json and DIR/report.html");
  check->callback([c]() {
    const int rc = run_check(*c);
    std::fflush(stdout);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace concord::cli
