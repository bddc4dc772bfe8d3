// concord serve: weight updates — POST /v1/weights stages a versioned sync payload, checks it with
// the seven sync checks (rl/sync.h) beside the running engine, and hands it to the scheduler,
// which swaps it in between steps once the running requests are done; GET /v1/weights reports
// what is served (server_impl.h, docs/serve.md "Weight updates").
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>

#include "concord/serve/server_impl.h"

namespace concord::serve {

using namespace server_detail;

namespace {

ApiError weights_error(int status, std::string code, std::string message, std::string param = "") {
  return ApiError(status, "invalid_request_error", std::move(code), std::move(message), std::move(param));
}

bool loopback(const std::string& ip) {
  return ip == "::1" || ip.rfind("127.", 0) == 0 || ip.rfind("::ffff:127.", 0) == 0;
}

uint64_t parse_version(const std::string& text) {
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v == 0)
    throw weights_error(400, "invalid_version",
                        fmt::format("version '{}' is not a positive integer", text), "version");
  return v;
}

// A POSIX shared-memory segment the trainer wrote, mapped read-only for as long as it lives.
class SharedSegment {
 public:
  explicit SharedSegment(const std::string& name) : name_(name) {
    if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos || name.size() > 255)
      throw weights_error(400, "invalid_shm",
                          fmt::format("shared-memory name '{}' must be '/' followed by a name without '/' "
                                      "(at most 255 characters)", name), "shm");
    const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
    if (fd < 0)
      throw weights_error(400, "invalid_shm",
                          fmt::format("cannot open shared memory '{}': {}", name, std::strerror(errno)), "shm");
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
      const int err = errno;
      ::close(fd);
      throw weights_error(400, "invalid_shm",
                          fmt::format("shared memory '{}' is empty or cannot be read ({})", name,
                                      st.st_size <= 0 ? "size 0" : std::strerror(err)), "shm");
    }
    size_ = static_cast<size_t>(st.st_size);
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED)
      throw weights_error(400, "invalid_shm", fmt::format("cannot map shared memory '{}': {}", name,
                                                          std::strerror(errno)), "shm");
    data_ = static_cast<const uint8_t*>(p);
  }
  ~SharedSegment() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  std::string name_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

std::vector<uint8_t> read_whole_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw weights_error(400, "invalid_path", fmt::format("'{}' is not a readable file", path), "path");
  std::ifstream in(path, std::ios::binary);
  const auto size = std::filesystem::file_size(path, ec);
  if (!in || ec)
    throw weights_error(400, "invalid_path", fmt::format("cannot read '{}': {}", path, std::strerror(errno)), "path");
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size))
    throw weights_error(400, "invalid_path", fmt::format("cannot read '{}': it changed while read", path), "path");
  return bytes;
}

// 409 with the failed check: {"error": {..., "code": "check_N_NAME", "check": N}, "report": ...}.
json check_failure(const rl::CheckOutcome& failed, const rl::SyncReport& report) {
  return {{"error",
           {{"message", failed.message},
            {"type", "sync_check_failed"},
            {"param", nullptr},
            {"code", fmt::format("check_{}_{}", static_cast<int>(failed.check), rl::sync_check_name(failed.check))},
            {"check", static_cast<int>(failed.check)}}},
          {"report", report.to_json()}};
}

constexpr const char* kNativeNotUpdatable =
    "this server serves the model file's quantized blocks as stored (--policy native): weight updates "
    "install fp32 values, so start it with a precision policy (--policy bf16, fp32, mxfp8, ...)";

}  // namespace

constexpr const char* kExpertParallelNotUpdatable =
    "this server runs expert-parallel (--expert-parallel): each rank holds its experts' weights, and the other "
    "ranks would keep the old ones; restart the job with the new weights";

std::string Server::Impl::make_weights_info() const {
  if (served.model.has_stored_weights()) {  // --policy native on a GGUF: no fp32 values to update
    return openai::dump(json{{"object", "weights"},
                             {"version", 0},
                             {"policy", served.model.policy().name},
                             {"config", served.model.config().to_json()},
                             {"updatable", false},
                             {"reason", kNativeNotUpdatable}});
  }
  if (options.mirror) {  // expert parallel: this rank holds only its experts' weights
    return openai::dump(json{{"object", "weights"},
                             {"version", 0},
                             {"policy", served.model.policy().name},
                             {"config", served.model.config().to_json()},
                             {"updatable", false},
                             {"reason", kExpertParallelNotUpdatable}});
  }
  json info = rl::served_weights_json(served.model);
  info["updatable"] = true;
  info["object"] = "weights";
  info["version"] = static_cast<int64_t>(receiver.version());
  info["policy"] = served.model.policy().name;
  info["config"] = served.model.config().to_json();
  return openai::dump(info);
}

