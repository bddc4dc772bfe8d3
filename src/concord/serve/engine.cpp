// The engine's scheduler: admission into KV-cache slots, one batched cached forward per step,
// per-sequence sampling and log-probabilities, cancellation.
#include "concord/serve/engine.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>

#include <fmt/format.h>

#include "concord/numerics/check.h"
#include "concord/sched/executor.h"
#include "concord/sched/model_graph.h"
#include "concord/serve/logprob.h"
#include "concord/serve/speculative.h"

namespace concord::serve {

struct Engine::Sequence {
  int64_t id = 0;
  Request request;
  int slot = -1;
  int64_t prefilled = 0;  // prompt tokens in the cache
  int32_t next_input = 0;  // the last sampled token, fed by the next decode step
  bool done = false;       // finished or cancelled (its completion is in done_)
  Completion completion;
  // Speculation: the prompt and the generated tokens, the drafts per round (γ), this step's
  // draft (index into drafts_, -1: none) and its input (the pending token, then the drafts).
  std::vector<int32_t> context;
  int gamma = 0;
  int draft = -1;
  std::vector<int32_t> spec_input;
};

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::context: return "context";
    case FinishReason::cancelled: return "cancelled";
  }
  return "?";
}

void top_logprobs(std::span<const float> logits, const SoftmaxStats& stats, int32_t n,
                  std::vector<TopLogprob>& out) {
  out.clear();
  if (n <= 0) return;
  const size_t keep = std::min(static_cast<size_t>(n), logits.size());
  // `better` is the heap's "less": the heap's front is the worst entry kept so far. Tokens come
  // in ascending id, so a later token with an equal logp never displaces an earlier one.
  const auto better = [](const TopLogprob& a, const TopLogprob& b) {
    return a.logprob > b.logprob || (a.logprob == b.logprob && a.token < b.token);
  };
  for (size_t i = 0; i < logits.size(); ++i) {
    const TopLogprob entry{static_cast<int32_t>(i), stats.logprob(logits[i])};
    if (out.size() < keep) {
      out.push_back(entry);
      std::push_heap(out.begin(), out.end(), better);
    } else if (better(entry, out.front())) {
      std::pop_heap(out.begin(), out.end(), better);
      out.back() = entry;
      std::push_heap(out.begin(), out.end(), better);
    }
  }
  std::sort_heap(out.begin(), out.end(), better);  // best first
}

const char* activation_arena_name(ActivationArena a) { return a == ActivationArena::planned ? "planned" : "bump"; }

ActivationArena activation_arena_from_name(const std::string& name) {
  if (name == "planned") return ActivationArena::planned;
  if (name == "bump") return ActivationArena::bump;
  throw InputError(fmt::format("[engine] unknown activation arena '{}' (planned, bump)", name));
}

// The planned activation arena: a plan per step shape, the memory they share.
struct Engine::ActivationPlans {
  struct Entry {
    sched::PreparedPass pass;
    uint64_t used = 0;
  };
  static constexpr size_t kKept = 64;
  std::map<std::string, Entry> entries;
  uint64_t clock = 0;
  sched::ArenaMemory memory;
};

