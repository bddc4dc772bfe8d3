// The RL run (loop.h): warm-up, then per step sync → rollout → learn → metrics, on every rank.
#include "concord/rl/loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>

#include <fmt/format.h>
#include <httplib.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "concord/io/atomic_file.h"
#include "concord/io/json_file.h"
#include "concord/io/safetensors.h"
#include "concord/io/tokenizer.h"
#include "concord/model/files.h"
#include "concord/model/model.h"
#include "concord/numerics/check.h"
#include "concord/numerics/philox.h"
#include "concord/rl/mismatch.h"
#include "concord/rl/report.h"
#include "concord/rl/tasks.h"
#include "concord/rl/text.h"
#include "concord/rl/warmup.h"
#include "concord/serve/engine.h"
#include "concord/serve/logprob.h"
#include "concord/train/checkpoint.h"
#include "concord/train/train_state.h"
#include "concord/train/data.h"
#include "concord/train/export.h"
#include "concord/train/fair_cast.h"
#include "concord/train/optimizer.h"

namespace concord::rl {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using steady = std::chrono::steady_clock;
using train::ByteTokenizer;

double seconds_since(steady::time_point t0) {
  return std::chrono::duration<double>(steady::now() - t0).count();
}

size_t sz(int64_t n) { return static_cast<size_t>(n); }

// The prompt of RL step `step` (1-based), prompt p.
TaskExample rl_example(const RlConfig& c, int64_t step, int64_t p) {
  return config_example(c, c.seed, static_cast<uint64_t>((step - 1) * c.prompts_per_step + p));
}

// Held-out prompt i: a seed stream of its own (the run's seed mixed with a constant), so that no
// held-out prompt is drawn by index from the training stream (at a small difficulty the task's
// problem space is small, and the same problem may still come up in both).
TaskExample heldout_example(const RlConfig& c, int64_t i) {
  return config_example(c, c.seed ^ 0x48454C444F555431ull, static_cast<uint64_t>(i));
}

// The run's prompt/completion form (rl/text.h): bytes, or init_from's tokenizer and chat
// template. Read once per process and init_from path.
const RlText& rl_text(const RlConfig& c) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<RlText>> cache;
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<RlText>& slot = cache[c.init_from];
  if (!slot) slot = std::make_unique<RlText>(c.init_from.empty() ? RlText() : RlText::of_model(c.init_from));
  return *slot;
}

std::vector<int32_t> encode(const RlConfig& c, const TaskExample& e) { return rl_text(c).prompt(e); }

// The sampling seed of completion j of prompt p at `step`: independent of which sampler runs it.
uint64_t sample_seed(const RlConfig& c, int64_t step, int64_t p, int64_t j) {
  const numerics::PhiloxBlock r = numerics::philox4x32_10(
      {static_cast<uint32_t>(step), static_cast<uint32_t>(p), static_cast<uint32_t>(j), 0x524F4C4Cu},
      {static_cast<uint32_t>(c.seed), static_cast<uint32_t>(c.seed >> 32)});
  return (static_cast<uint64_t>(r[0]) << 32) | r[1];
}

Fault fault_at(const RlConfig& c, int64_t step, bool on_learner) {
  for (const FaultAt& f : c.faults)
    if (f.step == step && learner_side(f.fault) == on_learner) return f.fault;
  return Fault::none;
}

// ---- rollouts: what a sampler sends back -----------------------------------------------------

struct Rollout {
  int64_t prompt = 0, sample = 0;
  std::vector<int32_t> tokens;
  std::vector<double> logprobs;
};

struct SamplerReply {
  int rank = 0;
  int64_t step = 0;  // the step announced (not sent: the learner knows it)
  uint64_t serving = 0;
  json sync;  // SyncReport::to_json
  bool applied = false;
  std::string failed_check, failure_message;
  double seconds_sync = 0, seconds_rollout = 0;
  int64_t tokens = 0;
  // Speculative rollouts: this step's verifications, drafts verified and accepted, tokens emitted.
  int64_t spec_rounds = 0, spec_drafted = 0, spec_accepted = 0, spec_emitted = 0;
  std::vector<Rollout> rollouts;
};

std::vector<uint8_t> encode_reply(const SamplerReply& r) {
  json rollouts = json::array();
  for (const Rollout& x : r.rollouts)
    rollouts.push_back({{"p", x.prompt}, {"j", x.sample}, {"tokens", x.tokens}, {"logprobs", x.logprobs}});
  const json j = {{"rank", r.rank}, {"serving", r.serving}, {"sync", r.sync}, {"applied", r.applied},
                  {"failed_check", r.failed_check}, {"failure_message", r.failure_message},
                  {"seconds_sync", r.seconds_sync}, {"seconds_rollout", r.seconds_rollout},
                  {"tokens", r.tokens}, {"rollouts", rollouts},
                  {"spec", {r.spec_rounds, r.spec_drafted, r.spec_accepted, r.spec_emitted}}};
  return json::to_cbor(j);
}

SamplerReply decode_reply(std::span<const uint8_t> bytes, int from) {
  const json j = json::from_cbor(bytes.begin(), bytes.end(), true, false);
  if (j.is_discarded() || !j.is_object())
    throw InputError(fmt::format("[rl] sampler {} sent a reply that is not a rollout message", from));
  try {
    SamplerReply r;
    r.rank = j.at("rank").get<int>();
    r.serving = j.at("serving").get<uint64_t>();
    r.sync = j.at("sync");
    r.applied = j.at("applied").get<bool>();
    r.failed_check = j.at("failed_check").get<std::string>();
    r.failure_message = j.at("failure_message").get<std::string>();
    r.seconds_sync = j.at("seconds_sync").get<double>();
    r.seconds_rollout = j.at("seconds_rollout").get<double>();
    r.tokens = j.at("tokens").get<int64_t>();
    const auto spec = j.at("spec").get<std::vector<int64_t>>();
    if (spec.size() != 4) throw InputError(fmt::format("[rl] sampler {} sent {} speculation counters, not 4", from, spec.size()));
    r.spec_rounds = spec[0];
    r.spec_drafted = spec[1];
    r.spec_accepted = spec[2];
    r.spec_emitted = spec[3];
    for (const json& x : j.at("rollouts")) {
      r.rollouts.push_back({x.at("p").get<int64_t>(), x.at("j").get<int64_t>(),
                            x.at("tokens").get<std::vector<int32_t>>(),
                            x.at("logprobs").get<std::vector<double>>()});
    }
    return r;
  } catch (const json::exception& e) {
    throw InputError(fmt::format("[rl] sampler {} sent a malformed rollout message: {}", from, e.what()));
  }
}

// ---- the sampler role -------------------------------------------------------------------------

// Keys of the config that do not change what a run computes (a resume may change them), and the
// files of a run directory, config.json first (train::discard_run_files).
constexpr const char* kResumableKeys[] = {"out", "checkpoint_every"};
const std::vector<std::string> kRunFiles = {"config.json", "checkpoints", "metrics.jsonl", "summary.json",
                                            "report.html", "rollouts.jsonl"};

// Version 0 with no payload: the learner resumed a run that had finished, so no step follows.
constexpr uint64_t kFinished = 0;

