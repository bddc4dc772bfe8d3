// Server internals shared by server.cpp (the public API, metrics, the connection watchdog),
// server_scheduler.cpp (the thread that owns the engine) and server_http.cpp (request handlers,
// streaming, routes). Private to concord_server.
#pragma once

#include <arpa/inet.h>
#include <fmt/format.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include "concord/io/utf8.h"
#include "concord/model/expert_pager.h"
#include "concord/numerics/check.h"
#include "concord/rl/sync.h"
#include "concord/serve/engine_mirror.h"
#include "concord/serve/openai.h"
#include "concord/serve/server.h"
#include "concord/serve/text.h"

namespace concord::serve {

using nlohmann::json;
using openai::ApiError;
using Clock = std::chrono::steady_clock;

namespace server_detail {

// cpp-httplib's listening socket is protected; the backlog it listens with is compiled into the
// Debian library (5), far too small for 128 clients connecting at once, so the server listens
// again with a larger one (Linux updates the backlog of a listening socket).
class HttpServer : public httplib::Server {
 public:
  void enlarge_backlog(int backlog) {
    const auto sock = svr_sock_.load();
    if (sock != INVALID_SOCKET) ::listen(sock, backlog);
  }
};

double seconds_between(Clock::time_point a, Clock::time_point b);
// The two ends of a connected TCP socket: the peer's address and port, and the local port.
bool socket_ends(int fd, std::string& peer_ip, int& peer_port, int& local_port);
// The connected socket of a request, found by its peer address (httplib does not hand it to
// handlers): a non-streaming handler watches it to cancel the request when the client leaves.
int find_connection_socket(const httplib::Request& req, int server_port);
// The peer closed its end (EOF on a peek); data waiting or nothing yet means it is still there.
bool peer_closed(int fd);
std::string random_hex(std::mt19937_64& rng);

}  // namespace server_detail

using server_detail::HttpServer;

// One choice of a job: an engine sequence and the text made of its tokens.
struct Choice {
  int64_t engine_id = -1;
  Utf8Stream utf8;
  std::optional<StopStrings> stops;
  std::string text;                         // emitted so far (stop strings removed)
  int64_t text_points = 0;                  // code points of `text`
  std::vector<openai::LoggedToken> tokens;  // with logprobs
  std::vector<double> prompt_logprobs;      // echo + logprobs
  std::vector<std::vector<TopLogprob>> prompt_top;
  int64_t generated = 0;
  bool stop_hit = false;
  bool done = false;
  std::string finish_reason;
  Clock::time_point last_token;
};

// One HTTP request in flight. The scheduler owns `choices` until `finished`; the HTTP thread
// reads them after seeing `finished` under `mutex`.
struct Job {
  openai::Endpoint endpoint = openai::Endpoint::completions;
  std::string endpoint_path;
  bool stream = false, logprobs = false, echo = false, include_usage = false, tokens_as_ids = false;
  int32_t top_logprobs = 0;
  std::vector<Request> requests;  // one per choice (seed s + i)
  std::vector<int32_t> prompt;
  std::string echo_text;
  openai::ResponseMeta meta;
  Clock::time_point arrival, deadline;
  bool has_deadline = false;
  bool first_token_seen = false;

  std::vector<Choice> choices;
  int64_t choices_left = 0;

  std::mutex mutex;
  std::condition_variable cv;
  std::deque<openai::ChunkPiece> pieces;  // streaming
  bool finished = false;
  std::optional<ApiError> error;  // timeout
  openai::Usage usage;
  std::atomic<bool> cancel_requested{false};
};

struct Server::Impl {
  ServedModel served;
  ServerOptions options;
  int64_t context = 0;
  Engine engine;
  Metrics metrics;
  Gauge& queue_gauge;
  Gauge& running_gauge;
  Counter& prompt_tokens;
  Counter& generated_tokens;
  Counter& spec_drafted;   // speculation: draft tokens verified, accepted
  Counter& spec_accepted;
  int64_t spec_drafted_seen = 0, spec_accepted_seen = 0;
  Histogram& ttft;
  Histogram& itl;
  Histogram& duration;

