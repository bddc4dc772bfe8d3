// concord serve: the HTTP side: request handlers, checks against the model, non-streaming and
// streaming responses, routes (server_impl.h).
#include <charconv>

#include "concord/serve/server_impl.h"

namespace concord::serve {

using namespace server_detail;

void Server::Impl::send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status();
  res.set_content(openai::error_body(e), "application/json");
  if (e.status() == 429 || e.status() == 503) res.set_header("Retry-After", "1");
}

// The tokenized prompt of a validated request, checked against the vocabulary and context.
std::vector<int32_t> Server::Impl::prompt_of(const openai::GenerationRequest& r,
                                             std::string& echo_text) const {
  const io::Tokenizer& tok = served.tokenizer;
  std::vector<int32_t> prompt;
  if (r.endpoint == openai::Endpoint::chat) {
    if (served.chat_template.empty())
      throw ApiError(400, "invalid_request_error", "unsupported",
                     "the model has no chat template; use /v1/completions", "messages");
    std::string text;
    try {
      ChatOptions chat;
      chat.enable_thinking = r.enable_thinking;  // as generate --chat [--no-think]
      text = render_chat(served.chat_template, r.messages, chat);
    } catch (const InputError& e) {
      throw ApiError(400, "invalid_request_error", "invalid_value", e.what(), "messages");
    }
    prompt = tok.encode_for_model(text);
  } else if (r.prompt_is_tokens) {
    const int64_t vocab = served.model.config().vocab_size;
    for (size_t i = 0; i < r.prompt_tokens.size(); ++i) {
      if (r.prompt_tokens[i] >= vocab)
        throw openai::invalid_request(
            "invalid_value",
            fmt::format("'prompt' token {} at position {} is outside the vocabulary of {} tokens",
                        r.prompt_tokens[i], i, vocab),
            "prompt");
      prompt.push_back(static_cast<int32_t>(r.prompt_tokens[i]));
    }
    std::string bytes;
    for (const int32_t t : prompt) bytes += tok.token_bytes(t);
    echo_text = io::utf8_lossy(bytes);
  } else {
    prompt = tok.encode_for_model(r.prompt_text);  // BOS where the vocabulary adds one
    echo_text = r.prompt_text;
  }
  if (prompt.empty())
    throw openai::invalid_request("invalid_value", "the prompt encodes to no tokens",
                                  r.endpoint == openai::Endpoint::chat ? "messages" : "prompt");
  const int64_t p = static_cast<int64_t>(prompt.size());
  if (p >= context)
    throw openai::invalid_request(
        "context_length_exceeded",
        fmt::format("the prompt ({} tokens) leaves no room in the context of {} tokens", p,
                    context),
        r.endpoint == openai::Endpoint::chat ? "messages" : "prompt");
  if (r.max_tokens && p + *r.max_tokens > context)
    throw openai::invalid_request(
        "context_length_exceeded",
        fmt::format("prompt ({} tokens) + max_tokens ({}) = {} exceeds the context of {} tokens", p,
                    *r.max_tokens, p + *r.max_tokens, context),
        "max_tokens");
  return prompt;
}

