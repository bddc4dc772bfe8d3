// Producing compared rows: run two kernel variants (kernels.h) over the same token sequences,
// teacher-forced, or read two logit dumps (dump.h), and compute each row's divergence.
//
// Sequences come from prompts: each is completed by the reference kernel (greedy by default,
// serve::Engine), and then both kernels score prompt + completion with Model::forward_cached,
// `batch` sequences per pass (so batch-dependent kernels see real batches). Every position of a
// sequence but the last gives a row (the next-token distribution after tokens 0..position).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "concord/audit/contract.h"
#include "concord/audit/dump.h"
#include "concord/audit/kernels.h"
#include "concord/model/model.h"
#include "concord/serve/sampling.h"

namespace concord::audit {

struct EvalSequence {
  std::vector<int32_t> tokens;  // prompt, then completion
  int32_t prompt_length = 0;
  std::string task, label;
};

struct CompletionOptions {
  int64_t max_new_tokens = 32;
  serve::SamplingParams sampling = greedy();  // greedy by default
  static serve::SamplingParams greedy() {
    serve::SamplingParams p;
    p.temperature = 0.0f;
    return p;
  }
  std::vector<int32_t> stop_tokens;  // e.g. the model's eos ids
  int64_t batch = 8;                 // sequences per engine batch
};

// Completes each prompt (tokens = prompt; prompt_length set) with `model` as it is configured.
std::vector<EvalSequence> complete(model::Model& model, std::vector<EvalSequence> prompts,
                                   const CompletionOptions& options);

using RowSink = std::function<void(const RowInfo& info, std::span<const float> logits)>;
// Teacher-forced logits of every row of every sequence, `batch` sequences per forward_cached,
// handed to sink in sequence order, then position order.
void teacher_forced_logits(model::Model& model, std::span<const EvalSequence> sequences,
                           int64_t batch, const RowSink& sink);

using Progress = std::function<void(int64_t done, int64_t total)>;
// ref and cand are two models with the same weights, each with its kernel applied. Depth-recurrent
// models must run at the same depth; their rows carry it (the depth:R slice).
std::vector<RowRecord> compare_models(model::Model& ref, model::Model& cand,
                                      std::span<const EvalSequence> sequences, int64_t batch,
                                      const Progress& progress = {});
// Rows matched by index; InputError naming the files when their vocabularies, row counts or
// row identities (sequence, position, token) differ.
std::vector<RowRecord> compare_dumps(const LogitDump& ref, const LogitDump& cand);
// A model against a dump: the dump's rows define the sequences (their `token` fields, which
// must be present and cover positions 0..n-1 of each sequence); ref_is_model picks the side.
// An fp64 dump is compared in fp64. progress(done, total) counts sequences, once per batch.
std::vector<RowRecord> compare_model_dump(model::Model& model, const LogitDump& dump,
                                          bool model_is_ref, int64_t batch,
                                          const Progress& progress = {});

}  // namespace concord::audit
