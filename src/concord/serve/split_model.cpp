// splitmodel (split_model.h): when disaggregated prefill pays — the time model, its fits, and the
// measurements on this machine that feed it.
#include "concord/serve/split_model.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <memory>
#include <random>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "concord/numerics/check.h"
#include "concord/serve/prefix_cache.h"

namespace concord::serve::splitmodel {

std::vector<Chunk> chunks_of(int64_t prompt_tokens, int64_t chunk) {
  CONCORD_CHECK(prompt_tokens >= 1 && chunk >= 1, "chunks_of: a prompt and a chunk of at least one token");
  std::vector<Chunk> out;
  for (int64_t s = 0; s < prompt_tokens; s += chunk) out.push_back({s, std::min(chunk, prompt_tokens - s)});
  return out;
}

double prefill_seconds(const Rates& r, const Chunk& c) {
  const double n = static_cast<double>(c.tokens), p = static_cast<double>(c.start);
  return n * r.token_s + r.pair_s * (n * p + n * (n - 1) / 2);
}

double decode_seconds(const Rates& r, int64_t rows) { return r.step_s + static_cast<double>(rows) * r.row_s; }

namespace {

void check_workload(const Workload& w) {
  if (w.prompt_tokens < 2)
    throw InputError(fmt::format("[split model] a prompt of {} tokens has no rows to hand over (2 or more)", w.prompt_tokens));
  if (w.streams < 0) throw InputError(fmt::format("[split model] {} streams", w.streams));
  if (w.chunk < 1) throw InputError(fmt::format("[split model] a prefill chunk of {} tokens", w.chunk));
  if (!(w.step_overhead_s >= 0)) throw InputError("[split model] a step overhead must be >= 0 seconds");
}

}  // namespace

Outcome engine_prefill(const Rates& r, const Workload& w) {
  check_workload(w);
  Outcome o;
  // Each chunk is one step with the streams' decode rows (while they last); the last samples the
  // first token.
  const std::vector<Chunk> chunks = chunks_of(w.prompt_tokens, w.chunk);
  const auto n = static_cast<int64_t>(chunks.size());
  const int64_t with_streams = w.streams == 0 ? 0 : w.stream_tokens > 0 ? std::min(w.stream_tokens, n) : n;
  double streams_time = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool rows = i < with_streams;
    const double step = prefill_seconds(r, chunks[static_cast<size_t>(i)]) + (rows ? static_cast<double>(w.streams) * r.row_s : 0.0) +
                        w.step_overhead_s;
    o.ttft_s += step;
    if (rows) {
      o.max_gap_s = std::max(o.max_gap_s, step);
      streams_time += step;
    }
  }
  o.stream_tokens = static_cast<double>(with_streams);
  if (with_streams > 0) o.stream_delay_s = streams_time - o.stream_tokens * (decode_seconds(r, w.streams) + w.step_overhead_s);
  return o;
}

Outcome disaggregated(const Rates& r, const Workload& w) {
  check_workload(w);
  Outcome o;
  double prefill = 0;  // alone
  for (const Chunk& c : chunks_of(w.prompt_tokens, w.chunk)) prefill += prefill_seconds(r, c);
  // The worker hands over every row but the last prompt token's (the engine feeds that one in the
  // step that samples the first token, attending to the L - 1 rows before it, after it copied them
  // into the sequence's slot).
  o.handover_bytes = r.bytes_per_token * static_cast<double>(w.prompt_tokens);
  const double exported = r.export_s * o.handover_bytes, import = r.import_s * o.handover_bytes;
  // The step that samples the first token also copies the rows into the sequence's KV slot.
  const double first_extra = r.pair_s * static_cast<double>(w.prompt_tokens - 1) + r.resume_s * o.handover_bytes;
  if (w.streams == 0) {  // the worker has the machine alone
    o.ttft_s = prefill + exported + import + decode_seconds(r, 1) + first_extra + w.step_overhead_s;
    return o;
  }
  // The streams decode beside the worker, each step slowed, until they end (if they do before the
  // prefill): from then on the worker's prefill runs at its own speed.
  const double alone = decode_seconds(r, w.streams) + w.step_overhead_s;
  const double step = r.decode_slowdown * decode_seconds(r, w.streams) + w.step_overhead_s;
  const double shared_prefill = r.prefill_slowdown * prefill;
  const double streams_end = w.stream_tokens > 0 ? static_cast<double>(w.stream_tokens) * step : shared_prefill + 1;
  if (streams_end >= shared_prefill + exported) {
    const double window = shared_prefill + exported;
    const double first = decode_seconds(r, w.streams + 1) + first_extra + w.step_overhead_s;
    o.ttft_s = window + import + first;
    o.stream_tokens = std::min(window / step + 1, w.stream_tokens > 0 ? static_cast<double>(w.stream_tokens) : 1e300);
    o.max_gap_s = std::max(step, import + first);
    o.stream_delay_s = o.ttft_s - o.stream_tokens * alone;
  } else {
    const double shared = std::min(streams_end, shared_prefill);
    const double window = shared + (prefill - shared / r.prefill_slowdown) + exported;
    o.ttft_s = window + import + decode_seconds(r, 1) + first_extra + w.step_overhead_s;
    o.stream_tokens = static_cast<double>(w.stream_tokens);
    o.max_gap_s = step;
    o.stream_delay_s = o.stream_tokens * (step - alone);
  }
  return o;
}

