// Compared rows from two kernels (teacher-forced, batched cached forwards), two logit dumps, or a
// kernel and a dump: completion of prompts with the engine, then one row_divergence per position.
#include "concord/audit/measure.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <utility>

#include "concord/model/kv_cache.h"
#include "concord/numerics/check.h"
#include "concord/serve/engine.h"

namespace concord::audit {
namespace {

void check_batch(int64_t batch) {
  if (batch < 1) throw InputError(fmt::format("[audit] batch must be >= 1, got {}", batch));
}

// Logits of every position of each sequence in `tokens` (each at least one token), in one
// Model::forward_cached: rows of sequence 0 first, then sequence 1, ... `cache` has at least
// tokens.size() free slots; they are released again before returning (also on an error).
void forward_all_positions(model::Model& model, model::KvCache& cache,
                           std::span<const std::span<const int32_t>> tokens,
                           std::vector<float>& logits) {
  logits.clear();
  if (tokens.empty()) return;
  std::vector<model::CachedInput> inputs;
  struct Slots {
    model::KvCache& cache;
    std::vector<int> ids;
    ~Slots() {
      for (int s : ids) cache.release(s);
    }
  } slots{cache, {}};
  for (std::span<const int32_t> t : tokens) {
    slots.ids.push_back(cache.allocate());
    inputs.push_back({.slot = slots.ids.back(), .tokens = t, .logits = model::LogitRows::all});
  }
  const int64_t V = model.config().vocab_size;
  logits.resize(static_cast<size_t>(model::logit_rows(inputs) * V));
  model.forward_cached(cache, inputs, logits);
}

// Rows of a sequence: one per position but the last, whose token is only ever a `next`. So a
// sequence of n tokens feeds its first n - 1 to the model (and one of 1 token feeds nothing).
int64_t scored_positions(const EvalSequence& s) {
  return std::max<int64_t>(static_cast<int64_t>(s.tokens.size()) - 1, 0);
}

// The most positions a sequence feeds, for the cache's capacity; InputError for an empty
// sequence or one longer than the model's context.
int64_t longest_sequence(const model::Model& model, std::span<const EvalSequence> sequences) {
  int64_t longest = 1;
  for (size_t i = 0; i < sequences.size(); ++i) {
    if (sequences[i].tokens.empty())
      throw InputError(fmt::format("[audit] sequence {} has no tokens", i));
    const int64_t n = scored_positions(sequences[i]);
    if (n > model.config().max_position_embeddings)
      throw InputError(fmt::format(
          "[audit] sequence {} has {} tokens, more than the model's context of {} + 1 (shorten "
          "the prompt or --max-new)",
          i, sequences[i].tokens.size(), model.config().max_position_embeddings));
    longest = std::max(longest, n);
  }
  return longest;
}

RowInfo row_info(const EvalSequence& s, int64_t sequence, int32_t position) {
  RowInfo info;
  info.sequence = sequence;
  info.position = position;
  info.prompt_length = s.prompt_length;
  info.token = s.tokens[static_cast<size_t>(position)];
  info.next = s.tokens[static_cast<size_t>(position) + 1];
  info.task = s.task;
  info.label = s.label;
  return info;
}

// Runs `fn(first, count)` over [0, n) in batches of `batch`.
template <class Fn>
void for_each_batch(int64_t n, int64_t batch, Fn&& fn) {
  for (int64_t first = 0; first < n; first += batch) fn(first, std::min(batch, n - first));
}

// The inputs of sequences [first, first + count): each one's tokens but its last (none for a
// sequence of one token, which has no rows).
std::vector<std::span<const int32_t>> token_spans(std::span<const EvalSequence> sequences,
                                                  int64_t first, int64_t count) {
  std::vector<std::span<const int32_t>> spans;
  for (int64_t i = first; i < first + count; ++i) {
    const EvalSequence& s = sequences[static_cast<size_t>(i)];
    if (scored_positions(s) > 0)
      spans.push_back(
          std::span<const int32_t>(s.tokens).first(static_cast<size_t>(scored_positions(s))));
  }
  return spans;
}

// The fields of a row both dumps agree on, merged: identity from the reference, labels from
// whichever side has them.
RowInfo merged_info(const RowInfo& ref, const RowInfo& cand) {
  RowInfo info = ref;
  if (info.prompt_length == 0) info.prompt_length = cand.prompt_length;
  if (info.next < 0) info.next = cand.next;
  if (info.task.empty()) info.task = cand.task;
  if (info.label.empty()) info.label = cand.label;
  return info;
}

}  // namespace

std::vector<EvalSequence> complete(model::Model& model, std::vector<EvalSequence> prompts,
                                   const CompletionOptions& options) {
  check_batch(options.batch);
  if (options.max_new_tokens < 0)
    throw InputError(
        fmt::format("[audit] max_new_tokens must be >= 0, got {}", options.max_new_tokens));
  if (prompts.empty() || options.max_new_tokens == 0) {
    for (EvalSequence& p : prompts) p.prompt_length = static_cast<int32_t>(p.tokens.size());
    return prompts;
  }
  serve::Engine engine(model, {.max_sequences = options.batch});
  std::vector<serve::Request> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].tokens.empty())
      throw InputError(fmt::format("[audit] prompt {} has no tokens", i));
    serve::Request r;
    r.prompt = prompts[i].tokens;
    r.sampling = options.sampling;
    r.max_tokens = options.max_new_tokens;
    r.stop_tokens = options.stop_tokens;
    requests.push_back(std::move(r));
  }
  std::vector<serve::Completion> done = engine.generate(std::move(requests));
  for (size_t i = 0; i < prompts.size(); ++i) {
    EvalSequence& s = prompts[i];
    s.prompt_length = static_cast<int32_t>(s.tokens.size());
    s.tokens.insert(s.tokens.end(), done[i].tokens.begin(), done[i].tokens.end());
  }
  return prompts;
}