int64_t longest_prompt(const RlConfig& c) {
  int64_t longest = 0;
  for (int64_t s = 1; s <= c.steps; ++s)
    for (int64_t p = 0; p < c.prompts_per_step; ++p)
      longest = std::max<int64_t>(longest, static_cast<int64_t>(encode(c, rl_example(c, s, p)).size()));
  return longest;
}

class SamplerRole {
 public:
  SamplerRole(const RlConfig& c, const model::ModelConfig& mc, int rank, int samplers)
      : c_(c), rank_(rank), samplers_(samplers),
        model_(mc, model::PrecisionPolicy::from_name_or_file(c.sampler)),
        receiver_(model_, c.probe),
        engine_(model_, engine_options(c, mc, samplers)) {
    if (c.speculative.empty()) return;
    spec_ = serve::parse_drafter_spec(c.speculative);
    if (spec_.kind == "model") {  // fixed: the policy drifts away from it
      model::LoadedModel d = model::load_model(spec_.path, "native");
      serve::check_drafter_vocabulary(mc, d.model.config(), "the RL policy", spec_.path);
      d.model.prepare_weights();
      engine_.set_drafter(std::make_shared<serve::ModelDrafter>(std::make_shared<model::Model>(std::move(d.model)),
                                                                spec_.path, engine_.options().max_sequences,
                                                                engine_.options().max_context),
                          {.draft_tokens = c.speculative_tokens});
    } else if (spec_.kind == "ngram") {
      engine_.set_drafter(std::make_shared<serve::PromptLookupDrafter>(), {.draft_tokens = c.speculative_tokens});
    }
  }

  // One round: the step is the version the learner announces (so a sampler follows a learner
  // that resumed from a checkpoint).
  SamplerReply step(Channel& channel) {
    const auto t0 = steady::now();
    return step(channel.receive(), t0);
  }
  SamplerReply step(WeightMessage message, steady::time_point t0) {
    SamplerReply reply;
    reply.rank = rank_;
    if (message.version < 1 || message.version > static_cast<uint64_t>(c_.steps))
      throw InputError(fmt::format("[rl] sampler {}: the learner announced step {} outside [1, {}]", rank_,
                                   message.version, c_.steps));
    const auto step = static_cast<int64_t>(message.version);
    const SyncReport report = receiver_.apply(message.payload, message.version, fault_at(c_, step, false));
    reply.step = step;
    reply.seconds_sync = seconds_since(t0);
    reply.serving = receiver_.version();
    reply.sync = report.to_json();
    reply.applied = report.applied;
    if (auto failure = report.failure()) {
      reply.failed_check = std::string(sync_check_name(failure->check));
      reply.failure_message = failure->message;
    }
    t0 = steady::now();
    if (spec_.kind == "self")  // the sampler's own weights as they are now: never out of sync
      engine_.set_drafter(serve::make_builtin_drafter(spec_, model_, c_.speculative, engine_.options().max_sequences,
                                                      engine_.options().max_context),
                          {.draft_tokens = c_.speculative_tokens});
    const serve::SpeculationStats before = engine_.stats().speculation;
    std::vector<serve::Request> requests;
    for (int64_t p = rank_ - 1; p < c_.prompts_per_step; p += samplers_) {
      const std::vector<int32_t> prompt = encode(c_, rl_example(c_, step, p));
      for (int64_t j = 0; j < c_.group_size; ++j) {
        serve::Request r;
        r.prompt = prompt;
        r.sampling.temperature = static_cast<float>(c_.temperature);
        r.sampling.seed = sample_seed(c_, step, p, j);
        r.max_tokens = c_.max_new_tokens;
        r.stop_tokens = rl_text(c_).stop_tokens();
        requests.push_back(std::move(r));
        reply.rollouts.push_back({p, j, {}, {}});
      }
    }
    std::vector<serve::Completion> done = engine_.generate(std::move(requests));
    for (size_t i = 0; i < done.size(); ++i) {
      reply.tokens += static_cast<int64_t>(done[i].tokens.size());
      reply.rollouts[i].tokens = std::move(done[i].tokens);
      reply.rollouts[i].logprobs = std::move(done[i].logprobs);
    }
    const serve::SpeculationStats& after = engine_.stats().speculation;
    reply.spec_rounds = after.rounds - before.rounds;
    reply.spec_drafted = after.drafted - before.drafted;
    reply.spec_accepted = after.accepted - before.accepted;
    reply.spec_emitted = after.emitted - before.emitted;
    reply.seconds_rollout = seconds_since(t0);
    return reply;
  }

 private:
  static serve::EngineOptions engine_options(const RlConfig& c, const model::ModelConfig& mc, int samplers) {
    serve::EngineOptions o;
    const int64_t prompts = (c.prompts_per_step + samplers - 1) / samplers;
    o.max_sequences = std::clamp<int64_t>(prompts * c.group_size, 1, 256);
    o.max_context = longest_prompt(c) + c.max_new_tokens;
    if (o.max_context > mc.max_position_embeddings)
      throw InputError(fmt::format("[rl] prompts of up to {} tokens plus max_new_tokens {} exceed the "
                                   "model's max_position_embeddings {}", o.max_context - c.max_new_tokens,
                                   c.max_new_tokens, mc.max_position_embeddings));
    return o;
  }

  const RlConfig& c_;
  int rank_, samplers_;
  model::Model model_;
  WeightReceiver receiver_;
  serve::Engine engine_;
  serve::DrafterSpec spec_;  // kind "" when not speculating
};

// ---- the sampler role played by a `concord serve` process (--transport http) -----------------

// What SamplerRole does, over HTTP: the payload goes to POST /v1/weights (the server runs the
// seven checks and swaps it in, or refuses it with the failed check and keeps serving), then
// every completion of the step is a POST /v1/completions with the prompt's token ids, the
// rollout's seed, the step's temperature and max_new_tokens, "\n" as a stop string (the server
// stops at eos by itself) and the sampled tokens' log-probs as ids. The server's engine is the
// in-process sampler's engine and batch-invariant, so the rollouts — and every metric computed
// from them — equal the in-process run's.
class HttpSamplerRole {
 public:
  // fresh_run: the run publishes from version 1, so a server already past version 0 (another
  // run's sampler) would refuse every sync by check 1 — an error before anything starts.
  HttpSamplerRole(const RlConfig& c, std::string url, std::string api_key, bool fresh_run)
      : c_(c), url_(std::move(url)), api_key_(std::move(api_key)) {
    if (!c.speculative.empty())
      throw InputError("[rl] --transport http: speculative rollouts need the in-process sampler (start "
                       "`concord serve --draft ...` yourself and leave \"speculative\" out)");
    httplib::Result res = client(30).Get("/v1/weights", headers());
    if (!res)
      throw InputError(fmt::format("[rl] sampler {}: GET /v1/weights failed ({}); is `concord serve` running there?",
                                   url_, httplib::to_string(res.error())));
    const json info = parse(*res, "GET /v1/weights");
    if (res->status != 200)
      throw InputError(fmt::format("[rl] sampler {}: GET /v1/weights answered {}: {}", url_, res->status,
                                   message_of(info)));
    if (!info.value("updatable", false))
      throw InputError(fmt::format("[rl] sampler {}: the server does not take weight updates: {}", url_,
                                   info.value("reason", std::string("(no reason given)"))));
    const int64_t serving = info.value("version", int64_t{0});
    if (fresh_run && serving > 0)
      throw InputError(fmt::format("[rl] sampler {}: the server already serves weights version {} (another "
                                   "run's); this run publishes from version 1 — restart the server, or let "
                                   "--transport http start one", url_, serving));
  }