Verdict predict(const Rates& r, const Workload& w) {
  Verdict v;
  v.engine = engine_prefill(r, w);
  v.split = disaggregated(r, w);
  v.saved_request_s = static_cast<double>(w.streams) * (v.engine.stream_delay_s - v.split.stream_delay_s) -
                      (v.split.ttft_s - v.engine.ttft_s);
  v.pays = v.saved_request_s > 0;
  return v;
}

namespace {

// min over a, b >= 0 of Σ (y - a·x1 - b·x2)²: the unconstrained solution when both are >= 0,
// else the better of the two one-variable fits.
std::pair<double, double> nonnegative_fit(std::span<const std::array<double, 3>> rows, const char* what) {
  double s11 = 0, s12 = 0, s22 = 0, s1y = 0, s2y = 0;
  for (const auto& [x1, x2, y] : rows) {
    s11 += x1 * x1;
    s12 += x1 * x2;
    s22 += x2 * x2;
    s1y += x1 * y;
    s2y += x2 * y;
  }
  const double det = s11 * s22 - s12 * s12;
  if (!(det > 1e-9 * s11 * s22))
    throw InputError(fmt::format("[split model] the {} measurements do not separate the two costs", what));
  double a = (s1y * s22 - s2y * s12) / det, b = (s2y * s11 - s1y * s12) / det;
  if (a >= 0 && b >= 0) return {a, b};
  auto sse = [&](double ca, double cb) {
    double e = 0;
    for (const auto& [x1, x2, y] : rows) e += (y - ca * x1 - cb * x2) * (y - ca * x1 - cb * x2);
    return e;
  };
  const double only_a = std::max(0.0, s1y / s11), only_b = std::max(0.0, s2y / s22);
  return sse(only_a, 0) <= sse(0, only_b) ? std::pair{only_a, 0.0} : std::pair{0.0, only_b};
}

}  // namespace

void fit_prefill(std::span<const PrefillStep> steps, Rates& r) {
  std::vector<std::array<double, 3>> rows;
  for (const PrefillStep& s : steps) {
    const Chunk& c = s.chunk;
    if (c.tokens < 1) throw InputError("[split model] a prefill measurement of no tokens");
    const double n = static_cast<double>(c.tokens), p = static_cast<double>(c.start);
    rows.push_back({n, n * p + n * (n - 1) / 2, s.seconds});
  }
  std::tie(r.token_s, r.pair_s) = nonnegative_fit(rows, "prefill");
}

void fit_decode(std::span<const DecodeStep> steps, Rates& r) {
  std::vector<std::array<double, 3>> rows;
  for (const DecodeStep& s : steps) rows.push_back({1.0, static_cast<double>(s.rows), s.seconds});
  std::tie(r.step_s, r.row_s) = nonnegative_fit(rows, "decode");
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  CONCORD_CHECK(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, std::mt19937_64& rng) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return t;
}

constexpr int64_t kStreamPrompt = 8, kDecodeWarm = 2, kDecodeTimed = 16;
constexpr int64_t kBesideSteps = 8, kMaxReps = 1000;  // decode steps wanted beside the worker's prefills

}  // namespace

