// Engine: generation for many sequences on one Model — KV cache, chunked prefill, batched decode,
// sampling and log-probabilities of the sampled tokens (and, on request, of the n most probable
// tokens and of the prompt's tokens).
//
// Each step() is ONE Model::forward_cached over every running sequence: a sequence still in its
// prompt contributes its next chunk (at most `prefill_chunk` tokens, cut at multiples of
// prefill_chunk from the prompt's start, whatever else runs), a decoding sequence its last
// sampled token. All rows share each GEMM, so a decode step streams every weight once for the
// whole batch. A sequence's chunking, logits, samples (seeded per sequence, sampling.h) and
// log-probabilities (logprob.h) depend only on that sequence: the results of a request are the
// same alone or in any batch, with any thread count (docs/engine.md states where bitwise).
// Asking for log-probabilities (top, prompt) changes no token and no logit: prompt log-probs
// take every row of the prompt chunks (LogitRows::all), and the final norm and lm_head are
// row-local in every policy, so the prompt's last row is the one a plain request samples from.
//
// Requests wait in FIFO order for one of `max_sequences` KV-cache slots; a finished sequence's
// slot is reused. Generation ends at a stop token (kept as the last token), after max_tokens,
// when the sequence fills its context (prompt + generated = max_context), or by cancel().
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "concord/model/kv_cache.h"
#include "concord/model/model.h"
#include "concord/serve/drafter.h"
#include "concord/serve/logprob.h"
#include "concord/serve/prefix_cache.h"
#include "concord/serve/sampling.h"