std::shared_ptr<Job> Server::Impl::make_job(const openai::GenerationRequest& r,
                                            const std::string& path) {
  auto job = std::make_shared<Job>();
  job->endpoint = r.endpoint;
  job->endpoint_path = path;
  job->stream = r.stream;
  job->logprobs = r.logprobs;
  job->top_logprobs = r.top_logprobs;
  job->echo = r.endpoint == openai::Endpoint::completions && r.echo;
  job->include_usage = r.stream && r.include_usage;
  job->tokens_as_ids = r.tokens_as_ids;
  job->arrival = Clock::now();
  if (options.request_timeout_seconds > 0) {
    job->has_deadline = true;
    job->deadline =
        job->arrival + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(options.request_timeout_seconds));
  }
  if (r.model && *r.model != options.model_name)
    throw ApiError(404, "invalid_request_error", "model_not_found",
                   fmt::format("the model '{}' does not exist; this server serves '{}'", *r.model,
                               options.model_name),
                   "model");
  job->prompt = prompt_of(r, job->echo_text);
  const int64_t p = static_cast<int64_t>(job->prompt.size());
  const int64_t max_tokens = r.max_tokens ? *r.max_tokens
                                          : (r.endpoint == openai::Endpoint::completions
                                                 ? std::min<int64_t>(16, context - p)
                                                 : context - p);
  uint64_t seed = 0;
  {
    std::lock_guard lk(mu);
    seed = r.seed ? *r.seed : rng();
    job->meta.id = fmt::format("{}-{}", r.endpoint == openai::Endpoint::chat ? "chatcmpl" : "cmpl",
                               random_hex(rng));
  }
  job->meta.created = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  job->meta.model = options.model_name;
  job->meta.system_fingerprint = "concord-" + options.policy_name;
  job->choices.resize(static_cast<size_t>(r.n));
  job->choices_left = r.n;
  for (int64_t i = 0; i < r.n; ++i) {
    Request req;
    req.prompt = job->prompt;
    req.sampling.temperature = r.temperature;
    req.sampling.top_k = r.top_k;
    req.sampling.top_p = r.top_p;
    req.sampling.min_p = r.min_p;
    req.sampling.seed = seed + static_cast<uint64_t>(i);  // choice i: seed s + i (wraps)
    req.max_tokens = max_tokens;
    req.stop_tokens = served.stop_token_ids;
    req.top_logprobs = r.logprobs ? r.top_logprobs : 0;
    req.prompt_logprobs = job->echo && r.logprobs;
    try {
      req.sampling.validate();
    } catch (const InputError& e) {
      throw openai::invalid_request("invalid_value", e.what());
    }
    job->requests.push_back(std::move(req));
    if (!r.stop.empty()) job->choices[static_cast<size_t>(i)].stops.emplace(r.stop);
  }
  // The stream's first pieces: chat's role delta, completions' echoed prompt.
  for (int64_t i = 0; i < r.n && r.stream; ++i) {
    openai::ChunkPiece piece;
    piece.index = i;
    if (r.endpoint == openai::Endpoint::chat)
      piece.role_first = true;
    else if (job->echo)
      piece.text = job->echo_text;
    else
      continue;
    job->pieces.push_back(std::move(piece));
  }
  return job;
}

// Queue a job, or 429 when its choices do not fit the queue.
void Server::Impl::enqueue(const std::shared_ptr<Job>& job) {
  const int64_t n = static_cast<int64_t>(job->requests.size());
  std::lock_guard lk(mu);
  if (n > options.max_queue)
    throw openai::invalid_request(
        "invalid_value",
        fmt::format("'n' ({}) is larger than the server's queue (--max-queue {})", n,
                    options.max_queue),
        "n");
  if (inbox_choices + engine_waiting + n > options.max_queue)
    throw ApiError(
        429, "rate_limit_error", "queue_full",
        fmt::format("the server's queue is full ({} choices waiting, --max-queue {}); retry later",
                    inbox_choices + engine_waiting, options.max_queue));
  inbox.push_back(job);
  inbox_choices += n;
  ++active_jobs;
  work_cv.notify_all();
}

void Server::Impl::request_cancel(Job& job) {
  job.cancel_requested.store(true);
  std::lock_guard lk(mu);
  work_cv.notify_all();
}

void Server::Impl::response_done() {
  std::lock_guard lk(mu);
  --open_responses;
  drained_cv.notify_all();
}

openai::TokenText Server::Impl::names(const Job& job) const {
  const io::Tokenizer* tok = &served.tokenizer;
  return {[tok](int32_t id) { return tok->token_bytes(id); }, job.tokens_as_ids};
}

