// concord serve: the scheduler thread, which owns the engine: admission, steps, tokens to text,
// stop strings, cancellation (server_impl.h).
#include "concord/serve/server_impl.h"

namespace concord::serve {

using namespace server_detail;

void Server::Impl::push_piece(Job& job, openai::ChunkPiece piece) {
  if (!job.stream) return;
  std::lock_guard lk(job.mutex);
  job.pieces.push_back(std::move(piece));
  job.cv.notify_all();
}

void Server::Impl::on_token(const TokenEvent& ev) {
  const auto it = by_engine_id.find(ev.id);
  if (it == by_engine_id.end()) return;
  Job& job = *it->second.first;
  const size_t index = it->second.second;
  Choice& c = job.choices[index];
  if (c.done || c.stop_hit) return;
  const auto now = Clock::now();
  generated_tokens.inc();
  if (!job.first_token_seen) {
    job.first_token_seen = true;
    ttft.observe(seconds_between(job.arrival, now));
  }
  if (c.generated > 0) itl.observe(seconds_between(c.last_token, now));
  c.last_token = now;
  ++c.generated;
  std::string piece_text;
  if (!served.tokenizer.is_special(ev.token)) {  // stop tokens and other control tokens: no text
    const std::string ready = c.utf8.push(served.tokenizer.token_bytes(ev.token));
    if (c.stops) {
      piece_text = c.stops->push(ready);
      if (c.stops->stopped()) {
        c.stop_hit = true;
        engine.cancel(ev.id);  // frees the slot now; this token is the completion's last
        if (options.mirror) mirror_log.cancelled(ev.id);
      }
    } else {
      piece_text = ready;
    }
  }
  openai::ChunkPiece piece;
  piece.index = static_cast<int64_t>(index);
  if (job.logprobs) {
    openai::LoggedToken t;
    t.token = ev.token;
    t.logprob = ev.logprob;
    std::vector<openai::Alternative> top;
    top.reserve(ev.top.size());
    for (const TopLogprob& a : ev.top) top.push_back({a.token, a.logprob});
    t.top = std::move(top);
    t.text_offset = c.text_points;
    c.tokens.push_back(t);
    piece.tokens.push_back(std::move(t));
  }
  c.text += piece_text;
  c.text_points += openai::code_points(piece_text);
  if (job.logprobs || !piece_text.empty()) {
    piece.text = std::move(piece_text);
    push_piece(job, std::move(piece));
  }
}

// A choice whose engine request finished (stop token, length, context, or cancelled by its
// stop string): flush its text, set its finish reason.
void Server::Impl::finalize(Job& job, size_t index, Completion completion) {
  Choice& c = job.choices[index];
  std::string rest;
  if (!c.stop_hit) {
    const std::string tail = c.utf8.flush();
    if (c.stops) {
      rest = c.stops->push(tail);
      if (c.stops->stopped())
        c.stop_hit = true;
      else
        rest += c.stops->flush();
    } else {
      rest = tail;
    }
  }
  c.text += rest;
  c.text_points += openai::code_points(rest);
  c.finish_reason = c.stop_hit || completion.finish == FinishReason::stop ? "stop" : "length";
  c.prompt_logprobs = std::move(completion.prompt_logprobs);
  c.prompt_top = std::move(completion.prompt_top_logprobs);
  c.generated = static_cast<int64_t>(completion.tokens.size());
  c.done = true;
  by_engine_id.erase(c.engine_id);
  openai::ChunkPiece piece;
  piece.index = static_cast<int64_t>(index);
  piece.text = std::move(rest);
  piece.finish_reason = c.finish_reason;
  push_piece(job, std::move(piece));
  --job.choices_left;
}

void Server::Impl::finish_job(Job& job, std::optional<ApiError> error) {
  openai::Usage usage;
  usage.prompt_tokens = static_cast<int64_t>(job.prompt.size());
  for (const Choice& c : job.choices) usage.completion_tokens += c.generated;
  duration.observe(seconds_between(job.arrival, Clock::now()));
  {
    std::lock_guard lk(job.mutex);
    job.usage = usage;
    job.error = std::move(error);
    job.finished = true;
    job.cv.notify_all();
  }
  std::lock_guard lk(mu);
  --active_jobs;
  drained_cv.notify_all();
}

// Ends every unfinished choice of a job now (client gone, deadline passed).
void Server::Impl::abort_job(Job& job, std::optional<ApiError> error) {
  for (Choice& c : job.choices) {
    if (c.done) continue;
    if (c.engine_id >= 0) {
      engine.cancel(c.engine_id);
      if (options.mirror) mirror_log.cancelled(c.engine_id);
      if (engine.finished(c.engine_id)) {
        const Completion done = engine.take(c.engine_id);
        c.generated = static_cast<int64_t>(done.tokens.size());
      }
      by_engine_id.erase(c.engine_id);
    }
    c.done = true;
    c.finish_reason = "length";
  }
  job.choices_left = 0;
  finish_job(job, std::move(error));
}

void Server::Impl::admit(const std::shared_ptr<Job>& job) {
  prompt_tokens.inc(static_cast<double>(job->prompt.size()));
  {
    std::lock_guard lk(job->mutex);  // before any piece: a stream chunk reads it
    job->meta.weights_version = weights_version;  // written by this thread only
  }
  for (size_t i = 0; i < job->requests.size(); ++i) {
    Choice& c = job->choices[i];
    try {
      if (options.mirror) {
        c.engine_id = engine.submit(job->requests[i]);
        mirror_log.submitted(c.engine_id, job->requests[i]);
      } else {
        c.engine_id = engine.submit(std::move(job->requests[i]));
      }
    } catch (const InputError& e) {  // validated before; a bug if it happens
      abort_job(*job, ApiError(500, "server_error", "internal_error", e.what()));
      return;
    }
    by_engine_id[c.engine_id] = {job.get(), i};
  }
  active.push_back(job);
}

int64_t Server::Impl::prefix_block() const {
  return options.prefix_cache_block > 0                   ? options.prefix_cache_block
         : rows_quantize_alone(served.model.policy()) ? 64
                                                      : options.engine.prefill_chunk;
}

std::shared_ptr<PrefixCache> Server::Impl::make_prefix_cache() {
  if (options.prefix_cache_bytes <= 0) return nullptr;
  PrefixCacheOptions o;
  o.max_bytes = static_cast<size_t>(options.prefix_cache_bytes);
  o.dir = options.prefix_cache_dir;
  o.block = prefix_block();
  return std::make_shared<PrefixCache>(served.model.config(), PrefixCache::fingerprint_of(served.model), o);
}

// The prefill worker: an engine of its own on the twin, one prompt at a time (its one sampled
// token dropped), the prompt's rows exported from its own prefix cache (which also lets it resume
// prompts sharing a prefix).
void Server::Impl::run_prefill_worker() {
  std::unique_ptr<Engine> worker;
  std::shared_ptr<PrefixCache> cache;
  const int64_t align = rows_quantize_alone(served.model.policy()) ? 1 : options.engine.prefill_chunk;
  while (true) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lk(prefill_mu);
      prefill_cv.wait(lk, [&] { return prefill_stop || !prefill_queue.empty(); });
      if (prefill_queue.empty()) return;  // stopping
      job = std::move(prefill_queue.front());
      prefill_queue.pop_front();
      if (prefill_stale || !worker) {  // first use, or the twin was remade after a weight update
        EngineOptions eo = options.engine;
        eo.max_sequences = 1;
        worker = std::make_unique<Engine>(*prefill_model, eo);
        PrefixCacheOptions po;
        po.max_bytes = static_cast<size_t>(options.prefix_cache_bytes);
        po.block = prefix_block();
        cache = std::make_shared<PrefixCache>(prefill_model->config(), PrefixCache::fingerprint_of(*prefill_model), po);
        worker->set_prefix_cache(cache);
        prefill_stale = false;
      }
    }
    std::vector<uint8_t> message;
    if (!job->cancel_requested.load()) {
      try {
        Request r = job->requests.at(0);
        r.max_tokens = 1;
        r.top_logprobs = 0;
        r.full_logprobs = false;
        (void)worker->generate({r});
        message = cache->export_prompt(job->prompt, align);
      } catch (const std::exception& e) {  // the engine then prefills it itself: same bits
        std::fprintf(stderr, "concord: [serve] the prefill worker failed on a request (%s); the engine prefills it\n",
                     e.what());
        message.clear();
      }
    }
    std::lock_guard lk(mu);
    prefilled.emplace_back(std::move(job), std::move(message));
    work_cv.notify_all();
  }
}

