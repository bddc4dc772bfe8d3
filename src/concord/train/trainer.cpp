// The training loop: export master -> served copy, forward/backward, the optimizer, validation,
// metrics, checkpoints, resume.
#include "concord/train/trainer.h"
#include "concord/train/depth_eval.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "concord/io/atomic_file.h"
#include "concord/io/json_file.h"
#include "concord/io/safetensors.h"
#include "concord/io/tokenizer.h"
#include "concord/model/files.h"
#include "concord/model/logprob.h"
#include "concord/model/model.h"
#include "concord/model/ops.h"
#include "concord/numerics/check.h"
#include "concord/sched/recompute.h"
#include "concord/train/binary.h"
#include "concord/train/checkpoint.h"
#include "concord/train/data.h"
#include "concord/train/export.h"
#include "concord/train/optimizer.h"
#include "concord/train/progress.h"
#include "concord/train/train_state.h"

namespace concord::train {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

[[noreturn]] void config_error(const std::string& source, const std::string& what) {
  throw InputError(fmt::format("[train] {}: {}", source, what));
}

// Keys of the training config that a resumed run may change without changing its results.
bool resumable_key(const std::string& key) { return key == "out"; }

size_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<size_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

// The resident set now (/proc/self/statm), bytes.
int64_t current_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

std::string mib(int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// The memory-budget plan (TrainOptions::memory_budget).
struct BudgetPlan {
  std::vector<sched::Recompute> smallest;
  int64_t smallest_peak = 0;
  std::optional<sched::RecomputePlan> plan;
};

// A depth-recurrent model is validated from the inference s0 at the depth it trains at: the
// fixed depth of a fixed-depth run, the model's mean depth (its default test depth) otherwise.
double validation_loss(model::Model& m, const std::vector<Batch>& batches, const DepthSampler& depth) {
  if (m.config().recurrent()) {
    m.set_depth(depth.kind == "fixed" ? depth.at(0, 0) : m.config().mean_recurrence);
    m.set_state_seed(0);
  }
  return mean_loss(m, batches);
}

// Distillation's validation: the mean KL(p_teacher || p_model) per token over the batches.
double distill_validation(model::Model& m, model::Model& teacher, const std::vector<Batch>& batches, int64_t B,
                          int64_t T) {
  const int64_t V = m.config().vocab_size;
  std::vector<float> u(static_cast<size_t>(B * T * V)), s(u.size());
  double total = 0;
  int64_t rows = 0;
  for (const Batch& b : batches) {
    teacher.forward(b.inputs, B, T, u);
    m.forward(b.inputs, B, T, s);
    for (int64_t r = 0; r < B * T; ++r, ++rows)
      total += model::kl_divergence(std::span<const float>(u).subspan(static_cast<size_t>(r * V), static_cast<size_t>(V)),
                                    std::span<const float>(s).subspan(static_cast<size_t>(r * V), static_cast<size_t>(V)));
  }
  return rows > 0 ? total / static_cast<double>(rows) : 0.0;
}

// The files of a run directory, config.json first (train::discard_run_files).
const std::vector<std::string> kRunFiles = {"config.json", "checkpoints", "final", "metrics.jsonl"};
constexpr const char* kFinalFiles[] = {"config.json", "model.safetensors", "tokenizer.json",
                                       "tokenizer_config.json", "generation_config.json"};

// The part of the config that decides the run's results (all but the resumable keys).
json run_identity(const json& config_json) {
  json identity = config_json;
  for (auto it = identity.begin(); it != identity.end();) it = resumable_key(it.key()) ? identity.erase(it) : std::next(it);
  return identity;
}

std::map<std::string, std::string> final_metadata(const TrainConfig& config, const json& identity, int64_t step) {
  return {{"concord.step", std::to_string(step)},
          {"concord.policy", config.policy.name},
          {"concord.export", config.export_rule},
          {"concord.run", identity_tag(identity.dump())}};
}

// final/: an HF-layout model folder of the served weights (fp32 values), with the byte
// tokenizer (a distilled model: the teacher's) as a tokenizer.json, so that `concord generate
// --model run/final` and HF tools read it as they read any model folder. Written as a whole
// (io::write_directory_atomic): a final/ is never half written.
void write_served_model(const fs::path& dir, model::Model& m, const std::map<std::string, std::string>& metadata,
                        const io::Tokenizer* tokenizer) {
  model::ExportOptions options;
  options.tokenizer = tokenizer ? *tokenizer : io::Tokenizer::byte_level({"<|bos|>", "<|eos|>", "<|pad|>"});
  options.metadata = metadata;
  io::write_directory_atomic(dir, [&](const fs::path& tmp) { model::export_model(m, tmp, options); });
}

// Whether `dir` holds this run's final model of `step`: every file there, and model.safetensors
// tagged with the step and the run's identity (a final/ of another step or run, or one written by
// an older concord, is rebuilt).
bool final_is_current(const fs::path& dir, const std::map<std::string, std::string>& metadata) {
  std::error_code ec;
  for (const char* name : kFinalFiles)
    if (!fs::is_regular_file(dir / name, ec)) return false;
  try {
    const io::SafetensorsFile file = io::SafetensorsFile::open(dir / "model.safetensors");
    for (const auto& [key, value] : metadata) {
      const auto it = file.metadata().find(key);
      if (it == file.metadata().end() || it->second != value) return false;
    }
  } catch (const InputError&) {
    return false;
  }
  return true;
}

}  // namespace

TrainConfig TrainConfig::from_json(const json& j, const std::string& source) {
  const io::JsonValue doc(j, "train", source);
  doc.object();
  TrainConfig c;
  bool depth_given = false, mean_given = false;
  doc.each_member([&](const std::string& key, const io::JsonValue& value) {
    if (key == "name") c.name = value.nonempty_string();
    else if (key == "model") c.model = model::ModelConfig::from_json(value);
    else if (key == "policy")
      c.policy = value.json().is_string() ? model::PrecisionPolicy::from_name_or_file(value.string())
                                          : model::PrecisionPolicy::from_json(value.object().json(), source + ": policy");
    else if (key == "export") c.export_rule = value.string();
    else if (key == "out") c.out = value.nonempty_string();
    else if (key == "optimizer") {
      value.each_member([&](const std::string&, const io::JsonValue& v) {
        const std::string& at = v.key();
        if (at == "optimizer.name") c.optimizer = v.nonempty_string();
        else if (at == "optimizer.binary") parse_binary_classes(v.string(), c.binary);
        else if (at == "optimizer.bits") c.binary.bits = static_cast<int>(v.integer(0));
        else if (at == "optimizer.rounding") c.binary.rounding = v.string();
        else if (at == "optimizer.update") c.binary.update = v.string();
        else if (at == "optimizer.beta2") c.binary.beta2 = v.number_in(0, 1);
        else if (at == "optimizer.range") c.binary.range = v.positive_number();
        else if (at == "optimizer.eps") c.binary.eps = v.positive_number();
        else if (at == "optimizer.bop_gamma") c.binary.bop_gamma = v.positive_number();
        else if (at == "optimizer.bop_threshold") c.binary.bop_threshold = v.number_at_least(0);
        else v.fail_unknown("optimizer: name, binary, bits, rounding, update, range, beta2, eps, bop_gamma, bop_threshold");
      });
    }
    else if (key == "distill") {
      value.each_member([&](const std::string&, const io::JsonValue& v) {
        if (v.key() == "distill.from") c.distill_from = v.nonempty_string();
        else v.fail_unknown("distill: from");
      });
    }
    else if (key == "init") {
      value.each_member([&](const std::string&, const io::JsonValue& v) {
        if (v.key() == "init.from") c.init_from = v.nonempty_string();
        else v.fail_unknown("init: from");
      });
    }
    else if (key == "depth") {
      depth_given = true;
      value.each_member([&](const std::string&, const io::JsonValue& v) {
        const std::string& at = v.key();
        if (at == "depth.sampler") c.depth.kind = v.string();
        else if (at == "depth.mean") {
          c.depth.mean = v.number();
          mean_given = true;
        }
        else if (at == "depth.sigma") c.depth.sigma = v.number();
        else if (at == "depth.fixed") c.depth.fixed = v.integer(0);
        else if (at == "depth.backprop") c.depth.backprop = v.integer(0);
        else v.fail_unknown("depth: sampler, mean, sigma, fixed, backprop");
      });
    }
    else if (key == "data" || key == "train" || key == "eval" || key == "checkpoint") {
      value.each_member([&](const std::string&, const io::JsonValue& v) {
        const std::string& at = v.key();
        if (at == "data.corpus") c.corpus = v.nonempty_string();
        else if (at == "data.validation_fraction") c.validation_fraction = v.number();
        else if (at == "data.chunk") c.split_chunk = v.integer(1);
        else if (at == "train.batch_size") c.batch_size = v.integer(1);
        else if (at == "train.seq_len") c.seq_len = v.integer(1);
        else if (at == "train.steps") c.steps = v.integer(1);
        else if (at == "train.seed") c.seed = static_cast<uint64_t>(v.integer(0));
        else if (at == "train.lr") c.lr = v.positive_number();
        else if (at == "train.min_lr") c.min_lr = v.number_at_least(0);
        else if (at == "train.warmup_steps") c.warmup_steps = v.integer(0);
        else if (at == "train.weight_decay") c.weight_decay = v.number_at_least(0);
        else if (at == "train.grad_clip") c.grad_clip = v.number_at_least(0);  // 0: no clipping
        else if (at == "train.beta1" || at == "train.beta2") {
          const double beta = v.number_in(0, 1);
          if (beta == 1) v.fail("must be below 1 (AdamW's bias correction 1 - beta^t would be 0)");
          (at == "train.beta1" ? c.beta1 : c.beta2) = beta;
        }
        else if (at == "train.init_std") c.init_std = v.positive_number();
        else if (at == "eval.every") c.eval_every = v.integer(0);
        else if (at == "eval.batches") c.eval_batches = v.integer(1);
        else if (at == "checkpoint.every") c.checkpoint_every = v.integer(0);
        else if (at == "checkpoint.keep") {
          const int64_t keep = v.integer(1);
          if (keep > 1'000'000) v.fail(fmt::format("must be at most 10^6, got {}", keep));
          c.checkpoint_keep = static_cast<int>(keep);
        }
        else if (at.starts_with("data.")) v.fail_unknown("data: corpus, validation_fraction, chunk");
        else if (at.starts_with("train."))
          v.fail_unknown("train: batch_size, seq_len, steps, seed, lr, min_lr, warmup_steps, weight_decay, "
                         "grad_clip, beta1, beta2, init_std");
        else if (at.starts_with("eval.")) v.fail_unknown("eval: every, batches");
        else v.fail_unknown("checkpoint: every, keep");
      });
    } else {
      value.fail_unknown("name, model, policy, export, data, train, eval, checkpoint, depth, distill, init, optimizer, out");
    }
  });
  // A binary-weight run's model is one: its final/ config.json says which weights are +-alpha.
  c.model.binary_weights = c.optimizer != "adamw" && (c.binary.attention || c.binary.mlp) ? binary_classes_text(c.binary) : "";
  if (c.model.recurrent()) {
    if (!mean_given) c.depth.mean = static_cast<double>(c.model.mean_recurrence);
    c.depth.validate(source);
  } else if (depth_given) {
    config_error(source, "a 'depth' section belongs to a depth-recurrent model (ConcordRecurrentForCausalLM)");
  }
  // Values that are each valid but not together (the flags of `concord train` come here too).
  if (c.batch_size <= 0 || c.seq_len <= 0) config_error(source, "batch_size and seq_len must be positive");
  if (c.steps < 1) config_error(source, fmt::format("train.steps must be at least 1 (got {})", c.steps));
  if (c.steps >= 100'000'000) config_error(source, "train.steps must be below 10^8 (checkpoint names)");
  if (c.seq_len > c.model.max_position_embeddings)
    config_error(source, fmt::format("train.seq_len ({}) exceeds the model's max_position_embeddings ({})",
                                     c.seq_len, c.model.max_position_embeddings));
  if (c.distill_from.empty() && c.model.vocab_size < ByteTokenizer::vocab_size())
    config_error(source, fmt::format("the byte-level tokenizer needs vocab_size >= {}",
                                     ByteTokenizer::vocab_size()));
  if (c.checkpoint_keep < 1) config_error(source, "checkpoint.keep must be at least 1");
  if (!(c.validation_fraction > 0 && c.validation_fraction < 0.5))
    config_error(source, "data.validation_fraction must lie in (0, 0.5)");
  if (!(c.lr > 0) || !(c.min_lr >= 0) || c.min_lr > c.lr)
    config_error(source, fmt::format("need 0 <= train.min_lr <= train.lr and train.lr > 0 (lr {}, min_lr {})",
                                     c.lr, c.min_lr));
  make_export_rule(c.export_rule, c.policy.served_weights, c.seed);  // validates the name
  try {
    make_optimizer(c.optimizer_config());  // validates the name and the binary settings
  } catch (const InputError& e) {
    config_error(source, e.what());
  }
  LrSchedule{c.lr, c.min_lr, c.warmup_steps, std::max(c.steps, c.warmup_steps)}.validate();
  return c;
}

TrainConfig TrainConfig::load(const fs::path& path) {
  return from_json(io::read_json_file(path, "train", "the training config"), path.string());
}

json TrainConfig::to_json() const {
  json j = {{"name", name},
          {"model", model.to_json()},
          {"policy", policy.to_json()},
          {"export", export_rule},
          {"data", {{"corpus", corpus}, {"validation_fraction", validation_fraction}, {"chunk", split_chunk}}},
          {"train", {{"batch_size", batch_size}, {"seq_len", seq_len}, {"steps", steps},
                     {"seed", seed}, {"lr", lr}, {"min_lr", min_lr}, {"warmup_steps", warmup_steps},
                     {"weight_decay", weight_decay}, {"grad_clip", grad_clip}, {"beta1", beta1},
                     {"beta2", beta2}, {"init_std", init_std}}},
          {"eval", {{"every", eval_every}, {"batches", eval_batches}}},
          {"checkpoint", {{"every", checkpoint_every}, {"keep", checkpoint_keep}}},
          {"out", out}};
  if (!distill_from.empty()) j["distill"] = {{"from", distill_from}};
  if (!init_from.empty()) j["init"] = {{"from", init_from}};
  // Written only for a binary optimizer, so that an adamw run's identity is what it always was.
  if (optimizer != "adamw") {
    j["optimizer"] = {{"name", optimizer}, {"binary", binary_classes_text(binary)}};
    if (optimizer != "bop") j["optimizer"]["range"] = binary.range;
    if (optimizer == "ed")
      j["optimizer"].update({{"bits", binary.bits}, {"rounding", binary.rounding}, {"update", binary.update},
                             {"beta2", binary.beta2}, {"eps", binary.eps}});
    if (optimizer == "bop") j["optimizer"].update({{"bop_gamma", binary.bop_gamma}, {"bop_threshold", binary.bop_threshold}});
  }
  if (model.recurrent())
    j["depth"] = {{"sampler", depth.kind}, {"mean", depth.mean}, {"sigma", depth.sigma}, {"fixed", depth.fixed},
                  {"backprop", depth.backprop}};
  return j;
}

namespace {

// --init: `m`'s weights from the model at `path` (fp32 values), whose architecture must be m's.
void init_weights_from(model::Model& m, const std::string& path) {
  const model::LoadedModel src = model::load_model(path, "fp32");
  json want = m.config().to_json(), have = src.model.config().to_json();
  // Which weights are +-alpha is the run's (its optimizer's) business, not the architecture's.
  want.erase("concord_binary_weights");
  have.erase("concord_binary_weights");
  for (const auto& [key, value] : want.items())
    if (!have.contains(key) || have.at(key) != value)
      throw InputError(fmt::format("[train] --init {}: its '{}' is {}, the training config's model says {}", path, key,
                                   have.contains(key) ? have.at(key).dump() : "absent", value.dump()));
  for (const model::ParamSpec& spec : m.params()) std::ranges::copy(src.model.param(spec.name), m.param(spec.name).begin());
  m.weights_changed();
}

}  // namespace

OptimizerConfig TrainConfig::optimizer_config() const {
  OptimizerConfig o{.name = optimizer, .adamw = {lr, beta1, beta2, 1e-8, weight_decay, grad_clip}, .binary = binary};
  o.binary.seed = seed;
  return o;
}

TrainResult train(const TrainConfig& config, const TrainOptions& options) {
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  TrainResult result;
  result.run_dir = options.out ? *options.out : fs::path(config.out);
  const fs::path& run_dir = result.run_dir;
  fs::create_directories(run_dir);

  // A run directory belongs to one configuration. A resume continues the run its config.json
  // describes, from a checkpoint that records the same config; a fresh start (no resume, or no
  // checkpoint) first discards the previous run's files, then writes its own config.json, so that
  // no later resume can pick up another run's checkpoints or final/.
  const json config_json = config.to_json();
  const json identity = run_identity(config_json);
  const fs::path config_path = run_dir / "config.json";
  const std::optional<fs::path> checkpoint = options.resume ? latest_checkpoint(run_dir) : std::nullopt;
  if (checkpoint && fs::exists(config_path)) {
    const json saved = io::read_json_file(config_path, "train", "the run's config");
    for (const auto& [key, value] : config_json.items()) {
      if (!resumable_key(key) && (!saved.contains(key) || saved.at(key) != value))
        throw InputError(fmt::format("[train] {} was trained with a different '{}'; resume it "
                                     "with the same config, or start afresh (--no-resume or "
                                     "another --out)", run_dir.string(), key));
    }
  }
  if (!checkpoint) discard_run_files(run_dir, kRunFiles);
  io::write_file_atomic(config_path, config_json.dump(2) + "\n");

  // Distillation: the teacher, in its file's own precision, and its tokenizer.
  std::optional<model::LoadedModel> teacher;
  if (!config.distill_from.empty()) {
    teacher.emplace(model::load_model(config.distill_from, "native"));
    const model::ModelConfig& tc = teacher->model.config();
    if (!teacher->source.tokenizer)
      throw InputError(fmt::format("[train] distill.from {}: the teacher has no tokenizer", config.distill_from));
    if (tc.vocab_size != config.model.vocab_size)
      throw InputError(fmt::format("[train] distill.from {} has a vocabulary of {} tokens: set model.vocab_size to {} "
                                   "(the config has {})", config.distill_from, tc.vocab_size, tc.vocab_size,
                                   config.model.vocab_size));
    if (config.seq_len > tc.max_position_embeddings)
      throw InputError(fmt::format("[train] train.seq_len {} exceeds the teacher's max_position_embeddings {}",
                                   config.seq_len, tc.max_position_embeddings));
    teacher->model.prepare_weights();
  }
  const io::Tokenizer* teacher_tokenizer = teacher ? &*teacher->source.tokenizer : nullptr;

  // Data: tokens of the corpus (byte-level, or the teacher's tokenizer), an interleaved
  // train/validation split.
  const std::string text = load_corpus(config.corpus);
  const TokenSplit split = split_tokens(teacher_tokenizer ? teacher_tokenizer->encode(text) : ByteTokenizer().encode(text),
                                        config.validation_fraction, config.split_chunk);
  const int64_t B = config.batch_size, T = config.seq_len;
  const BatchSampler sampler(split.train, B, T, config.seed);
  const std::vector<Batch> validation = validation_batches(split.validation, B, T, config.eval_batches);

  // The training state (master weights, export rule, optimizer) and the model holding the
  // served copy the forward and backward passes use.
  model::Model m(config.model, config.policy);
  m.init_random(config.seed, static_cast<float>(config.init_std));
  if (!config.init_from.empty()) init_weights_from(m, config.init_from);
  TrainState state(m, config.policy, config.export_rule, config.seed, config.optimizer_config());
  const LrSchedule schedule{config.lr, config.min_lr, config.warmup_steps, std::max(config.steps, config.warmup_steps)};
  const auto* binary_optimizer = dynamic_cast<const BinaryOptimizer*>(&state.optimizer());
  int64_t flips_before = 0;

  // The memory budget: refuse now if even the smallest activation plan cannot fit beside what the
  // process holds and the gradients; the first step runs under that plan (TrainOptions).
  BudgetPlan budget;
  if (options.memory_budget) {
    if (config.model.recurrent())
      throw InputError("[train] --memory-budget: a depth-recurrent model's activations are not planned yet");
    const model::ModelConfig& c = config.model;
    budget.smallest = sched::smallest_plan(c);
    budget.smallest_peak = sched::training_memory(c, B, T, budget.smallest).peak;
    int64_t gradients = 0;
    for (const model::ParamSpec& p : m.params()) gradients += p.numel() * 4;
    const int64_t held = current_rss_bytes();
    if (held + gradients + budget.smallest_peak > *options.memory_budget)
      throw InputError(fmt::format("[train] --memory-budget {}: the process holds {} (model, master weights, optimizer, "
                                   "data), the gradients take {} and the smallest activation plan (every block "
                                   "recomputed) needs {}: at least {}",
                                   mib(*options.memory_budget), mib(held), mib(gradients), mib(budget.smallest_peak),
                                   mib(held + gradients + budget.smallest_peak)));
    m.set_recompute(budget.smallest);
  }

  int64_t step = 0;
  const fs::path metrics_path = run_dir / "metrics.jsonl";
  if (checkpoint) {
    LoadedCheckpoint ckpt = load_checkpoint(*checkpoint);
    check_checkpoint_config(ckpt, identity, "train");
    if (ckpt.step > config.steps)
      throw InputError(fmt::format("[train] {}: step {} is beyond train.steps {}", ckpt.dir.string(), ckpt.step,
                                   config.steps));
    state.restore(ckpt, "train");
    step = ckpt.step;
    result.start_step = step;
    truncate_after_step(metrics_path, step);
  }
  MetricsWriter metrics(metrics_path);

  // The served copy of a step is made once (a stateful rule such as ef must not run twice).
  // A checkpoint of step s holds the rule's state from before the export of step s (the master
  // it holds is the one that export reads): an evaluation at s exports before the save, so the
  // state is set aside then.
  auto saves_at = [&](int64_t s) {
    return (config.checkpoint_every > 0 && s % config.checkpoint_every == 0) || s == config.steps;
  };
  int64_t exported_step = -1;
  std::vector<NamedTensor> export_state_before;  // of exported_step, when saves_at(it)
  auto export_served = [&](int64_t at_step) {
    if (exported_step == at_step) return;
    exported_step = at_step;
    if (saves_at(at_step)) export_state_before = state.export_state();
    state.export_to(m, at_step);
  };
  auto save = [&](int64_t at_step) {
    const json extra = {{"step", at_step}, {"seed", config.seed}, {"tokens_seen", at_step * B * T},
                        {"last_validation_loss", result.last_validation_loss}, {"config", identity}};
    state.save(run_dir, at_step, extra, config.checkpoint_keep, {},
               exported_step == at_step ? &export_state_before : nullptr);
  };

  ProgressBar progress(stderr);
  if (options.progress)
    progress.message(fmt::format("{}: {} parameters, policy {}, export {}, B={} T={}, {} steps{}",
                                 config.name, config.model.parameter_count(), config.policy.name,
                                 config.export_rule, B, T, config.steps,
                                 step > 0 ? fmt::format(", resumed at step {}", step) : ""));
  if (options.progress && config.model.recurrent())
    progress.message(fmt::format("depth per step: {} (E[r] = {:.2f}, sd {:.2f}), gradient through {}", config.depth.kind,
                                 config.depth.expected_depth(), std::sqrt(config.depth.depth_variance()),
                                 config.depth.backprop > 0 ? fmt::format("the last {} iterations", config.depth.backprop)
                                                           : std::string("every iteration")));
  if (!config.init_from.empty() && step == 0 && !teacher) {
    // A fine-tuning run: where the initial weights stand on the new corpus.
    export_served(0);
    result.initial_validation_loss = validation_loss(m, validation, config.depth);
    metrics.write({{"step", 0}, {"val_loss", *result.initial_validation_loss}});
    if (options.progress)
      progress.message(fmt::format("step 0 ({}): validation loss {:.4f} nats/byte", config.init_from,
                                   *result.initial_validation_loss));
  }
  const int64_t tokens_per_step = B * T;
  std::vector<float> teacher_logits;
  double train_seconds = 0;
  int64_t steps_here = 0;
  for (; step < config.steps; ++step) {
    const auto t0 = clock::now();
    export_served(step);
    const Batch batch = sampler.at(step);
    const bool moe = config.model.moe();
    if (moe) m.set_router_stats(true);  // this step's routing, for the metrics line
    const bool recurrent = config.model.recurrent();
    int64_t depth = 0;
    if (recurrent) {  // this step's depth and s0, functions of (seed, step): a resume draws the same
      depth = config.depth.at(config.seed, step);
      m.set_depth(depth);
      m.set_backprop_iterations(config.depth.backprop);
      m.set_state_seed(config.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step) + 1);
    }
    float loss = 0;
    if (teacher) {
      teacher_logits.resize(static_cast<size_t>(B * T * config.model.vocab_size));
      teacher->model.forward(batch.inputs, B, T, teacher_logits);
      loss = static_cast<float>(m.forward_backward_distill(batch.inputs, teacher_logits, B, T, static_cast<uint64_t>(step)));
    } else {
      loss = m.forward_backward(batch.inputs, batch.targets, B, T, static_cast<uint64_t>(step));
    }
    const int64_t activations = m.activation_memory().live_high_water;
    result.activation_measured = std::max(result.activation_measured, activations);
    const double lr = schedule.at(step);
    const double grad_norm = state.step(m, lr);
    if (options.memory_budget && !budget.plan) {
      // After the first step: what the process holds besides the activations, measured.
      const auto peak = static_cast<int64_t>(peak_rss_bytes());
      if (peak > *options.memory_budget)
        throw InputError(fmt::format("[train] --memory-budget {}: the first step, under the smallest activation plan "
                                     "({} of activations), peaked at {} of RSS", mib(*options.memory_budget),
                                     mib(activations), mib(peak)));
      // Kept aside besides: the validation pass's logits (B·T·V floats) and the served copy the
      // final export writes (a float per parameter), which come after the first step.
      int64_t later = B * T * config.model.vocab_size * 4;
      for (const model::ParamSpec& p : m.params()) later += p.numel() * 4;
      const int64_t other = peak - activations + later;
      budget.plan = sched::plan_recompute(config.model, B, T, *options.memory_budget - other);
      const bool fits = budget.plan.has_value();
      if (!fits) budget.plan = sched::RecomputePlan{budget.smallest, sched::training_memory(config.model, B, T, budget.smallest)};
      if (!fits && options.progress)
        progress.message(fmt::format("memory budget {}: no plan fits beside the {} the process holds and will hold; the "
                                     "smallest runs, and the run may exceed the budget by up to {}",
                                     mib(*options.memory_budget), mib(other),
                                     mib(other + budget.plan->memory.peak - *options.memory_budget)));
      m.set_recompute(budget.plan->modes);
      for (sched::Recompute r : budget.plan->modes) result.recompute.push_back(sched::recompute_name(r));
      result.activation_predicted = budget.plan->memory.peak;
      if (options.progress)
        progress.message(fmt::format("memory budget {}: {} besides activations (measured in the first step, with the "
                                     "validation logits and the final export's copy); activations "
                                     "planned at {} ({}; +{:.1f}% FLOPs per step)",
                                     mib(*options.memory_budget), mib(other), mib(budget.plan->memory.peak),
                                     sched::recompute_summary(budget.plan->modes),
                                     100 * budget.plan->memory.recompute_flops / budget.plan->memory.step_flops));
    }
    const double dt = std::chrono::duration<double>(clock::now() - t0).count();
    train_seconds += dt;
    ++steps_here;
    result.losses.push_back(loss);
    const double tokens_per_s = static_cast<double>(tokens_per_step) / dt;  // tokens, not token·iterations
    nlohmann::json line = {{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", grad_norm},
                           {"tokens_per_s", tokens_per_s}, {"step_seconds", dt}, {"activation_bytes", activations}};
    if (recurrent) line["depth"] = depth;
    if (binary_optimizer != nullptr) {
      // The binary optimizers: this step's sign flips and the state per binary weight, from the
      // optimizer's allocations.
      const OptimizerMemory memory = binary_optimizer->memory();
      line["sign_flips"] = binary_optimizer->flips() - flips_before;
      line["state_bits_per_binary_weight"] = memory.binary_bits_per_weight();
      line["optimizer_state_bytes"] = memory.total_bytes();
      line["peak_rss_bytes"] = peak_rss_bytes();
      flips_before = binary_optimizer->flips();
    }
    if (moe) {
      // Qwen3-MoE: the step's tokens per expert of each MoE layer, and the load-balancing loss
      // (when output_router_logits puts it in the loss).
      nlohmann::json routed = nlohmann::json::array();
      for (const std::vector<int64_t>& counts : m.router_stats().counts)
        if (!counts.empty()) routed.push_back(counts);
      line["tokens_per_expert"] = std::move(routed);
      if (config.model.output_router_logits) line["moe_aux_loss"] = m.moe_aux_loss();
      m.set_router_stats(false);
    }
    metrics.write(line);
    if (options.progress) progress.update(step + 1 - result.start_step, config.steps - result.start_step, loss,
                                          static_cast<double>(steps_here * tokens_per_step) / train_seconds);
    const bool last = step + 1 == config.steps;
    if ((config.eval_every > 0 && (step + 1) % config.eval_every == 0) || last) {
      export_served(step + 1);
      result.last_validation_loss = teacher ? distill_validation(m, teacher->model, validation, B, T)
                                            : validation_loss(m, validation, config.depth);
      metrics.write({{"step", step + 1}, {"val_loss", result.last_validation_loss}});
      if (options.progress)
        progress.message(fmt::format("step {}: validation {} {:.4f} nats/{}", step + 1, teacher ? "KL to the teacher" : "loss",
                                     result.last_validation_loss, teacher ? "token" : "byte"));
    }
    if (saves_at(step + 1)) save(step + 1);
    if (options.stop_after && steps_here >= *options.stop_after) {
      ++step;
      break;
    }
  }
  if (options.progress) progress.finish();
  result.steps_done = step;
  // final/ of the last step: written after the run, or rebuilt from the last checkpoint when a
  // finished run lacks it (killed between the last checkpoint and final/, or final/ removed). The
  // checkpoint of step s holds the export rule's state from before the export of s, so the
  // rebuilt copy is the one the uninterrupted run wrote, bit for bit.
  const std::map<std::string, std::string> metadata = final_metadata(config, identity, config.steps);
  if (step == config.steps && (steps_here > 0 || !final_is_current(run_dir / "final", metadata))) {
    result.final_rebuilt = steps_here == 0;
    export_served(step);
    write_served_model(run_dir / "final", m, metadata, teacher_tokenizer);
  }
  result.tokens_per_second = train_seconds > 0 ? static_cast<double>(steps_here * tokens_per_step) / train_seconds : 0;
  result.seconds = std::chrono::duration<double>(clock::now() - t_start).count();
  result.peak_rss_bytes = peak_rss_bytes();
  result.optimizer_memory = state.optimizer().memory();
  for (const std::vector<float>& master : state.masters())
    result.master_bytes += static_cast<int64_t>(master.capacity() * sizeof(float));
  if (binary_optimizer != nullptr) result.binary_flips = binary_optimizer->flips();
  return result;
}

}  // namespace concord::train
