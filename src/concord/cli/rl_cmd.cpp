// `concord rl`: one sampler–learner RL run (rl/loop.h) from a JSON config and/or flags, over the
// in-process, shared-memory or MPI transport (rl/channel.h), or with a `concord serve` process as
// the sampler (--transport http). Under mpirun rank 0 learns and the other ranks sample; with
// --transport shm the learner starts its sampler processes itself, with --transport http its
// server (unless --sampler-url names one).
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "concord/cli/commands.h"
#include "concord/cli/flags.h"
#include "concord/io/atomic_file.h"
#include "concord/model/files.h"
#include "concord/model/model.h"
#include "concord/numerics/check.h"
#include "concord/rl/channel.h"
#include "concord/rl/loop.h"
#include "concord/rl/report.h"
#include "concord/rl/sync.h"
#include "concord/rl/tasks.h"

namespace concord::cli {
namespace {

struct RlArgs {
  std::string config, out, name, sampler, learner, export_rule, task, init_from, base, is_mode;
  std::string transport, role = "learner", shm_name, sampler_url, sampler_api_key;
  std::vector<std::string> faults;
  // Empty: not given (the config's value, or its default).
  std::optional<int64_t> steps, warmup_steps, prompts, group, max_new, checkpoint_every;
  std::optional<int64_t> eval_every, eval_prompts;
  std::optional<int> difficulty, speculative_tokens;
  std::string speculative;
  std::optional<uint64_t> seed;
  std::optional<double> lr, kl_coef;
  int samplers = 1, rank = 0;
  bool loss_on_master = false, quick = false, quiet = false, log_rollouts = false;
  bool no_resume = false;
};

// --quick: a run that shows every part in seconds (CI).
void make_quick(rl::RlConfig& c) {
  c.warmup_steps = std::min<int64_t>(c.warmup_steps, 40);
  c.steps = std::min<int64_t>(c.steps, 4);
  c.prompts_per_step = std::min<int64_t>(c.prompts_per_step, 4);
  c.group_size = std::min<int64_t>(c.group_size, 4);
  c.max_new_tokens = std::min<int64_t>(c.max_new_tokens, 4);
}

rl::RlOptions options(const RlArgs& a, bool learner) {
  rl::RlOptions o;
  o.progress = !a.quiet && learner;
  o.resume = !a.no_resume;
  return o;
}

rl::RlConfig resolve(const RlArgs& a) {
  rl::RlConfig c;
  if (!a.config.empty()) c = rl::RlConfig::load(a.config);
  if (a.quick) make_quick(c);
  if (!a.name.empty()) c.name = a.name;
  if (!a.sampler.empty()) c.sampler = a.sampler;
  if (!a.learner.empty()) c.learner = a.learner;
  if (!a.export_rule.empty()) c.export_rule = a.export_rule;
  if (!a.task.empty()) c.task = a.task;
  if (!a.init_from.empty()) c.init_from = a.init_from;
  if (!a.base.empty()) c.base = a.base;
  if (!a.is_mode.empty()) c.loss.is = rl::is_mode_from_name(a.is_mode);
  if (a.loss_on_master) c.loss_on_served = false;
  if (a.log_rollouts) c.log_rollouts = true;
  if (a.difficulty) c.difficulty = *a.difficulty;
  if (a.steps) c.steps = *a.steps;
  if (a.warmup_steps) c.warmup_steps = *a.warmup_steps;
  if (a.prompts) c.prompts_per_step = *a.prompts;
  if (a.group) c.group_size = *a.group;
  if (a.max_new) c.max_new_tokens = *a.max_new;
  if (a.seed) c.seed = *a.seed;
  if (a.lr) c.lr = *a.lr;
  if (a.kl_coef) c.loss.kl_coef = *a.kl_coef;
  if (a.checkpoint_every) c.checkpoint_every = *a.checkpoint_every;
  if (a.eval_every) c.eval_every = *a.eval_every;
  if (a.eval_prompts) c.eval_prompts = *a.eval_prompts;
  if (!a.speculative.empty()) c.speculative = a.speculative;
  if (a.speculative_tokens) c.speculative_tokens = *a.speculative_tokens;
  for (const std::string& f : a.faults) c.faults.push_back(rl::parse_fault(f));
  if (!a.out.empty()) c.out = a.out;
  // Re-validate what the flags touched, naming them as the source.
  return rl::RlConfig::from_json(c.to_json(), a.config.empty() ? "the flags" : a.config);
}

// Bytes of the largest weight payload: the served weights (at most fp32) plus manifest, hashes
// and the probe, with room to spare.
size_t payload_capacity(const rl::RlConfig& c) {
  const int64_t params = c.resolved_model().parameter_count();
  return static_cast<size_t>(params) * 4 + (4u << 20) +
         static_cast<size_t>(c.probe.sequences * c.probe.length) * 16;
}

size_t rollout_capacity(const rl::RlConfig& c) {
  return (1u << 20) + static_cast<size_t>(c.prompts_per_step * c.group_size * (c.max_new_tokens * 24 + 128));
}

void print_result(const rl::RlConfig& c, const rl::RlResult& r, const std::string& transport, int samplers) {
  std::printf("%s\n", fmt::format("{}: sampler {}, learner {}, export {}, {} steps over {} ({} sampler{})",
                                  c.name, c.sampler, c.learner, c.export_rule, r.steps.size(),
                                  transport, samplers, samplers == 1 ? "" : "s").c_str());
  std::printf("%s\n", fmt::format("  reward {:.3f} at step 1 (after the warm-up); {:.3f} over the first 10% of "
                                  "steps -> {:.3f} over the last 10%", r.warmup_reward, r.initial_reward,
                                  r.final_reward).c_str());
  std::printf("%s\n", fmt::format("  mismatch k3 KL {:.3g} (mean over steps), Fair Cast lag median {} p90 {} steps",
                                  r.mean_mismatch_kl, r.lag_median, r.lag_p90).c_str());
  std::printf("%s\n", fmt::format("  time: warm-up {:.1f} s{}, rollout {:.1f} s, learner {:.1f} s, sync + checks {:.1f} s, total {:.1f} s",
                                  r.seconds_warmup, r.warmup_cached ? " (cached)" : "", r.seconds_rollout,
                                  r.seconds_learner, r.seconds_sync, r.seconds_total).c_str());
  if (r.start_step > 0) std::printf("%s\n", fmt::format("  (resumed at step {}: the times count every process; this one ran {:.1f} s)", r.start_step, r.seconds_this_process).c_str());
  if (r.summary.contains("eval_final")) {
    const auto& e = r.summary.at("eval_final");
    std::printf("%s\n", fmt::format("  held-out ({} prompts, greedy): reward {:.3f} served copy, {:.3f} fp32 master; "
                                    "{:.0f}% of the replies the same tokens",
                                    e.at("prompts").get<int64_t>(), e.at("reward_served").get<double>(),
                                    e.at("reward_master").get<double>(), 100 * e.at("greedy_same").get<double>()).c_str());
  }
  if (r.sync_failures == 0) {
    std::printf("  weight sync: every step passed the seven checks\n");
  } else {
    std::printf("%s\n", fmt::format("  weight sync: {} failed sync(s); the previous version kept serving:",
                                    r.sync_failures).c_str());
    for (const auto& e : r.summary.at("sync_events"))
      std::printf("%s\n", fmt::format("    step {} sampler {}: {} — {}", e.at("step").get<int64_t>(),
                                      e.at("rank").get<int>(), e.at("check").get<std::string>(),
                                      e.at("message").get<std::string>()).c_str());
  }
  std::printf("%s\n", fmt::format("  -> {}/metrics.jsonl, {}/report.html, {}/summary.json", c.out, c.out, c.out).c_str());
}

// --transport http without --sampler-url: `concord serve` started here on the run's model (its
// weights do not matter: the first step's sync replaces them), at the sampler preset, on a free
// loopback port read from its ready line; its stderr is passed on. SIGTERM when the run ends.
struct ServeProcess {
  rl::SamplerProcesses process;
  std::string url;
  std::thread drain;
  ~ServeProcess() {
    process.terminate();
    if (drain.joinable()) drain.join();
  }
};

std::unique_ptr<ServeProcess> start_sampler_server(const rl::RlConfig& c, bool quiet) {
  namespace fs = std::filesystem;
  std::string model = c.init_from;
  if (model.empty()) {
    const fs::path folder = fs::path(c.out) / "sampler-model";
    model::Model m(c.resolved_model());
    m.init_random(c.seed, 0.02f);
    model::ExportOptions o;
    for (const int64_t id : c.resolved_model().eos_token_ids) o.stop_token_ids.push_back(static_cast<int32_t>(id));
    model::export_model(m, folder, o);
    model = folder.string();
  }
  const int64_t sequences = std::clamp<int64_t>(c.prompts_per_step * c.group_size, 1, 256);
  std::vector<std::string> args = {"concord", "serve", "--model", model, "--policy", c.sampler, "--host",
                                   "127.0.0.1", "--port", "0", "--max-sequences", std::to_string(sequences),
                                   "--max-queue", std::to_string(std::max<int64_t>(1, c.prompts_per_step * c.group_size))};
  if (!c.faults.empty()) args.push_back("--weights-faults");
  std::vector<char*> argv;
  for (std::string& x : args) argv.push_back(x.data());
  argv.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw InputError(fmt::format("[rl] --transport http: pipe: {}", std::strerror(errno)));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw InputError(fmt::format("[rl] --transport http: fork: {}", std::strerror(errno)));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) _exit(127);
    ::dup2(fds[1], STDERR_FILENO);
    ::execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  ::close(fds[1]);
  auto p = std::make_unique<ServeProcess>();
  p->process = rl::SamplerProcesses({pid});
  // Read its stderr up to the ready line (or its end: it failed), then keep passing it on.
  // The ready line: "[serve] listening on http://HOST:PORT (model ...". (No std::regex: GCC 12's
  // warns maybe-uninitialized inside it at -O2, which the sanitizer build makes an error.)
  const std::string ready = "[serve] listening on ";
  std::string seen, line;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
  char ch = 0;
  while (p->url.empty()) {
    const ssize_t n = ::read(fds[0], &ch, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || std::chrono::steady_clock::now() > deadline) {
      ::close(fds[0]);
      throw InputError(fmt::format("[rl] --transport http: `concord serve --model {}` did not start: {}", model,
                                   seen.empty() ? "(no output)" : seen));
    }
    if (ch != '\n') {
      line += ch;
      continue;
    }
    const size_t at = line.find(ready);
    if (at != std::string::npos && line.compare(at + ready.size(), 7, "http://") == 0) {
      const size_t from = at + ready.size();
      p->url = line.substr(from, line.find(' ', from) - from);
    } else {
      seen += line + " ";
      if (!quiet) std::fprintf(stderr, "[sampler] %s\n", line.c_str());
    }
    line.clear();
  }
  const int fd = fds[0];
  p->drain = std::thread([fd, quiet] {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) != 0) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;
      if (!quiet) static_cast<void>(::write(STDERR_FILENO, buf, static_cast<size_t>(n)));
    }
    ::close(fd);
  });
  return p;
}

