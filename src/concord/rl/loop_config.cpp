// The RL run's configuration (loop.h): JSON in and out, validation, fault specs.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "concord/io/json_file.h"
#include "concord/model/files.h"
#include "concord/model/policy.h"
#include "concord/numerics/check.h"
#include "concord/rl/loop.h"
#include "concord/rl/tasks.h"
#include "concord/train/data.h"
#include "concord/train/export.h"

namespace concord::rl {
namespace {

using nlohmann::json;

[[noreturn]] void config_error(const std::string& source, const std::string& what) {
  throw InputError(fmt::format("[rl] {}: {}", source, what));
}

using Reader = io::JsonValue;

// Calls fn(key, reader) for every key of section `name` (an object).
template <class Fn>
void each_key(const Reader& section, Fn fn) {
  section.each_member(fn);
}

void check_preset(const std::string& source, const std::string& key, const std::string& name) {
  try {
    (void)model::PrecisionPolicy::from_name_or_file(name);
  } catch (const InputError& e) {
    config_error(source, fmt::format("'{}': {}", key, e.what()));
  }
}

}  // namespace

model::ModelConfig default_rl_model() {
  model::ModelConfig m;
  m.vocab_size = train::ByteTokenizer::vocab_size();
  m.hidden_size = 64;
  m.intermediate_size = 128;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 2;
  m.num_key_value_heads = 1;
  m.head_dim = 32;
  m.max_position_embeddings = 128;
  m.bos_token_id = train::ByteTokenizer::kBos;
  m.eos_token_id = train::ByteTokenizer::kEos;
  m.eos_token_ids = {train::ByteTokenizer::kEos};
  return m;
}

FaultAt parse_fault(std::string_view text) {
  const size_t at = text.rfind('@');
  if (at == std::string_view::npos)
    throw InputError(fmt::format("[rl] fault '{}' must be NAME@STEP (e.g. flipped_bit@3; names: {})",
                                 text, fmt::join(fault_names(), ", ")));
  FaultAt f;
  f.fault = fault_from_name(text.substr(0, at));
  const std::string step(text.substr(at + 1));
  char* end = nullptr;
  const long long v = std::strtoll(step.c_str(), &end, 10);
  if (step.empty() || *end != '\0' || v < 1)
    throw InputError(fmt::format("[rl] fault '{}': the step must be an integer >= 1", text));
  f.step = v;
  return f;
}

model::ModelConfig RlConfig::resolved_model() const {
  if (init_from.empty()) return model;
  return model::inspect_model(init_from).config;
}

RlConfig RlConfig::from_json(const json& j, const std::string& source) {
  const Reader doc(j, "rl", source);
  doc.object();
  RlConfig c;
  for (const auto& [key, value] : j.items()) {
    const Reader r = doc[key];
    if (key == "name") c.name = r.string();
    else if (key == "model") c.model = model::ModelConfig::from_json(r);
    else if (key == "init_from") c.init_from = r.string();
    else if (key == "base") c.base = r.string();
    else if (key == "sampler") c.sampler = r.string();
    else if (key == "learner") c.learner = r.string();
    else if (key == "export") c.export_rule = r.string();
    else if (key == "loss_on_served") c.loss_on_served = r.boolean();
    else if (key == "seed") c.seed = static_cast<uint64_t>(r.integer());
    else if (key == "out") c.out = r.string();
    else if (key == "log_rollouts") c.log_rollouts = r.boolean();
    else if (key == "checkpoint_every") c.checkpoint_every = r.integer();
    else if (key == "speculative") {
      each_key(r, [&](const std::string& k, const Reader& kr) {
        if (k == "drafter") c.speculative = kr.string();
        else if (k == "draft_tokens") {
          const int64_t n = kr.integer(1);
          if (n > 64) config_error(source, fmt::format("speculative.draft_tokens {} must lie in [1, 64]", n));
          c.speculative_tokens = static_cast<int>(n);
        }
        else config_error(source, fmt::format("unknown key '{}' (drafter, draft_tokens)", kr.key()));
      });
    }
    else if (key == "eval") {
      each_key(r, [&](const std::string& k, const Reader& kr) {
        if (k == "every") c.eval_every = kr.integer();
        else if (k == "prompts") c.eval_prompts = kr.integer(1);
        else if (k == "max_new_tokens") c.eval_max_new_tokens = kr.integer();
        else config_error(source, fmt::format("unknown key '{}' (every, prompts, max_new_tokens)", kr.key()));
      });
    }
    else if (key == "task") {
      each_key(r, [&](const std::string& k, const Reader& kr) {
        if (k == "name") c.task = kr.string();
        else if (k == "difficulty") c.difficulty = static_cast<int>(std::min<int64_t>(kr.integer(1), 1000));
        else config_error(source, fmt::format("unknown key '{}' (name, difficulty)", kr.key()));
      });
    } else if (key == "warmup") {
      each_key(r, [&](const std::string& k, const Reader& kr) {
        if (k == "steps") c.warmup_steps = kr.integer();
        else if (k == "lr") c.warmup_lr = kr.number();
        else if (k == "batch_size") c.warmup_batch = kr.integer();
        else config_error(source, fmt::format("unknown key '{}' (steps, lr, batch_size)", kr.key()));
      });
    } else if (key == "grpo") {
      each_key(r, [&](const std::string& k, const Reader& kr) {
        if (k == "steps") c.steps = kr.integer();
        else if (k == "prompts_per_step") c.prompts_per_step = kr.integer();
        else if (k == "group_size") c.group_size = kr.integer();
        else if (k == "max_new_tokens") c.max_new_tokens = kr.integer();
        else if (k == "temperature") c.temperature = kr.number();
        else if (k == "ppo_epochs") c.ppo_epochs = kr.integer();
        else if (k == "lr") c.lr = kr.number();
        else if (k == "weight_decay") c.weight_decay = kr.number();
        else if (k == "grad_clip") c.grad_clip = kr.number_at_least(0);  // 0: no clipping
        else if (k == "beta1") c.beta1 = kr.number();
        else if (k == "beta2") c.beta2 = kr.number();
        else
          config_error(source, fmt::format("unknown key '{}' (steps, prompts_per_step, group_size, "
                                           "max_new_tokens, temperature, ppo_epochs, lr, "
                                           "weight_decay, grad_clip, beta1, beta2)", kr.key()));
      });
    } else if (key == "loss") {
      each_key(r, [&](const std::string& k, const Reader& kr) {
        if (k == "clip_low") c.loss.clip_low = kr.number();
        else if (k == "clip_high") c.loss.clip_high = kr.number();
        else if (k == "kl_coef") c.loss.kl_coef = kr.number();
        else if (k == "is") c.loss.is = is_mode_from_name(kr.string());
        else if (k == "is_cap") c.loss.is_cap = kr.number();
        else if (k == "mask_lo") c.loss.mask_lo = kr.number();
        else if (k == "mask_hi") c.loss.mask_hi = kr.number();
        else
          config_error(source, fmt::format("unknown key '{}' (clip_low, clip_high, kl_coef, is, "
                                           "is_cap, mask_lo, mask_hi)", kr.key()));
      });
    } else if (key == "probe") {
      each_key(r, [&](const std::string& k, const Reader& kr) {
        if (k == "sequences") c.probe.sequences = kr.integer();
        else if (k == "length") c.probe.length = kr.integer();
        else if (k == "seed") c.probe.seed = static_cast<uint64_t>(kr.integer());
        else if (k == "max_k3_kl") c.probe.max_k3_kl = kr.number_at_least(0);
        else if (k == "osc_max") {
          const double osc = kr.number_at_least(0);
          c.probe.contract = audit::Contract{};
          c.probe.contract.ref = "learner";
          c.probe.contract.cand = "sampler";
          c.probe.contract.slices.push_back({"all", 0, 1.0, osc, osc});
        } else {
          config_error(source, fmt::format("unknown key '{}' (sequences, length, seed, max_k3_kl, "
                                           "osc_max)", kr.key()));
        }
      });
    } else if (key == "faults") {
      if (!value.is_array()) config_error(source, "'faults' must be a list of \"NAME@STEP\" strings");
      for (const json& f : value) {
        if (!f.is_string()) config_error(source, "'faults' must be a list of \"NAME@STEP\" strings");
        try {
          c.faults.push_back(parse_fault(f.get<std::string>()));
        } catch (const InputError& e) {
          config_error(source, e.what());
        }
      }
    } else {
      config_error(source, fmt::format("unknown key '{}' (name, model, init_from, base, sampler, "
                                       "learner, export, loss_on_served, task, warmup, grpo, loss, "
                                       "probe, faults, seed, out, log_rollouts, "
                                       "checkpoint_every, speculative, eval)", key));
    }
  }
  c.validate(source);
  return c;
}

void RlConfig::validate(const std::string& source) const {
  check_preset(source, "sampler", sampler);
  check_preset(source, "learner", learner);
  const auto rules = train::export_rule_names();
  if (std::find(rules.begin(), rules.end(), export_rule) == rules.end())
    config_error(source, fmt::format("unknown export rule '{}' ({})", export_rule, fmt::join(rules, ", ")));
  if (task != "mixed") {
    const Task& t = rl::task(task);  // InputError for an unknown task
    if (difficulty < 1 || difficulty > t.max_difficulty())
      config_error(source, fmt::format("task '{}': difficulty {} outside [1, {}]", task, difficulty,
                                       t.max_difficulty()));
  } else {
    for (const std::string& each : task_names()) {
      if (difficulty < 1 || difficulty > rl::task(each).max_difficulty())
        config_error(source, fmt::format("task '{}': difficulty {} outside [1, {}]", each, difficulty,
                                         rl::task(each).max_difficulty()));
    }
  }
  if (steps < 1) config_error(source, "grpo.steps must be at least 1");
  if (steps >= 100000000) config_error(source, "grpo.steps must be below 10^8 (checkpoint names)");
  if (checkpoint_every < 0) config_error(source, "checkpoint_every must be >= 0 (0: only after the last step)");
  if (eval_every < 0) config_error(source, "eval.every must be >= 0 (0: no held-out evaluation)");
  if (eval_prompts < 1 || eval_prompts > 4096) config_error(source, "eval.prompts must lie in [1, 4096]");
  if (eval_max_new_tokens < 0) config_error(source, "eval.max_new_tokens must be >= 0 (0: grpo.max_new_tokens)");
  if (prompts_per_step < 1 || group_size < 2)
    config_error(source, "grpo.prompts_per_step must be >= 1 and grpo.group_size >= 2 (GRPO "
                         "compares completions within a group)");
  if (max_new_tokens < 1) config_error(source, "grpo.max_new_tokens must be at least 1");
  if (temperature != 1.0)
    config_error(source, "grpo.temperature must be 1 (the learner scores tokens at T = 1, so "
                         "another sampling temperature would be a mismatch by construction)");
  if (ppo_epochs < 1) config_error(source, "grpo.ppo_epochs must be at least 1");
  for (const auto& [key, beta] : {std::pair{"grpo.beta1", beta1}, std::pair{"grpo.beta2", beta2}})
    if (!(beta >= 0 && beta < 1))
      config_error(source, fmt::format("{} must lie in [0, 1) (AdamW's bias correction 1 - beta^t), got {}",
                                       key, beta));
  if (!(lr >= 0) || !(warmup_lr >= 0) || !(weight_decay >= 0) || !(grad_clip >= 0))
    config_error(source, fmt::format("learning rates, weight decay and grad_clip must be >= 0 (grpo.lr {}, "
                                     "warmup.lr {}, grpo.weight_decay {}, grpo.grad_clip {})",
                                     lr, warmup_lr, weight_decay, grad_clip));
  if (warmup_steps > 0 && warmup_batch < 1) config_error(source, "warmup.batch_size must be at least 1");
  if (!(loss.clip_low >= 0 && loss.clip_low < 1) || !(loss.clip_high >= 0))
    config_error(source, "loss.clip_low must lie in [0, 1) and loss.clip_high be >= 0");
  if (!(loss.kl_coef >= 0)) config_error(source, "loss.kl_coef must be >= 0");
  if (!(loss.is_cap > 0) || !(loss.mask_lo >= 0 && loss.mask_lo < loss.mask_hi))
    config_error(source, "loss.is_cap must be > 0 and 0 <= loss.mask_lo < loss.mask_hi");
  if (probe.sequences < 1 || probe.length < 2)
    config_error(source, "probe.sequences must be >= 1 and probe.length >= 2");
  const model::ModelConfig m = init_from.empty() ? model : model::ModelConfig{};
  if (init_from.empty()) {
    if (m.vocab_size < train::ByteTokenizer::vocab_size())
      config_error(source, fmt::format("the byte-level tokenizer needs model.vocab_size >= {}",
                                       train::ByteTokenizer::vocab_size()));
    if (probe.length > m.max_position_embeddings)
      config_error(source, "probe.length exceeds the model's max_position_embeddings");
  }
  if (out.empty()) config_error(source, "'out' must not be empty");
  if (!base.empty() && std::filesystem::path(base).lexically_normal() == std::filesystem::path(out).lexically_normal())
    config_error(source, fmt::format("'base' and 'out' are the same folder ({}); the warm-up cache needs its own "
                                     "(e.g. {}/base)", out, out));
  for (const FaultAt& f : faults) {
    if (f.step < 1 || f.step > steps)
      config_error(source, fmt::format("fault {}@{}: the step must lie in [1, {}]",
                                       fault_name(f.fault), f.step, steps));
  }
}

RlConfig RlConfig::load(const std::filesystem::path& path) {
  return from_json(io::read_json_file(path, "rl", "the RL config"), path.string());
}

json RlConfig::to_json() const {
  json faults_json = json::array();
  for (const FaultAt& f : faults) faults_json.push_back(fmt::format("{}@{}", fault_name(f.fault), f.step));
  json probe_json = {{"sequences", probe.sequences}, {"length", probe.length},
                     {"seed", probe.seed}, {"max_k3_kl", probe.max_k3_kl}};
  if (probe.contract.slices.size() == 1 && probe.contract.slices[0].slice == "all")
    probe_json["osc_max"] = probe.contract.slices[0].osc_max;
  json grpo = {{"steps", steps}, {"prompts_per_step", prompts_per_step},
               {"group_size", group_size}, {"max_new_tokens", max_new_tokens},
               {"temperature", temperature}, {"ppo_epochs", ppo_epochs}, {"lr", lr},
               {"weight_decay", weight_decay}, {"grad_clip", grad_clip}};
  // Only when set: a config from before these keys keeps its identity (loop.h).
  if (beta1 != kDefaultBeta1) grpo["beta1"] = beta1;
  if (beta2 != kDefaultBeta2) grpo["beta2"] = beta2;
  json j = {{"name", name},
          {"model", model.to_json()},
          {"init_from", init_from},
          {"base", base},
          {"sampler", sampler},
          {"learner", learner},
          {"export", export_rule},
          {"loss_on_served", loss_on_served},
          {"task", {{"name", task}, {"difficulty", difficulty}}},
          {"warmup", {{"steps", warmup_steps}, {"lr", warmup_lr}, {"batch_size", warmup_batch}}},
          {"grpo", std::move(grpo)},
          {"loss", {{"clip_low", loss.clip_low}, {"clip_high", loss.clip_high},
                    {"kl_coef", loss.kl_coef}, {"is", std::string(is_mode_name(loss.is))},
                    {"is_cap", loss.is_cap}, {"mask_lo", loss.mask_lo}, {"mask_hi", loss.mask_hi}}},
          {"probe", probe_json},
          {"faults", faults_json},
          {"seed", seed},
          {"out", out},
          {"log_rollouts", log_rollouts},
          {"checkpoint_every", checkpoint_every}};
  if (!speculative.empty()) j["speculative"] = {{"drafter", speculative}, {"draft_tokens", speculative_tokens}};
  // Written only when on, so that a run from before the key keeps its config identity.
  if (eval_every > 0)
    j["eval"] = {{"every", eval_every}, {"prompts", eval_prompts}, {"max_new_tokens", eval_max_new_tokens}};
  return j;
}

}  // namespace concord::rl