  SamplerReply step(const WeightMessage& message, steady::time_point t0) {
    SamplerReply reply;
    reply.rank = 1;
    if (message.version < 1 || message.version > static_cast<uint64_t>(c_.steps))
      throw InputError(fmt::format("[rl] sampler {}: the learner announced step {} outside [1, {}]", url_,
                                   message.version, c_.steps));
    const auto step = static_cast<int64_t>(message.version);
    reply.step = step;
    std::string path = fmt::format("/v1/weights?version={}", message.version);
    if (const Fault fault = fault_at(c_, step, false); fault != Fault::none)
      path += fmt::format("&fault={}", fault_name(fault));
    httplib::Result res = client(600).Post(path, headers(), reinterpret_cast<const char*>(message.payload.data()),
                                           message.payload.size(), "application/octet-stream");
    if (!res)
      throw InputError(fmt::format("[rl] sampler {}: POST /v1/weights failed: {}", url_, httplib::to_string(res.error())));
    const json body = parse(*res, "POST /v1/weights");
    if (res->status == 200) {
      reply.applied = true;
      reply.sync = body.at("report");
      reply.serving = message.version;
    } else if (res->status == 409 && body.contains("report") && body.at("error").contains("check")) {
      reply.sync = body.at("report");
      reply.serving = reply.sync.at("serving").get<uint64_t>();
      reply.failed_check = std::string(sync_check_name(static_cast<SyncCheck>(body["error"]["check"].get<int>())));
      reply.failure_message = message_of(body);
    } else {
      throw InputError(fmt::format("[rl] sampler {}: POST /v1/weights answered {}: {}", url_, res->status,
                                   message_of(body)));
    }
    reply.seconds_sync = seconds_since(t0);

    t0 = steady::now();
    for (int64_t p = 0; p < c_.prompts_per_step; ++p)
      for (int64_t j = 0; j < c_.group_size; ++j) reply.rollouts.push_back({p, j, {}, {}});
    std::vector<std::string> bodies(reply.rollouts.size());
    for (size_t i = 0; i < bodies.size(); ++i) {
      const Rollout& r = reply.rollouts[i];
      bodies[i] = json{{"prompt", encode(c_, rl_example(c_, step, r.prompt))},
                       {"max_tokens", c_.max_new_tokens},
                       {"temperature", c_.temperature},
                       {"seed", sample_seed(c_, step, r.prompt, r.sample)},
                       {"stop", rl_text(c_).stop_strings()},
                       {"logprobs", 0},
                       {"return_tokens_as_token_ids", true}}.dump();
    }
    // One client per worker thread; the server batches what arrives together.
    std::atomic<size_t> next{0};
    std::mutex error_mu;
    std::string error;
    auto work = [&] {
      httplib::Client cli = client(600);
      for (size_t i = next++; i < bodies.size(); i = next++) {
        try {
          httplib::Result r = cli.Post("/v1/completions", headers(), bodies[i], "application/json");
          if (!r) throw InputError(fmt::format("POST /v1/completions failed: {}", httplib::to_string(r.error())));
          const json out = parse(*r, "POST /v1/completions");
          if (r->status != 200)
            throw InputError(fmt::format("POST /v1/completions answered {}: {}", r->status, message_of(out)));
          const json& lp = out.at("choices").at(0).at("logprobs");
          Rollout& x = reply.rollouts[i];
          for (const json& t : lp.at("tokens")) {
            const std::string id = t.get<std::string>();
            if (id.rfind("token_id:", 0) != 0) throw InputError(fmt::format("token '{}' is not 'token_id:N'", id));
            x.tokens.push_back(std::stoi(id.substr(9)));
          }
          x.logprobs = lp.at("token_logprobs").get<std::vector<double>>();
          if (x.logprobs.size() != x.tokens.size())
            throw InputError(fmt::format("{} tokens with {} log-probs", x.tokens.size(), x.logprobs.size()));
        } catch (const std::exception& e) {
          std::lock_guard lk(error_mu);
          if (error.empty()) error = e.what();
          next = bodies.size();
        }
      }
    };
    const size_t workers = std::min<size_t>(bodies.size(), 32);
    std::vector<std::thread> threads;
    for (size_t w = 0; w < workers; ++w) threads.emplace_back(work);
    for (std::thread& t : threads) t.join();
    if (!error.empty()) throw InputError(fmt::format("[rl] sampler {}: {}", url_, error));
    for (const Rollout& x : reply.rollouts) reply.tokens += static_cast<int64_t>(x.tokens.size());
    reply.seconds_rollout = seconds_since(t0);
    return reply;
  }

 private:
  httplib::Client client(time_t read_timeout_s) const {
    httplib::Client cli(url_);
    cli.set_connection_timeout(10, 0);
    cli.set_read_timeout(read_timeout_s, 0);
    cli.set_write_timeout(600, 0);
    return cli;
  }
  httplib::Headers headers() const {
    if (api_key_.empty()) return {};
    return {{"Authorization", "Bearer " + api_key_}};
  }
  json parse(const httplib::Response& res, const char* what) const {
    json j = json::parse(res.body, nullptr, false);
    if (j.is_discarded())
      throw InputError(fmt::format("[rl] sampler {}: {} answered {} with a body that is not JSON: {}", url_, what,
                                   res.status, res.body.substr(0, 200)));
    return j;
  }
  static std::string message_of(const json& body) {
    if (body.is_object() && body.contains("error") && body["error"].is_object() && body["error"].contains("message"))
      return body["error"]["message"].get<std::string>();
    return body.dump().substr(0, 300);
  }

  const RlConfig& c_;
  std::string url_, api_key_;
};

// ---- the learner ------------------------------------------------------------------------------

// One batch of rollouts as the learner sees it, sequence i = prompt p * G + sample j.
struct Batch {
  int64_t B = 0, T = 0;
  std::vector<int32_t> inputs, targets;
  std::vector<size_t> first;                 // row of sequence i's first completion target
  std::vector<std::vector<double>> sampler;  // s_t per sequence
  std::vector<double> rewards;
  std::vector<std::vector<int32_t>> completions;
  int64_t tokens = 0;
};

