// concord serve: the Server API, metrics and the connection watchdog (server.h, server_impl.h).
#include "concord/serve/server_impl.h"

namespace concord::serve {

namespace server_detail {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The two ends of a connected TCP socket: the peer's address and port, and the local port.
bool socket_ends(int fd, std::string& peer_ip, int& peer_port, int& local_port) {
  sockaddr_storage peer{}, local{};
  socklen_t peer_len = sizeof(peer), local_len = sizeof(local);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) return false;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0) return false;
  char ip[INET6_ADDRSTRLEN] = {};
  if (peer.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&peer);
    ::inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
    peer_port = ntohs(a->sin_port);
    local_port = ntohs(reinterpret_cast<const sockaddr_in*>(&local)->sin_port);
  } else if (peer.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&peer);
    ::inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
    peer_port = ntohs(a->sin6_port);
    local_port = ntohs(reinterpret_cast<const sockaddr_in6*>(&local)->sin6_port);
  } else {
    return false;
  }
  peer_ip = ip;
  return true;
}

// Calls fn(fd, peer_ip, peer_port) for every connected TCP socket of this process whose local
// port is `local_port` (httplib does not hand sockets to handlers; /proc/self/fd lists them).
template <class Fn>
void for_each_connection(int local_port, Fn&& fn) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    std::string ip;
    int peer_port = -1, port = -1;
    if (socket_ends(fd, ip, peer_port, port) && port == local_port) fn(fd, ip, peer_port);
  }
}

// The connected socket of a request, found by its peer address: a non-streaming handler watches
// it to cancel the request when the client leaves.
int find_connection_socket(const httplib::Request& req, int server_port) {
  int found = -1;
  for_each_connection(server_port, [&](int fd, const std::string& ip, int peer_port) {
    if (found < 0 && peer_port == req.remote_port && ip == req.remote_addr) found = fd;
  });
  return found;
}

// The peer closed its end (EOF on a peek); data waiting or nothing yet means it is still there.
bool peer_closed(int fd) {
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

std::string random_hex(std::mt19937_64& rng) { return fmt::format("{:016x}", rng()); }

}  // namespace server_detail

using namespace server_detail;

void Server::Impl::count(const std::string& endpoint, int status) {
  metrics
      .counter("concord_requests_total", "HTTP requests answered, by endpoint and status.",
               {{"endpoint", endpoint}, {"status", std::to_string(status)}})
      .inc();
}

Clock::duration Server::Impl::receive_timeout() const {
  return std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options.receive_timeout_seconds));
}

// A request's headers arrived: its connection is busy until the response is written.
void Server::Impl::connection_busy(const std::string& key) {
  std::lock_guard lk(connections_mu);
  connections[key].busy = true;
}

// The response went out (or is about to, bounded by the write timeout): the next request's
// headers get a new deadline.
void Server::Impl::connection_idle(const std::string& key, Clock::duration extra) {
  std::lock_guard lk(connections_mu);
  const auto it = connections.find(key);
  if (it == connections.end()) return;
  it->second.busy = false;
  it->second.deadline = Clock::now() + receive_timeout() + extra;
}