void Engine::forward(std::span<const model::CachedInput> inputs) {
  if (!plans_ || model_.adaptive_exit_on()) {  // adaptive exit decides iterations per token as it runs
    model_.forward_cached(cache_, inputs, logits_);
    stats_.activation_arena_bytes = std::max(stats_.activation_arena_bytes,
                                             static_cast<int64_t>(cache_.workspace().bytes_live_high_water()));
    return;
  }
  // The step's shape; its scores get room for the longest row's keys rounded up to a power of two
  // (within the context), so that a run of decode steps shares one plan.
  sched::CachedShape shape;
  int64_t keys = 0;
  std::string key;
  for (const model::CachedInput& in : inputs) {
    shape.context.push_back(cache_.length(in.slot));
    shape.tokens.push_back(static_cast<int64_t>(in.tokens.size()));
    shape.logits.push_back(in.logits);
    keys = std::max(keys, shape.context.back() + shape.tokens.back());
    key += fmt::format("{}{},", shape.tokens.back(), "nla"[static_cast<int>(in.logits)]);
  }
  shape.key_capacity = std::max(keys, std::min(options_.max_context, static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(keys, 64))))));
  key += fmt::format("{}", shape.key_capacity);
  if (model_.config().recurrent()) key += fmt::format("d{}", model_.depth());  // the plan is the depth's
  ActivationPlans& p = *plans_;
  auto it = p.entries.find(key);
  if (it == p.entries.end()) {
    if (p.entries.size() >= ActivationPlans::kKept)
      p.entries.erase(std::min_element(p.entries.begin(), p.entries.end(),
                                       [](const auto& a, const auto& b) { return a.second.used < b.second.used; }));
    sched::Graph graph = sched::model_graph(model_, shape);
    sched::Order order = sched::program_order(graph);
    sched::ArenaPlan plan = sched::plan_offsets(graph, order, sched::Planner::greedy_by_size);
    it = p.entries.emplace(key, ActivationPlans::Entry{sched::PreparedPass(std::move(graph), std::move(order), std::move(plan))})
             .first;
    ++stats_.activation_plans;
  }
  it->second.used = ++p.clock;
  it->second.pass.run(model_, cache_, inputs, p.memory, logits_);
  stats_.activation_arena_bytes = std::max(stats_.activation_arena_bytes, p.memory.bytes());
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
      cache_(model.config(), options_.max_sequences, options_.max_context, options_.kv_core_slots) {
  options_.max_context = cache_.capacity();
  running_.resize(static_cast<size_t>(options_.max_sequences));
  const model::ModelConfig& c = model.config();
  if (options_.activation_arena == ActivationArena::planned && !c.moe())
    plans_ = std::make_unique<ActivationPlans>();
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
  if (request.top_logprobs < 0 || request.top_logprobs > kMaxTopLogprobs)
    throw InputError(fmt::format("[engine] top_logprobs must be in 0..{}, got {}", kMaxTopLogprobs,
                                 request.top_logprobs));
  auto s = std::make_unique<Sequence>();
  s->id = next_id_++;
  s->request = std::move(request);
  s->context = s->request.prompt;
  s->gamma = speculation_.draft_tokens;
  const bool scores_prompt = s->request.prompt_logprobs && s->request.prompt.size() >= 2;
  if (s->request.max_tokens == 0 && !scores_prompt) {
    done_[s->id] = Completion{};
    return s->id;
  }
  waiting_.push_back(std::move(s));
  return next_id_ - 1;
}

// Whether every forward activation is quantized row by row (no scale shared across a GEMM's rows:
// not NVFP4's S_enc, not per-tensor FP8), so that any prefill chunking computes the same bits.
bool rows_quantize_alone(const model::PrecisionPolicy& p) {
  auto alone = [](const model::LayerPrecision& l) {
    const auto& a = l[model::GemmRole::forward].a;
    return !a || !(a->is_per_tensor() || (a->has_scale && a->scale == numerics::Format::ue4m3));
  };
  for (const model::LayerPrecision& l : p.layer_class)
    if (!alone(l)) return false;
  return p.high_precision_last_layers == 0 || alone(p.high_precision);
}

void Engine::set_prefix_cache(std::shared_ptr<PrefixCache> cache) {
  if (cache && !rows_quantize_alone(model_.policy()) && cache->options().block % options_.prefill_chunk != 0)
    throw InputError(fmt::format(
        "[engine] the prefix cache's block ({} tokens) must be a multiple of the prefill chunk ({}) under "
        "policy {}: its activations share a scale across a chunk's rows, so a block must hold whole chunks",
        cache->options().block, options_.prefill_chunk, model_.policy().name));
  prefix_cache_ = std::move(cache);
}