// The non-streaming body of a finished job.
json Server::Impl::final_response(const Job& job) const {
  std::vector<openai::ChoiceOutput> outs;
  const int64_t echo_points = job.echo ? openai::code_points(job.echo_text) : 0;
  for (const Choice& c : job.choices) {
    openai::ChoiceOutput o;
    o.text = job.echo ? job.echo_text + c.text : c.text;
    o.finish_reason = c.finish_reason;
    if (job.logprobs) {
      if (job.echo) {
        int64_t offset = 0;
        for (size_t i = 0; i < job.prompt.size(); ++i) {
          openai::LoggedToken t;
          t.token = job.prompt[i];
          t.text_offset = std::min(offset, echo_points);
          if (i > 0 && i - 1 < c.prompt_logprobs.size()) {
            t.logprob = c.prompt_logprobs[i - 1];
            std::vector<openai::Alternative> top;
            if (i - 1 < c.prompt_top.size())
              for (const TopLogprob& a : c.prompt_top[i - 1]) top.push_back({a.token, a.logprob});
            t.top = std::move(top);
          }
          offset +=
              openai::code_points(io::utf8_lossy(served.tokenizer.token_bytes(job.prompt[i])));
          o.tokens.push_back(std::move(t));
        }
      }
      for (openai::LoggedToken t : c.tokens) {
        t.text_offset += echo_points;
        o.tokens.push_back(std::move(t));
      }
    }
    outs.push_back(std::move(o));
  }
  return job.endpoint == openai::Endpoint::chat
             ? openai::chat_response(job.meta, outs, job.usage, names(job), job.logprobs)
             : openai::completion_response(job.meta, outs, job.usage, names(job), job.logprobs);
}

void Server::Impl::handle_generation(openai::Endpoint endpoint, const std::string& path,
                                     const httplib::Request& req, httplib::Response& res,
                                     const httplib::ContentReader& reader) {
  // The body, bounded also when it comes chunked (httplib's own limit covers Content-Length).
  std::string body;
  bool too_large = false, too_slow = false;
  const auto body_deadline = Clock::now() + receive_timeout();
  const bool read = reader([&](const char* data, size_t size) {
    if (Clock::now() > body_deadline) {  // a body trickled in (slowloris)
      too_slow = true;
      return false;
    }
    if (body.size() + size > static_cast<size_t>(options.max_body_bytes)) {
      too_large = true;
      return false;
    }
    body.append(data, size);
    return true;
  });
  if (too_large || res.status == 413) {
    res.set_header("Connection", "close");
    throw ApiError(413, "invalid_request_error", "payload_too_large",
                   fmt::format("the request body is larger than --max-body-bytes ({} bytes)",
                               options.max_body_bytes));
  }
  if (too_slow) {
    res.set_header("Connection", "close");
    throw ApiError(408, "invalid_request_error", "receive_timeout",
                   fmt::format("the request body did not arrive within --receive-timeout ({} s)",
                               options.receive_timeout_seconds));
  }
  if (!read) throw openai::invalid_request("invalid_body", "the request body could not be read");
  if (!authorized(req)) {
    res.set_header("WWW-Authenticate", "Bearer");
    throw ApiError(401, "authentication_error", "invalid_api_key",
                   "missing or wrong API key: send 'Authorization: Bearer KEY' (--api-key)");
  }
  if (draining.load())
    throw ApiError(503, "server_error", "draining", "the server is shutting down");
  const openai::GenerationRequest r = openai::parse_request(endpoint, body);
  const std::shared_ptr<Job> job = make_job(r, path);
  {
    std::lock_guard lk(mu);
    ++open_responses;
  }
  try {
    enqueue(job);
  } catch (...) {
    response_done();
    throw;
  }
  if (job->stream) {
    stream_response(job, peer_key(req.remote_addr, req.remote_port), res);
    return;
  }
  // Non-streaming: wait, watching the connection so that a client that leaves frees its slots.
  struct Done {
    Impl* self;
    ~Done() { self->response_done(); }
  } done{this};
  const int fd = find_connection_socket(req, bound_port);
  std::unique_lock lk(job->mutex);
  while (!job->finished) {
    job->cv.wait_for(lk, std::chrono::milliseconds(50));
    if (!job->finished && fd >= 0 && peer_closed(fd)) {
      lk.unlock();
      request_cancel(*job);
      res.status = 499;  // never reaches the client; counted in the metrics
      return;
    }
  }
  if (job->error) throw *job->error;
  const json body_json = final_response(*job);
  lk.unlock();
  res.status = 200;
  res.set_content(openai::dump(body_json), "application/json");
}