void run(const RlArgs& a) {
  std::string transport = a.transport;
  if (transport.empty()) transport = rl::launched_by_mpirun() ? "mpi" : "in-process";
  if (transport != "in-process" && transport != "shm" && transport != "mpi" && transport != "http")
    throw InputError(fmt::format("[rl] unknown --transport '{}' (in-process, shm, mpi, http)", transport));
  if (!a.sampler_url.empty() && transport != "http")
    throw InputError("[rl] --sampler-url needs --transport http");
  if (transport == "http" && a.samplers != 1)
    throw InputError("[rl] --transport http has one sampler: the `concord serve` process (it batches every rollout)");
  if (a.role != "learner" && a.role != "sampler")
    throw InputError(fmt::format("[rl] unknown --role '{}' (learner, sampler)", a.role));
  if (transport == "in-process" && a.samplers != 1)
    throw InputError("[rl] --samplers needs --transport shm (or mpirun); in process there is one sampler");
  if (a.role == "sampler" && transport != "shm")
    throw InputError("[rl] --role sampler is for the processes `--transport shm` starts");

  if (transport == "mpi") {
    // Every rank must leave together: an error on one rank aborts the job (rl/channel.h).
    try {
      const rl::RlConfig c = resolve(a);
      auto channel = rl::make_mpi_channel();
      const rl::RlResult r = rl::run_rl(c, *channel, options(a, channel->rank() == 0));
      if (channel->rank() == 0) print_result(c, r, "mpi", channel->samplers());
    } catch (const InputError& e) {
      std::fprintf(stderr, "concord: %s\n", e.what());
      rl::mpi_abort(2);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "concord: %s\n", e.what());
      rl::mpi_abort(3);
    }
    return;
  }

  const rl::RlConfig c = resolve(a);
  if (transport == "http") {
    std::unique_ptr<ServeProcess> server;
    rl::RlOptions o = options(a, true);
    o.sampler_url = a.sampler_url;
    o.sampler_api_key = a.sampler_api_key;
    if (o.sampler_api_key.empty())
      if (const char* env = std::getenv("CONCORD_API_KEY")) o.sampler_api_key = env;
    if (o.sampler_url.empty()) {
      std::filesystem::create_directories(c.out);
      server = start_sampler_server(c, a.quiet);
      o.sampler_url = server->url;
    }
    auto channel = rl::make_in_process_channel();
    const rl::RlResult r = rl::run_rl(c, *channel, o);
    print_result(c, r, "http", 1);
    return;
  }
  if (transport == "in-process") {
    auto channel = rl::make_in_process_channel();
    const rl::RlResult r = rl::run_rl(c, *channel, options(a, true));
    print_result(c, r, "in-process", 1);
    return;
  }

  const int samplers = a.samplers;
  if (a.role == "sampler") {
    if (a.shm_name.empty()) throw InputError("[rl] --role sampler needs --shm-name");
    if (a.rank < 1 || a.rank > samplers)
      throw InputError(fmt::format("[rl] --rank {} outside [1, {}]", a.rank, samplers));
    rl::ShmOptions o;  // capacities 0: the learner's
    auto channel = rl::make_shm_channel(a.shm_name, a.rank, samplers, o);
    rl::run_rl(c, *channel, false);
    return;
  }
  // The learner: create the segment, write the resolved config for the samplers, start them.
  const std::string name = a.shm_name.empty() ? rl::default_shm_name() : a.shm_name;
  rl::ShmOptions o;
  o.capacity = payload_capacity(c);
  o.rollout_capacity = rollout_capacity(c);
  auto channel = rl::make_shm_channel(name, 0, samplers, o);
  std::filesystem::create_directories(c.out);
  const std::string config_path = (std::filesystem::path(c.out) / "sampler_config.json").string();
  rl::RlConfig for_samplers = c;
  for_samplers.base.clear();  // samplers never warm up
  io::write_file_atomic(config_path, for_samplers.to_json().dump(2) + "\n");
  rl::SamplerProcesses children = rl::spawn_samplers(
      {"concord", "rl", "--config", config_path, "--transport", "shm", "--role", "sampler",
       "--samplers", std::to_string(samplers), "--shm-name", name, "--quiet"},
      samplers);
  const rl::RlResult r = rl::run_rl(c, *channel, options(a, true));
  children.wait();
  print_result(c, r, "shm", samplers);
}

}  // namespace