void Server::Impl::serve_swap_request() {
  SwapRequest* request = nullptr;
  {
    std::lock_guard lk(mu);
    request = swap_request;
  }
  if (!request) return;
  if (request->abort_running)
    for (const auto& job : active)
      if (!job->finished)
        abort_job(*job, ApiError(503, "server_error", "weights_updated",
                                 fmt::format("the request was aborted by the weight update to version {} "
                                             "(abort_running)", request->report->version)));
  std::erase_if(active, [](const std::shared_ptr<Job>& j) {
    std::lock_guard lk(j->mutex);
    return j->finished;
  });
  if (!active.empty() || engine.running() + engine.waiting() > 0 || prefilling > 0) return;  // still finishing
  std::string error;
  std::string info;
  try {
    receiver.commit(*request->report);  // nothing runs on the model now
    if (options.remake_drafter) engine.set_drafter(options.remake_drafter(), options.speculation);
    if (engine.prefix_cache()) engine.set_prefix_cache(make_prefix_cache());  // the old rows are stale
    if (prefill_model) {  // nothing is with the prefill worker now (checked above)
      std::lock_guard lk(prefill_mu);
      *prefill_model = served.model.twin();
      prefill_model->prepare_weights();
      prefill_stale = true;
    }
    info = make_weights_info();
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::lock_guard lk(mu);
  if (error.empty()) {
    weights_version = static_cast<int64_t>(receiver.version());
    weights_info = std::move(info);
    weights_version_gauge.set(static_cast<double>(weights_version));
  }
  request->error = std::move(error);
  request->done = true;
  swap_request = nullptr;
  swap_cv.notify_all();
}

void Server::Impl::update_pager_metrics() {
  const model::ExpertPagingStats s = served.model.expert_pager()->stats();
  PagerMetrics& m = *pager_metrics;
  m.cap.set(static_cast<double>(s.cap));
  m.held.set(static_cast<double>(s.held));
  m.high_water.set(static_cast<double>(s.high_water));
  m.uses.inc(static_cast<double>(s.uses - m.seen.uses));
  m.hits.inc(static_cast<double>(s.hits - m.seen.hits));
  m.reads.inc(static_cast<double>(s.loads - m.seen.loads));
  m.read_bytes.inc(static_cast<double>(s.loaded_bytes - m.seen.loaded_bytes));
  m.evictions.inc(static_cast<double>(s.evictions - m.seen.evictions));
  m.stall_seconds.inc(std::max(0.0, s.stall_s - m.seen.stall_s));
  m.seen = s;
}

void Server::Impl::run_scheduler() {
  engine.set_token_callback([this](const TokenEvent& ev) { on_token(ev); });
  if (prefill_model) prefill_worker = std::thread([this] { run_prefill_worker(); });
  while (true) {
    std::deque<std::shared_ptr<Job>> fresh;
    std::deque<std::pair<std::shared_ptr<Job>, std::vector<uint8_t>>> handed;
    int64_t fresh_choices = 0;
    {
      std::unique_lock lk(mu);
      if (active.empty()) {
        // Wake up for new jobs, or now and then to notice cancellations of queued jobs.
        work_cv.wait_for(lk, std::chrono::milliseconds(200),
                         [&] { return !inbox.empty() || !prefilled.empty() || stop_scheduler || swap_request; });
      }
      if (stop_scheduler && inbox.empty() && active.empty() && !swap_request && prefilling == 0 && prefilled.empty()) break;
      // A weight update waits for the running requests: new ones wait for it (they run on the
      // new version).
      if (!swap_request) fresh.swap(inbox);
      handed.swap(prefilled);
    }
    for (auto& [job, message] : handed) {  // back from the prefill worker: its rows, then the job
      --prefilling;
      if (!message.empty()) {
        try {
          engine.prefix_cache()->import_prompt(message, "the prefill worker's hand-over");
          handovers.inc();
          handover_bytes.inc(static_cast<double>(message.size()));
        } catch (const InputError& e) {  // a bug: the engine prefills the prompt itself
          std::fprintf(stderr, "concord: [serve] %s\n", e.what());
        }
      }
      admit(job);
    }
    for (const auto& job : fresh) {
      fresh_choices += static_cast<int64_t>(job->requests.size());
      // Disaggregated: the prompt goes to the prefill worker first (echo requests score their
      // prompt here; a one-token prompt has no rows to hand over).
      if (prefill_model && !job->echo && job->prompt.size() >= 2) {
        ++prefilling;
        std::lock_guard lk(prefill_mu);
        prefill_queue.push_back(job);
        prefill_cv.notify_one();
        continue;
      }
      admit(job);
    }
    {
      std::lock_guard lk(mu);
      inbox_choices -= fresh_choices;
      engine_waiting = engine.waiting();
    }
    // Cancellations and deadlines, between steps.
    const auto now = Clock::now();
    for (const auto& job : active) {
      if (job->finished) continue;
      if (job->cancel_requested.load()) {
        abort_job(*job, std::nullopt);
      } else if (job->has_deadline && now > job->deadline) {
        abort_job(*job, ApiError(504, "timeout_error", "request_timeout",
                                 fmt::format("the request did not finish within --request-timeout "
                                             "({} s); it was cancelled",
                                             options.request_timeout_seconds)));
      }
    }
    if (engine.waiting() + engine.running() > 0) {
      try {
        if (options.mirror) options.mirror(mirror_log.take(false));  // the other ranks step with it
        engine.step();
      } catch (const std::exception& e) {
        // A bug (the requests were validated): fail what runs, keep serving.
        for (const auto& job : active)
          if (!job->finished)
            abort_job(*job, ApiError(500, "server_error", "internal_error",
                                     fmt::format("the engine failed: {}", e.what())));
      }
    } else if (!active.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // only finished-at-once choices
    }
    // The gauges before any response of this step goes out (finished slots are free already).
    {
      std::lock_guard lk(mu);
      engine_waiting = engine.waiting();
      queue_gauge.set(static_cast<double>(engine_waiting + inbox_choices));
      running_gauge.set(static_cast<double>(engine.running()));
    }
    const SpeculationStats& spec = engine.stats().speculation;
    if (spec.drafted > spec_drafted_seen) spec_drafted.inc(static_cast<double>(spec.drafted - spec_drafted_seen));
    if (spec.accepted > spec_accepted_seen) spec_accepted.inc(static_cast<double>(spec.accepted - spec_accepted_seen));
    spec_drafted_seen = spec.drafted;
    spec_accepted_seen = spec.accepted;
    if (const PrefixCache* pc = engine.prefix_cache()) {
      // Totals over every cache this server had (a weight update starts a new one).
      const PrefixCacheStats& ps = pc->stats();
      if (ps.hits < prefix_hits_seen || ps.tokens_reused < prefix_reused_seen) prefix_hits_seen = prefix_reused_seen = 0;
      prefix_hits.inc(static_cast<double>(ps.hits - prefix_hits_seen));
      prefix_reused.inc(static_cast<double>(ps.tokens_reused - prefix_reused_seen));
      prefix_hits_seen = ps.hits;
      prefix_reused_seen = ps.tokens_reused;
      prefix_bytes.set(static_cast<double>(ps.bytes));
    }
    if (pager_metrics) update_pager_metrics();
    // Finished choices (a finishing token's event, a cancel by stop string, max_tokens = 0).
    for (const auto& job : active) {
      if (job->finished) continue;
      for (size_t i = 0; i < job->choices.size(); ++i) {
        Choice& c = job->choices[i];
        if (!c.done && engine.finished(c.engine_id)) finalize(*job, i, engine.take(c.engine_id));
      }
      if (job->choices_left == 0) finish_job(*job, std::nullopt);
    }
    std::erase_if(active, [](const std::shared_ptr<Job>& j) {
      std::lock_guard lk(j->mutex);
      return j->finished;
    });
    serve_swap_request();
  }
  if (options.mirror) options.mirror(mirror_log.take(true));  // the other ranks end
  if (prefill_worker.joinable()) {
    {
      std::lock_guard lk(prefill_mu);
      prefill_stop = true;
      prefill_cv.notify_all();
    }
    prefill_worker.join();
  }
}

}  // namespace concord::serve
