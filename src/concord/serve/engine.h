// Engine: generation for many sequences on one Model — KV cache, chunked prefill, batched decode,
// sampling and log-probabilities of the sampled tokens.
//
// Each step() is ONE Model::forward_cached over every running sequence: a sequence still in its
// prompt contributes its next chunk (at most `prefill_chunk` tokens, cut at multiples of
// prefill_chunk from the prompt's start, whatever else runs), a decoding sequence its last
// sampled token. All rows share each GEMM, so a decode step streams every weight once for the
// whole batch. A sequence's chunking, logits, samples (seeded per sequence, sampling.h) and
// log-probabilities (logprob.h) depend only on that sequence: the results of a request are the
// same alone or in any batch, with any thread count (docs/engine.md states where bitwise).
//
// Requests wait in FIFO order for one of `max_sequences` KV-cache slots; a finished sequence's
// slot is reused. Generation ends at a stop token (kept as the last token), after max_tokens, or
// when the sequence fills its context (prompt + generated = max_context).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "concord/model/kv_cache.h"
#include "concord/model/model.h"
#include "concord/serve/sampling.h"

namespace concord::serve {

struct EngineOptions {
  int64_t max_sequences = 8;    // sequences decoded together (KV-cache slots)
  int64_t prefill_chunk = 512;  // prompt tokens of one sequence per forward pass
  int64_t max_context = 0;      // prompt + generated tokens per sequence; 0: max_position_embeddings
};

struct Request {
  std::vector<int32_t> prompt;       // at least one token
  SamplingParams sampling;
  int64_t max_tokens = 256;          // tokens to generate at most (0: none)
  std::vector<int32_t> stop_tokens;  // e.g. the model's eos ids
  bool full_logprobs = false;        // also return logp of every vocabulary entry per step
};

enum class FinishReason { stop, length, context };
const char* finish_reason_name(FinishReason r);

struct Completion {
  std::vector<int32_t> tokens;    // generated tokens (a stop token included)
  std::vector<double> logprobs;   // logp of each generated token (logprob.h)
  std::vector<std::vector<float>> full_logprobs;  // per generated token, (V), when asked for
  FinishReason finish = FinishReason::length;
};

// Throughput counters. A step that processes prompt tokens counts as prefill time; a step with
// decode rows only counts as decode time (mixed steps count their decode rows as prefill time).
struct EngineStats {
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0;
  int64_t decode_tokens = 0;     // rows of decode-only steps
  double decode_seconds = 0;
  int64_t generated_tokens = 0;  // tokens sampled (each ends a prefill or a decode step's row)
  int64_t steps = 0;
};

class Engine {
 public:
  // The model must outlive the engine. Weights are quantized once, on first use (Model caches
  // them until weights_changed()).
  explicit Engine(model::Model& model, EngineOptions options = {});
  ~Engine();

  // Queues a request (validated here: InputError for an empty or out-of-vocabulary prompt, a
  // prompt that does not fit max_context, bad sampling parameters); returns its id.
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

  // Called for every sampled token as it is sampled (streaming).
  using TokenCallback = std::function<void(int64_t id, int32_t token)>;
  void set_token_callback(TokenCallback callback) { on_token_ = std::move(callback); }

  const EngineStats& stats() const { return stats_; }
  const EngineOptions& options() const { return options_; }
  model::KvCache& cache() { return cache_; }

 private:
  struct Sequence;
  void admit();
  bool finish_if_done(Sequence& s, int32_t token);

  model::Model& model_;
  EngineOptions options_;
  model::KvCache cache_;
  int64_t next_id_ = 0;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // by slot (null: free)
  std::map<int64_t, Completion> done_;
  std::vector<float> logits_;
  TokenCallback on_token_;
  EngineStats stats_;
};

}  // namespace concord::serve