void add_rl_command(CLI::App& app) {
  auto a = std::make_shared<RlArgs>();
  CLI::App* cmd = app.add_subcommand(
      "rl",
      "One sampler-learner RL run (GRPO on a verifiable task): warm-up, then per step export "
      "the fp32 master (rne/sr/ef), sync it to the samplers with seven checks, roll out with the "
      "engine, learn. Writes config.json, metrics.jsonl, summary.json and report.html under --out, "
      "and checkpoints under --out/checkpoints: running the same command on the same --out resumes "
      "a killed run from its last checkpoint, bit-identically (--no-resume starts over).");
  cmd->add_option("--config", a->config, "RL config (JSON, docs/rl.md); flags override it");
  cmd->add_option("--out", a->out, "run directory (default: the config's \"out\", runs/rl)");
  cmd->add_option("--name", a->name, "run name (reports, progress)");
  cmd->add_option("--sampler", a->sampler, "sampler precision preset (fp32, bf16, mxfp8, fp8-tensor, nvfp4, mxfp4) or policy JSON");
  cmd->add_option("--learner", a->learner, "learner precision preset or policy JSON");
  cmd->add_option("--export", a->export_rule, "fp32 master -> served copy: rne, sr, ef");
  cmd->add_flag("--loss-on-master", a->loss_on_master,
                "compute the learner's loss on the fp32 master instead of the served copy");
  cmd->add_option("--task", a->task,
                  fmt::format("verifiable task: {} (docs/tasks.md)", fmt::join(rl::task_choices(), ", ")));
  add_integer_flag(cmd, "--difficulty", a->difficulty, at_least(1),
                   "task difficulty (default 1; each task has its maximum, docs/tasks.md)");
  cmd->add_option("--init-from", a->init_from, "model folder (HF layout) to start from");
  cmd->add_option("--base", a->base, "folder caching the warmed-up model (reused when it matches)");
  add_integer_flag(cmd, "--steps", a->steps, between(1, kMaxSteps), "GRPO steps");
  add_integer_flag(cmd, "--warmup-steps", a->warmup_steps, at_least(0), "supervised warm-up steps (0: none)");
  add_integer_flag(cmd, "--prompts", a->prompts, at_least(1), "prompts per step");
  add_integer_flag(cmd, "--group", a->group, at_least(2),
                   "completions per prompt (GRPO compares completions within a group)");
  add_integer_flag(cmd, "--max-new", a->max_new, at_least(1), "tokens generated per completion at most");
  add_real_flag(cmd, "--lr", a->lr, non_negative(),
                "GRPO learning rate (0: the master never moves, a control run)");
  add_real_flag(cmd, "--kl-coef", a->kl_coef, non_negative(), "KL penalty to the warmed-up model (0: none)");
  cmd->add_option("--is", a->is_mode, "importance sampling: none, token_tis, seq_tis, token_mask, seq_mask");
  add_seed_flag(cmd, "--seed", a->seed, "seed for init, prompts, sampling and stochastic rounding");
  cmd->add_option("--fault", a->faults,
                  fmt::format("inject a weight-sync fault at a GRPO step, NAME@STEP (repeatable); NAME: {}",
                              fmt::join(rl::fault_names(), ", ")));
  cmd->add_option("--transport", a->transport,
                  "in-process (default), shm (sampler processes on this machine), mpi (under mpirun), http (a "
                  "`concord serve` process samples: weights go to its POST /v1/weights, rollouts come from "
                  "its /v1/completions)");
  cmd->add_option("--sampler-url", a->sampler_url,
                  "with --transport http: the running `concord serve` to use (http://HOST:PORT; it must serve "
                  "the run's model at the sampler preset); default: one started here");
  cmd->add_option("--sampler-api-key", a->sampler_api_key,
                  "with --sampler-url: that server's --api-key (default: $CONCORD_API_KEY)");
  add_integer_flag(cmd, "--samplers", a->samplers, between(1, 4096),
                   "sampler processes with --transport shm (default 1)");
  cmd->add_option("--speculative", a->speculative,
                  "sample rollouts with speculative decoding: ngram, self:PRESET or self:layers=K (the sampler's own "
                  "weights, rebuilt after every sync), or a draft model folder (fixed); the rollouts follow the "
                  "sampler's distribution and carry its log-probs; metrics gain spec/accept_rate, spec/accept_length");
  add_integer_flag(cmd, "--speculative-tokens", a->speculative_tokens, between(1, 64),
                   "with --speculative: tokens drafted per verification (default 4)");
  cmd->add_flag("--log-rollouts", a->log_rollouts, "also write rollouts.jsonl (every completion, reward, log-probs)");
  add_integer_flag(cmd, "--checkpoint-every", a->checkpoint_every, at_least(0),
                   "write a checkpoint every N steps (default 25; 0: only after the last step)");
  cmd->add_flag("--no-resume", a->no_resume,
                "start over even when --out holds a checkpoint (default: resume from it)");
  add_integer_flag(cmd, "--eval-every", a->eval_every, at_least(0),
                   "held-out evaluation every N steps and after the last (0: none; docs/rl.md): greedy "
                   "rewards of the served copy and the fp32 master, and how many replies agree");
  add_integer_flag(cmd, "--eval-prompts", a->eval_prompts, between(1, 4096), "held-out prompts per evaluation (default 32)");
  cmd->add_flag("--quick", a->quick, "a few small steps (CI)");
  cmd->add_flag("--quiet", a->quiet, "no progress on stderr");
  cmd->add_option("--role", a->role, "internal: learner or sampler (processes --transport shm starts)")
      ->group("");
  add_integer_flag(cmd, "--rank", a->rank, between(1, 4096), "internal: sampler rank")->group("");
  cmd->add_option("--shm-name", a->shm_name, "internal: shared-memory segment")->group("");
  cmd->callback([a]() { run(*a); });
}

void add_rl_report_command(CLI::App& app) {
  struct Args {
    std::vector<std::string> runs;
    std::string out, title = "concord rl runs";
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "rl-report",
      "One offline HTML report (rl/report.h: summary table, per-step plots, held-out evaluation, lag "
      "histograms, failed syncs, configs) over finished `concord rl` runs, read from their directories.");
  cmd->add_option("--run", a->runs, "a finished run's directory (repeatable; named by its config's name)")
      ->required();
  cmd->add_option("--out", a->out, "the HTML file to write")->required();
  cmd->add_option("--title", a->title, "the report's title");
  cmd->callback([a]() {
    std::vector<rl::LoadedRun> runs;
    runs.reserve(a->runs.size());
    for (const std::string& dir : a->runs) runs.push_back(rl::load_rl_run(dir));
    std::vector<rl::ReportArm> arms;
    for (const rl::LoadedRun& r : runs) arms.push_back({r.config.name, &r.config, &r.result});
    rl::write_rl_report(a->out, a->title, arms);
    std::printf("%s\n", fmt::format("{} run{} -> {}", runs.size(), runs.size() == 1 ? "" : "s", a->out).c_str());
  });
}

}  // namespace concord::cli