void Engine::admit() {
  while (!waiting_.empty() && cache_.sequences_in_use() < cache_.max_sequences()) {
    std::unique_ptr<Sequence> s = std::move(waiting_.front());
    waiting_.pop_front();
    s->slot = cache_.allocate();
    if (prefix_cache_ && !s->request.prompt_logprobs) {
      const int64_t align = rows_quantize_alone(model_.policy()) ? 1 : options_.prefill_chunk;
      s->prefilled = prefix_cache_->restore(s->request.prompt, cache_, s->slot, align);
      stats_.prefix_reused_tokens += s->prefilled;
    }
    running_[static_cast<size_t>(s->slot)] = std::move(s);
  }
}

// Records the sampled token; true when the sequence is done.
// `cached`: the sequence's tokens in the cache, the token not yet fed.
bool Engine::finish_if_done(Sequence& s, int32_t token, int64_t cached) {
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
  if (cached + 1 > options_.max_context) {  // no room to feed the token back
    c.finish = FinishReason::context;
    return true;
  }
  return false;
}

void Engine::finish(Sequence& s, FinishReason reason) {
  s.completion.finish = reason;
  s.done = true;
  cache_.release(s.slot);
  if (drafter_) drafter_->release(s.id);
  done_[s.id] = std::move(s.completion);
  std::unique_ptr<Sequence>& owner = running_[static_cast<size_t>(s.slot)];
  // During step()'s sampling loop the loop still points at the sequence: keep it until the end.
  if (in_step_) retired_.push_back(std::move(owner));
  owner.reset();
}

