// Weight updates into a running server (POST/GET /v1/weights): a clean update swaps the version
// every later request reports and serves (GET reports the hashes the learner sent, computed on
// the prepared copies); every sync fault is refused with its check's number while the old
// version keeps serving; requests running while an update arrives finish on their version, none
// lost or duplicated; abort_running; the payload by path, shared memory and body; bad requests.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/io/safetensors.h"
#include "concord/io/tokenizer.h"
#include "concord/model/model.h"
#include "concord/rl/sync.h"
#include "concord/serve/server.h"

namespace concord::serve {
namespace {

using nlohmann::json;
using rl::Fault;
using rl::SyncCheck;

model::ModelConfig config() {
  model::ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 259;  // 256 bytes + 3 special tokens
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;  // q_proj square: transposed_tensor applies
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = true;  // untied_lm_head applies
  return c;
}

rl::ProbeOptions probe() {
  rl::ProbeOptions p;
  p.sequences = 2;
  p.length = 12;
  return p;
}

// The check each fault is caught by on an NVFP4 sampler (rl/sync.h; stale_router needs an MoE).
SyncCheck check_of(Fault f) {
  switch (f) {
    case Fault::stale_version: return SyncCheck::version;
    case Fault::dropped_tensor:
    case Fault::untied_lm_head:
    case Fault::partial_sync: return SyncCheck::manifest;
    case Fault::stale_derived: return SyncCheck::derived_state;
    case Fault::zeroed_scales:
    case Fault::wrong_tensor_scale: return SyncCheck::scale_sanity;
    case Fault::stale_weights: return SyncCheck::probe;
    default: return SyncCheck::content;
  }
}

class WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    policy_ = model::PrecisionPolicy::preset("nvfp4");
    serving_.emplace(config(), policy_);
    serving_->init_random(5, 0.3f);
    serving_->prepare_weights();
    learner_.emplace(config(), policy_);
    learner_->init_random(6, 0.3f);
    publisher_.emplace(*learner_, policy_, probe());
    tokenizer_.emplace(io::Tokenizer::byte_level({"<|im_start|>", "<|im_end|>", "<|endoftext|>"}));
    dir_ = std::filesystem::temp_directory_path() /
           fmt::format("concord-weights-{}-{}", ::getpid(), ::testing::UnitTest::GetInstance()->random_seed());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Servers here stop at max_tokens only (no stop token): every request runs its full length.
  void start(ServerOptions o = with_faults()) {
    o.port = 0;
    o.model_name = "tiny";
    o.engine.max_sequences = 4;
    server_ = std::make_unique<Server>(ServedModel{*serving_, *tokenizer_, "", {}}, o);
    port_ = server_->start();
  }
  static ServerOptions with_faults() {
    ServerOptions o;
    o.weights_faults = true;
    return o;
  }
  // The learner moves (new random weights) and publishes `version`.
  std::vector<uint8_t> publish(uint64_t version, Fault fault = Fault::none) {
    learner_->init_random(100 + version, 0.3f);
    return publisher_->publish(version, fault);
  }
  std::string write(const std::vector<uint8_t>& payload, const std::string& name) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(payload.data()),
                                                static_cast<std::streamsize>(payload.size()));
    return path;
  }
  httplib::Result post_weights(const json& body) {
    httplib::Client cli("127.0.0.1", port_);
    cli.set_read_timeout(60, 0);
    return cli.Post("/v1/weights", body.dump(), "application/json");
  }
  json get_weights() {
    httplib::Client cli("127.0.0.1", port_);
    auto res = cli.Get("/v1/weights");
    EXPECT_TRUE(res);
    EXPECT_EQ(res->status, 200);
    return json::parse(res->body);
  }
  json complete(const std::string& prompt, int max_tokens = 12) {
    httplib::Client cli("127.0.0.1", port_);
    cli.set_read_timeout(60, 0);
    auto res = cli.Post("/v1/completions",
                        json{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}}.dump(),
                        "application/json");
    EXPECT_TRUE(res);
    if (!res) return {};
    EXPECT_EQ(res->status, 200) << res->body;
    return json::parse(res->body);
  }
  static json content_of(const std::vector<uint8_t>& payload) {
    const io::SafetensorsFile f = io::SafetensorsFile::from_bytes(payload, "payload");
    return json::parse(f.metadata().at("concord.sync.content"));
  }

  model::PrecisionPolicy policy_;
  std::optional<model::Model> serving_, learner_;
  std::optional<rl::WeightPublisher> publisher_;
  std::optional<io::Tokenizer> tokenizer_;
  std::filesystem::path dir_;
  std::unique_ptr<Server> server_;
  int port_ = -1;
};