void teacher_forced_logits(model::Model& model, std::span<const EvalSequence> sequences,
                           int64_t batch, const RowSink& sink) {
  check_batch(batch);
  if (sequences.empty()) return;
  const int64_t V = model.config().vocab_size;
  model::KvCache cache(model.config(), batch, longest_sequence(model, sequences));
  std::vector<float> logits;
  for_each_batch(static_cast<int64_t>(sequences.size()), batch, [&](int64_t first, int64_t count) {
    const auto spans = token_spans(sequences, first, count);
    forward_all_positions(model, cache, spans, logits);
    int64_t row = 0;
    for (int64_t i = first; i < first + count; ++i) {
      const EvalSequence& s = sequences[static_cast<size_t>(i)];
      const auto n = static_cast<int32_t>(s.tokens.size());
      for (int32_t p = 0; p + 1 < n; ++p) {
        sink(row_info(s, i, p), std::span<const float>(logits).subspan(
                                    static_cast<size_t>((row + p) * V), static_cast<size_t>(V)));
      }
      row += std::max(n - 1, 0);
    }
  });
}

std::vector<RowRecord> compare_models(model::Model& ref, model::Model& cand,
                                      std::span<const EvalSequence> sequences, int64_t batch,
                                      const Progress& progress) {
  check_batch(batch);
  if (ref.config().vocab_size != cand.config().vocab_size)
    throw InputError(fmt::format("[audit] the models' vocabularies differ ({} vs {})",
                                 ref.config().vocab_size, cand.config().vocab_size));
  const bool recurrent = ref.config().recurrent();
  if (recurrent != cand.config().recurrent() || (recurrent && ref.depth() != cand.depth()))
    throw InputError(fmt::format("[audit] the models must run at the same depth (reference {}, candidate {})",
                                 recurrent ? ref.depth() : 0, cand.config().recurrent() ? cand.depth() : 0));
  std::vector<RowRecord> records;
  if (sequences.empty()) return records;
  const int64_t V = ref.config().vocab_size;
  const int64_t longest =
      std::max(longest_sequence(ref, sequences), longest_sequence(cand, sequences));
  model::KvCache ref_cache(ref.config(), batch, longest), cand_cache(cand.config(), batch, longest);
  std::vector<float> ref_logits, cand_logits;
  const auto total = static_cast<int64_t>(sequences.size());
  for_each_batch(total, batch, [&](int64_t first, int64_t count) {
    const auto spans = token_spans(sequences, first, count);
    forward_all_positions(ref, ref_cache, spans, ref_logits);
    forward_all_positions(cand, cand_cache, spans, cand_logits);
    int64_t row = 0;
    for (int64_t i = first; i < first + count; ++i) {
      const EvalSequence& s = sequences[static_cast<size_t>(i)];
      const auto n = static_cast<int32_t>(s.tokens.size());
      for (int32_t p = 0; p + 1 < n; ++p) {
        const auto offset = static_cast<size_t>((row + p) * V);
        RowRecord r;
        r.info = row_info(s, i, p);
        if (recurrent) r.info.depth = static_cast<int32_t>(ref.depth());
        r.div = row_divergence(
            std::span<const float>(ref_logits).subspan(offset, static_cast<size_t>(V)),
            std::span<const float>(cand_logits).subspan(offset, static_cast<size_t>(V)),
            r.info.next);
        records.push_back(std::move(r));
      }
      row += std::max(n - 1, 0);
    }
    if (progress) progress(first + count, total);
  });
  return records;
}

