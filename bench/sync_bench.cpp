// Weight sync (rl/sync.h): one sync — publish on the learner, the seven checks and the swap on
// the sampler — against a plain memcpy of the same weights (the payload's weight bytes), measured
// in the same run, per model size and sampler preset (bench/README.md, "Weight sync").
//
// Counters are milliseconds per sync, averaged over the iterations: the learner's publish split
// (encode, hash = the learner's quantizer and XXH3, probe forward, serialize), the sampler's
// decode (parse + install + prepare the derived copies), each check, the swap; memcpy_ms is the
// best of 5 copies of the weight bytes. checks_1_6_vs_memcpy = (checks 1-6) / memcpy: the
// issue's goal is < 0.2 (measured here, not asserted).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "concord/model/model.h"
#include "concord/numerics/format.h"
#include "concord/rl/sync.h"

namespace {

using namespace concord;

struct Size {
  const char* name;
  int64_t hidden, intermediate, layers, heads, kv_heads, vocab;
};
// tiny and small are configs/tiny.json and configs/small.json's shapes; mid lies between.
constexpr Size kSizes[] = {
    {"tiny", 128, 512, 4, 4, 2, 259},
    {"mid", 256, 768, 6, 4, 2, 4096},
    {"small", 512, 1536, 8, 8, 4, 259},
};
const char* kPresets[] = {"bf16", "mxfp8", "nvfp4", "fp8-tensor"};

model::ModelConfig config_of(const Size& s) {
  model::ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = s.hidden / s.heads;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = true;
  return c;
}

// Bytes of the weights in the payload's dtypes (matrices in the served format, the rest f32).
size_t weight_bytes(const model::Model& m) {
  const size_t served = static_cast<size_t>(numerics::traits(m.policy().served_weights).bits / 8);
  size_t bytes = 0;
  for (const auto& spec : m.params())
    bytes += static_cast<size_t>(spec.numel()) * (spec.is_matrix() ? served : 4);
  return bytes;
}

double memcpy_seconds(size_t bytes) {
  std::vector<uint8_t> from(bytes, 1), to(bytes, 0);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(to.data(), from.data(), bytes);
    benchmark::DoNotOptimize(to.data());
    benchmark::ClobberMemory();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// range(0): size index, range(1): preset index.
void BM_sync(benchmark::State& state) {
  const Size& size = kSizes[state.range(0)];
  const auto policy = model::PrecisionPolicy::preset(kPresets[state.range(1)]);
  const model::ModelConfig config = config_of(size);
  model::Model served(config, policy), serving(config, policy);
  served.init_random(1, 0.05f);
  for (const auto& spec : served.params()) {  // the served copy is on the bf16 grid
    if (!spec.is_matrix() || policy.served_weights != numerics::Format::bf16) continue;
    for (float& x : served.param(spec.name))
      x = std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0xFFFF0000u);
  }
  served.weights_changed();
  rl::WeightPublisher publisher(served, policy);
  rl::WeightReceiver receiver(serving);
  std::map<std::string, double> ms;
  uint64_t version = 0;
  size_t payload_bytes = 0;
  for (auto _ : state) {
    ++version;
    const std::vector<uint8_t> payload = publisher.publish(version);
    const rl::SyncReport r = receiver.apply(payload, version);
    if (!r.applied) {
      state.SkipWithError(r.failure()->message.c_str());
      return;
    }
    payload_bytes = payload.size();
    ms["publish_encode_ms"] += publisher.seconds_encode * 1e3;
    ms["publish_hash_ms"] += publisher.seconds_hash * 1e3;
    ms["publish_probe_ms"] += publisher.seconds_probe * 1e3;
    ms["publish_serialize_ms"] += publisher.seconds_serialize * 1e3;
    ms["decode_ms"] += r.seconds_decode * 1e3;
    ms["decode_install_ms"] += r.seconds_install * 1e3;
    ms["decode_prepare_ms"] += r.seconds_prepare * 1e3;
    ms["swap_ms"] += r.seconds_swap * 1e3;
    for (const rl::CheckOutcome& c : r.checks)
      ms[std::string("check") + std::to_string(static_cast<int>(c.check)) + "_" +
         std::string(rl::sync_check_name(c.check)) + "_ms"] += c.seconds * 1e3;
  }
  const double n = static_cast<double>(state.iterations());
  double checks_1_6 = 0;
  for (auto& [name, total] : ms) {
    total /= n;
    state.counters[name] = total;
    if (name.rfind("check", 0) == 0 && name.rfind("check7", 0) != 0) checks_1_6 += total;
  }
  const size_t bytes = weight_bytes(served);
  const double copy_ms = memcpy_seconds(bytes) * 1e3;
  state.counters["weight_mib"] = static_cast<double>(bytes) / (1 << 20);
  state.counters["payload_mib"] = static_cast<double>(payload_bytes) / (1 << 20);
  state.counters["memcpy_ms"] = copy_ms;
  state.counters["checks_1_6_ms"] = checks_1_6;
  state.counters["checks_1_6_vs_memcpy"] = checks_1_6 / copy_ms;
  state.SetLabel(std::string(size.name) + "/" + kPresets[state.range(1)]);
}

void sync_args(benchmark::internal::Benchmark* b) {
  for (int64_t size = 0; size < 3; ++size)
    for (int64_t preset = 0; preset < 4; ++preset) b->Args({size, preset});
}
BENCHMARK(BM_sync)->Apply(sync_args)->Unit(benchmark::kMillisecond)->Iterations(5);

}  // namespace

BENCHMARK_MAIN();