TEST_F(WeightsTest, ACleanUpdateSwapsTheVersionEveryLaterRequestServes) {
  start();
  const json v0 = get_weights();
  EXPECT_EQ(v0["version"], 0);
  EXPECT_EQ(v0["policy"], "nvfp4");
  const json before = complete("the sea");
  EXPECT_EQ(before["weights_version"], 0);

  const std::vector<uint8_t> payload = publish(1);
  auto res = post_weights({{"version", 1}, {"path", write(payload, "v1.safetensors")}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json applied = json::parse(res->body);
  EXPECT_TRUE(applied["applied"].get<bool>());
  EXPECT_EQ(applied["report"]["checks"].size(), 7u);

  // GET reports the hashes of what the kernels read now: the learner's, entry for entry.
  const json v1 = get_weights();
  EXPECT_EQ(v1["version"], 1);
  EXPECT_EQ(v1["content"], content_of(payload));
  EXPECT_NE(v1["content"], v0["content"]);
  EXPECT_EQ(v1["manifest"], json::parse(io::SafetensorsFile::from_bytes(payload, "p").metadata().at(
                                "concord.sync.manifest")));

  // Later requests run on version 1: the text a server started on the learner's weights gives.
  const json after = complete("the sea");
  EXPECT_EQ(after["weights_version"], 1);
  server_.reset();
  // The reference holds the payload's values as the safetensors reader decodes them.
  model::Model reference(config(), policy_);
  const io::SafetensorsFile file = io::SafetensorsFile::from_bytes(payload, "payload");
  for (const model::ParamSpec& spec : reference.params()) {
    const std::vector<float> from = io::tensor_to_floats(*file.find(spec.name));
    ASSERT_EQ(from.size(), reference.param(spec.name).size()) << spec.name;
    std::copy(from.begin(), from.end(), reference.param(spec.name).begin());
  }
  reference.weights_changed();
  Server alone(ServedModel{reference, *tokenizer_, "", {}}, [] {
    ServerOptions o;
    o.port = 0;
    o.model_name = "tiny";
    return o;
  }());
  port_ = alone.start();
  const json expected = complete("the sea");
  EXPECT_EQ(after["choices"][0]["text"], expected["choices"][0]["text"]);
  EXPECT_NE(after["choices"][0]["text"], before["choices"][0]["text"]);
}

TEST_F(WeightsTest, EveryFaultIsRefusedByItsCheckAndTheOldVersionServes) {
  start();
  ASSERT_EQ(post_weights({{"version", 1}, {"path", write(publish(1), "v1.safetensors")}})->status, 200);
  const json served = complete("abc");
  const json hashes = get_weights()["content"];
  uint64_t version = 2;
  for (const std::string& name : rl::fault_names()) {
    const Fault fault = rl::fault_from_name(name);
    if (fault == Fault::stale_router) continue;  // Qwen3-MoE only (tests/rl/sync_test.cpp)
    const std::vector<uint8_t> payload = publish(version, rl::learner_side(fault) ? fault : Fault::none);
    json body = {{"version", version}, {"path", write(payload, name + ".safetensors")}};
    if (!rl::learner_side(fault)) body["fault"] = name;
    // A request sent while the faulty update is checked completes on version 1.
    json during;
    std::thread client([&] { during = complete("abc"); });
    auto res = post_weights(body);
    client.join();
    ASSERT_TRUE(res) << name;
    EXPECT_EQ(res->status, 409) << name << ": " << res->body;
    const json err = json::parse(res->body);
    const int check = static_cast<int>(check_of(fault));
    EXPECT_EQ(err["error"]["check"], check) << name << ": " << res->body;
    EXPECT_EQ(err["error"]["code"], fmt::format("check_{}_{}", check, rl::sync_check_name(check_of(fault))));
    EXPECT_EQ(err["error"]["message"].get<std::string>().rfind(fmt::format("[sync] check {} ", check), 0), 0u);
    EXPECT_EQ(during["weights_version"], 1) << name;
    EXPECT_EQ(during["choices"][0]["text"], served["choices"][0]["text"]) << name;
    ++version;
  }
  EXPECT_EQ(get_weights()["version"], 1);
  EXPECT_EQ(get_weights()["content"], hashes);
  EXPECT_EQ(complete("abc")["choices"][0]["text"], served["choices"][0]["text"]);
  // The next clean update goes through.
  ASSERT_EQ(post_weights({{"version", version}, {"path", write(publish(version), "clean.safetensors")}})->status, 200);
  EXPECT_EQ(get_weights()["version"], version);
}

TEST_F(WeightsTest, RequestsRunningDuringAnUpdateFinishOnTheirVersionNoneLostOrDuplicated) {
  start();
  const std::string prompt = "once upon";
  const json v0 = complete(prompt, 24);
  const std::vector<uint8_t> payload = publish(1);
  const std::string path = write(payload, "v1.safetensors");

  // 8 streams, each sending requests back to back until told to stop; the update lands midway.
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<json> results;  // one per request: its streamed text, version and [DONE]
  std::atomic<int> sent{0};
  auto stream = [&] {
    httplib::Client cli("127.0.0.1", port_);
    cli.set_read_timeout(60, 0);
    while (!stop.load()) {
      ++sent;
      auto res = cli.Post("/v1/completions",
                          json{{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"stream", true}}.dump(),
                          "application/json");
      json r = {{"ok", res && res->status == 200}};
      if (res) {
        std::string text;
        int64_t version = -1;
        size_t pos = 0;
        while ((pos = res->body.find("data: ", pos)) != std::string::npos) {
          const size_t end = res->body.find("\n\n", pos);
          const std::string data = res->body.substr(pos + 6, end - pos - 6);
          pos = end;
          if (data == "[DONE]") {
            r["done"] = true;
            break;
          }
          const json chunk = json::parse(data);
          if (version >= 0) {
            EXPECT_EQ(chunk["weights_version"], version) << "one version per request";
          }
          version = chunk["weights_version"].get<int64_t>();
          text += chunk["choices"][0]["text"].get<std::string>();
        }
        r["text"] = text;
        r["version"] = version;
      }
      std::lock_guard lk(mu);
      results.push_back(r);
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) threads.emplace_back(stream);
  while (sent.load() < 16) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto res = post_weights({{"version", 1}, {"path", path}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  const int at_update = sent.load();
  while (sent.load() < at_update + 16) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stop = true;
  for (std::thread& t : threads) t.join();

  const json v1 = complete(prompt, 24);
  ASSERT_EQ(v1["weights_version"], 1);
  ASSERT_NE(v1["choices"][0]["text"], v0["choices"][0]["text"]);
  std::map<int64_t, int> by_version;
  ASSERT_EQ(static_cast<int>(results.size()), sent.load()) << "a request got no answer";
  for (const json& r : results) {
    ASSERT_TRUE(r["ok"].get<bool>());
    ASSERT_TRUE(r.value("done", false)) << "a stream did not end with [DONE]";
    const int64_t v = r["version"].get<int64_t>();
    ++by_version[v];
    EXPECT_EQ(r["text"], (v == 0 ? v0 : v1)["choices"][0]["text"]) << "version " << v;
  }
  EXPECT_GT(by_version[0], 0);
  EXPECT_GT(by_version[1], 0);
  EXPECT_EQ(by_version.size(), 2u);
}

TEST_F(WeightsTest, AbortRunningEndsRunningRequestsWithAnError) {
  start();
  std::string body;
  std::thread client([&] {
    httplib::Client cli("127.0.0.1", port_);
    cli.set_read_timeout(60, 0);
    auto res = cli.Post("/v1/completions",
                        json{{"prompt", "x"}, {"max_tokens", 480}, {"temperature", 0}, {"stream", true}}.dump(),
                        "application/json");
    if (res) body = res->body;
  });
  // Wait for the request to run (a token streamed), then update with abort_running.
  for (int i = 0; i < 500; ++i) {
    httplib::Client cli("127.0.0.1", port_);
    auto m = cli.Get("/metrics");
    if (m && m->body.find("concord_running_sequences 1") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto res = post_weights({{"version", 1}, {"path", write(publish(1), "v1.safetensors")}, {"abort_running", true}});
  client.join();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_NE(body.find("weights_updated"), std::string::npos) << body.substr(0, 400);
  EXPECT_EQ(complete("x")["weights_version"], 1);
}

TEST_F(WeightsTest, ThePayloadMayComeByPathSharedMemoryOrBody) {
  start();
  // Shared memory, as a trainer writes it.
  const std::vector<uint8_t> p1 = publish(1);
  const std::string shm = fmt::format("/concord-test-{}", ::getpid());
  const int fd = ::shm_open(shm.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(p1.size())), 0);
  ASSERT_EQ(::write(fd, p1.data(), p1.size()), static_cast<ssize_t>(p1.size()));
  ::close(fd);
  auto res = post_weights({{"version", 1}, {"shm", shm}});
  ::shm_unlink(shm.c_str());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(get_weights()["content"], content_of(p1));
  // The body (application/octet-stream, the version in the query).
  const std::vector<uint8_t> p2 = publish(2);
  httplib::Client cli("127.0.0.1", port_);
  res = cli.Post("/v1/weights?version=2", reinterpret_cast<const char*>(p2.data()), p2.size(),
                 "application/octet-stream");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(get_weights()["content"], content_of(p2));
  // Cut short in transit: check 2.
  const std::vector<uint8_t> p3 = publish(3);
  res = cli.Post("/v1/weights?version=3", reinterpret_cast<const char*>(p3.data()), p3.size() / 2,
                 "application/octet-stream");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 409);
  EXPECT_EQ(json::parse(res->body)["error"]["check"], 2) << res->body;
  EXPECT_EQ(get_weights()["version"], 2);
}

TEST_F(WeightsTest, BadRequestsAreRefusedWithReasons) {
  ServerOptions o = with_faults();
  o.api_key = "k";
  start(o);
  const std::string path = write(publish(1), "v1.safetensors");
  using Got = std::pair<int, std::string>;
  auto status_and_code = [&](const json& body, const httplib::Headers& headers = {{"Authorization", "Bearer k"}}) {
    httplib::Client cli("127.0.0.1", port_);
    auto res = cli.Post("/v1/weights", headers, body.dump(), "application/json");
    EXPECT_TRUE(res);
    const json j = json::parse(res->body);
    return Got(res->status, j.contains("error") ? j["error"]["code"].get<std::string>() : "");
  };
  EXPECT_EQ(status_and_code({{"version", 1}, {"path", path}}, {}), Got(401, "invalid_api_key"));
  EXPECT_EQ(status_and_code({{"path", path}}), Got(400, "invalid_version"));
  EXPECT_EQ(status_and_code({{"version", 0}, {"path", path}}), Got(400, "invalid_version"));
  EXPECT_EQ(status_and_code({{"version", 1}}), Got(400, "missing_source"));
  EXPECT_EQ(status_and_code({{"version", 1}, {"path", path}, {"shm", "/x"}}),
            Got(400, "missing_source"));
  EXPECT_EQ(status_and_code({{"version", 1}, {"path", path}, {"verison", 2}}),
            Got(400, "unknown_field"));
  EXPECT_EQ(status_and_code({{"version", 1}, {"path", (dir_ / "none").string()}}),
            Got(400, "invalid_path"));
  EXPECT_EQ(status_and_code({{"version", 1}, {"shm", "/concord-no-such-segment"}}),
            Got(400, "invalid_shm"));
  EXPECT_EQ(status_and_code({{"version", 1}, {"path", path}, {"fault", "no_such"}}),
            Got(400, "invalid_fault"));
  EXPECT_EQ(status_and_code({{"version", 1}, {"path", path}, {"fault", "stale_version"}}),
            Got(400, "invalid_fault"));  // a learner-side fault
  EXPECT_EQ(status_and_code({{"version", 1}, {"path", path}}), Got(200, ""));
  // Not newer than the serving version: check 1.
  EXPECT_EQ(status_and_code({{"version", 1}, {"path", path}}), Got(409, "check_1_version"));
  httplib::Client cli("127.0.0.1", port_);
  EXPECT_EQ(cli.Get("/v1/weights")->status, 401);
  auto got = cli.Get("/v1/weights", httplib::Headers{{"Authorization", "Bearer k"}});
  EXPECT_EQ(got->status, 200);
  auto metrics = cli.Get("/metrics");
  EXPECT_NE(metrics->body.find("concord_weights_version 1"), std::string::npos);
  EXPECT_NE(metrics->body.find("concord_weight_updates_total{result=\"applied\"} 1"), std::string::npos);
  EXPECT_NE(metrics->body.find("concord_weight_updates_total{result=\"refused\"} 1"), std::string::npos);
}

double metric(int port, const std::string& name) {
  httplib::Client cli("127.0.0.1", port);
  auto res = cli.Get("/metrics");
  const size_t at = res->body.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(res->body.substr(at + name.size() + 2));
}

TEST_F(WeightsTest, ThePrefixCacheServesTheSameBitsAndAWeightUpdateEmptiesIt) {
  ServerOptions o = with_faults();
  o.prefix_cache_bytes = 64 << 20;
  o.prefix_cache_block = 16;  // nvfp4 here: a multiple of the prefill chunk (16 below)
  o.engine.prefill_chunk = 16;
  start(o);
  const std::string prompt(150, 'x');
  auto logprobs_of = [&] {
    httplib::Client cli("127.0.0.1", port_);
    auto res = cli.Post("/v1/completions",
                        json{{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0.8}, {"seed", 3}, {"logprobs", 2}}.dump(),
                        "application/json");
    return json::parse(res->body)["choices"][0]["logprobs"];
  };
  const json first = logprobs_of();
  EXPECT_EQ(metric(port_, "concord_prefix_cache_hits_total"), 0);
  EXPECT_EQ(logprobs_of(), first);  // bit for bit: JSON numbers print every bit of a double
  EXPECT_EQ(metric(port_, "concord_prefix_cache_hits_total"), 1);
  EXPECT_EQ(metric(port_, "concord_prefix_cache_reused_tokens_total"), 144);  // 9 blocks of 16
  EXPECT_GT(metric(port_, "concord_prefix_cache_bytes"), 0);
  ASSERT_EQ(post_weights({{"version", 1}, {"path", write(publish(1), "v1.safetensors")}})->status, 200);
  const json after = logprobs_of();  // the old rows are gone: no hit, the new weights' bits
  EXPECT_NE(after, first);
  EXPECT_EQ(metric(port_, "concord_prefix_cache_hits_total"), 1);
  EXPECT_EQ(logprobs_of(), after);
  EXPECT_EQ(metric(port_, "concord_prefix_cache_hits_total"), 2);
}

// Disaggregated prefill across a weight update: the prefill worker's twin is remade from the new
// weights, so its hand-overs keep being taken (a stale twin's rows would be refused by their
// fingerprint and recomputed: the same bits, but no rows resumed).
TEST_F(WeightsTest, ThePrefillWorkerFollowsAWeightUpdate) {
  ServerOptions o = with_faults();
  o.disaggregate = true;
  o.prefix_cache_block = 16;
  o.engine.prefill_chunk = 16;
  start(o);
  auto logprobs_of = [&](const std::string& prompt) {
    httplib::Client cli("127.0.0.1", port_);
    auto res = cli.Post("/v1/completions",
                        json{{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0.8}, {"seed", 3}, {"logprobs", 2}}.dump(),
                        "application/json");
    return json::parse(res->body)["choices"][0]["logprobs"];
  };
  const std::string a(150, 'x'), b(120, 'y');
  const json first = logprobs_of(a);
  EXPECT_EQ(metric(port_, "concord_disaggregated_prefills_total"), 1);
  EXPECT_EQ(metric(port_, "concord_prefix_cache_reused_tokens_total"), 144);  // 9 handed-over blocks of 16
  ASSERT_EQ(post_weights({{"version", 1}, {"path", write(publish(1), "v1.safetensors")}})->status, 200);
  const json after = logprobs_of(a);
  EXPECT_NE(after, first);
  EXPECT_EQ(metric(port_, "concord_disaggregated_prefills_total"), 2);
  EXPECT_EQ(metric(port_, "concord_prefix_cache_reused_tokens_total"), 288);  // the new twin's rows taken
  (void)logprobs_of(b);
  EXPECT_EQ(metric(port_, "concord_prefix_cache_reused_tokens_total"), 288 + 112);
  // The same bits as a server that prefills on its engine, on the same new weights.
  server_.reset();
  ServerOptions plain = with_faults();
  plain.engine.prefill_chunk = 16;
  start(plain);
  EXPECT_EQ(logprobs_of(a), after);
}

TEST_F(WeightsTest, FaultsAreRefusedUnlessTheServerAllowsThem) {
  ServerOptions o;
  o.weights_faults = false;
  o.port = 0;
  o.model_name = "tiny";
  server_ = std::make_unique<Server>(ServedModel{*serving_, *tokenizer_, "", {}}, o);
  port_ = server_->start();
  auto res = post_weights({{"version", 1}, {"path", write(publish(1), "v1.safetensors")}, {"fault", "flipped_bit"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "faults_off");
}

}  // namespace
}  // namespace concord::serve