  std::unique_ptr<HttpServer> http;
  int bound_port = -1;
  std::thread scheduler, listener, watchdog;
  bool started = false, waited = false;
  int64_t started_unix = 0;  // /v1/models "created"

  std::mutex mu;                       // guards everything below
  std::condition_variable work_cv;     // the scheduler waits on it
  std::condition_variable drained_cv;  // wait() waits on it
  std::deque<std::shared_ptr<Job>> inbox;
  int64_t inbox_choices = 0;
  int64_t engine_waiting = 0;  // snapshot after each admission / step
  int64_t active_jobs = 0;     // inbox + admitted, not finished
  int64_t open_responses = 0;  // generation responses not yet written out
  bool stop_scheduler = false;
  bool listener_done = false;
  bool stop_watchdog = false;

  // Connections to this server by peer "ip:port", for the receive deadline (watchdog below).
  struct Connection {
    int fd = -1;
    Clock::time_point deadline;
    bool busy = false;  // a request on it is being handled (its headers arrived)
  };
  std::mutex connections_mu;
  std::condition_variable watchdog_cv;
  std::map<std::string, Connection> connections;
  std::atomic<bool> draining{false};
  std::mt19937_64 rng{std::random_device{}()};

  // Weight updates (server_weights.cpp). One update is staged at a time (weights_mu, held by
  // the HTTP thread that stages it); a verified one is handed to the scheduler as swap_request
  // (under mu), which stops admitting, lets running requests finish (or aborts them), commits
  // the swap between steps, and answers through swap_cv.
  rl::WeightReceiver receiver;
  std::mutex weights_mu;
  struct SwapRequest {
    rl::SyncReport* report = nullptr;
    bool abort_running = false;
    bool done = false;
    std::string error;  // the commit failed (a bug: it was verified)
  };
  SwapRequest* swap_request = nullptr;  // guarded by mu
  std::condition_variable swap_cv;
  int64_t weights_version = 0;          // guarded by mu: what admitted requests run on
  std::string weights_info;             // guarded by mu: GET /v1/weights's body
  Gauge& weights_version_gauge;
  Counter& weight_updates_applied;
  Counter& weight_updates_refused;
  Counter& prefix_hits;
  Counter& prefix_reused;
  Gauge& prefix_bytes;
  int64_t prefix_hits_seen = 0, prefix_reused_seen = 0;
  // A prefix cache for the model as it is now (its fingerprint); nullptr when off.
  std::shared_ptr<PrefixCache> make_prefix_cache();
  int64_t prefix_block() const;

  // Disaggregated prefill (options.disaggregate). The scheduler hands new jobs to the prefill
  // worker (prefill_queue) and takes each back with its prompt's rows (prefilled), imports them
  // into the engine's prefix cache and admits the job. After a weight update the scheduler remakes
  // the twin (nothing is prefilling then) and marks the worker's engine stale.
  std::unique_ptr<model::Model> prefill_model;
  std::thread prefill_worker;
  std::mutex prefill_mu;
  std::condition_variable prefill_cv;
  std::deque<std::shared_ptr<Job>> prefill_queue;  // guarded by prefill_mu
  bool prefill_stop = false, prefill_stale = false;  // guarded by prefill_mu
  std::deque<std::pair<std::shared_ptr<Job>, std::vector<uint8_t>>> prefilled;  // guarded by mu
  int64_t prefilling = 0;  // scheduler-only: jobs with the worker, not yet taken back
  Counter& handovers;
  Counter& handover_bytes;
  EngineLog mirror_log;  // options.mirror: the engine's operations since its last step
  void run_prefill_worker();