namespace concord::serve {

// Where a step's activations live (docs/engine.md). `planned`: the memory scheduler's plan of the
// step (sched/: the graph of the step's shape — every input's new tokens, cached tokens and logit
// rows —, program order, TFLM's greedy-by-size offsets, its scores sized for the context rounded up
// to a power of two so that one plan serves many decode steps), run node by node through one
// arena of the largest plan's size, reused from step to step; a plan is made once per shape and
// kept (the 64 most recently used). `bump`: Model::forward_cached's bump allocator (the KV
// cache's workspace). The same logits and cache rows either way, bit for bit. MoE models run
// `bump` (an expert's rows are known only once the router has run), and so does a recurrent model
// under adaptive exit (its iterations are decided per token as it runs).
enum class ActivationArena : uint8_t { planned, bump };
const char* activation_arena_name(ActivationArena a);  // "planned", "bump"
ActivationArena activation_arena_from_name(const std::string& name);  // InputError otherwise

struct EngineOptions {
  int64_t max_sequences = 8;    // sequences decoded together (KV-cache slots)
  int64_t prefill_chunk = 512;  // prompt tokens of one sequence per forward pass
  int64_t max_context = 0;      // prompt + generated tokens per sequence; 0: max_position_embeddings
  // A depth-recurrent model: the KV cache's core iteration slots (model/kv_cache.h; 0: one per
  // iteration up to max_recurrence, fewer: Huginn's fixed budget).
  int64_t kv_core_slots = 0;
  ActivationArena activation_arena = ActivationArena::planned;
};

inline constexpr int32_t kMaxTopLogprobs = 20;  // OpenAI's limit for top_logprobs

struct Request {
  std::vector<int32_t> prompt;       // at least one token
  SamplingParams sampling;
  int64_t max_tokens = 256;          // tokens to generate at most (0: none)
  std::vector<int32_t> stop_tokens;  // e.g. the model's eos ids
  bool full_logprobs = false;        // also return logp of every vocabulary entry per step
  // Per generated token (and per prompt token with prompt_logprobs), the n most probable
  // entries (logprob descending, token id ascending on ties); 0..kMaxTopLogprobs, capped at the
  // vocabulary size.
  int32_t top_logprobs = 0;
  // logp(prompt[i] | prompt[<i]) for i >= 1 (OpenAI's echo), with the request's temperature.
  // With max_tokens = 0 the prompt is still run (scoring a text without generating). Costs the
  // lm_head over every prompt row and a (chunk, V) block of the step's logits buffer.
  bool prompt_logprobs = false;
};

enum class FinishReason { stop, length, context, cancelled };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "context", "cancelled"

// One entry of a top-n list: a token and its logp (logprob.h).
struct TopLogprob {
  int32_t token = 0;
  double logprob = 0;
  bool operator==(const TopLogprob&) const = default;
};

struct Completion {
  std::vector<int32_t> tokens;    // generated tokens (a stop token included)
  std::vector<double> logprobs;   // logp of each generated token (logprob.h)
  std::vector<std::vector<float>> full_logprobs;  // per generated token, (V), when asked for
  std::vector<std::vector<TopLogprob>> top_logprobs;  // per generated token, when asked for
  std::vector<double> prompt_logprobs;  // prompt.size() - 1 values, when asked for (fewer when
                                        // cancelled during the prompt)
  // Per prompt token i >= 1, with both prompt_logprobs and top_logprobs.
  std::vector<std::vector<TopLogprob>> prompt_top_logprobs;
  FinishReason finish = FinishReason::length;
};

// The n most probable entries of logits under `stats` (softmax_stats of the same logits), in
// (logp descending, token id ascending) order, into `out` (resized to min(n, V)). One pass over
// the logits with a heap of n entries: no per-vocabulary allocation. logp values are exactly
// stats.logprob(logit), i.e. token_logprob's.
void top_logprobs(std::span<const float> logits, const SoftmaxStats& stats, int32_t n,
                  std::vector<TopLogprob>& out);

// What the streaming callback gets for every sampled token.
struct TokenEvent {
  int64_t id = 0;
  int32_t token = 0;
  double logprob = 0;
  std::span<const TopLogprob> top;  // the request's top_logprobs entries; valid during the call
  bool finished = false;            // this token ended the sequence ...
  FinishReason finish = FinishReason::length;  // ... for this reason (meaningful when finished)
};

// Speculative decoding (Engine::set_drafter; speculative.h).
struct SpeculationOptions {
  int draft_tokens = 4;  // γ: drafts per round at most (and at the start)
  // γ per sequence from its last round (Hugging Face's heuristic): +2 after a round that
  // accepted every draft, −1 otherwise, within 1 .. draft_tokens. Off: always draft_tokens.
  bool adaptive = false;
};
struct SpeculationStats {
  int64_t rounds = 0;    // verifications (a decode row with at least one draft)
  int64_t drafted = 0;   // draft tokens verified
  int64_t accepted = 0;  // of them accepted
  int64_t emitted = 0;   // tokens the rounds emitted (accepted + one each, fewer at a stop)
  int64_t proposed = 0;  // draft tokens the drafter proposed (verified or not)
  double draft_seconds = 0;  // time inside the drafter (part of the steps' time)
  // Per draft position i: rounds that verified draft i (every earlier one accepted), and those
  // that accepted it; their ratio estimates α at position i. alpha_at[i]: the sum over those
  // rounds of α = Σ min(p, q) computed from the target's and the drafter's distributions — the
  // acceptance theory predicts accepted_at[i] ≈ alpha_at[i].
  std::vector<int64_t> verified_at, accepted_at;
  std::vector<double> alpha_at;
  // The kernel-contract link (docs/contracts.md): a model drafter's logits z_q and the target's
  // z_p at a position, osc = (max − min of z_q − z_p) / T, give TV(p, q) <= tanh(osc/4), so
  // α >= 1 − tanh(osc/4). Checked at every verified position of an untruncated request
  // (T > 0, no top-k / top-p / min-p); a violation would be a bug.
  int64_t contract_checked = 0;
  int64_t contract_violations = 0;
  double contract_min_slack = 1.0;  // min of α − (1 − tanh(osc/4)) over the checked positions
};

// Throughput counters. A step that processes prompt tokens counts as prefill time; a step with
// decode rows only counts as decode time (mixed steps count their decode rows as prefill time).
struct EngineStats {
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0;
  int64_t decode_tokens = 0;     // tokens emitted by decode-only steps (with speculation, several
                                 // per row)
  double decode_seconds = 0;
  int64_t generated_tokens = 0;  // tokens sampled (each ends a prefill or a decode step's row)
  int64_t prefix_reused_tokens = 0;  // prompt tokens resumed from the prefix cache (not prefilled)
  int64_t steps = 0;
  // A depth-recurrent model: core iterations summed over the last token of every input of every
  // step, and those tokens (with adaptive exit every token is one; their mean is iterations per
  // token).
  int64_t core_iterations = 0;
  int64_t iterated_tokens = 0;
  // The activation arena: planned, its size (the largest plan run so far) and the plans made
  // (one per new step shape); bump, the workspace's live high-water mark.
  int64_t activation_arena_bytes = 0;
  int64_t activation_plans = 0;
  SpeculationStats speculation;
};

// Whether a policy quantizes every forward activation row by row (any prefill chunking then
// computes the same bits; NVFP4 and per-tensor FP8 share a scale across a GEMM's rows).
bool rows_quantize_alone(const model::PrecisionPolicy& policy);

class Engine {
 public:
  // The model must outlive the engine. Weights are quantized once, on first use (Model caches
  // them until weights_changed()).
  explicit Engine(model::Model& model, EngineOptions options = {});
  ~Engine();