Batch build_batch(const RlConfig& c, int64_t step, std::vector<Rollout>& rollouts) {
  Batch b;
  b.B = c.prompts_per_step * c.group_size;
  std::vector<Rollout*> by_seq(sz(b.B), nullptr);
  for (Rollout& r : rollouts) {
    if (r.prompt < 0 || r.prompt >= c.prompts_per_step || r.sample < 0 || r.sample >= c.group_size)
      throw InputError(fmt::format("[rl] a sampler returned rollout ({}, {}) outside the step's "
                                   "{} prompts x {} samples", r.prompt, r.sample, c.prompts_per_step,
                                   c.group_size));
    Rollout*& slot = by_seq[sz(r.prompt * c.group_size + r.sample)];
    if (slot != nullptr) throw InputError(fmt::format("[rl] rollout ({}, {}) returned twice", r.prompt, r.sample));
    if (r.tokens.empty() || r.tokens.size() != r.logprobs.size())
      throw InputError(fmt::format("[rl] rollout ({}, {}) has {} tokens and {} log-probs", r.prompt,
                                   r.sample, r.tokens.size(), r.logprobs.size()));
    slot = &r;
  }
  std::vector<std::vector<int32_t>> prompts;
  std::vector<TaskExample> examples;
  for (int64_t p = 0; p < c.prompts_per_step; ++p) {
    examples.push_back(rl_example(c, step, p));
    prompts.push_back(encode(c, examples.back()));
  }
  for (int64_t i = 0; i < b.B; ++i) {
    if (by_seq[sz(i)] == nullptr)
      throw InputError(fmt::format("[rl] no sampler returned rollout ({}, {})", i / c.group_size,
                                   i % c.group_size));
    const auto& pr = prompts[sz(i / c.group_size)];
    b.T = std::max<int64_t>(b.T, static_cast<int64_t>(pr.size() + by_seq[sz(i)]->tokens.size()) - 1);
  }
  b.inputs.assign(sz(b.B * b.T), ByteTokenizer::kPad);
  b.targets.assign(sz(b.B * b.T), -1);
  for (int64_t i = 0; i < b.B; ++i) {
    const Rollout& r = *by_seq[sz(i)];
    const TaskExample& e = examples[sz(i / c.group_size)];
    const auto& pr = prompts[sz(i / c.group_size)];
    std::vector<int32_t> seq = pr;
    seq.insert(seq.end(), r.tokens.begin(), r.tokens.end());
    const size_t row = sz(i * b.T);
    for (size_t t = 0; t + 1 < seq.size(); ++t) {
      b.inputs[row + t] = seq[t];
      if (t + 1 >= pr.size()) b.targets[row + t] = seq[t + 1];
    }
    b.first.push_back(row + pr.size() - 1);
    b.sampler.push_back(r.logprobs);
    b.completions.push_back(r.tokens);
    b.rewards.push_back(rl_text(c).reward(e, r.tokens));
    b.tokens += static_cast<int64_t>(r.tokens.size());
  }
  return b;
}

