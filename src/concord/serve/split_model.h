// Disaggregated prefill and decode, planned (issue 25; docs/serve.md "Planning the split"): when
// does `concord serve --disaggregate` pay, before running it?
//
// A prompt of L tokens arrives while S requests are decoding. Without the prefill worker the
// engine runs the prompt in chunks of at most `chunk` tokens, each in one step with the S decode
// rows: every chunk is a gap in the streams, and the prompt's first token comes with its last
// chunk. With the worker, a second engine prefills the prompt beside the engine's decode steps —
// on the same cores each slows the other (`prefill_slowdown`, `decode_slowdown`; 1 where the
// worker has cores of its own: another machine's MPI rank, a GPU) — exports the prompt's KV rows,
// and the engine imports them between two steps and samples the first token in its next step.
//
// The cost of each piece, measured alone on this machine (measure()):
//   a prefill chunk of n tokens at positions p .. p+n-1:  n · token_s + pair_s · Σ_i (p + i)
//     (the per-token GEMMs, and attention over the rows before each token);
//   a decode step of b rows:                              step_s + b · row_s;
//   a mixed step (a chunk and b decode rows):             the chunk's seconds + b · row_s;
//   the hand-over:  bytes = L · bytes_per_token (the KV rows: 2 · layers · kv_heads · head_dim ·
//                   4), exported at export_s per byte, imported at import_s per byte, and copied
//                   into the sequence's slot at resume_s per byte in the step that samples the
//                   prompt's first token (a one-row step attending to the L - 1 rows);
//   both busy on shared cores: the worker's prefill takes prefill_slowdown times as long, and a
//                   decode step decode_slowdown times.
// predict() turns them into what a user sees: the prompt's time to first token, the largest gap
// between a running stream's tokens, the tokens each stream emits meanwhile, and the delay each
// stream suffers; `pays` weighs the streams' saved delay against the prompt's added wait
// (request-seconds). bench/disaggregate_bench.py checks the predictions against two real servers.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "concord/model/model.h"
#include "concord/serve/engine.h"

namespace concord::serve::splitmodel {

struct Rates {
  double token_s = 0, pair_s = 0;  // prefill: seconds per token, per (token, earlier row) pair
  double step_s = 0, row_s = 0;    // decode: seconds per step, per row
  double bytes_per_token = 0;      // hand-over bytes per prompt token
  double export_s = 0, import_s = 0;  // hand-over: seconds per byte
  double resume_s = 0;  // the engine copying the handed-over rows into a sequence's slot, per byte
  double prefill_slowdown = 1, decode_slowdown = 1;  // both busy on shared cores (1: separate cores)
};

// One chunk of a prompt as the engine runs it.
struct Chunk {
  int64_t start = 0, tokens = 0;
};
// The chunks of a prompt of `prompt_tokens` tokens: cut at multiples of `chunk` from its start
// (the engine's rule), the last prompt token included.
std::vector<Chunk> chunks_of(int64_t prompt_tokens, int64_t chunk);
double prefill_seconds(const Rates& r, const Chunk& c);
double decode_seconds(const Rates& r, int64_t rows);

struct Workload {
  int64_t prompt_tokens = 0;  // the arriving prompt (>= 2: a one-token prompt has no rows to hand over)
  int64_t streams = 0;        // requests decoding when it arrives
  int64_t chunk = 512;        // the engine's --prefill-chunk
  // Tokens each stream still generates when the prompt arrives; 0: more than the prefill takes.
  // Streams that end during the prefill leave the machine to it from then on.
  int64_t stream_tokens = 0;
  // Seconds a serving step costs beyond the engine's forward (the server's loop, the streamed
  // responses, the clients on the same cores): added to every step of the engine.
  double step_overhead_s = 0;
};

struct Outcome {
  double ttft_s = 0;            // the prompt's time to first token, from its arrival
  double max_gap_s = 0;         // the largest gap between a stream's tokens meanwhile (0: no streams)
  double stream_tokens = 0;     // tokens each stream emits before the prompt's first token
  // Each stream's delay: the time its tokens of that window took, less their time alone.
  double stream_delay_s = 0;
  double handover_bytes = 0;
};
Outcome engine_prefill(const Rates& r, const Workload& w);
Outcome disaggregated(const Rates& r, const Workload& w);

struct Verdict {
  Outcome engine, split;
  // streams · (engine's stream delay − split's) − (split's ttft − engine's): request-seconds of
  // waiting the split saves; it pays when positive.
  double saved_request_s = 0;
  bool pays = false;
};
Verdict predict(const Rates& r, const Workload& w);

// Least-squares fits of measured steps (InputError without enough distinct points).
struct PrefillStep {
  Chunk chunk;
  double seconds = 0;
};
struct DecodeStep {
  int64_t rows = 0;
  double seconds = 0;
};
// token_s, pair_s >= 0 from chunks at two or more distinct start positions.
void fit_prefill(std::span<const PrefillStep> steps, Rates& r);
// step_s, row_s >= 0 from steps of two or more distinct row counts.
void fit_decode(std::span<const DecodeStep> steps, Rates& r);

// Measures the rates on this machine with the engine itself: a seeded prompt of `prompt_tokens`
// random token ids prefilled alone three times in chunks of `options.prefill_chunk` (each step
// timed; each chunk's median), decode steps of 1, 2 and 4 rows, the prefill worker's engine on a
// twin of the model prefilling the prompt beside an engine decoding one stream (the slowdowns),
// and the prompt's hand-over as the server's worker and scheduler run it (the export, the import,
// the engine's step that resumes the prompt from the rows). `progress` gets a
// line per stage. Takes a few prompts' prefill time.
struct Measured {
  Rates rates;
  std::vector<PrefillStep> prefill;          // alone
  std::vector<DecodeStep> decode;            // alone
  double shared_prefill_s = 0, alone_prefill_s = 0;
  double shared_decode_step_s = 0, alone_decode_step_s = 0;
  int64_t shared_decode_steps = 0;
  double handover_bytes = 0, export_seconds = 0, import_seconds = 0, resume_step_seconds = 0;
};
Measured measure(model::Model& model, const EngineOptions& options, int64_t prompt_tokens, uint64_t seed,
                 const std::function<void(const std::string&)>& progress = {});

}  // namespace concord::serve::splitmodel