std::vector<RowRecord> compare_dumps(const LogitDump& ref, const LogitDump& cand) {
  if (ref.vocab() != cand.vocab())
    throw InputError(fmt::format("[audit] {} and {}: vocabularies differ ({} vs {})", ref.path(),
                                 cand.path(), ref.vocab(), cand.vocab()));
  if (ref.rows() != cand.rows())
    throw InputError(fmt::format("[audit] {} and {}: row counts differ ({} vs {})", ref.path(),
                                 cand.path(), ref.rows(), cand.rows()));
  std::vector<RowRecord> records;
  records.reserve(static_cast<size_t>(ref.rows()));
  const auto V = static_cast<size_t>(ref.vocab());
  // fp64 dumps are compared in fp64; every other dtype converts to float exactly.
  const bool wide = ref.is_f64() || cand.is_f64();
  std::vector<double> ref_d(wide ? V : 0), cand_d(wide ? V : 0);
  std::vector<float> ref_f(wide ? 0 : V), cand_f(wide ? 0 : V);
  for (int64_t i = 0; i < ref.rows(); ++i) {
    const RowInfo& a = ref.info(i);
    const RowInfo& b = cand.info(i);
    const bool next_differs = a.next >= 0 && b.next >= 0 && a.next != b.next;
    if (a.sequence != b.sequence || a.position != b.position || a.token != b.token || next_differs)
      throw InputError(fmt::format(
          "[audit] {} and {}: row {} is (sequence {}, position {}, token {}, next {}) in one and "
          "(sequence {}, position {}, token {}, next {}) in the other (dumps must hold the same "
          "rows in the same order)",
          ref.path(), cand.path(), i, a.sequence, a.position, a.token, a.next, b.sequence,
          b.position, b.token, b.next));
    RowRecord r;
    r.info = merged_info(a, b);
    if (wide) {
      ref.row(i, ref_d);
      cand.row(i, cand_d);
      r.div = row_divergence(std::span<const double>(ref_d), std::span<const double>(cand_d),
                             r.info.next);
    } else {
      ref.row(i, ref_f);
      cand.row(i, cand_f);
      r.div = row_divergence(std::span<const float>(ref_f), std::span<const float>(cand_f),
                             r.info.next);
    }
    records.push_back(std::move(r));
  }
  return records;
}

