// The supervised warm-up of an RL run (warmup.h) and the folder that caches it.
#include "concord/rl/warmup.h"

#include <algorithm>
#include <cstdio>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/io/atomic_file.h"
#include "concord/io/safetensors.h"
#include "concord/io/tokenizer.h"
#include "concord/model/files.h"
#include "concord/numerics/check.h"
#include "concord/train/data.h"
#include "concord/train/optimizer.h"
#include "concord/train/train_state.h"

namespace concord::rl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using train::ByteTokenizer;

size_t sz(int64_t n) { return static_cast<size_t>(n); }

std::vector<int32_t> encode(std::string_view text) { return ByteTokenizer{}.encode(text); }

// Warm-up examples come from another seed than the RL prompts.
uint64_t warmup_seed(const RlConfig& c) { return c.seed ^ 0x5741524D55500000ull; }

}  // namespace

TaskExample config_example(const RlConfig& c, uint64_t seed, uint64_t index) {
  if (c.task == "mixed") {
    const std::vector<std::string> names = task_names();
    return task(names[index % names.size()]).generate(seed, index, c.difficulty);
  }
  return task(c.task).generate(seed, index, c.difficulty);
}

std::vector<std::vector<float>> model_weights(model::Model& m) {
  std::vector<std::vector<float>> out;
  for (const model::ParamSpec& p : m.params()) {
    auto v = m.param(p.name);
    out.emplace_back(v.begin(), v.end());
  }
  return out;
}

void set_model_weights(model::Model& m, const std::vector<std::vector<float>>& values) {
  const auto& specs = m.params();
  for (size_t p = 0; p < specs.size(); ++p) {
    auto dst = m.param(specs[p].name);
    std::copy(values[p].begin(), values[p].end(), dst.begin());
  }
  m.weights_changed();
}

namespace {

// A batch of supervised sequences prompt + answer + eos: inputs (B, T) padded, targets the next
// token on answer positions (the prompt is given, not learned) and -1 elsewhere.
struct SupervisedBatch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> inputs, targets;
};

SupervisedBatch warmup_batch(const RlConfig& c, int64_t step) {
  SupervisedBatch b;
  b.B = c.warmup_batch;
  std::vector<std::vector<int32_t>> seqs;
  std::vector<size_t> prompt_len;
  for (int64_t i = 0; i < b.B; ++i) {
    const TaskExample e = config_example(c, warmup_seed(c), static_cast<uint64_t>(step * b.B + i));
    std::vector<int32_t> s = encode(e.prompt);
    prompt_len.push_back(s.size());
    const std::vector<int32_t> a = encode(e.answer);
    s.insert(s.end(), a.begin(), a.end());
    s.push_back(ByteTokenizer::kEos);
    b.T = std::max(b.T, static_cast<int64_t>(s.size()) - 1);
    seqs.push_back(std::move(s));
  }
  b.inputs.assign(sz(b.B * b.T), ByteTokenizer::kPad);
  b.targets.assign(sz(b.B * b.T), -1);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const size_t row = i * sz(b.T);
    for (size_t t = 0; t + 1 < seqs[i].size(); ++t) {
      b.inputs[row + t] = seqs[i][t];
      if (t + 1 >= prompt_len[i]) b.targets[row + t] = seqs[i][t + 1];
    }
  }
  return b;
}

json warmup_stamp(const RlConfig& c) {
  return {{"format", "concord-rl-base/1"},
          {"model", c.resolved_model().to_json()},
          {"init_from", c.init_from},
          {"task", c.task},
          {"difficulty", c.difficulty},
          {"steps", c.warmup_steps},
          {"lr", c.warmup_lr},
          {"batch_size", c.warmup_batch},
          {"seed", c.seed}};
}

void write_base(const fs::path& dir, model::Model& m, const json& stamp, double final_loss) {
  // First: while the model files change, no warmup.json may vouch for them (an older stamp left
  // beside newer weights would make a later run with the older settings reuse these).
  std::error_code ec;
  fs::remove(dir / "warmup.json", ec);
  if (ec) throw InputError(fmt::format("[rl] {}: cannot remove the old warmup.json ({})", dir.string(), ec.message()));
  model::ExportOptions options;
  options.tokenizer = io::Tokenizer::byte_level({"<|bos|>", "<|eos|>", "<|pad|>"});
  options.metadata = {{"concord.rl.warmup_loss", fmt::format("{}", final_loss)}};
  model::export_model(m, dir, options);
  // Last: a folder without a matching warmup.json is never trusted.
  io::write_file_atomic(dir / "warmup.json", stamp.dump(2) + "\n");
}

bool base_matches(const fs::path& dir, const json& stamp) {
  std::ifstream in(dir / "warmup.json");
  if (!in || !fs::exists(dir / "model.safetensors")) return false;
  const json saved = json::parse(in, nullptr, false);
  return !saved.is_discarded() && saved == stamp;  // anything else: rebuilt
}

}  // namespace

WarmupResult warm_up(const RlConfig& c, bool progress) {
  const model::ModelConfig mc = c.resolved_model();
  WarmupResult result;
  const json stamp = warmup_stamp(c);
  if (!c.base.empty() && base_matches(c.base, stamp)) {
    model::LoadedModel loaded = model::load_model(c.base);
    if (loaded.model.config().to_json() == mc.to_json()) {
      result.cached = true;
      result.weights = model_weights(loaded.model);
      if (progress) std::fprintf(stderr, "%s: warmed-up model from %s\n", c.name.c_str(), c.base.c_str());
      return result;
    }
  }
  model::Model m(mc, model::PrecisionPolicy::preset("fp32"));
  if (c.init_from.empty()) {
    m.init_random(c.seed);
  } else {
    model::LoadedModel loaded = model::load_model(c.init_from);
    set_model_weights(m, model_weights(loaded.model));
  }
  // fp32 throughout: the master is the model's own values (copied back after each step), and
  // the warm-up's AdamW has fixed settings (betas 0.9 / 0.95, no weight decay, clip at 1).
  train::TrainState state(m, model::PrecisionPolicy::preset("fp32"), "rne", c.seed,
                          {.name = "adamw", .adamw = {c.warmup_lr, 0.9, 0.95, 1e-8, 0.0, 1.0}, .binary = {}});
  const train::LrSchedule schedule{c.warmup_lr, c.warmup_lr * 0.1, std::min<int64_t>(10, c.warmup_steps),
                                   std::max<int64_t>(c.warmup_steps, 1)};
  float loss = 0;
  for (int64_t s = 0; s < c.warmup_steps; ++s) {
    const SupervisedBatch b = warmup_batch(c, s);
    loss = m.forward_backward(b.inputs, b.targets, b.B, b.T, static_cast<uint64_t>(s));
    state.step(m, schedule.at(s));
    state.copy_master_to(m);
    if (progress && ((s + 1) % std::max<int64_t>(1, c.warmup_steps / 5) == 0 || s + 1 == c.warmup_steps))
      std::fprintf(stderr, "%s: warm-up step %lld/%lld  loss %.4f\n", c.name.c_str(),
                   static_cast<long long>(s + 1), static_cast<long long>(c.warmup_steps), loss);
  }
  if (!c.base.empty()) write_base(c.base, m, stamp, loss);
  result.loss = loss;
  result.weights = model_weights(m);
  return result;
}


}  // namespace concord::rl