// logp(prompt[i] | prompt[<i]) from the logits of prompt token i - 1: `rows` logit rows of
// prompt tokens first_row, first_row + 1, ... Rows are independent (each sums on one thread, in
// index order), so they run in parallel without changing a bit.
void Engine::record_prompt_logprobs(Sequence& s, std::span<const float> logits, int64_t first_row,
                                    int64_t rows) {
  const int64_t V = model_.config().vocab_size;
  const Request& r = s.request;
  Completion& c = s.completion;
  const auto prompt_len = static_cast<int64_t>(r.prompt.size());
  const int64_t scored = std::min(rows, prompt_len - 1 - first_row);  // the last token scores none
  if (scored <= 0) return;
  const size_t base = c.prompt_logprobs.size();
  c.prompt_logprobs.resize(base + static_cast<size_t>(scored));
  if (r.top_logprobs > 0) c.prompt_top_logprobs.resize(base + static_cast<size_t>(scored));
  std::exception_ptr error;
#pragma omp parallel for schedule(static) if (scored * V > 65536)
  for (int64_t j = 0; j < scored; ++j) {
    try {
      const std::span<const float> row = logits.subspan(static_cast<size_t>(j * V), static_cast<size_t>(V));
      const SoftmaxStats stats = softmax_stats(row, r.sampling.temperature);
      const size_t k = base + static_cast<size_t>(j);
      c.prompt_logprobs[k] = stats.logprob(row[static_cast<size_t>(r.prompt[first_row + j + 1])]);
      if (r.top_logprobs > 0) top_logprobs(row, stats, r.top_logprobs, c.prompt_top_logprobs[k]);
    } catch (...) {
#pragma omp critical(concord_engine_prompt_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

bool Engine::step() {
  CONCORD_CHECK(!in_step_, "Engine::step() called from the token callback");
  admit();
  const auto t0 = std::chrono::steady_clock::now();  // the drafting counts in the step's time
  // Drafts for every decoding sequence, from one drafter call.
  drafts_.clear();
  if (drafter_) {
    for (auto& slot : running_) {
      if (!slot) continue;
      Sequence& s = *slot;
      s.draft = -1;
      if (s.prefilled < static_cast<int64_t>(s.request.prompt.size())) continue;
      const auto generated = static_cast<int64_t>(s.completion.tokens.size());
      // Room: tokens still to generate beyond the one the round always emits, and context for
      // the pending token and the drafts.
      const int64_t gamma = std::min({static_cast<int64_t>(s.gamma), s.request.max_tokens - generated - 1,
                                      options_.max_context - cache_.length(s.slot) - 1});
      if (gamma <= 0) continue;
      s.draft = static_cast<int>(drafts_.size());
      DraftRequest& r = drafts_.emplace_back();
      r.id = s.id;
      r.context = s.context;
      r.sampling = &s.request.sampling;
      r.position = static_cast<uint64_t>(generated);
      r.gamma = static_cast<int>(gamma);
    }
    const auto d0 = std::chrono::steady_clock::now();
    drafter_->propose(drafts_);
    stats_.speculation.draft_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - d0).count();
    for (const DraftRequest& r : drafts_) stats_.speculation.proposed += static_cast<int64_t>(r.tokens.size());
  }
  std::vector<model::CachedInput> inputs;
  std::vector<Sequence*> owners;
  std::vector<int64_t> prompt_first;  // per input: its first prompt position, -1 for decode rows
  std::vector<bool> samples;          // per input: its last logits row is sampled
  int64_t prefill_rows = 0, decode_emitted = 0;
  for (auto& slot : running_) {
    if (!slot) continue;
    Sequence& s = *slot;
    const auto prompt_len = static_cast<int64_t>(s.request.prompt.size());
    model::CachedInput in;
    in.slot = s.slot;
    if (s.prefilled < prompt_len) {
      const int64_t n = std::min(options_.prefill_chunk, prompt_len - s.prefilled);
      const bool last_chunk = s.prefilled + n == prompt_len;
      in.tokens = std::span<const int32_t>(s.request.prompt).subspan(
          static_cast<size_t>(s.prefilled), static_cast<size_t>(n));
      in.logits = s.request.prompt_logprobs ? model::LogitRows::all
                  : last_chunk             ? model::LogitRows::last
                                           : model::LogitRows::none;
      prompt_first.push_back(s.prefilled);
      samples.push_back(last_chunk && s.request.max_tokens > 0);
      s.prefilled += n;
      prefill_rows += n;
    } else if (s.draft >= 0 && !drafts_[static_cast<size_t>(s.draft)].tokens.empty()) {
      const std::vector<int32_t>& d = drafts_[static_cast<size_t>(s.draft)].tokens;
      s.spec_input.assign(1, s.next_input);
      s.spec_input.insert(s.spec_input.end(), d.begin(), d.end());
      in.tokens = s.spec_input;
      in.logits = model::LogitRows::all;
      prompt_first.push_back(-1);
      samples.push_back(true);
    } else {
      if (drafter_) s.draft = -1;
      in.tokens = std::span<const int32_t>(&s.next_input, 1);
      in.logits = model::LogitRows::last;
      prompt_first.push_back(-1);
      samples.push_back(true);
    }
    inputs.push_back(in);
    owners.push_back(&s);
  }
  if (inputs.empty()) return false;

  const int64_t V = model_.config().vocab_size;
  logits_.resize(static_cast<size_t>(model::logit_rows(inputs) * V));
  forward(inputs);
  // Prefills that completed: their prompts' blocks into the prefix cache (before any slot is
  // released below).
  if (prefix_cache_)
    for (size_t k = 0; k < inputs.size(); ++k) {
      const Sequence& s = *owners[k];
      if (prompt_first[k] >= 0 && !s.request.prompt_logprobs &&
          s.prefilled == static_cast<int64_t>(s.request.prompt.size()))
        prefix_cache_->store(s.request.prompt, cache_, s.slot,
                             rows_quantize_alone(model_.policy()) ? 1 : options_.prefill_chunk);
    }
  if (model_.config().recurrent())
    for (int32_t n : model_.last_iterations()) {
      stats_.core_iterations += n;
      ++stats_.iterated_tokens;
    }

  // The sampling loop; callbacks may cancel or finish sequences (retired_ keeps them alive).
  struct StepScope {
    Engine& e;
    explicit StepScope(Engine& engine) : e(engine) { e.in_step_ = true; }
    ~StepScope() {
      e.in_step_ = false;
      e.retired_.clear();
    }
  } scope(*this);
  // Draws first, for every sampled row at once: each depends only on its own logits row,
  // parameters and position (sampling.h), so running the rows on several threads changes no
  // bit; at batch 8 the V-wide exp passes of sampling and log-probs are a fifth of a decode step.
  std::vector<int64_t> first_row(inputs.size()), rows_of(inputs.size());  // per input's logits
  for (size_t i = 0, row = 0; i < inputs.size(); ++i) {
    first_row[i] = static_cast<int64_t>(row);
    rows_of[i] = model::logit_rows({&inputs[i], 1});
    row += static_cast<size_t>(rows_of[i]);
  }
  draws_.resize(inputs.size());
  const auto n_inputs = static_cast<int64_t>(inputs.size());
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1) if (n_inputs > 1)
  for (int64_t i = 0; i < n_inputs; ++i) {
    const auto k = static_cast<size_t>(i);
    if (!samples[k]) continue;
    try {
      const Sequence& s = *owners[k];
      const SamplingParams& p = s.request.sampling;
      Draw& d = draws_[k];
      if (prompt_first[k] < 0 && s.draft >= 0) {  // a speculative round: verify the drafts
        const DraftRequest& r = drafts_[static_cast<size_t>(s.draft)];
        const size_t gamma = r.tokens.size();
        std::vector<std::vector<double>> ps(gamma + 1), qs(gamma);
        for (size_t j = 0; j <= gamma; ++j)
          ps[j] = processed_distribution(
              std::span<const float>(logits_.data() + (first_row[k] + static_cast<int64_t>(j)) * V, static_cast<size_t>(V)), p);
        for (size_t j = 0; j < gamma; ++j) qs[j] = r.q.empty() ? one_hot(V, r.tokens[j]) : r.q[j];
        PhiloxChoices choices(p.seed);
        const Verdict v = verify_draft(r.tokens, qs, ps, choices, r.position);
        d.accepted = v.accepted;
        d.tokens = v.tokens;
        const size_t verified = std::min(gamma, static_cast<size_t>(v.accepted) + 1);
        const bool untruncated = !p.greedy() && p.top_k == 0 && p.top_p == 1.0f && p.min_p == 0.0f;
        d.alphas.resize(verified);
        d.slacks.assign(verified, std::numeric_limits<double>::quiet_NaN());
        for (size_t j = 0; j < verified; ++j) {
          d.alphas[j] = acceptance_probability(ps[j], qs[j]);
          if (!untruncated || r.logits.size() <= j) continue;
          const float* zp = logits_.data() + (first_row[k] + static_cast<int64_t>(j)) * V;
          double lo = INFINITY, hi = -INFINITY;
          for (int64_t x = 0; x < V; ++x) {
            const double delta = static_cast<double>(r.logits[j][static_cast<size_t>(x)]) - static_cast<double>(zp[x]);
            lo = std::min(lo, delta);
            hi = std::max(hi, delta);
          }
          const double osc = (hi - lo) / static_cast<double>(p.temperature);
          d.slacks[j] = d.alphas[j] - (1.0 - std::tanh(osc / 4.0));
        }
        d.logprobs.resize(v.tokens.size());
        d.tops.resize(v.tokens.size());
        for (size_t j = 0; j < v.tokens.size(); ++j) {
          const std::span<const float> row(logits_.data() + (first_row[k] + static_cast<int64_t>(j)) * V,
                                           static_cast<size_t>(V));
          const SoftmaxStats stats = softmax_stats(row, p.temperature);
          d.logprobs[j] = stats.logprob(row[static_cast<size_t>(v.tokens[j])]);
          d.tops[j].clear();
          if (s.request.top_logprobs > 0) top_logprobs(row, stats, s.request.top_logprobs, d.tops[j]);
        }
        continue;
      }
      const std::span<const float> logits(logits_.data() + (first_row[k] + rows_of[k] - 1) * V,
                                          static_cast<size_t>(V));
      d.token = sample_token(logits, p, s.completion.tokens.size());
      // stats.logprob(logits[token]) is token_logprob(logits, token, T), computed once per row.
      const SoftmaxStats stats = softmax_stats(logits, p.temperature);
      d.logprob = stats.logprob(logits[static_cast<size_t>(d.token)]);
      d.top.clear();
      if (s.request.top_logprobs > 0) top_logprobs(logits, stats, s.request.top_logprobs, d.top);
    } catch (...) {
#pragma omp critical(concord_engine_draw_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);

  for (size_t i = 0; i < inputs.size(); ++i) {
    const int64_t rows = rows_of[i];
    const std::span<const float> block(logits_.data() + first_row[i] * V,
                                       static_cast<size_t>(rows * V));
    Sequence& s = *owners[i];
    if (s.done) continue;  // cancelled by an earlier callback of this step
    if (prompt_first[i] >= 0 && s.request.prompt_logprobs)
      record_prompt_logprobs(s, block, prompt_first[i], rows);
    if (!samples[i]) {
      if (s.prefilled == static_cast<int64_t>(s.request.prompt.size()))
        finish(s, FinishReason::length);  // max_tokens = 0: the prompt is scored, nothing drawn
      continue;
    }
    if (prompt_first[i] < 0 && s.draft >= 0) {
      decode_emitted += emit_speculative(s, block, draws_[i]);
      continue;
    }
    const std::span<const float> logits = block.last(static_cast<size_t>(V));
    Completion& c = s.completion;
    const Request& r = s.request;
    const Draw& d = draws_[i];
    const int32_t token = d.token;
    c.tokens.push_back(token);
    c.logprobs.push_back(d.logprob);
    if (r.full_logprobs) {
      c.full_logprobs.emplace_back(static_cast<size_t>(V));
      full_logprobs(logits, r.sampling.temperature, c.full_logprobs.back());
    }
    if (r.top_logprobs > 0) c.top_logprobs.push_back(d.top);
    s.next_input = token;
    s.context.push_back(token);
    ++stats_.generated_tokens;
    if (prompt_first[i] < 0) ++decode_emitted;
    const bool ended = finish_if_done(s, token, cache_.length(s.slot));
    const FinishReason reason = c.finish;
    if (ended) finish(s, reason);  // before the event: cancel() from it returns false
    if (on_token_) on_token_(TokenEvent{s.id, token, d.logprob, d.top, ended, reason});
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++stats_.steps;
  if (prefill_rows > 0) {
    stats_.prefill_tokens += prefill_rows;
    stats_.prefill_seconds += seconds;
  } else {
    stats_.decode_tokens += decode_emitted;
    stats_.decode_seconds += seconds;
  }
  return true;
}

// Emits a speculative round's tokens (Draw::tokens) in order, as the plain path emits one:
// the cache keeps the pending token and the accepted drafts; a stop, the length limit or a
// cancel from the callback ends the sequence at that token. Returns the tokens emitted.
int64_t Engine::emit_speculative(Sequence& s, std::span<const float> block, const Draw& d) {
  const int64_t V = model_.config().vocab_size;
  const DraftRequest& r = drafts_[static_cast<size_t>(s.draft)];
  const auto gamma = static_cast<int64_t>(r.tokens.size());
  const int64_t before = cache_.length(s.slot) - 1 - gamma;  // the cache before this step
  cache_.truncate(s.slot, before + 1 + d.accepted);
  SpeculationStats& st = stats_.speculation;
  ++st.rounds;
  st.drafted += std::min<int64_t>(gamma, d.accepted + 1);
  st.accepted += d.accepted;
  if (st.verified_at.size() < static_cast<size_t>(gamma)) {
    st.verified_at.resize(static_cast<size_t>(gamma));
    st.accepted_at.resize(static_cast<size_t>(gamma));
  }
  if (st.alpha_at.size() < st.verified_at.size()) st.alpha_at.resize(st.verified_at.size());
  for (int64_t j = 0; j < std::min<int64_t>(gamma, d.accepted + 1); ++j) {
    const auto jj = static_cast<size_t>(j);
    ++st.verified_at[jj];
    st.accepted_at[jj] += j < d.accepted;
    st.alpha_at[jj] += d.alphas[jj];
    if (!std::isnan(d.slacks[jj])) {
      ++st.contract_checked;
      // 1e-9: α and the bound are computed in double from float logits.
      st.contract_violations += d.slacks[jj] < -1e-9;
      st.contract_min_slack = std::min(st.contract_min_slack, d.slacks[jj]);
    }
  }
  if (speculation_.adaptive)
    s.gamma = d.accepted == gamma ? std::min(speculation_.draft_tokens, s.gamma + 2) : std::max(1, s.gamma - 1);
  Completion& c = s.completion;
  const Request& req = s.request;
  int64_t emitted = 0;
  for (size_t j = 0; j < d.tokens.size(); ++j) {
    const int32_t token = d.tokens[j];
    c.tokens.push_back(token);
    c.logprobs.push_back(d.logprobs[j]);
    if (req.full_logprobs) {
      c.full_logprobs.emplace_back(static_cast<size_t>(V));
      full_logprobs(block.subspan(j * static_cast<size_t>(V), static_cast<size_t>(V)), req.sampling.temperature,
                    c.full_logprobs.back());
    }
    if (req.top_logprobs > 0) c.top_logprobs.push_back(d.tops[j]);
    s.next_input = token;
    s.context.push_back(token);
    ++stats_.generated_tokens;
    ++st.emitted;
    ++emitted;
    const bool ended = finish_if_done(s, token, before + 1 + static_cast<int64_t>(j));
    const FinishReason reason = c.finish;
    if (ended) finish(s, reason);
    if (on_token_) on_token_(TokenEvent{s.id, token, d.logprobs[j], d.tops[j], ended, reason});
    if (s.done) break;
  }
  return emitted;
}

void Engine::set_drafter(std::shared_ptr<Drafter> drafter, SpeculationOptions options) {
  if (options.draft_tokens < 1)
    throw InputError(fmt::format("[engine] draft_tokens must be >= 1, got {}", options.draft_tokens));
  drafter_ = std::move(drafter);
  speculation_ = options;
  for (auto& slot : running_)
    if (slot) slot->gamma = options.draft_tokens;
  for (auto& s : waiting_) s->gamma = options.draft_tokens;
}

void Engine::run() {
  while (step()) {
  }
}

bool Engine::finished(int64_t id) const { return done_.count(id) != 0; }

bool Engine::cancel(int64_t id) {
  const auto queued = std::find_if(waiting_.begin(), waiting_.end(),
                                   [id](const std::unique_ptr<Sequence>& s) { return s->id == id; });
  if (queued != waiting_.end()) {
    Completion c = std::move((*queued)->completion);
    c.finish = FinishReason::cancelled;
    done_[id] = std::move(c);
    waiting_.erase(queued);
    return true;
  }
  for (auto& slot : running_) {
    if (slot && slot->id == id && !slot->done) {
      finish(*slot, FinishReason::cancelled);
      return true;
    }
  }
  return false;
}

int64_t Engine::waiting() const { return static_cast<int64_t>(waiting_.size()); }

int64_t Engine::running() const { return cache_.sequences_in_use(); }

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