double mean(std::span<const double> v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

json finite_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

class Learner {
 public:
  Learner(const RlConfig& c, const model::ModelConfig& mc, std::vector<std::vector<float>> start)
      : c_(c),
        sampler_policy_(model::PrecisionPolicy::from_name_or_file(c.sampler)),
        learner_(mc, model::PrecisionPolicy::from_name_or_file(c.learner)),
        served_(mc, sampler_policy_),
        state_(mc, sampler_policy_, c.export_rule, c.seed,
               {.name = "adamw", .adamw = {c.lr, c.beta1, c.beta2, 1e-8, c.weight_decay, c.grad_clip}, .binary = {}},
               std::move(start)),
        meter_(sampler_policy_.served_weights),
        publisher_(served_, sampler_policy_, c.probe) {
    if (c.loss.kl_coef > 0) {
      reference_ = std::make_unique<model::Model>(mc, model::PrecisionPolicy::from_name_or_file(c.learner));
      set_model_weights(*reference_, state_.masters());
    }
  }

  // Export the master to the served copy for `step`, update the learner's model, measure
  // Fair Cast; returns the payload to publish.
  std::vector<uint8_t> sync(int64_t step, json& fair_cast) {
    const auto t0 = steady::now();
    const auto& specs = served_.params();
    state_.export_to(served_, step);
    for (size_t p = 0; p < specs.size(); ++p) {
      auto src = c_.loss_on_served ? std::span<const float>(served_.param(specs[p].name))
                                   : state_.master(p);
      auto dst = learner_.param(specs[p].name);
      std::copy(src.begin(), src.end(), dst.begin());
    }
    learner_.weights_changed();
    meter_.begin_step(static_cast<uint64_t>(step));
    int matrix = 0;
    for (size_t p = 0; p < specs.size(); ++p)
      if (specs[p].is_matrix()) meter_.record(matrix++, state_.master(p), served_.param(specs[p].name));
    const train::FairCastStep fc = meter_.end_step();
    fair_cast = fc.to_json();
    last_lag_ = fc.lag;
    seconds_export_ = seconds_since(t0);
    const auto t1 = steady::now();
    std::vector<uint8_t> payload = publisher_.publish(static_cast<uint64_t>(step), fault_at(c_, step, true));
    seconds_publish_ = seconds_since(t1);
    return payload;
  }
  // The last sync's export (+ Fair Cast meter) and publish (payload, hashes, probe) seconds.
  double seconds_export() const { return seconds_export_; }
  double seconds_publish() const { return seconds_publish_; }

  struct StepOut {
    PolicyLossStats loss;
    std::vector<std::vector<double>> old_logp;
    std::vector<double> advantages;
    double grad_norm = 0;
  };

  StepOut learn(const Batch& b, int64_t step) {
    StepOut out;
    out.advantages = group_advantages(b.rewards, c_.group_size);
    const std::vector<double>& advantages = out.advantages;
    std::vector<std::vector<double>> ref;
    if (reference_) ref = score(*reference_, b);
    for (int64_t epoch = 0; epoch < c_.ppo_epochs; ++epoch) {
      auto loss_fn = [&](std::span<const double> logp, std::span<const double> entropy, std::span<double> coef) {
        std::vector<std::vector<double>> l(sz(b.B)), h(sz(b.B)), g(sz(b.B));
        for (size_t i = 0; i < sz(b.B); ++i) {
          const size_t n = b.sampler[i].size();
          l[i].assign(logp.begin() + static_cast<std::ptrdiff_t>(b.first[i]),
                      logp.begin() + static_cast<std::ptrdiff_t>(b.first[i] + n));
          h[i].assign(entropy.begin() + static_cast<std::ptrdiff_t>(b.first[i]),
                      entropy.begin() + static_cast<std::ptrdiff_t>(b.first[i] + n));
          g[i].assign(n, 0.0);
        }
        if (epoch == 0) out.old_logp = l;  // θ_old: the learner's log-probs before this step's update
        std::vector<SequenceLogprobs> seqs(sz(b.B));
        for (size_t i = 0; i < sz(b.B); ++i) {
          seqs[i].old_logp = out.old_logp[i];
          seqs[i].sampler_logp = b.sampler[i];
          if (!ref.empty()) seqs[i].ref_logp = ref[i];
          seqs[i].advantage = advantages[i];
        }
        const PolicyLossStats stats = policy_loss(seqs, l, h, c_.loss, g);
        if (epoch == 0) out.loss = stats;
        std::fill(coef.begin(), coef.end(), 0.0);
        for (size_t i = 0; i < sz(b.B); ++i)
          std::copy(g[i].begin(), g[i].end(), coef.begin() + static_cast<std::ptrdiff_t>(b.first[i]));
      };
      learner_.forward_backward_policy(b.inputs, b.targets, b.B, b.T, loss_fn,
                                       static_cast<uint64_t>(step * c_.ppo_epochs + epoch));
      const double norm = state_.step(learner_, c_.lr);
      if (epoch == 0) out.grad_norm = norm;
      if (epoch + 1 < c_.ppo_epochs) refresh_learner();
    }
    return out;
  }

  const train::LagSummary& lag() const { return last_lag_; }
  json lag_counts() const { return meter_.state_json().at("lag_counts"); }

  // The held-out evaluation (RlConfig::eval_every) of the served copy as the last sync() made it
  // against the master it was made from: greedy replies to the held-out prompts from each, their
  // mean rewards, and the replies that are the same tokens.
  json evaluate() {
    const auto t0 = steady::now();
    const int64_t P = c_.eval_prompts;
    const int64_t max_new = c_.eval_max_new_tokens > 0 ? c_.eval_max_new_tokens : c_.max_new_tokens;
    std::vector<TaskExample> examples;
    std::vector<std::vector<int32_t>> prompts;
    int64_t longest = 0;
    for (int64_t i = 0; i < P; ++i) {
      examples.push_back(heldout_example(c_, i));
      prompts.push_back(rl_text(c_).prompt(examples.back()));
      longest = std::max<int64_t>(longest, static_cast<int64_t>(prompts.back().size()));
    }
    const model::ModelConfig& mc = served_.config();
    if (longest + max_new > mc.max_position_embeddings)
      throw InputError(fmt::format("[rl] held-out prompts of up to {} tokens plus {} new tokens exceed the model's "
                                   "max_position_embeddings {}", longest, max_new, mc.max_position_embeddings));
    auto greedy = [&](model::Model& m) {
      serve::EngineOptions o;
      o.max_sequences = std::clamp<int64_t>(P, 1, 256);
      o.max_context = longest + max_new;
      serve::Engine engine(m, o);
      std::vector<serve::Request> requests;
      for (int64_t i = 0; i < P; ++i) {
        serve::Request r;
        r.prompt = prompts[sz(i)];
        r.sampling.temperature = 0.0f;
        r.max_tokens = max_new;
        r.stop_tokens = rl_text(c_).stop_tokens();
        requests.push_back(std::move(r));
      }
      std::vector<std::vector<int32_t>> out;
      for (serve::Completion& done : engine.generate(std::move(requests))) out.push_back(std::move(done.tokens));
      return out;
    };
    const std::vector<std::vector<int32_t>> served = greedy(served_);
    std::vector<std::vector<int32_t>> master;
    {
      model::Model m(mc, model::PrecisionPolicy::from_name_or_file("fp32"));
      set_model_weights(m, state_.masters());
      master = greedy(m);
    }
    double reward_served = 0, reward_master = 0;
    int64_t same = 0, served_tokens = 0;
    for (int64_t i = 0; i < P; ++i) {
      reward_served += rl_text(c_).reward(examples[sz(i)], served[sz(i)]);
      reward_master += rl_text(c_).reward(examples[sz(i)], master[sz(i)]);
      same += served[sz(i)] == master[sz(i)] ? 1 : 0;
      served_tokens += static_cast<int64_t>(served[sz(i)].size());
    }
    const auto n = static_cast<double>(P);
    return {{"prompts", P},
            {"reward_served", reward_served / n},
            {"reward_master", reward_master / n},
            {"greedy_same", static_cast<double>(same) / n},
            {"served_length", static_cast<double>(served_tokens) / n},
            {"seconds", seconds_since(t0)}};
  }

  // The served copy of the final master (the export a step after the last would publish), for the
  // run's last evaluation. Called after the last checkpoint: the export rule's state it advances
  // is never saved.
  void export_final(int64_t steps) { state_.export_to(served_, steps + 1); }

  // ---- checkpoints ----
  // The checkpoint of `at_step`: the training state (master, optimizer, export rule's state) and
  // what else a resumed learner needs as state tensors: the Fair Cast meter ("fair_cast.<i>.*")
  // and the reference policy ("reference.<name>", kl_coef > 0). `state` is the caller's JSON.
  void save(const fs::path& out, int64_t at_step, json state) const {
    std::vector<train::NamedTensor> extra = meter_.state_tensors(kFairCastPrefix);
    if (reference_) {
      for (const model::ParamSpec& spec : served_.params()) {
        auto v = reference_->param(spec.name);
        extra.push_back({"reference." + spec.name, spec.shape, std::vector<float>(v.begin(), v.end())});
      }
    }
    state["fair_cast"] = meter_.state_json();
    state_.save(out, at_step, std::move(state), /*keep=*/2, extra);
  }
  void restore(const train::LoadedCheckpoint& ckpt) {
    const fs::path state_file = ckpt.dir / "state.safetensors";
    state_.restore(ckpt, "rl");
    if (reference_) {
      for (const model::ParamSpec& spec : served_.params()) {
        const train::NamedTensor* r = train::find_tensor(ckpt.state_tensors, "reference." + spec.name);
        if (r == nullptr || static_cast<int64_t>(r->values.size()) != spec.numel())
          throw InputError(fmt::format("[rl] {}: tensor 'reference.{}' is missing or has the wrong size",
                                       state_file.string(), spec.name));
        std::copy(r->values.begin(), r->values.end(), reference_->param(spec.name).begin());
      }
      reference_->weights_changed();
    }
    try {
      meter_.restore(ckpt.state_tensors, kFairCastPrefix, ckpt.state.at("fair_cast"));
    } catch (const json::exception& e) {
      throw InputError(fmt::format("[rl] {}: {}", (ckpt.dir / "state.json").string(), e.what()));
    } catch (const InputError& e) {  // the meter's tensors (state.safetensors) or counts (state.json)
      throw InputError(fmt::format("[rl] {}: {}", ckpt.dir.string(), e.what()));
    }
    last_lag_ = meter_.lag();
  }

 private:
  static constexpr std::string_view kFairCastPrefix = "fair_cast";

  // Between PPO epochs of one step the learner's model follows the master: round to nearest
  // into the served format when the loss is on the served copy (a stateless rule, so the export
  // rule's state — ef's carried error — advances once per step), else the master itself.
  void refresh_learner() {
    const auto& specs = learner_.params();
    auto rne = train::make_export_rule("rne", sampler_policy_.served_weights, c_.seed);
    for (size_t p = 0; p < specs.size(); ++p) {
      if (c_.loss_on_served)
        rne->export_param(static_cast<int>(p), specs[p], state_.master(p), learner_.param(specs[p].name), 0);
      else
        std::ranges::copy(state_.master(p), learner_.param(specs[p].name).begin());
    }
    learner_.weights_changed();
  }

  // Log-probs of each sequence's completion tokens under `m` (the reference policy), T = 1.
  std::vector<std::vector<double>> score(model::Model& m, const Batch& b) {
    const int64_t V = m.config().vocab_size;
    std::vector<float> logits(sz(b.B * b.T * V));
    m.forward(b.inputs, b.B, b.T, logits);
    std::vector<std::vector<double>> out(sz(b.B));
    for (size_t i = 0; i < sz(b.B); ++i) {
      for (size_t t = 0; t < b.sampler[i].size(); ++t) {
        const size_t row = b.first[i] + t;
        out[i].push_back(serve::token_logprob(
            std::span<const float>(logits).subspan(row * sz(V), sz(V)), b.targets[row], 1.0f));
      }
    }
    return out;
  }

  const RlConfig& c_;
  model::PrecisionPolicy sampler_policy_;
  model::Model learner_, served_;
  std::unique_ptr<model::Model> reference_;
  train::TrainState state_;
  train::FairCastMeter meter_;
  WeightPublisher publisher_;
  train::LagSummary last_lag_;
  double seconds_export_ = 0, seconds_publish_ = 0;
};

// The rollouts.jsonl lines of one step (RlConfig::log_rollouts).
void append_rollouts(std::string& text, const RlConfig& c, int64_t step, const Batch& b,
                     const Learner::StepOut& learned) {
  for (int64_t i = 0; i < b.B; ++i) {
    const int64_t p = i / c.group_size;
    const TaskExample e = rl_example(c, step, p);
    const auto& tokens = b.completions[sz(i)];
    const json line = {{"step", step}, {"prompt", p}, {"sample", i % c.group_size},
                       {"task", e.task},
                       {"prompt_text", rl_text(c).kind() == RlText::Kind::chat ? e.instruction : e.prompt},
                       {"completion", rl_text(c).completion(tokens)}, {"tokens", tokens},
                       {"reward", b.rewards[sz(i)]}, {"advantage", learned.advantages[sz(i)]},
                       {"sampler_logprobs", b.sampler[sz(i)]},
                       {"learner_logprobs", learned.old_logp[sz(i)]}};
    // A completion is bytes, not always UTF-8: invalid bytes show as U+FFFD in "completion"
    // ("tokens" keeps them exactly).
    text += line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  }
}

std::string write_jsonl(const std::vector<RlStepMetrics>& steps) {
  std::string text;
  for (const RlStepMetrics& s : steps) text += s.line.dump() + "\n";
  return text;
}

json summarize(const RlConfig& c, const RlResult& r) {
  json by_check = json::object();
  json events = json::array();
  for (const RlStepMetrics& s : r.steps) {
    for (const json& rep : s.line.at("sync/reports")) {
      if (!rep.at("applied").get<bool>()) {
        const std::string check = rep.at("failed_check").get<std::string>();
        by_check[check] = by_check.value(check, 0) + 1;
        events.push_back({{"step", s.step}, {"rank", rep.at("rank")}, {"check", check},
                          {"message", rep.at("failure_message")}});
      }
    }
  }
  json faults = json::array();
  for (const FaultAt& f : c.faults) {
    bool caught = false;
    for (const json& e : events) caught = caught || e.at("step").get<int64_t>() == f.step;
    faults.push_back({{"fault", std::string(fault_name(f.fault))}, {"step", f.step}, {"caught", caught}});
  }
  return {{"name", c.name},
          {"sampler", c.sampler},
          {"learner", c.learner},
          {"export", c.export_rule},
          {"loss_on_served", c.loss_on_served},
          {"task", c.task},
          {"steps", static_cast<int64_t>(r.steps.size())},
          {"warmup_reward", r.warmup_reward},
          {"initial_reward", r.initial_reward},
          {"final_reward", r.final_reward},
          {"mean_k3_kl", r.mean_mismatch_kl},
          {"lag_median", r.lag_median},
          {"lag_p90", r.lag_p90},
          {"seconds", {{"warmup", r.seconds_warmup}, {"rollout", r.seconds_rollout},
                       {"learner", r.seconds_learner}, {"sync", r.seconds_sync},
                       {"total", r.seconds_total}, {"this_process", r.seconds_this_process}}},
          {"warmup_cached", r.warmup_cached},
          {"sync_failures", r.sync_failures},
          {"sync_failures_by_check", by_check},
          {"sync_events", events},
          {"faults", faults}};
}

}  // namespace

