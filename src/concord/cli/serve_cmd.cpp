// `concord serve`: load a model and serve it over the OpenAI HTTP API (docs/serve.md) until
// SIGTERM / SIGINT, which drain the running requests before exiting 0.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "concord/cli/commands.h"
#include "concord/cli/draft.h"
#include "concord/cli/expert_cap.h"
#include "concord/cli/expert_parallel.h"
#include "concord/cli/flags.h"
#include "concord/model/files.h"
#include "concord/numerics/check.h"
#include "concord/rl/channel.h"
#include "concord/serve/engine_mirror.h"
#include "concord/serve/server.h"

namespace concord::cli {
namespace {

// The signal handler only writes to this pipe (async-signal-safe); a watcher thread reads it and
// starts the drain. A second signal exits at once.
int g_signal_pipe[2] = {-1, -1};
volatile std::sig_atomic_t g_signals = 0;

void on_signal(int) {
  g_signals = g_signals + 1;
  if (g_signals > 1) ::_exit(1);
  const char byte = 1;
  const ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  static_cast<void>(n);
}

void install_signal_handlers() {
  if (::pipe(g_signal_pipe) != 0) throw InputError("[serve] cannot create the signal pipe");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
}

std::string default_model_name(const std::filesystem::path& path) {
  std::filesystem::path p = path;
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "dir/" -> "dir"
  return std::filesystem::is_directory(p) ? p.filename().string() : p.stem().string();
}

struct ServeArgs {
  std::string model, model_name, host = "127.0.0.1", policy = "native", api_key, prefix_cache_dir,
      activation_arena = "planned";
  DraftArgs draft;
  int64_t port = 8000, max_sequences = 8, prefill_chunk = 512, max_context = 0, max_queue = 256,
          max_body_bytes = 1 << 20, read_timeout = 10, write_timeout = 10, http_threads = 0,
          max_weights_body_bytes = int64_t{1} << 30, prefix_cache_bytes = 0, prefix_cache_block = 0;
  double request_timeout = 600, receive_timeout = 30;
  bool weights_from_any_host = false, weights_faults = false, disaggregate = false, expert_parallel = false;
  ExpertCapArgs cap;
};

// The server of rank 0 (or of the one process) until SIGTERM / SIGINT drains it.
void run_server(const ServeArgs& args, model::LoadedModel& loaded, const serve::ServerOptions& options);

}  // namespace

void add_serve_command(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "Serve a model folder or GGUF file over the OpenAI HTTP API (/v1/completions, "
      "/v1/chat/completions with streaming, /v1/models, /health, /metrics) with continuous "
      "batching, and take versioned weight updates from a trainer (POST/GET /v1/weights, checked "
      "by the seven sync checks); SIGTERM/SIGINT drain running requests, then exit 0 "
      "(docs/serve.md).");
  cmd->add_option("--model", a->model, "model folder or .gguf file")->required();
  cmd->add_option(
      "--model-name", a->model_name,
      "model id clients send and /v1/models lists (default: the file's stem or folder name)");
  cmd->add_option("--host", a->host, "address to bind (default 127.0.0.1: loopback only)");
  add_integer_flag(cmd, "--port", a->port, between(0, 65535),
                   "TCP port (0: any free port; default 8000)");
  cmd->add_option("--policy", a->policy,
                  "native (default: a GGUF's Q4_0/Q4_1/Q8_0 weights served as stored), a precision "
                  "preset (fp32, bf16, mxfp8, fp8-tensor, nvfp4, mxfp4), or a policy JSON");
  add_integer_flag(cmd, "--max-sequences", a->max_sequences, between(1, 4096),
                   "KV-cache slots: sequences decoded together (default 8)");
  add_integer_flag(cmd, "--prefill-chunk", a->prefill_chunk, at_least(1),
                   "prompt tokens of one sequence per forward pass (default 512)");
  add_integer_flag(
      cmd, "--max-context", a->max_context, at_least(0),
      "prompt + generated tokens per sequence (default 0: the model's max_position_embeddings)");
  add_integer_flag(cmd, "--max-queue", a->max_queue, between(1, 1'000'000),
                   "choices waiting for a slot; more: 429 with Retry-After (default 256)");
  add_integer_flag(cmd, "--max-body-bytes", a->max_body_bytes, between(1, int64_t{1} << 32),
                   "largest request body; larger: 413 (default 1048576)");
  add_real_flag(cmd, "--request-timeout", a->request_timeout, non_negative(),
                "seconds from arrival to the end of a request; then it is cancelled (504) "
                "(0: no limit; default 600)");
  add_integer_flag(cmd, "--read-timeout", a->read_timeout, between(1, 3600),
                   "seconds a client may stay silent while sending a request (default 10)");
  add_real_flag(cmd, "--receive-timeout", a->receive_timeout, positive(),
                "seconds within which a request's headers, and then its body, must arrive, however "
                "slowly they trickle (default 30)");
  add_integer_flag(cmd, "--write-timeout", a->write_timeout, between(1, 3600),
                   "seconds a write may block on a client that does not read (default 10)");
  add_integer_flag(cmd, "--http-threads", a->http_threads, between(0, 65536),
                   "HTTP worker threads (default 0: max-sequences + max-queue + 64)");
  cmd->add_option(
      "--api-key", a->api_key,
      "require 'Authorization: Bearer KEY' on /v1/* (default: $CONCORD_API_KEY, else none)");
  add_integer_flag(cmd, "--max-weights-body-bytes", a->max_weights_body_bytes, between(1, int64_t{1} << 40),
                   "largest weight payload sent in a POST /v1/weights body (a file path or "
                   "shared-memory segment has no limit; default 1073741824)");
  add_integer_flag(cmd, "--prefix-cache-bytes", a->prefix_cache_bytes, between(0, int64_t{1} << 40),
                   "keep the KV rows of prompt prefixes, up to this many bytes, so that a prompt sharing a "
                   "stored prefix (a repeated prompt, a common system prompt) skips its prefill; responses "
                   "are unchanged bit for bit (default 0: off)");
  add_integer_flag(cmd, "--prefix-cache-block", a->prefix_cache_block, between(0, 1 << 20),
                   "prefix-cache block in tokens (default 0: 64, or --prefill-chunk under NVFP4 / per-tensor "
                   "FP8 activations, where a block must be whole chunks)");
  cmd->add_option("--prefix-cache-dir", a->prefix_cache_dir,
                  "also keep the prefix cache's snapshots as files in this folder (per model; they outlive the "
                  "server); turns the cache on (256 MiB in memory unless --prefix-cache-bytes)");
  cmd->add_flag("--disaggregate", a->disaggregate,
                "prefill each prompt on a prefill worker (a thread with an engine of its own on a twin of the "
                "model) and hand its KV rows to the decode engine, so a long prompt does not stall the running "
                "requests' decode steps; responses unchanged bit for bit; turns the prefix cache on (1 GiB unless "
                "--prefix-cache-bytes). docs/serve.md, disaggregated prefill and decode");
  cmd->add_flag("--expert-parallel", a->expert_parallel,
                "an MoE model under mpirun -np R: each rank computes R-th of every MoE layer's experts; rank 0 "
                "serves HTTP and the other ranks mirror its engine step by step, so responses are the one-process "
                "server's bit for bit (docs/moe.md); not with the prefix cache, --disaggregate, a draft model or "
                "weight updates");
  cmd->add_flag("--weights-from-any-host", a->weights_from_any_host,
                "accept POST /v1/weights from any peer (default: loopback only)");
  cmd->add_flag("--weights-faults", a->weights_faults,
                "honour a weight update's \"fault\" (the sampler-side sync faults of concord rl "
                "--fault; for testing the checks)");
  cmd->add_option("--activation-arena", a->activation_arena,
                  "where a step's activations live: planned (default: the memory scheduler's plan of the step, "
                  "one reused arena of the largest plan's size; docs/sched.md) or bump (forward_cached's bump "
                  "allocator); the same tokens bit for bit; MoE models (and adaptive exit) run bump");
  add_expert_cap_flags(cmd, a->cap, "responses");
  add_draft_flags(cmd, a->draft, false);
  cmd->callback([a]() {
    a->draft.check("serve");
    a->cap.check("serve", a->policy);
    if (a->cap.memory_cap && a->disaggregate)
      throw InputError("[serve] --memory-cap with --disaggregate: the prefill worker would need a second pager (one pass at "
                       "a time reads the experts); choose one");
    const serve::ActivationArena arena = serve::activation_arena_from_name(a->activation_arena);
    serve::ServerOptions options;
    options.host = a->host;
    options.port = static_cast<int>(a->port);
    options.policy_name = a->policy;
    options.engine.max_sequences = a->max_sequences;
    options.engine.prefill_chunk = a->prefill_chunk;
    options.engine.max_context = a->max_context;
    options.engine.activation_arena = arena;
    options.max_queue = a->max_queue;
    options.max_body_bytes = a->max_body_bytes;
    options.max_weights_body_bytes = a->max_weights_body_bytes;
    options.weights_from_any_host = a->weights_from_any_host;
    options.weights_faults = a->weights_faults;
    options.prefix_cache_bytes = a->prefix_cache_bytes;
    options.prefix_cache_block = a->prefix_cache_block;
    options.prefix_cache_dir = a->prefix_cache_dir;
    options.disaggregate = a->disaggregate;
    options.request_timeout_seconds = a->request_timeout;
    options.read_timeout_seconds = static_cast<int>(a->read_timeout);
    options.write_timeout_seconds = static_cast<int>(a->write_timeout);
    options.receive_timeout_seconds = a->receive_timeout;
    options.http_threads = a->http_threads;
    options.api_key = a->api_key;
    if (options.api_key.empty())
      if (const char* env = std::getenv("CONCORD_API_KEY")) options.api_key = env;
    options.model_name = a->model_name.empty() ? default_model_name(a->model) : a->model_name;

    // Load and prepare every weight before listening (as generate does).
    model::LoadedModel loaded = a->cap.load(a->model, a->policy);
    loaded.model.prepare_weights();
    if (!loaded.source.tokenizer)
      throw InputError(fmt::format("[serve] {}: the model has no tokenizer", a->model));
    const int64_t max_position = loaded.model.config().max_position_embeddings;
    if (options.engine.max_context > max_position)
      throw InputError(
          fmt::format("[serve] --max-context {} exceeds the model's max_position_embeddings ({})",
                      options.engine.max_context, max_position));
    options.policy_name = loaded.model.policy().name;
    if (!a->draft.spec.empty()) {
      const int64_t capacity = options.engine.max_context > 0 ? options.engine.max_context : max_position;
      options.drafter = make_drafter(a->draft, loaded, a->model, options.engine.max_sequences, capacity);
      options.speculation = a->draft.options();
      // A drafter built from the served weights follows a weight update (POST /v1/weights).
      if (a->draft.spec.rfind("self:", 0) == 0) {
        const int64_t sequences = options.engine.max_sequences;
        options.remake_drafter = [a, &loaded, sequences, capacity] {
          return make_drafter(a->draft, loaded, a->model, sequences, capacity);
        };
      }
    }

    if (a->expert_parallel) {
      if (a->cap.memory_cap) throw InputError("[serve] --expert-parallel with --memory-cap: choose one");
      if (!loaded.model.config().moe())
        throw InputError(fmt::format("[serve] --expert-parallel: {} is a {}, which has no experts", a->model,
                                     loaded.model.config().architecture));
      if (options.prefix_cache_bytes > 0 || !options.prefix_cache_dir.empty() || options.disaggregate || options.drafter)
        throw InputError("[serve] --expert-parallel mirrors the engine's steps on every rank: not with the prefix cache, "
                         "--disaggregate or a draft model");
      auto ep = rl::make_mpi_expert_parallel();
      const int64_t all_experts = loaded.model.expert_bytes_held();
      hold_own_experts(loaded.model, *ep, false);  // a file's stored blocks: every expert stays
      loaded.model.set_expert_parallel(ep);
      const std::vector<double> held =
          rl::mpi_gather_doubles(std::vector<double>{static_cast<double>(loaded.model.expert_bytes_held())});
      if (ep->rank == 0) {
        std::string per_rank;
        for (size_t q = 0; q < held.size(); ++q) per_rank += fmt::format("{}{:.0f}", q ? ", " : "", held[q] / 1024.0);
        std::fprintf(stderr, "[serve] expert parallel: %d ranks; expert weights held per rank: %s KiB of %.0f\n",
                     ep->ranks, per_rank.c_str(), static_cast<double>(all_experts) / 1024.0);
      }
      if (ep->rank != 0) {
        // A mirror of rank 0's engine: no HTTP; rank 0 ends the job (a signal here is ignored: mpirun
        // forwards SIGTERM to every rank, and rank 0 drains, then sends the stop).
        std::signal(SIGTERM, SIG_IGN);
        std::signal(SIGINT, SIG_IGN);
        serve::Engine engine(loaded.model, options.engine);
        try {
          (void)serve::follow_engine(engine, [] {
            std::vector<uint8_t> bytes;
            rl::mpi_broadcast_bytes(bytes);
            return bytes;
          });
        } catch (const std::exception& e) {
          std::fprintf(stderr, "concord: [serve] rank %d: %s\n", ep->rank, e.what());
          rl::mpi_abort(2);
        }
        return;
      }
      options.mirror = [](std::vector<uint8_t> bytes) {
        try {
          rl::mpi_broadcast_bytes(bytes);
        } catch (const std::exception& e) {  // the other ranks cannot follow any more: end the job
          std::fprintf(stderr, "concord: [serve] rank 0: %s\n", e.what());
          rl::mpi_abort(2);
        }
      };
    }
    if (options.mirror) {  // rank 0 of an expert-parallel job: an error ends every rank (they wait for it)
      try {
        run_server(*a, loaded, options);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "concord: %s\n", e.what());
        rl::mpi_abort(2);
      }
      return;
    }
    run_server(*a, loaded, options);
  });
}