  // Experts under a memory cap (concord serve --memory-cap; model/expert_pager.h): the pager's
  // figures, brought up to date after every engine step by the scheduler.
  struct PagerMetrics {
    Gauge& cap;
    Gauge& held;
    Gauge& high_water;
    Counter& uses;
    Counter& hits;
    Counter& reads;
    Counter& read_bytes;
    Counter& evictions;
    Counter& stall_seconds;
    model::ExpertPagingStats seen;
  };
  std::unique_ptr<PagerMetrics> pager_metrics;
  void update_pager_metrics();

  // Scheduler-only.
  std::vector<std::shared_ptr<Job>> active;
  std::map<int64_t, std::pair<Job*, size_t>> by_engine_id;

  Impl(ServedModel s, ServerOptions o)
      : served(std::move(s)),
        options(std::move(o)),
        engine(served.model, options.engine),
        queue_gauge(metrics.gauge("concord_queue_length", "Choices waiting for a KV-cache slot.")),
        running_gauge(
            metrics.gauge("concord_running_sequences", "Sequences holding a KV-cache slot.")),
        prompt_tokens(metrics.counter("concord_prompt_tokens_total",
                                      "Prompt tokens of admitted requests (once per request).")),
        generated_tokens(
            metrics.counter("concord_generated_tokens_total", "Tokens generated (all choices).")),
        spec_drafted(metrics.counter("concord_speculative_drafted_tokens_total",
                                     "Draft tokens verified (speculative decoding, --draft).")),
        spec_accepted(metrics.counter("concord_speculative_accepted_tokens_total",
                                      "Draft tokens accepted (speculative decoding, --draft).")),
        ttft(metrics.histogram("concord_time_to_first_token_seconds",
                               "Arrival to the first generated token of a request.",
                               kLatencyBuckets)),
        itl(metrics.histogram("concord_inter_token_latency_seconds",
                              "Time between consecutive tokens of one choice.", kLatencyBuckets)),
        duration(metrics.histogram("concord_request_duration_seconds",
                                   "Arrival to the end of a generation request.",
                                   kLatencyBuckets)),
        receiver(served.model),
        weights_version_gauge(metrics.gauge("concord_weights_version",
                                            "The weights version serving (0: as loaded; POST /v1/weights).")),
        weight_updates_applied(metrics.counter("concord_weight_updates_total",
                                               "Weight updates (POST /v1/weights) by result.",
                                               {{"result", "applied"}})),
        weight_updates_refused(metrics.counter("concord_weight_updates_total",
                                               "Weight updates (POST /v1/weights) by result.",
                                               {{"result", "refused"}})),
        prefix_hits(metrics.counter("concord_prefix_cache_hits_total",
                                    "Requests resumed from the prefix cache (--prefix-cache-bytes).")),
        prefix_reused(metrics.counter("concord_prefix_cache_reused_tokens_total",
                                      "Prompt tokens resumed from the prefix cache instead of prefilled.")),
        prefix_bytes(metrics.gauge("concord_prefix_cache_bytes", "Bytes the prefix cache holds.")),
        handovers(metrics.counter("concord_disaggregated_prefills_total",
                                  "Prompts the prefill worker ran and handed over (--disaggregate).")),
        handover_bytes(metrics.counter("concord_handover_bytes_total",
                                       "Bytes of KV rows handed from the prefill worker to the engine (--disaggregate).")) {
    context = options.engine.max_context > 0 ? options.engine.max_context
                                             : served.model.config().max_position_embeddings;
    if (options.drafter) engine.set_drafter(options.drafter, options.speculation);
    if (options.disaggregate) {
      if (options.prefix_cache_bytes <= 0) options.prefix_cache_bytes = int64_t{1} << 30;
      prefill_model = std::make_unique<model::Model>(served.model.twin());
      prefill_model->prepare_weights();
    }
    if (options.prefix_cache_bytes > 0) engine.set_prefix_cache(make_prefix_cache());
    if (served.model.expert_pager()) {
      pager_metrics = std::make_unique<PagerMetrics>(PagerMetrics{
          metrics.gauge("concord_expert_cap_bytes", "The memory cap on expert blocks (--memory-cap)."),
          metrics.gauge("concord_expert_held_bytes", "Bytes of expert blocks held (reads in flight included)."),
          metrics.gauge("concord_expert_held_high_water_bytes", "The most bytes of expert blocks held at once."),
          metrics.counter("concord_expert_uses_total", "Experts computed by MoE layers (--memory-cap)."),
          metrics.counter("concord_expert_hits_total", "Experts computed that were resident when a layer asked."),
          metrics.counter("concord_expert_reads_total", "Experts read from the model file (--memory-cap)."),
          metrics.counter("concord_expert_read_bytes_total", "Packed bytes of the experts read from the model file."),
          metrics.counter("concord_expert_evictions_total", "Experts evicted to make room under the cap."),
          metrics.counter("concord_expert_stall_seconds_total", "Seconds MoE layers waited for an expert's read."),
          {}});
      update_pager_metrics();
    }
  }

