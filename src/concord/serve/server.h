// Server: `concord serve`'s HTTP front — the OpenAI API (openai.h) on cpp-httplib, driving one
// Engine with continuous batching.
//
// Threads: HTTP worker threads read, authenticate, parse and validate a request, tokenize it
// (chat template applied), check it against the context, and hand it to the scheduler as a job
// (429 when the queue is full). ONE scheduler thread owns the Engine: it submits new jobs'
// choices (choice i with seed s + i), runs engine.step() while anything is running — requests
// join and leave the batch at every step —, turns each sampled token into text (Utf8Stream, then
// StopStrings: a completed stop string cancels the sequence at once) and hands pieces to the
// job's channel; it cancels jobs whose client went away or whose deadline passed. Streaming
// responses are written by their HTTP thread from that channel as server-sent events; a failed
// write cancels the request (its KV slot is free from the next step on).
//
// Invariance: every request is an engine sequence of its own with its own seed; the engine's
// results do not depend on the batch (docs/engine.md), and nothing here samples or keeps state
// across requests, so a request's tokens, text and log-probs are the same alone or under load.
//
// Weight updates (POST /v1/weights, server_weights.cpp): a versioned sync payload is staged and
// checked by the seven sync checks (rl/sync.h) beside the running engine, then the scheduler
// swaps it in between steps once the running requests finish (they never mix versions; each
// response reports its weights_version); a failed check leaves the old version serving (409).
//
// Shutdown: shutdown() starts draining (new requests 503, /health 503), wait() returns once every
// queued and running request has finished and its response has been written, then stops the
// HTTP server. docs/serve.md documents every limit and code.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "concord/io/tokenizer.h"
#include "concord/model/model.h"
#include "concord/serve/engine.h"
#include "concord/serve/metrics.h"

namespace concord::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                       // 0: a free port (start() returns it)
  std::string model_name = "model";      // the id /v1/models lists; `model` must match it
  std::string policy_name = "fp32";      // reported (ready line, system_fingerprint)
  EngineOptions engine;                  // max_sequences = KV slots, prefill_chunk, max_context
  int64_t max_queue = 256;               // choices waiting for a slot; past it: 429
  int64_t max_body_bytes = 1 << 20;      // larger bodies: 413
  double request_timeout_seconds = 600;  // arrival to end of generation; 0: none
  int read_timeout_seconds = 10;         // silence while a request is being sent (slowloris)
  int write_timeout_seconds = 10;        // a write blocked on a client that does not read
  double receive_timeout_seconds = 30;   // a request's headers, and then its body, must each
                                         // arrive within this (slowloris that trickles bytes)
  int64_t http_threads = 0;              // 0: max_sequences + max_queue + 64
  std::string api_key;                   // "": no authentication
  // Speculative decoding (docs/speculative.md): every request decodes with this drafter;
  // responses are unchanged in distribution (greedy: the same tokens); /metrics gains
  // concord_speculative_{drafted,accepted}_tokens_total. nullptr: off.
  std::shared_ptr<Drafter> drafter;
  SpeculationOptions speculation;
  // A drafter made from the served weights (self:PRESET, self:layers=K) is remade by this after
  // a weight update, so that it drafts from the new version; empty: `drafter` is kept.
  std::function<std::shared_ptr<Drafter>()> remake_drafter;
  // Weight updates (POST/GET /v1/weights, docs/serve.md "Weight updates"): a trainer pushes a
  // versioned sync payload (rl/sync.h) as a safetensors file, a POSIX shared-memory segment or
  // the request body; it is staged, checked by the seven sync checks and swapped in between
  // engine steps. Only loopback peers may post one unless weights_from_any_host.
  bool weights_from_any_host = false;
  int64_t max_weights_body_bytes = int64_t{1} << 30;  // a payload sent in the body; larger: 413
  bool weights_faults = false;  // honour a request's "fault" (tests: rl::Fault's sampler side)
  // The prefix snapshot cache (prefix_cache.h; docs/serve.md): bytes of KV rows kept for prompt
  // prefixes (0: off) and the block in tokens (0: 64, or prefill_chunk under NVFP4 / per-tensor
  // FP8 activations). Responses are unchanged bit for bit; a weight update empties it.
  int64_t prefix_cache_bytes = 0;
  int64_t prefix_cache_block = 0;
  std::string prefix_cache_dir;  // also keep the snapshots as files here ("": memory only)
  // Disaggregated prefill and decode (docs/serve.md): a prefill worker thread with an engine of
  // its own on a twin of the model (Model::twin) runs each new request's prompt and hands its KV
  // rows to the serving engine's prefix cache (PrefixCache::export_prompt / import_prompt), which
  // then feeds only the last prompt token; long prompts no longer stall the running requests'
  // decode steps. Responses are unchanged bit for bit. The prefix cache is on (prefix_cache_bytes,
  // or 1 GiB when that is 0). Not for depth-recurrent models; echo requests prefill as usual.
  bool disaggregate = false;
  // Expert parallelism across processes (concord serve --expert-parallel, docs/moe.md): the other
  // ranks mirror this server's engine (engine_mirror.h). Before each engine step the scheduler
  // passes `mirror` the operations since the last one (submits, cancels), and a stop message when
  // it ends; the ranks' engines then run the same steps, so the MoE layers' exchanges meet.
  // Weight updates are refused (the other ranks would keep the old weights), and so are the
  // prefix cache, disaggregation and speculative decoding (their steps are not the mirrored ones).
  std::function<void(std::vector<uint8_t>)> mirror;
};

// What a server serves: the model (must outlive the server), its tokenizer, chat template
// ("" : /v1/chat/completions answers 400) and stop token ids (eos).
struct ServedModel {
  model::Model& model;
  const io::Tokenizer& tokenizer;
  std::string chat_template;
  std::vector<int32_t> stop_token_ids;
};

class Server {
 public:
  // Validates the options (InputError naming the bad one); binds nothing yet.
  Server(ServedModel served, ServerOptions options);
  ~Server();  // shutdown() + wait() when still running
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port (InputError when it cannot), starts the scheduler and the HTTP threads;
  // returns the bound port. Requests are served from its return on.
  int start();
  // Begins draining; thread-safe, returns at once (not async-signal-safe: call it from a
  // thread, not from a signal handler).
  void shutdown();
  // Blocks until shutdown() was called and every request has finished and been written, then
  // stops the HTTP server and waits up to `connection_grace_seconds` (< 0: read timeout + 7 s)
  // for its connection threads (an idle keep-alive connection ends within the keep-alive
  // timeout). False when some did not end in time: the caller should then exit the process
  // rather than destroy the server (nothing is left to answer).
  bool wait(double connection_grace_seconds = -1);

  int port() const;
  const ServerOptions& options() const;
  Metrics& metrics();
  // The context every request must fit: prompt + max_tokens <= this.
  int64_t context() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace concord::serve