namespace {

void run_server(const ServeArgs& args, model::LoadedModel& loaded, const serve::ServerOptions& options) {
    const ServeArgs* a = &args;
    serve::Server server({loaded.model, *loaded.source.tokenizer, loaded.source.chat_template,
                          loaded.source.stop_token_ids},
                         options);
    install_signal_handlers();
    const int port = server.start();
    std::fprintf(stderr,
                 "[serve] listening on http://%s:%d (model %s, policy %s, max-sequences %lld%s)\n",
                 options.host.c_str(), port, options.model_name.c_str(),
                 options.policy_name.c_str(), static_cast<long long>(options.engine.max_sequences),
                 a->draft.spec.empty() ? "" : fmt::format(", draft {} x{}", a->draft.spec, a->draft.tokens).c_str());
    std::fflush(stderr);

    std::thread watcher([&server] {
      char byte = 0;
      while (::read(g_signal_pipe[0], &byte, 1) < 0 && errno == EINTR) {
      }
      std::fprintf(stderr, "[serve] draining: finishing running and queued requests\n");
      server.shutdown();
    });
    // Every response is written once wait() returns; idle keep-alive connections need not be
    // waited for (up to the keep-alive timeout): exit without them.
    const bool clean = server.wait(0.5);
    std::fprintf(stderr, "[serve] stopped\n");
    std::fflush(stderr);
    if (!clean) {  // a connection thread still trickles: do not destroy the server
      if (options.mirror) std::exit(0);  // MPI_Finalize at exit (the other ranks wait in it)
      std::_Exit(0);
    }
    watcher.join();
}

}  // namespace

}  // namespace concord::cli