RlResult run_rl(const RlConfig& config, Channel& channel, bool progress) {
  RlOptions options;
  options.progress = progress;
  options.resume = false;
  return run_rl(config, channel, options);
}

RlResult run_rl(const RlConfig& config, Channel& channel, const RlOptions& options) {
  const bool progress = options.progress;
  config.validate("the RL config");
  if (options.stop_after && *options.stop_after < 1) throw InputError("[rl] stop_after must be at least 1");
  const auto t_start = steady::now();
  RlResult result;
  const model::ModelConfig mc = config.resolved_model();
  const int samplers = channel.samplers();
  if (samplers < 1) throw InputError("[rl] the channel has no samplers");

  // Sampler ranks: receive, check, generate, send — one round per step.
  if (channel.rank() != 0) {
    SamplerRole role(config, mc, channel.rank(), samplers);
    for (int64_t step = 0; step < config.steps;) {
      const auto t0 = steady::now();
      WeightMessage message = channel.receive();
      if (message.version == kFinished && message.payload.empty()) break;  // a finished run resumed
      const SamplerReply reply = role.step(std::move(message), t0);
      step = reply.step;
      result.seconds_sync += reply.seconds_sync;
      result.seconds_rollout += reply.seconds_rollout;
      result.sync_failures += reply.applied ? 0 : 1;
      channel.send(encode_reply(reply));
    }
    result.seconds_total = result.seconds_this_process = seconds_since(t_start);
    return result;
  }

  // The learner (rank 0), and in process the one sampler too.
  const bool in_process = channel.name() == "in-process";
  if (in_process && samplers != 1) throw InputError("[rl] the in-process channel runs exactly one sampler");
  if (!options.sampler_url.empty() && !in_process)
    throw InputError("[rl] a sampler URL (--transport http) needs the in-process channel on the learner's side");
  if (options.stop_after && !in_process)
    throw InputError("[rl] stop_after needs the in-process channel (sampler ranks would wait for the next step)");
  const fs::path out = config.out;
  // The sampler server is asked first: an unreachable or unsuitable one writes nothing.
  std::unique_ptr<HttpSamplerRole> remote;
  if (!options.sampler_url.empty()) {
    std::error_code ec;
    const bool fresh = !(options.resume && fs::exists(out, ec) && train::latest_checkpoint(out));
    remote = std::make_unique<HttpSamplerRole>(config, options.sampler_url, options.sampler_api_key, fresh);
  }
  fs::create_directories(out);

  // A run directory belongs to one configuration (train/checkpoint.h, run directories): a resume
  // continues the run config.json describes, from a checkpoint that records the same config; a
  // fresh start first discards the previous run's files, then writes its own config.json.
  const json config_json = config.to_json();
  json identity = config_json;
  for (const char* key : kResumableKeys) identity.erase(key);
  const fs::path config_path = out / "config.json";
  const std::optional<fs::path> checkpoint = options.resume ? train::latest_checkpoint(out) : std::nullopt;
  if (checkpoint) {
    std::error_code ec;
    if (!fs::exists(config_path, ec))
      throw InputError(fmt::format("[rl] {}: missing, so the checkpoint in {} cannot be resumed; start afresh "
                                   "(--no-resume or another --out)", config_path.string(), out.string()));
    const json saved = io::read_json_file(config_path, "rl", "the run's config");
    if (!saved.is_object())
      throw InputError(fmt::format("[rl] {}: not a JSON object, so the checkpoint in {} cannot "
                                   "be resumed; start afresh (--no-resume or another --out)",
                                   config_path.string(), out.string()));
    for (const auto& [key, value] : config_json.items()) {
      if (!identity.contains(key)) continue;  // does not change what the run computes
      if (!saved.contains(key) || saved.at(key) != value)
        throw InputError(fmt::format("[rl] {} was run with a different '{}'; resume it with the same "
                                     "config, or start afresh (--no-resume or another --out)",
                                     out.string(), key));
    }
  } else {
    train::discard_run_files(out, kRunFiles);
  }
  io::write_file_atomic(config_path, config_json.dump(2) + "\n");

  auto t0 = steady::now();
  double k3_sum = 0;
  double seconds_before = 0;  // wall time of the processes before a resume (their checkpoint's total)
  std::string rollouts_log;
  std::unique_ptr<Learner> learner_ptr;
  int64_t first_step = 1;
  if (checkpoint) {
    // The checkpoint replaces the warm-up: the learner starts from its master and state.
    const train::LoadedCheckpoint ckpt = train::load_checkpoint(*checkpoint);
    train::check_checkpoint_config(ckpt, identity, "rl");
    if (ckpt.step < 1 || ckpt.step > config.steps)
      throw InputError(fmt::format("[rl] {}: step {} outside [1, {}] (grpo.steps)", ckpt.dir.string(),
                                   ckpt.step, config.steps));
    std::vector<std::vector<float>> start;
    for (const model::ParamSpec& spec : model::parameter_specs(mc))
      start.emplace_back(sz(spec.numel()), 0.0f);
    learner_ptr = std::make_unique<Learner>(config, mc, std::move(start));
    learner_ptr->restore(ckpt);
    try {
      const json& st = ckpt.state;
      for (const json& line : st.at("metrics")) {
        RlStepMetrics m;
        m.step = line.at("step").get<int64_t>();
        m.reward = line.at("reward").get<double>();
        m.entropy = line.at("entropy").get<double>();
        m.line = line;
        result.steps.push_back(std::move(m));
      }
      if (static_cast<int64_t>(result.steps.size()) != ckpt.step)
        throw InputError(fmt::format("[rl] {}: {} metrics lines for step {}", (ckpt.dir / "state.json").string(),
                                     result.steps.size(), ckpt.step));
      const json& acc = st.at("result");
      result.seconds_warmup = acc.at("seconds_warmup").get<double>();
      result.warmup_cached = acc.at("warmup_cached").get<bool>();
      result.seconds_rollout = acc.at("seconds_rollout").get<double>();
      result.seconds_learner = acc.at("seconds_learner").get<double>();
      result.seconds_sync = acc.at("seconds_sync").get<double>();
      result.sync_failures = acc.at("sync_failures").get<int64_t>();
      seconds_before = acc.at("seconds_total").get<double>();
      k3_sum = acc.at("k3_sum").get<double>();
      rollouts_log = acc.at("rollouts").get<std::string>();
    } catch (const json::exception& e) {
      throw InputError(fmt::format("[rl] {}: {}", (ckpt.dir / "state.json").string(), e.what()));
    }
    result.start_step = ckpt.step;
    first_step = ckpt.step + 1;
    io::write_file_atomic(out / "metrics.jsonl", write_jsonl(result.steps));
    if (progress)
      std::fprintf(stderr, "%s: resumed from %s (step %lld/%lld)\n", config.name.c_str(), ckpt.dir.string().c_str(),
                   static_cast<long long>(ckpt.step), static_cast<long long>(config.steps));
  } else {
    WarmupResult warm = warm_up(config, progress);
    result.seconds_warmup = seconds_since(t0);
    result.warmup_cached = warm.cached;
    learner_ptr = std::make_unique<Learner>(config, mc, std::move(warm.weights));
  }
  Learner& learner = *learner_ptr;
  std::unique_ptr<SamplerRole> local;
  if (in_process && !remote) local = std::make_unique<SamplerRole>(config, mc, 1, 1);

  auto save = [&](int64_t at_step) {
    json lines = json::array();
    for (const RlStepMetrics& m : result.steps) lines.push_back(m.line);
    json state;
    state["step"] = at_step;
    state["seed"] = config.seed;
    state["metrics"] = std::move(lines);
    state["config"] = identity;
    state["result"] = {{"seconds_warmup", result.seconds_warmup}, {"warmup_cached", result.warmup_cached},
                       {"seconds_rollout", result.seconds_rollout}, {"seconds_learner", result.seconds_learner},
                       {"seconds_sync", result.seconds_sync}, {"sync_failures", result.sync_failures},
                       {"k3_sum", k3_sum}, {"rollouts", rollouts_log},
                       {"seconds_total", seconds_before + seconds_since(t_start)}};
    learner.save(out, at_step, std::move(state));
  };

  int64_t steps_here = 0;
  for (int64_t step = first_step; step <= config.steps; ++step) {
    const auto t_step = steady::now();
    json fair_cast;
    t0 = steady::now();
    const std::vector<uint8_t> payload = learner.sync(step, fair_cast);
    channel.publish(static_cast<uint64_t>(step), payload);
    const double learner_sync_s = seconds_since(t0);
    // The held-out evaluation of the served copy just exported (the master of step - 1).
    json evaluation;
    if (config.eval_every > 0 && (step - 1) % config.eval_every == 0) evaluation = learner.evaluate();

    if (local) {
      const SamplerReply reply = local->step(channel);
      channel.send(encode_reply(reply));
    } else if (remote) {
      const auto t_sampler = steady::now();
      const SamplerReply reply = remote->step(channel.receive(), t_sampler);
      channel.send(encode_reply(reply));
    }
    t0 = steady::now();
    const std::vector<std::vector<uint8_t>> messages = channel.gather();
    const double wait_s = seconds_since(t0);
    if (static_cast<int>(messages.size()) != samplers)
      throw InputError(fmt::format("[rl] {} channel: {} replies from {} samplers", channel.name(),
                                   messages.size(), samplers));
    std::vector<Rollout> rollouts;
    double sampler_sync_s = 0, rollout_s = 0;
    int64_t spec_rounds = 0, spec_drafted = 0, spec_accepted = 0, spec_emitted = 0;
    json reports = json::array();
    bool all_applied = true;
    std::string failed;
    for (size_t i = 0; i < messages.size(); ++i) {
      SamplerReply r = decode_reply(messages[i], static_cast<int>(i) + 1);
      sampler_sync_s = std::max(sampler_sync_s, r.seconds_sync);
      rollout_s = std::max(rollout_s, r.seconds_rollout);
      spec_rounds += r.spec_rounds;
      spec_drafted += r.spec_drafted;
      spec_accepted += r.spec_accepted;
      spec_emitted += r.spec_emitted;
      all_applied = all_applied && r.applied;
      if (!r.applied && failed.empty()) failed = r.failed_check;
      reports.push_back({{"rank", r.rank}, {"serving", r.serving}, {"applied", r.applied},
                         {"failed_check", r.failed_check}, {"failure_message", r.failure_message},
                         {"report", r.sync}});
      for (Rollout& x : r.rollouts) rollouts.push_back(std::move(x));
    }

    t0 = steady::now();
    const Batch batch = build_batch(config, step, rollouts);
    const Learner::StepOut learned = learner.learn(batch, step);
    const double learner_s = seconds_since(t0);
    const MismatchMetrics mm = mismatch_metrics(batch.sampler, learned.old_logp);
    if (config.log_rollouts) append_rollouts(rollouts_log, config, step, batch, learned);

    RlStepMetrics m;
    m.step = step;
    m.reward = mean(batch.rewards);
    m.entropy = learned.loss.entropy;
    json line = {{"step", step}, {"version", step}, {"reward", m.reward}, {"entropy", m.entropy},
                 {"response_length", static_cast<double>(batch.tokens) / static_cast<double>(batch.B)},
                 {"grad_norm", finite_or_null(learned.grad_norm)}, {"lr", config.lr}};
    line.update(mm.to_json());
    line.update(learned.loss.to_json());  // verl's actor/* names
    line["fair_cast"] = fair_cast;
    line["sync/applied"] = all_applied;
    line["sync/failed_check"] = failed.empty() ? json(nullptr) : json(failed);
    line["sync/reports"] = reports;
    if (!evaluation.is_null()) line["eval"] = evaluation;
    if (!config.speculative.empty()) {
      // The fraction of drafts accepted, and the tokens a verification emitted on average
      // (accepted drafts + 1), over every sampler's rollouts of the step.
      line["spec/accept_rate"] = spec_drafted > 0 ? json(static_cast<double>(spec_accepted) / static_cast<double>(spec_drafted))
                                                  : json(nullptr);
      line["spec/accept_length"] = spec_rounds > 0 ? json(static_cast<double>(spec_emitted) / static_cast<double>(spec_rounds))
                                                   : json(nullptr);
      line["spec/drafted"] = spec_drafted;
    }
    const double sync_s = learner_sync_s + sampler_sync_s;
    const double step_s = seconds_since(t_step);
    line["time/rollout_s"] = rollout_s;
    line["time/learner_s"] = learner_s;
    line["time/sync_s"] = sync_s;
    line["time/export_s"] = learner.seconds_export();
    line["time/publish_s"] = learner.seconds_publish();
    line["time/sampler_sync_s"] = sampler_sync_s;
    line["time/wait_s"] = wait_s;
    line["time/step_s"] = step_s;
    m.line = std::move(line);
    result.steps.push_back(std::move(m));
    io::write_file_atomic(out / "metrics.jsonl", write_jsonl(result.steps));

    result.seconds_rollout += rollout_s;
    result.seconds_learner += learner_s;
    result.seconds_sync += sync_s;
    result.sync_failures += all_applied ? 0 : 1;
    k3_sum += mm.k3_kl;
    if (progress) {
      std::fprintf(stderr, "%s: step %lld/%lld  reward %.3f  k3_kl %.2e  entropy %.3f  lag p50 %.0f  "
                           "sync %s  %.2fs\n",
                   config.name.c_str(), static_cast<long long>(step), static_cast<long long>(config.steps),
                   result.steps.back().reward, mm.k3_kl, result.steps.back().entropy,
                   learner.lag().median, all_applied ? "ok" : ("FAILED (" + failed + ")").c_str(), step_s);
    }
    if ((config.checkpoint_every > 0 && step % config.checkpoint_every == 0) || step == config.steps) save(step);
    if (options.stop_after && ++steps_here >= *options.stop_after && step < config.steps) {
      result.stopped = true;
      result.seconds_this_process = seconds_since(t_start);
      result.seconds_total = seconds_before + result.seconds_this_process;
      return result;
    }
  }

  if (first_step > config.steps && !in_process) channel.publish(kFinished, {});
  const size_t n = result.steps.size();
  const size_t tail = std::max<size_t>(1, n / 10);
  double head_sum = 0, tail_sum = 0;
  for (size_t i = 0; i < tail; ++i) head_sum += result.steps[i].reward;
  for (size_t i = n - tail; i < n; ++i) tail_sum += result.steps[i].reward;
  result.initial_reward = head_sum / static_cast<double>(tail);
  result.final_reward = tail_sum / static_cast<double>(tail);
  result.warmup_reward = result.steps.front().reward;
  result.mean_mismatch_kl = k3_sum / static_cast<double>(n);
  result.lag_median = learner.lag().median;
  result.lag_p90 = learner.lag().p90;
  result.seconds_this_process = seconds_since(t_start);
  result.seconds_total = seconds_before + result.seconds_this_process;
  result.summary = summarize(config, result);
  result.summary["lag"] = learner.lag().to_json();
  result.summary["lag_counts"] = learner.lag_counts();  // exact: events closed after 0, 1, 2, ... steps
  if (config.eval_every > 0) {
    // The last checkpoint is written: the final evaluation's export changes nothing it holds.
    learner.export_final(config.steps);
    result.summary["eval_final"] = learner.evaluate();
    result.summary["eval_final"]["step"] = config.steps + 1;
  }
  io::write_file_atomic(out / "summary.json", result.summary.dump(2) + "\n");
  if (config.log_rollouts) io::write_file_atomic(out / "rollouts.jsonl", rollouts_log);
  const ReportArm arm{config.name, &config, &result};
  write_rl_report(out / "report.html", fmt::format("concord rl: {}", config.name), {&arm, 1});
  return result;
}

