// Held-out evaluation at depths and with adaptive exit (depth_eval.h).
#include "concord/train/depth_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include <fmt/format.h>

#include "concord/io/json_file.h"
#include "concord/model/kv_cache.h"
#include "concord/model/ops.h"
#include "concord/numerics/check.h"

namespace concord::train {

RunData load_run_data(const std::filesystem::path& run_dir) {
  const std::filesystem::path config_path = run_dir / "config.json";
  if (!std::filesystem::is_regular_file(config_path))
    throw InputError(fmt::format("[eval] {}: no config.json (is it a `concord train` run directory?)", run_dir.string()));
  RunData run{TrainConfig::load(config_path), {}};
  const TrainConfig& c = run.config;
  const ByteTokenizer tokenizer;
  const TokenSplit split = split_tokens(tokenizer.encode(load_corpus(c.corpus)), c.validation_fraction, c.split_chunk);
  run.validation = validation_batches(split.validation, c.batch_size, c.seq_len, c.eval_batches);
  return run;
}

double mean_loss(model::Model& m, const std::vector<Batch>& batches) {
  const int64_t V = m.config().vocab_size;
  double sum = 0;
  int64_t count = 0;
  std::vector<float> logits;
  for (const Batch& b : batches) {
    logits.resize(static_cast<size_t>(b.B * b.T * V));
    m.forward(b.inputs, b.B, b.T, logits);
    sum += model::cross_entropy_forward<float>(nullptr, logits.data(), b.targets.data(), b.B * b.T, V);
    for (int32_t t : b.targets) count += t >= 0;
  }
  return count > 0 ? sum / static_cast<double>(count) : 0.0;
}

DecodeEval decode_eval(model::Model& m, const std::vector<Batch>& batches, int64_t rows,
                       std::optional<model::Model::AdaptiveExit> exit) {
  const bool recurrent = m.config().recurrent();
  if (exit && !recurrent) throw InputError("[eval] adaptive exit needs a depth-recurrent model");
  const int64_t V = m.config().vocab_size;
  if (recurrent) m.set_adaptive_exit(exit);
  model::KvCache cache(m.config(), 1);
  std::vector<float> logits(static_cast<size_t>(V));
  DecodeEval out;
  double sum = 0, seconds = 0;
  int64_t iterations = 0, done_rows = 0;
  for (const Batch& b : batches) {
    for (int64_t r = 0; r < b.B && done_rows < rows; ++r, ++done_rows) {
      const int slot = cache.allocate();
      for (int64_t t = 0; t < b.T; ++t) {
        const int32_t* token = b.inputs.data() + r * b.T + t;
        const model::CachedInput in{slot, std::span(token, 1), model::LogitRows::last};
        const auto t0 = std::chrono::steady_clock::now();
        m.forward_cached(cache, std::span(&in, 1), logits);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (recurrent) iterations += m.last_iterations().at(0);
        const int32_t target = b.targets[static_cast<size_t>(r * b.T + t)];
        if (target < 0) continue;
        sum += model::cross_entropy_forward<float>(nullptr, logits.data(), &target, 1, V);
        ++out.tokens;
      }
      cache.release(slot);
    }
  }
  if (recurrent) m.set_adaptive_exit(std::nullopt);
  const auto steps = static_cast<double>(done_rows * (batches.empty() ? 0 : batches.front().T));
  out.loss = out.tokens > 0 ? sum / static_cast<double>(out.tokens) : 0.0;
  out.iterations_per_token = steps > 0 ? static_cast<double>(iterations) / steps : 0.0;
  out.tokens_per_second = seconds > 0 ? steps / seconds : 0.0;
  return out;
}

double addition_accuracy(model::Model& m, int digits, int64_t problems, uint64_t seed, SumOrder order) {
  const std::string text = addition_problems(problems, digits, digits, seed, order);
  const int64_t V = m.config().vocab_size;
  const ByteTokenizer tokenizer;
  model::KvCache cache(m.config(), 1);
  std::vector<float> logits(static_cast<size_t>(V));
  int64_t right = 0;
  std::istringstream lines(text);
  std::string line;
  for (int64_t i = 0; i < problems && std::getline(lines, line); ++i) {
    const size_t eq = line.find('=');
    CONCORD_CHECK(eq != std::string::npos, "an addition problem without '='");
    std::string prompt(1, '\n');
    prompt.append(line, 0, eq + 1);
    const std::string answer(line.begin() + static_cast<std::ptrdiff_t>(eq) + 1, line.end());
    const int slot = cache.allocate();
    std::vector<int32_t> tokens = tokenizer.encode(prompt);
    std::string got;
    for (int step = 0; step < digits + 2; ++step) {
      const model::CachedInput in{slot, tokens, model::LogitRows::last};
      m.forward_cached(cache, std::span(&in, 1), logits);
      const auto next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (next == '\n' || next >= 256) break;
      got += static_cast<char>(next);
      tokens = {next};
    }
    right += got == answer;
    cache.release(slot);
  }
  return problems > 0 ? static_cast<double>(right) / static_cast<double>(problems) : 0.0;
}

}  // namespace concord::train