void Server::Impl::stream_response(const std::shared_ptr<Job>& job, const std::string& connection,
                                   httplib::Response& res) {
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, job](size_t, httplib::DataSink& sink) {
        std::deque<openai::ChunkPiece> pieces;
        bool finished = false;
        {
          std::unique_lock lk(job->mutex);
          job->cv.wait_for(lk, std::chrono::milliseconds(100),
                           [&] { return !job->pieces.empty() || job->finished; });
          pieces.swap(job->pieces);
          finished = job->finished;
        }
        const openai::TokenText text = names(*job);
        std::string out;
        for (const openai::ChunkPiece& p : pieces)
          out += openai::sse_event(openai::stream_chunk(job->endpoint, job->meta, p, text,
                                                        job->logprobs, job->include_usage));
        if (finished) {
          if (job->error) {
            out += openai::sse_event(openai::error_json(*job->error));
          } else if (job->include_usage) {
            out += openai::sse_event(openai::usage_chunk(job->endpoint, job->meta, job->usage));
          }
          out += openai::kSseDone;
        }
        if (!out.empty() ? !sink.write(out.data(), out.size()) : !sink.is_writable()) {
          request_cancel(*job);  // the client is gone: free its slots now
          return false;
        }
        if (finished) sink.done();
        return true;
      },
      [this, job, connection](bool success) {
        if (!success) request_cancel(*job);
        connection_idle(connection);
        response_done();
      });
}

bool Server::Impl::authorized(const httplib::Request& req) const {
  if (options.api_key.empty()) return true;
  const std::string expected = "Bearer " + options.api_key;
  const std::string got = req.get_header_value("Authorization");
  if (got.size() != expected.size()) return false;
  unsigned char diff = 0;  // constant time in the key's length
  for (size_t i = 0; i < got.size(); ++i) diff |= static_cast<unsigned char>(got[i] ^ expected[i]);
  return diff == 0;
}

std::string Server::Impl::endpoint_label(const std::string& path) {
  for (const char* known :
       {"/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/weights", "/health", "/metrics"})
    if (path == known) return known;
  return "other";  // unknown paths share one label (no unbounded label values)
}