// cpp-httplib 0.11 bounds only the silence between reads: a client trickling a header byte now
// and then holds its thread forever. The watchdog gives every connection's headers
// --receive-timeout seconds (from when it is first seen, or from the previous response) and
// shuts down the socket of one that is not done by then and that a thread is reading (nothing
// left unread in its socket buffer), which ends that read at once.
void Server::Impl::run_watchdog() {
  std::unique_lock lk(connections_mu);
  while (!stop_watchdog) {
    lk.unlock();
    std::map<std::string, int> open;  // this server's connected sockets now
    for_each_connection(bound_port, [&](int fd, const std::string& ip, int peer_port) {
      open[peer_key(ip, peer_port)] = fd;
    });
    const auto now = Clock::now();
    lk.lock();
    for (auto it = connections.begin(); it != connections.end();) {
      const auto o = open.find(it->first);
      if (o == open.end() && !it->second.busy) {
        it = connections.erase(it);  // closed
        continue;
      }
      if (o != open.end()) it->second.fd = o->second;
      ++it;
    }
    for (const auto& [key, fd] : open) {
      auto [it, fresh] = connections.try_emplace(key);
      if (fresh) it->second = {fd, now + receive_timeout(), false};
    }
    for (auto& [key, c] : connections) {
      if (c.busy || c.fd < 0 || now <= c.deadline) continue;
      // Bytes waiting unread: no thread is reading this connection yet (it waits in the pool's
      // queue behind others); its deadline only matters once one does.
      int unread = 0;
      if (::ioctl(c.fd, FIONREAD, &unread) == 0 && unread > 0) continue;
      std::string ip;
      int peer_port = -1, local_port = -1;
      if (socket_ends(c.fd, ip, peer_port, local_port) && peer_key(ip, peer_port) == key)
        ::shutdown(c.fd, SHUT_RDWR);  // the HTTP thread's read fails; it closes the socket
      c.deadline = now + std::chrono::hours(24);  // once
    }
    watchdog_cv.wait_for(lk, std::chrono::milliseconds(250), [&] { return stop_watchdog; });
  }
}

Server::Server(ServedModel served, ServerOptions options) {
  auto positive = [](int64_t v, const char* flag) {
    if (v < 1) throw InputError(fmt::format("[serve] {} must be at least 1, not {}", flag, v));
  };
  positive(options.engine.max_sequences, "--max-sequences");
  positive(options.engine.prefill_chunk, "--prefill-chunk");
  positive(options.max_queue, "--max-queue");
  positive(options.max_body_bytes, "--max-body-bytes");
  positive(options.max_weights_body_bytes, "--max-weights-body-bytes");
  positive(options.read_timeout_seconds, "--read-timeout");
  positive(options.write_timeout_seconds, "--write-timeout");
  if (!(options.receive_timeout_seconds > 0))
    throw InputError("[serve] --receive-timeout must be > 0");
  if (options.port < 0 || options.port > 65535)
    throw InputError(fmt::format("[serve] --port must be in [0, 65535], not {}", options.port));
  if (!(options.request_timeout_seconds >= 0))
    throw InputError("[serve] --request-timeout must be >= 0 (0: no limit)");
  if (options.http_threads < 0)
    throw InputError("[serve] --http-threads must be >= 1 (0: default)");
  if (options.http_threads == 0)
    options.http_threads = options.engine.max_sequences + options.max_queue + 64;
  if (options.model_name.empty()) throw InputError("[serve] the model name must not be empty");
  if (options.prefix_cache_bytes < 0) throw InputError("[serve] --prefix-cache-bytes must be >= 0 (0: off)");
  if (!options.prefix_cache_dir.empty() && options.prefix_cache_bytes == 0)
    options.prefix_cache_bytes = int64_t{256} << 20;  // a directory turns the cache on
  if (options.prefix_cache_block < 0) throw InputError("[serve] --prefix-cache-block must be >= 0 (0: automatic)");
  if (options.disaggregate && served.model.config().recurrent())
    throw InputError("[serve] --disaggregate: a depth-recurrent model's state is not only KV rows; serve it "
                     "without a prefill worker");
  if (options.prefix_cache_bytes > 0 && served.model.config().recurrent())
    throw InputError("[serve] --prefix-cache-bytes: a depth-recurrent model's state is not only KV rows; "
                     "serve it without the prefix cache");
  if (options.mirror && (options.prefix_cache_bytes > 0 || options.disaggregate || options.drafter))
    throw InputError("[serve] --expert-parallel mirrors the engine's steps on every rank: not with the prefix cache, "
                     "--disaggregate or a draft model (their steps are not the mirrored ones)");
  impl_ = std::make_unique<Impl>(std::move(served), std::move(options));
}