  // ---- metrics, connections (server.cpp)
  void count(const std::string& endpoint, int status);
  Clock::duration receive_timeout() const;
  static std::string peer_key(const std::string& ip, int port) {
    return fmt::format("{}:{}", ip, port);
  }
  // A request's headers arrived: its connection is busy until the response is written.
  void connection_busy(const std::string& key);
  // The response went out (or is about to, bounded by the write timeout): the next request's
  // headers get a new deadline.
  void connection_idle(const std::string& key, Clock::duration extra = {});
  // cpp-httplib 0.11 bounds only the silence between reads: a client trickling a header byte now
  // and then holds its thread forever. The watchdog gives every connection's headers
  // --receive-timeout seconds (from when it is first seen, or from the previous response) and
  // shuts down the socket of one that is not done by then and that a thread is reading (nothing
  // left unread in its socket buffer), which ends that read at once.
  void run_watchdog();

  // ---- the scheduler thread (server_scheduler.cpp)
  void push_piece(Job& job, openai::ChunkPiece piece);
  void on_token(const TokenEvent& ev);
  // A choice whose engine request finished (stop token, length, context, or cancelled by its
  // stop string): flush its text, set its finish reason.
  void finalize(Job& job, size_t index, Completion completion);
  void finish_job(Job& job, std::optional<ApiError> error);
  // Ends every unfinished choice of a job now (client gone, deadline passed).
  void abort_job(Job& job, std::optional<ApiError> error);
  void admit(const std::shared_ptr<Job>& job);
  // A verified update is pending: abort running jobs when asked, and once none runs, swap it in.
  void serve_swap_request();
  void run_scheduler();

  // ---- weight updates (server_weights.cpp)
  // GET /v1/weights's body for the model now serving (its hashes computed from the copies the
  // kernels read); called before the server starts and by the scheduler after a swap.
  std::string make_weights_info() const;
  void handle_weights_post(const httplib::Request& req, httplib::Response& res,
                           const httplib::ContentReader& reader);

  // ---- HTTP threads (server_http.cpp)
  static void send_error(httplib::Response& res, const ApiError& e);
  // The tokenized prompt of a validated request, checked against the vocabulary and context.
  std::vector<int32_t> prompt_of(const openai::GenerationRequest& r, std::string& echo_text) const;
  std::shared_ptr<Job> make_job(const openai::GenerationRequest& r, const std::string& path);
  // Queue a job, or 429 when its choices do not fit the queue.
  void enqueue(const std::shared_ptr<Job>& job);
  void request_cancel(Job& job);
  void response_done();
  openai::TokenText names(const Job& job) const;
  // The non-streaming body of a finished job.
  json final_response(const Job& job) const;
  void handle_generation(openai::Endpoint endpoint, const std::string& path,
                         const httplib::Request& req, httplib::Response& res,
                         const httplib::ContentReader& reader);
  void stream_response(const std::shared_ptr<Job>& job, const std::string& connection,
                       httplib::Response& res);
  bool authorized(const httplib::Request& req) const;
  static std::string endpoint_label(const std::string& path);
  void setup_routes();
};

}  // namespace concord::serve