void Server::Impl::setup_routes() {
  HttpServer& s = *http;
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    connection_busy(peer_key(req.remote_addr, req.remote_port));
    if (req.path != "/v1/weights" && req.has_header("Content-Length")) {
      const std::string length = req.get_header_value("Content-Length");
      uint64_t n = 0;
      const auto [end, ec] = std::from_chars(length.data(), length.data() + length.size(), n);
      if (ec != std::errc() || n > static_cast<uint64_t>(options.max_body_bytes)) {
        send_error(res, ApiError(413, "invalid_request_error", "payload_too_large",
                                 fmt::format("the request body is larger than --max-body-bytes ({} bytes)",
                                             options.max_body_bytes)));
        res.set_header("Connection", "close");
        count(endpoint_label(req.path), 413);
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    // POST bodies are read first (handle_generation), so that the connection stays usable.
    if (req.path.rfind("/v1/", 0) == 0 && req.method != "POST" && !authorized(req)) {
      send_error(
          res, ApiError(401, "authentication_error", "invalid_api_key",
                        "missing or wrong API key: send 'Authorization: Bearer KEY' (--api-key)"));
      res.set_header("WWW-Authenticate", "Bearer");
      count(endpoint_label(req.path), 401);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  auto generation = [this](openai::Endpoint endpoint, std::string path) {
    return [this, endpoint, path](const httplib::Request& req, httplib::Response& res,
                                  const httplib::ContentReader& reader) {
      try {
        handle_generation(endpoint, path, req, res, reader);
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const std::exception& e) {
        send_error(res, ApiError(500, "server_error", "internal_error", e.what()));
      }
      count(path, res.status);
    };
  };
  s.Post("/v1/completions", generation(openai::Endpoint::completions, "/v1/completions"));
  s.Post("/v1/chat/completions", generation(openai::Endpoint::chat, "/v1/chat/completions"));
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const json body = {{"object", "list"},
                       {"data", json::array({{{"id", options.model_name},
                                              {"object", "model"},
                                              {"created", started_unix},
                                              {"owned_by", "concord"},
                                              {"max_model_len", context}}})}};
    res.set_content(openai::dump(body), "application/json");
    count("/v1/models", 200);
  });
  s.Post("/v1/weights", [this](const httplib::Request& req, httplib::Response& res,
                               const httplib::ContentReader& reader) {
    try {
      handle_weights_post(req, res, reader);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      send_error(res, ApiError(500, "server_error", "internal_error", e.what()));
    }
    count("/v1/weights", res.status);
  });
  s.Get("/v1/weights", [this](const httplib::Request&, httplib::Response& res) {
    std::string body;
    {
      std::lock_guard lk(mu);
      body = weights_info;
    }
    res.set_content(body, "application/json");
    count("/v1/weights", 200);
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool ok = !draining.load();
    res.status = ok ? 200 : 503;
    res.set_content(ok ? R"({"status":"ok"})" : R"({"status":"draining"})", "application/json");
    count("/health", res.status);
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    count("/metrics", 200);
    res.set_content(metrics.render(), std::string(kPrometheusContentType));
  });
  s.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.is_chunked_content_provider_)  // streams: when the stream ends (releaser)
      connection_idle(peer_key(req.remote_addr, req.remote_port),
                      std::chrono::seconds(options.write_timeout_seconds));
  });
  // A known path with the wrong method.
  auto not_allowed = [this](const char* allowed) {
    return [this, allowed](const httplib::Request& req, httplib::Response& res) {
      send_error(res, ApiError(405, "invalid_request_error", "method_not_allowed",
                               fmt::format("{} {} is not allowed; use {}", req.method, req.path,
                                           allowed)));
      res.set_header("Allow", allowed);
      count(endpoint_label(req.path), 405);
    };
  };
  s.Put("/v1/weights", not_allowed("GET, POST"));
  s.Delete("/v1/weights", not_allowed("GET, POST"));
  for (const char* p : {"/v1/completions", "/v1/chat/completions"}) {
    s.Get(p, not_allowed("POST"));
    s.Put(p, not_allowed("POST"));
    s.Delete(p, not_allowed("POST"));
  }
  for (const char* p : {"/v1/models", "/health", "/metrics"}) {
    s.Post(p, not_allowed("GET"));
    s.Put(p, not_allowed("GET"));
    s.Delete(p, not_allowed("GET"));
  }
  // Whatever httplib answers by itself (404, 400 for a malformed request line, 413) gets an
  // OpenAI-style body too.
  s.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                  httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404) {
      send_error(res, ApiError(404, "invalid_request_error", "not_found",
                               fmt::format("no such endpoint: {} {}", req.method, req.path)));
      count("other", 404);
    } else if (res.status == 413) {
      send_error(res,
                 ApiError(413, "invalid_request_error", "payload_too_large",
                          fmt::format("the request body is larger than --max-body-bytes ({} bytes)",
                                      options.max_body_bytes)));
      count(endpoint_label(req.path), 413);
    } else {
      send_error(res,
                 ApiError(res.status, "invalid_request_error", "bad_request",
                          fmt::format("the request could not be handled (HTTP {})", res.status)));
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler(
      [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, ApiError(500, "server_error", "internal_error", what));
        count(endpoint_label(req.path), 500);
      });
}

}  // namespace concord::serve