Measured measure(model::Model& model, const EngineOptions& options, int64_t prompt_tokens, uint64_t seed,
                 const std::function<void(const std::string&)>& progress) {
  const model::ModelConfig& c = model.config();
  const int64_t context = options.max_context > 0 ? options.max_context : c.max_position_embeddings;
  if (prompt_tokens < 2 || prompt_tokens + 1 > context)
    throw InputError(fmt::format("[split model] a calibration prompt of {} tokens: 2 to {} (the context less one)",
                                 prompt_tokens, context - 1));
  if (kStreamPrompt + kDecodeWarm + kDecodeTimed + 1 > context)
    throw InputError(fmt::format("[split model] a context of {} tokens is too short to time decode steps", context));
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  say(fmt::format("measuring with a {}-token prompt in chunks of {}", prompt_tokens, options.prefill_chunk));
  std::mt19937_64 rng(seed);
  const std::vector<int32_t> prompt = random_tokens(prompt_tokens, c.vocab_size, rng);
  const std::vector<Chunk> chunks = chunks_of(prompt_tokens, options.prefill_chunk);
  Measured m;

  // Prefill alone, three times on one engine; each chunk's median.
  {
    Engine e(model, options);
    std::vector<std::vector<double>> times(chunks.size());
    std::vector<double> totals;
    for (int run = 0; run < 3; ++run) {
      Request r;
      r.prompt = prompt;
      r.max_tokens = 1;
      const int64_t id = e.submit(r);
      size_t i = 0;
      while (!e.finished(id)) {
        const auto t0 = Clock::now();
        e.step();
        const double s = seconds_since(t0);
        CONCORD_CHECK(i < chunks.size(), "the engine ran more prefill steps than chunks_of() counts");
        times[i].push_back(s);
        ++i;
      }
      CONCORD_CHECK(i == chunks.size(), "the engine ran fewer prefill steps than chunks_of() counts");
      (void)e.take(id);
      totals.push_back(0);
      for (const std::vector<double>& t : times) totals.back() += t.back();
    }
    for (size_t i = 0; i < chunks.size(); ++i) {
      m.prefill.push_back({chunks[i], median(times[i])});
      m.alone_prefill_s += m.prefill.back().seconds;
    }
    say(fmt::format("prefill alone: {} tokens in {} chunks, {:.3f} s (runs {:.3f}, {:.3f}, {:.3f} s)", prompt_tokens,
                    chunks.size(), m.alone_prefill_s, totals[0], totals[1], totals[2]));
  }

  // Decode steps of 1, 2 and 4 rows alone.
  EngineOptions decode_options = options;
  decode_options.max_sequences = std::max<int64_t>(options.max_sequences, 4);
  {
    Engine e(model, decode_options);
    for (int64_t rows : {1, 2, 4}) {
      std::vector<int64_t> ids;
      for (int64_t k = 0; k < rows; ++k) {
        Request r;
        r.prompt = random_tokens(kStreamPrompt, c.vocab_size, rng);
        r.max_tokens = kDecodeWarm + kDecodeTimed + 1;
        ids.push_back(e.submit(r));
      }
      int64_t decode_steps = 0;
      while (e.running() + e.waiting() > 0 && decode_steps < kDecodeWarm + kDecodeTimed) {
        const int64_t before = e.stats().prefill_tokens;
        const auto t0 = Clock::now();
        e.step();
        const double s = seconds_since(t0);
        if (e.stats().prefill_tokens != before) continue;  // the prompts' step
        if (decode_steps++ >= kDecodeWarm) m.decode.push_back({rows, s});
      }
      while (e.running() + e.waiting() > 0) e.step();
      for (int64_t id : ids) (void)e.take(id);
    }
    std::vector<double> one;
    for (const DecodeStep& d : m.decode)
      if (d.rows == 1) one.push_back(d.seconds);
    m.alone_decode_step_s = median(one);
    say(fmt::format("decode alone: a step of 1 row {:.2f} ms", 1e3 * m.alone_decode_step_s));
  }

  // The prefill worker (an engine on a twin, with the prefix cache it exports from) beside an
  // engine decoding one stream, as `concord serve --disaggregate` runs them.
  const int64_t block = rows_quantize_alone(model.policy()) ? 64 : options.prefill_chunk;
  const int64_t align = rows_quantize_alone(model.policy()) ? 1 : options.prefill_chunk;
  PrefixCacheOptions po;
  po.block = block;
  po.max_bytes = size_t{1} << 40;
  model::Model twin = model.twin();
  const uint64_t fingerprint = PrefixCache::fingerprint_of(twin);
  std::vector<uint8_t> message;
  {
    Engine d(model, decode_options);
    Request stream;
    stream.prompt = random_tokens(kStreamPrompt, c.vocab_size, rng);
    stream.max_tokens = context;  // until the context is full; then another
    int64_t id = d.submit(stream);
    auto decode_step = [&]() {
      const int64_t before = d.stats().prefill_tokens;
      const auto t0 = Clock::now();
      d.step();
      const double s = seconds_since(t0);
      if (d.finished(id)) {
        (void)d.take(id);
        id = d.submit(stream);
      }
      return d.stats().prefill_tokens == before ? s : -1.0;
    };
    for (int64_t k = 0; k < kDecodeWarm + 2;) k += decode_step() >= 0 ? 1 : 0;

    // The worker prefills the prompt again (a fresh cache each time) until enough decode steps ran
    // beside it (a short prompt on a small model may take less than one): its time is the mean.
    std::atomic<int> phase{0};  // 1: prefilling, 2: done
    std::atomic<int64_t> steps_beside{0};
    std::exception_ptr error;
    int64_t reps = 0;
    std::thread worker([&] {
      try {
        EngineOptions wo = options;
        wo.max_sequences = 1;
        Engine w(twin, wo);
        Request r;
        r.prompt = prompt;
        r.max_tokens = 1;
        double total = 0;
        std::shared_ptr<PrefixCache> cache;
        phase = 1;
        do {
          cache = std::make_shared<PrefixCache>(twin.config(), fingerprint, po);
          w.set_prefix_cache(cache);
          const auto t0 = Clock::now();
          (void)w.generate({r});
          total += seconds_since(t0);
          ++reps;
        } while (steps_beside.load() < kBesideSteps && reps < kMaxReps);
        m.shared_prefill_s = total / static_cast<double>(reps);
        const auto t1 = Clock::now();
        message = cache->export_prompt(prompt, align);
        m.export_seconds = seconds_since(t1);
      } catch (...) {
        error = std::current_exception();
      }
      phase = 2;
    });
    std::vector<double> beside;
    while (phase.load() < 2) {
      const bool during = phase.load() == 1;
      const double s = decode_step();
      if (during && phase.load() == 1 && s >= 0) {
        beside.push_back(s);
        ++steps_beside;
      }
    }
    worker.join();
    if (error) std::rethrow_exception(error);
    if (beside.empty())
      throw InputError(fmt::format("[split model] no decode step ran beside {} prefills of the prompt; calibrate with a "
                                   "longer prompt", reps));
    m.shared_decode_steps = static_cast<int64_t>(beside.size());
    m.shared_decode_step_s = median(beside);
    say(fmt::format("prefill worker beside a decoding stream: prefill {:.3f} s{}, {} decode steps of {:.2f} ms",
                    m.shared_prefill_s, reps > 1 ? fmt::format(" (the mean of {})", reps) : std::string(), beside.size(),
                    1e3 * m.shared_decode_step_s));
  }
  {
    // The engine's side: the import, then the step that resumes the prompt from the rows and
    // samples its first token.
    auto engine_cache = std::make_shared<PrefixCache>(c, PrefixCache::fingerprint_of(model), po);
    const auto t0 = Clock::now();
    const int64_t records = engine_cache->import_prompt(message, "the calibration's hand-over");
    m.import_seconds = seconds_since(t0);
    CONCORD_CHECK(records > 0, "the calibration's hand-over carried no record");
    m.handover_bytes = static_cast<double>(message.size());
    Engine e(model, options);
    e.set_prefix_cache(engine_cache);
    Request r;
    r.prompt = prompt;
    r.max_tokens = 1;
    m.resume_step_seconds = std::numeric_limits<double>::infinity();
    for (int run = 0; run < 3; ++run) {  // the first on a fresh engine plans its step; the least
      const int64_t id = e.submit(r);
      const auto t1 = Clock::now();
      while (!e.finished(id)) e.step();
      m.resume_step_seconds = std::min(m.resume_step_seconds, seconds_since(t1));
      (void)e.take(id);
    }
    CONCORD_CHECK(e.stats().prefix_reused_tokens == 3 * (prompt_tokens - 1), "the calibration's prompt was not resumed whole");
    say(fmt::format("hand-over: {:.2f} MiB, export {:.1f} ms, import {:.1f} ms, the first token's step {:.1f} ms",
                    m.handover_bytes / (1024.0 * 1024.0), 1e3 * m.export_seconds, 1e3 * m.import_seconds,
                    1e3 * m.resume_step_seconds));
  }

  Rates& r = m.rates;
  fit_prefill(m.prefill, r);
  fit_decode(m.decode, r);
  // What the first token's step costs beyond a one-row step attending to the prompt: copying the
  // rows into the slot, per byte.
  r.resume_s = std::max(0.0, m.resume_step_seconds - decode_seconds(r, 1) - r.pair_s * static_cast<double>(prompt_tokens - 1)) /
               m.handover_bytes;
  r.bytes_per_token = m.handover_bytes / static_cast<double>(prompt_tokens);
  r.export_s = m.export_seconds / m.handover_bytes;
  r.import_s = m.import_seconds / m.handover_bytes;
  // Sharing the cores slows each, never speeds it: a ratio below 1 is noise.
  r.prefill_slowdown = std::max(1.0, m.shared_prefill_s / m.alone_prefill_s);
  r.decode_slowdown = std::max(1.0, m.shared_decode_step_s / m.alone_decode_step_s);
  return m;
}

}  // namespace concord::serve::splitmodel