  // Queues a request (validated here: InputError for an empty or out-of-vocabulary prompt, a
  // prompt that does not fit max_context, bad sampling parameters, top_logprobs outside
  // 0..kMaxTopLogprobs); returns its id. A request with nothing to compute (max_tokens = 0 and
  // no prompt log-probs to score) is finished at once.
  int64_t submit(Request request);
  // One forward pass over the running sequences (admitting waiting ones first), then sampling.
  // Returns false when there was nothing to run.
  bool step();
  // step() until every submitted request has finished.
  void run();
  bool finished(int64_t id) const;
  // The completion of a finished request (removed from the engine); InputError otherwise.
  Completion take(int64_t id);
  // Submits the requests, runs them to completion, returns their completions in order.
  std::vector<Completion> generate(std::vector<Request> requests);
  // Ends a waiting or running request now: it leaves the queue, or its KV-cache slot is freed
  // (reused from the next step on); its completion (the tokens so far, finish = cancelled) is
  // available to take(). False for an id that is unknown, finished or taken. May be called from
  // the token callback (for the event's own request too: the event's token is then the last of
  // the completion).
  bool cancel(int64_t id);
  int64_t waiting() const;  // requests queued for a slot
  int64_t running() const;  // sequences holding a slot

  // Called for every sampled token as it is sampled (streaming), on the thread that runs
  // step(), in each sequence's token order; `finished` is set on a sequence's last event, whose
  // completion is then already available to take(). Requests that end without sampling a token
  // (max_tokens = 0, cancel()) get no event: see finished(). The callback may call submit(),
  // cancel() and take(); it must not call step() or throw.
  using TokenCallback = std::function<void(const TokenEvent&)>;
  void set_token_callback(TokenCallback callback) { on_token_ = std::move(callback); }

  // Speculative decoding from now on: each decode row feeds the sequence's pending token and the
  // drafter's proposals (capped by max_tokens and the context), verified by speculative.h's
  // rule against the target's processed distributions with the request's seed; the KV cache
  // drops the rejected drafts. A request's tokens then depend on its seed, the drafter and
  // the draft lengths — not on the batch or thread count — and follow the target's
  // distribution; greedy requests emit the non-speculative tokens exactly. Log-probabilities
  // stay the target's. nullptr: off.
  void set_drafter(std::shared_ptr<Drafter> drafter, SpeculationOptions options = {});
  // A prefix snapshot cache (prefix_cache.h) from now on: an admitted request that does not
  // score its prompt resumes from the longest stored prefix of its prompt, and every prefill
  // that completes stores its prompt's blocks. Results are unchanged bit for bit. Under NVFP4
  // or per-tensor FP8 activations a row's keys depend on every row of its prefill chunk (their
  // shared scale), so blocks must be whole chunks and a prefix resumes only at a chunk start,
  // where a full prefill's chunk would start too. The cache
  // must hold this engine's model's rows (its fingerprint) and be cleared when the weights
  // change. nullptr: off.
  // InputError when the policy shares an activation scale across a chunk's rows and the cache's
  // block is not a multiple of prefill_chunk.
  void set_prefix_cache(std::shared_ptr<PrefixCache> cache);
  PrefixCache* prefix_cache() const { return prefix_cache_.get(); }

  const EngineStats& stats() const { return stats_; }
  const EngineOptions& options() const { return options_; }
  model::KvCache& cache() { return cache_; }

 private:
  struct Sequence;
  void admit();
  bool finish_if_done(Sequence& s, int32_t token, int64_t cached);
  void record_prompt_logprobs(Sequence& s, std::span<const float> logits, int64_t first_row,
                              int64_t rows);
  void finish(Sequence& s, FinishReason reason);
  struct Draw;
  int64_t emit_speculative(Sequence& s, std::span<const float> block, const Draw& d);
  // One cached forward over `inputs` into logits_, in the activation arena the options chose.
  void forward(std::span<const model::CachedInput> inputs);
  struct ActivationPlans;  // engine.cpp: the plans by step shape and the arena's memory
  std::unique_ptr<ActivationPlans> plans_;  // null: the bump arena

  model::Model& model_;
  EngineOptions options_;
  model::KvCache cache_;
  int64_t next_id_ = 0;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // by slot (null: free)
  std::map<int64_t, Completion> done_;
  std::vector<float> logits_;
  // One step's draw per input row (sampled token, its log-prob, its top entries); reused.
  struct Draw {
    int32_t token = 0;
    double logprob = 0;
    std::vector<TopLogprob> top;
    // A speculative row: every emitted token with its log-prob and top entries; α and the
    // contract slack (NaN: not checked) of each verified draft position.
    int accepted = 0;
    std::vector<double> alphas, slacks;
    std::vector<int32_t> tokens;
    std::vector<double> logprobs;
    std::vector<std::vector<TopLogprob>> tops;
  };
  std::vector<Draw> draws_;
  bool in_step_ = false;
  // Sequences finished or cancelled during the current step's sampling loop, kept alive until
  // the loop is over (it holds pointers to them).
  std::vector<std::unique_ptr<Sequence>> retired_;
  TokenCallback on_token_;
  EngineStats stats_;
  std::shared_ptr<Drafter> drafter_;
  std::shared_ptr<PrefixCache> prefix_cache_;
  SpeculationOptions speculation_;
  std::vector<DraftRequest> drafts_;
};

}  // namespace concord::serve