Server::~Server() {
  if (impl_ && impl_->started && !impl_->waited) {
    shutdown();
    if (!wait()) {
      // A connection thread still runs inside the HTTP server: leave it allocated (the process
      // is exiting) rather than destroy what it uses.
      static_cast<void>(impl_.release());
    }
  }
}

int Server::start() {
  Impl& m = *impl_;
  CONCORD_CHECK(!m.started, "Server::start called twice");
  m.http = std::make_unique<HttpServer>();
  const auto threads = static_cast<size_t>(m.options.http_threads);
  m.http->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // httplib's own limit admits a weight payload; the other routes keep --max-body-bytes (the
  // pre-routing handler refuses a larger Content-Length before its body is read).
  m.http->set_payload_max_length(
      static_cast<size_t>(std::max(m.options.max_body_bytes, m.options.max_weights_body_bytes)));
  m.weights_info = m.make_weights_info();  // version 0: the weights as loaded
  m.http->set_read_timeout(m.options.read_timeout_seconds, 0);
  m.http->set_write_timeout(m.options.write_timeout_seconds, 0);
  m.http->set_keep_alive_timeout(std::min<time_t>(m.options.read_timeout_seconds, 5));
  m.http->set_keep_alive_max_count(1000);
  m.http->set_tcp_nodelay(true);
  m.setup_routes();
  int port = m.options.port;
  if (port == 0) {
    port = m.http->bind_to_any_port(m.options.host);
  } else if (!m.http->bind_to_port(m.options.host, port)) {
    port = -1;
  }
  if (port <= 0)
    throw InputError(
        fmt::format("[serve] cannot listen on {}:{} (address in use, or not an address "
                    "of this machine?)",
                    m.options.host, m.options.port));
  m.http->enlarge_backlog(1024);
  m.bound_port = port;
  m.started = true;
  m.started_unix = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  m.scheduler = std::thread([&m] { m.run_scheduler(); });
  m.watchdog = std::thread([&m] { m.run_watchdog(); });
  m.listener = std::thread([&m] {
    m.http->listen_after_bind();
    std::lock_guard lk(m.mu);
    m.listener_done = true;
    m.drained_cv.notify_all();
  });
  return port;
}

void Server::shutdown() {
  Impl& m = *impl_;
  m.draining.store(true);
  std::lock_guard lk(m.mu);
  m.work_cv.notify_all();
  m.drained_cv.notify_all();
}

bool Server::wait(double connection_grace_seconds) {
  Impl& m = *impl_;
  if (!m.started || m.waited) return true;
  {
    std::unique_lock lk(m.mu);
    m.drained_cv.wait(lk, [&] {
      return m.draining.load() && m.inbox.empty() && m.active_jobs == 0 && m.open_responses == 0;
    });
    m.stop_scheduler = true;
    m.work_cv.notify_all();
  }
  m.scheduler.join();
  {
    std::lock_guard lk(m.connections_mu);
    m.stop_watchdog = true;
    m.watchdog_cv.notify_all();
  }
  m.watchdog.join();
  m.http->stop();
  m.waited = true;
  // Connection threads end within a read timeout (or keep-alive timeout) of the stop.
  const auto limit = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
      connection_grace_seconds >= 0 ? connection_grace_seconds
                                    : m.options.read_timeout_seconds + 7.0));
  std::unique_lock lk(m.mu);
  if (!m.drained_cv.wait_for(lk, limit, [&] { return m.listener_done; })) {
    m.listener.detach();
    return false;
  }
  lk.unlock();
  m.listener.join();
  return true;
}

int Server::port() const { return impl_->bound_port; }
const ServerOptions& Server::options() const { return impl_->options; }
Metrics& Server::metrics() { return impl_->metrics; }
int64_t Server::context() const { return impl_->context; }

}  // namespace concord::serve
