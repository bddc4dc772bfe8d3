// The engine's scheduler: admission into KV-cache slots, one batched cached forward per step,
// per-sequence sampling and log-probabilities.
#include "concord/serve/engine.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "concord/numerics/check.h"
#include "concord/serve/logprob.h"

namespace concord::serve {

struct Engine::Sequence {
  int64_t id = 0;
  Request request;
  int slot = -1;
  int64_t prefilled = 0;  // prompt tokens in the cache
  int32_t next_input = 0;  // the last sampled token, fed by the next decode step
  Completion completion;
};

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::context: return "context";
  }
  return "?";
}

static const EngineOptions& checked_options(const EngineOptions& o) {
  if (o.max_sequences <= 0)
    throw InputError(fmt::format("[engine] max_sequences must be >= 1, got {}", o.max_sequences));
  if (o.prefill_chunk <= 0)
    throw InputError(fmt::format("[engine] prefill_chunk must be >= 1, got {}", o.prefill_chunk));
  return o;
}

Engine::Engine(model::Model& model, EngineOptions options)
    : model_(model),
      options_(checked_options(options)),
      cache_(model.config(), options_.max_sequences, options_.max_context) {
  options_.max_context = cache_.capacity();
  running_.resize(static_cast<size_t>(options_.max_sequences));
}

Engine::~Engine() = default;

int64_t Engine::submit(Request request) {
  request.sampling.validate();
  const int64_t V = model_.config().vocab_size;
  if (request.prompt.empty()) throw InputError("[engine] a request needs at least one prompt token");
  if (static_cast<int64_t>(request.prompt.size()) > options_.max_context)
    throw InputError(fmt::format("[engine] prompt of {} tokens does not fit the context of {} "
                                 "tokens", request.prompt.size(), options_.max_context));
  for (int32_t t : request.prompt)
    if (t < 0 || t >= V)
      throw InputError(fmt::format("[engine] prompt token {} outside the vocabulary [0, {})", t, V));
  for (int32_t t : request.stop_tokens)
    if (t < 0 || t >= V)
      throw InputError(fmt::format("[engine] stop token {} outside the vocabulary [0, {})", t, V));
  if (request.max_tokens < 0)
    throw InputError(fmt::format("[engine] max_tokens must be >= 0, got {}", request.max_tokens));
  auto s = std::make_unique<Sequence>();
  s->id = next_id_++;
  s->request = std::move(request);
  if (s->request.max_tokens == 0) {
    done_[s->id] = Completion{};
    return s->id;
  }
  waiting_.push_back(std::move(s));
  return next_id_ - 1;
}

void Engine::admit() {
  while (!waiting_.empty() && cache_.sequences_in_use() < cache_.max_sequences()) {
    std::unique_ptr<Sequence> s = std::move(waiting_.front());
    waiting_.pop_front();
    s->slot = cache_.allocate();
    running_[static_cast<size_t>(s->slot)] = std::move(s);
  }
}

// Records the sampled token; true when the sequence is done.
bool Engine::finish_if_done(Sequence& s, int32_t token) {
  Completion& c = s.completion;
  const Request& r = s.request;
  if (std::find(r.stop_tokens.begin(), r.stop_tokens.end(), token) != r.stop_tokens.end()) {
    c.finish = FinishReason::stop;
    return true;
  }
  if (static_cast<int64_t>(c.tokens.size()) >= r.max_tokens) {
    c.finish = FinishReason::length;
    return true;
  }
  if (cache_.length(s.slot) + 1 > options_.max_context) {  // no room to feed the token back
    c.finish = FinishReason::context;
    return true;
  }
  return false;
}

bool Engine::step() {
  admit();
  std::vector<model::CachedInput> inputs;
  std::vector<Sequence*> owners;
  int64_t prefill_rows = 0, decode_rows = 0;
  for (auto& slot : running_) {
    if (!slot) continue;
    Sequence& s = *slot;
    const auto prompt_len = static_cast<int64_t>(s.request.prompt.size());
    model::CachedInput in;
    in.slot = s.slot;
    if (s.prefilled < prompt_len) {
      const int64_t n = std::min(options_.prefill_chunk, prompt_len - s.prefilled);
      in.tokens = std::span<const int32_t>(s.request.prompt).subspan(
          static_cast<size_t>(s.prefilled), static_cast<size_t>(n));
      in.logits = s.prefilled + n == prompt_len ? model::LogitRows::last : model::LogitRows::none;
      s.prefilled += n;
      prefill_rows += n;
    } else {
      in.tokens = std::span<const int32_t>(&s.next_input, 1);
      in.logits = model::LogitRows::last;
      decode_rows += 1;
    }
    inputs.push_back(in);
    owners.push_back(&s);
  }
  if (inputs.empty()) return false;

  const int64_t V = model_.config().vocab_size;
  logits_.resize(static_cast<size_t>(model::logit_rows(inputs) * V));
  const auto t0 = std::chrono::steady_clock::now();
  model_.forward_cached(cache_, inputs, logits_);

  int64_t row = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].logits == model::LogitRows::none) continue;
    Sequence& s = *owners[i];
    const std::span<const float> logits(logits_.data() + row * V, static_cast<size_t>(V));
    ++row;
    Completion& c = s.completion;
    const SamplingParams& p = s.request.sampling;
    const int32_t token = sample_token(logits, p, c.tokens.size());
    c.tokens.push_back(token);
    c.logprobs.push_back(token_logprob(logits, token, p.temperature));
    if (s.request.full_logprobs) {
      c.full_logprobs.emplace_back(static_cast<size_t>(V));
      full_logprobs(logits, p.temperature, c.full_logprobs.back());
    }
    s.next_input = token;
    ++stats_.generated_tokens;
    if (on_token_) on_token_(s.id, token);
    if (finish_if_done(s, token)) {
      cache_.release(s.slot);
      done_[s.id] = std::move(c);
      running_[static_cast<size_t>(s.slot)].reset();
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.steps;
  if (prefill_rows > 0) {
    stats_.prefill_tokens += prefill_rows;
    stats_.prefill_seconds += seconds;
  } else {
    stats_.decode_tokens += decode_rows;
    stats_.decode_seconds += seconds;
  }
  return true;
}

void Engine::run() {
  while (step()) {
  }
}

bool Engine::finished(int64_t id) const { return done_.count(id) != 0; }

Completion Engine::take(int64_t id) {
  auto it = done_.find(id);
  if (it == done_.end())
    throw InputError(fmt::format("[engine] request {} has not finished (or was taken)", id));
  Completion c = std::move(it->second);
  done_.erase(it);
  return c;
}

std::vector<Completion> Engine::generate(std::vector<Request> requests) {
  std::vector<int64_t> ids;
  for (Request& r : requests) ids.push_back(submit(std::move(r)));
  run();
  std::vector<Completion> out;
  for (int64_t id : ids) out.push_back(take(id));
  return out;
}

}  // namespace concord::serve