std::vector<RowRecord> compare_model_dump(model::Model& model, const LogitDump& dump,
                                          bool model_is_ref, int64_t batch,
                                          const Progress& progress) {
  check_batch(batch);
  const int64_t V = model.config().vocab_size;
  if (dump.vocab() != V)
    throw InputError(fmt::format("[audit] {}: vocabulary of {} entries, the model has {}",
                                 dump.path(), dump.vocab(), V));
  // The dump's sequences: rows by sequence id, then by position, which must run 0..n-1.
  std::map<int64_t, std::vector<int64_t>> rows_of;
  for (int64_t i = 0; i < dump.rows(); ++i) rows_of[dump.info(i).sequence].push_back(i);
  struct DumpSequence {
    std::vector<int32_t> tokens;
    std::vector<int64_t> rows;  // dump row of each position
  };
  std::vector<DumpSequence> sequences;
  for (auto& [id, rows] : rows_of) {
    DumpSequence s;
    s.rows.assign(rows.size(), -1);
    s.tokens.assign(rows.size(), -1);
    for (int64_t r : rows) {
      const RowInfo& info = dump.info(r);
      if (info.position < 0 || info.position >= static_cast<int32_t>(rows.size()) ||
          s.rows[static_cast<size_t>(info.position)] >= 0)
        throw InputError(fmt::format(
            "[audit] {}: sequence {} has {} rows but a row at position {} (a dump compared with a "
            "kernel needs one row per position 0..n-1 of each sequence)",
            dump.path(), id, rows.size(), info.position));
      if (info.token < 0 || info.token >= V)
        throw InputError(fmt::format(
            "[audit] {}: row {} has token {} (a dump compared with a kernel needs every row's "
            "input token id in [0, {}))",
            dump.path(), r, info.token, V));
      s.rows[static_cast<size_t>(info.position)] = r;
      s.tokens[static_cast<size_t>(info.position)] = info.token;
    }
    sequences.push_back(std::move(s));
  }

  std::vector<RowRecord> records(static_cast<size_t>(dump.rows()));
  if (sequences.empty()) return records;
  int64_t longest = 1;
  for (const DumpSequence& s : sequences)
    longest = std::max(longest, static_cast<int64_t>(s.tokens.size()));
  if (longest > model.config().max_position_embeddings)
    throw InputError(
        fmt::format("[audit] {}: a sequence of {} positions is longer than the "
                    "model's context of {}",
                    dump.path(), longest, model.config().max_position_embeddings));
  model::KvCache cache(model.config(), batch, longest);
  std::vector<float> logits, dump_row(static_cast<size_t>(V));
  std::vector<double> model_row_d, dump_row_d(static_cast<size_t>(V));
  const auto total = static_cast<int64_t>(sequences.size());
  for_each_batch(total, batch, [&](int64_t first, int64_t count) {
    std::vector<std::span<const int32_t>> spans;
    for (int64_t i = first; i < first + count; ++i)
      spans.emplace_back(sequences[static_cast<size_t>(i)].tokens);
    forward_all_positions(model, cache, spans, logits);
    int64_t row = 0;
    for (int64_t i = first; i < first + count; ++i) {
      const DumpSequence& s = sequences[static_cast<size_t>(i)];
      const auto n = static_cast<int64_t>(s.tokens.size());
      for (int64_t p = 0; p < n; ++p) {
        const int64_t r = s.rows[static_cast<size_t>(p)];
        RowRecord& rec = records[static_cast<size_t>(r)];
        rec.info = dump.info(r);
        if (rec.info.next < 0 && p + 1 < n) rec.info.next = s.tokens[static_cast<size_t>(p) + 1];
        const auto model_row = std::span<const float>(logits).subspan(
            static_cast<size_t>((row + p) * V), static_cast<size_t>(V));
        if (dump.is_f64()) {
          // An fp64 dump is compared in fp64 (the model's floats widen exactly).
          model_row_d.assign(model_row.begin(), model_row.end());
          dump.row(r, std::span<double>(dump_row_d));
          const std::span<const double> m(model_row_d), d(dump_row_d);
          rec.div = model_is_ref ? row_divergence(m, d, rec.info.next)
                                 : row_divergence(d, m, rec.info.next);
        } else {
          dump.row(r, std::span<float>(dump_row));
          const std::span<const float> dumped(dump_row);
          rec.div = model_is_ref ? row_divergence(model_row, dumped, rec.info.next)
                                 : row_divergence(dumped, model_row, rec.info.next);
        }
      }
      row += n;
    }
    if (progress) progress(first + count, total);
  });
  return records;
}

}  // namespace concord::audit