LoadedRun load_rl_run(const fs::path& dir) {
  LoadedRun run;
  const fs::path config_path = dir / "config.json", metrics_path = dir / "metrics.jsonl",
                 summary_path = dir / "summary.json";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(fmt::format("[rl] {}: not a directory", dir.string()));
  for (const fs::path& f : {config_path, metrics_path, summary_path})
    if (!fs::exists(f, ec))
      throw InputError(fmt::format("[rl] {}: missing ({})", f.string(),
                                   f == summary_path ? "the run has not finished" : "not an rl run directory"));
  run.config = RlConfig::load(config_path);
  RlResult& r = run.result;
  std::ifstream in(metrics_path);
  std::string text;
  int64_t number = 0;
  while (std::getline(in, text)) {
    ++number;
    if (text.empty()) continue;
    try {
      RlStepMetrics m;
      m.line = json::parse(text);
      m.step = m.line.at("step").get<int64_t>();
      m.reward = m.line.at("reward").get<double>();
      m.entropy = m.line.at("entropy").get<double>();
      if (m.step != static_cast<int64_t>(r.steps.size()) + 1)
        throw InputError(fmt::format("step {} where step {} belongs", m.step, r.steps.size() + 1));
      r.steps.push_back(std::move(m));
    } catch (const json::exception& e) {
      throw InputError(fmt::format("[rl] {}: line {}: {}", metrics_path.string(), number, e.what()));
    } catch (const InputError& e) {
      throw InputError(fmt::format("[rl] {}: line {}: {}", metrics_path.string(), number, e.what()));
    }
  }
  r.summary = io::read_json_file(summary_path, "rl", "the run's summary");
  try {
    const json& s = r.summary;
    if (s.at("steps").get<int64_t>() != static_cast<int64_t>(r.steps.size()))
      throw InputError(fmt::format("{} steps, but {} lines in {}", s.at("steps").get<int64_t>(), r.steps.size(),
                                   metrics_path.string()));
    if (r.steps.empty()) throw InputError("no steps");
    r.warmup_reward = s.at("warmup_reward").get<double>();
    r.initial_reward = s.at("initial_reward").get<double>();
    r.final_reward = s.at("final_reward").get<double>();
    r.mean_mismatch_kl = s.at("mean_k3_kl").get<double>();
    r.lag_median = s.at("lag_median").get<double>();
    r.lag_p90 = s.at("lag_p90").get<double>();
    const json& sec = s.at("seconds");
    r.seconds_warmup = sec.at("warmup").get<double>();
    r.seconds_rollout = sec.at("rollout").get<double>();
    r.seconds_learner = sec.at("learner").get<double>();
    r.seconds_sync = sec.at("sync").get<double>();
    r.seconds_total = sec.at("total").get<double>();
    r.seconds_this_process = sec.at("this_process").get<double>();
    r.warmup_cached = s.at("warmup_cached").get<bool>();
    r.sync_failures = s.at("sync_failures").get<int64_t>();
  } catch (const json::exception& e) {
    throw InputError(fmt::format("[rl] {}: {}", summary_path.string(), e.what()));
  } catch (const InputError& e) {
    throw InputError(fmt::format("[rl] {}: {}", summary_path.string(), e.what()));
  }
  return run;
}

}  // namespace concord::rl