void Server::Impl::handle_weights_post(const httplib::Request& req, httplib::Response& res,
                                       const httplib::ContentReader& reader) {
  const std::string content_type = req.get_header_value("Content-Type");
  const bool inline_payload = content_type.rfind("application/octet-stream", 0) == 0;
  const int64_t limit = inline_payload ? options.max_weights_body_bytes : options.max_body_bytes;
  std::string body;
  bool too_large = false, too_slow = false;
  // An inline payload may be large: its own deadline grows with it (1 s per 64 MiB on top).
  const auto deadline = Clock::now() + receive_timeout() +
                        std::chrono::seconds(inline_payload ? options.max_weights_body_bytes >> 26 : 0);
  const bool read = reader([&](const char* data, size_t size) {
    if (Clock::now() > deadline) {
      too_slow = true;
      return false;
    }
    if (body.size() + size > static_cast<size_t>(limit)) {
      too_large = true;
      return false;
    }
    body.append(data, size);
    return true;
  });
  if (too_large) {
    res.set_header("Connection", "close");
    throw ApiError(413, "invalid_request_error", "payload_too_large",
                   fmt::format("the request body is larger than {} ({} bytes)",
                               inline_payload ? "--max-weights-body-bytes" : "--max-body-bytes", limit));
  }
  if (too_slow) {
    res.set_header("Connection", "close");
    throw ApiError(408, "invalid_request_error", "receive_timeout", "the request body did not arrive in time");
  }
  if (!read) throw openai::invalid_request("invalid_body", "the request body could not be read");
  if (!authorized(req)) {
    res.set_header("WWW-Authenticate", "Bearer");
    throw ApiError(401, "authentication_error", "invalid_api_key",
                   "missing or wrong API key: send 'Authorization: Bearer KEY' (--api-key)");
  }
  if (!options.weights_from_any_host && !loopback(req.remote_addr))
    throw ApiError(403, "permission_error", "weights_from_remote_host",
                   fmt::format("weight updates are accepted from loopback only (this came from {}; "
                               "--weights-from-any-host allows others)", req.remote_addr));
  if (draining.load()) throw ApiError(503, "server_error", "draining", "the server is shutting down");
  if (served.model.has_stored_weights()) throw ApiError(409, "conflict_error", "not_updatable", kNativeNotUpdatable);
  if (options.mirror) throw ApiError(409, "conflict_error", "not_updatable", kExpertParallelNotUpdatable);

  // What to stage: the payload's bytes, where they come from, and the options.
  uint64_t version = 0;
  bool abort_running = false;
  rl::Fault fault = rl::Fault::none;
  std::optional<SharedSegment> segment;
  std::vector<uint8_t> owned;
  std::span<const uint8_t> payload;
  std::string fault_name;
  if (inline_payload) {
    if (!req.has_param("version"))
      throw weights_error(400, "missing_version", "an application/octet-stream payload needs ?version=N", "version");
    version = parse_version(req.get_param_value("version"));
    const std::string abort = req.has_param("abort_running") ? req.get_param_value("abort_running") : "false";
    if (abort != "true" && abort != "false")
      throw weights_error(400, "invalid_abort_running", "abort_running must be true or false", "abort_running");
    abort_running = abort == "true";
    if (req.has_param("fault")) fault_name = req.get_param_value("fault");
    payload = {reinterpret_cast<const uint8_t*>(body.data()), body.size()};
  } else {
    json j;
    try {
      j = json::parse(body);
    } catch (const json::exception& e) {
      throw weights_error(400, "invalid_json",
                          fmt::format("the body is not JSON ({}); send {{\"version\": N, \"path\" | \"shm\": ...}} "
                                      "or the payload as application/octet-stream", e.what()));
    }
    if (!j.is_object()) throw weights_error(400, "invalid_json", "the body must be a JSON object");
    for (const auto& [key, value] : j.items())
      if (key != "version" && key != "path" && key != "shm" && key != "abort_running" && key != "fault")
        throw weights_error(400, "unknown_field",
                            fmt::format("unknown field '{}' (version, path, shm, abort_running, fault)", key), key);
    if (!j.contains("version") || !j["version"].is_number_unsigned() || j["version"].get<uint64_t>() == 0)
      throw weights_error(400, "invalid_version", "\"version\" must be a positive integer", "version");
    version = j["version"].get<uint64_t>();
    if (j.contains("abort_running")) {
      if (!j["abort_running"].is_boolean())
        throw weights_error(400, "invalid_abort_running", "\"abort_running\" must be true or false", "abort_running");
      abort_running = j["abort_running"].get<bool>();
    }
    if (j.contains("fault")) {
      if (!j["fault"].is_string()) throw weights_error(400, "invalid_fault", "\"fault\" must be a string", "fault");
      fault_name = j["fault"].get<std::string>();
    }
    const bool has_path = j.contains("path"), has_shm = j.contains("shm");
    if (has_path == has_shm)
      throw weights_error(400, "missing_source",
                          "give exactly one of \"path\" (a safetensors sync payload on this machine) and "
                          "\"shm\" (a POSIX shared-memory segment holding one)");
    const char* key = has_path ? "path" : "shm";
    if (!j[key].is_string()) throw weights_error(400, "invalid_source", fmt::format("\"{}\" must be a string", key), key);
    if (has_path) {
      owned = read_whole_file(j["path"].get<std::string>());
      payload = owned;
    } else {
      segment.emplace(j["shm"].get<std::string>());
      payload = segment->bytes();
    }
  }
  if (!fault_name.empty()) {
    if (!options.weights_faults)
      throw weights_error(400, "faults_off", "fault injection is off (concord serve --weights-faults)", "fault");
    try {
      fault = rl::fault_from_name(fault_name);
    } catch (const InputError& e) {
      throw weights_error(400, "invalid_fault", e.what(), "fault");
    }
    if (rl::learner_side(fault))
      throw weights_error(400, "invalid_fault",
                          fmt::format("fault {} happens on the learner's side: put it into the payload", fault_name),
                          "fault");
  }

  std::unique_lock staging(weights_mu, std::try_to_lock);
  if (!staging.owns_lock())
    throw ApiError(409, "conflict_error", "update_in_progress",
                   "another weight update is being staged; send the next one when it is answered");
  const auto t0 = Clock::now();
  rl::SyncReport report;
  {
    std::lock_guard lk(mu);
    if (static_cast<int64_t>(version) <= weights_version) {
      // Check 1 as the receiver words it, for a version that is not newer.
      report.version = version;
      report.serving = static_cast<uint64_t>(weights_version);
      report.checks.push_back({rl::SyncCheck::version, false,
                               rl::sync_check_message(rl::SyncCheck::version,
                                                      fmt::format("version {} is not newer than the serving "
                                                                  "version {}", version, weights_version)),
                               0.0});
    }
  }
  if (report.checks.empty()) report = receiver.verify(payload, version, fault);
  segment.reset();  // the staging model holds the values now
  if (const auto failed = report.failure()) {
    weight_updates_refused.inc();
    res.status = 409;
    res.set_content(openai::dump(check_failure(*failed, report)), "application/json");
    return;
  }
  // Verified: the scheduler swaps it in between steps, once the running requests are done.
  SwapRequest request;
  request.report = &report;
  request.abort_running = abort_running;
  const auto t_wait = Clock::now();
  {
    std::unique_lock lk(mu);
    swap_request = &request;
    work_cv.notify_all();
    swap_cv.wait(lk, [&] { return request.done; });
  }
  if (!request.error.empty()) {
    weight_updates_refused.inc();
    throw ApiError(500, "server_error", "internal_error", fmt::format("the swap failed: {}", request.error));
  }
  weight_updates_applied.inc();
  json out = {{"object", "weights"},
              {"version", version},
              {"applied", true},
              {"seconds", seconds_between(t0, Clock::now())},
              {"seconds_drain", seconds_between(t_wait, Clock::now()) - report.seconds_swap},
              {"report", report.to_json()}};
  res.status = 200;
  res.set_content(openai::dump(out), "application/json");
}

}  // namespace concord::serve
