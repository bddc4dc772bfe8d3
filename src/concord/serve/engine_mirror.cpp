// engine_mirror.h: the record of an engine's operations, its bytes, and the mirroring rank's loop.
#include "concord/serve/engine_mirror.h"

#include <cstring>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "concord/numerics/check.h"

namespace concord::serve {

namespace {

constexpr std::string_view kMagic = "CCDMIR01";

class Writer {
 public:
  template <class T>
  void put(T v) {
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
  }
  void tokens(const std::vector<int32_t>& t) {
    put<uint64_t>(t.size());
    for (int32_t x : t) put<int32_t>(x);
  }
  std::vector<uint8_t> out;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : bytes(b) {}
  template <class T>
  T get(const char* what) {
    if (bytes.size() - at < sizeof(T)) throw InputError(fmt::format("[mirror] a message cut short in {}", what));
    T v;
    std::memcpy(&v, bytes.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  std::vector<int32_t> tokens(const char* what) {
    const auto n = get<uint64_t>(what);
    if (n > (bytes.size() - at) / sizeof(int32_t)) throw InputError(fmt::format("[mirror] {} past the message's end", what));
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = get<int32_t>(what);
    return t;
  }
  std::span<const uint8_t> bytes;
  size_t at = 0;
};

}  // namespace

std::vector<uint8_t> encode_mirror(const MirrorMessage& m) {
  Writer w;
  w.out.assign(kMagic.begin(), kMagic.end());
  w.put<uint8_t>(m.stop ? 2 : 1);
  w.put<uint64_t>(m.ops.size());
  for (const EngineOp& op : m.ops) {
    w.put<uint8_t>(static_cast<uint8_t>(op.type));
    w.put<int64_t>(op.id);
    if (op.type != EngineOp::Type::submit) continue;
    const Request& r = op.request;
    w.tokens(r.prompt);
    w.put<float>(r.sampling.temperature);
    w.put<int32_t>(r.sampling.top_k);
    w.put<float>(r.sampling.top_p);
    w.put<float>(r.sampling.min_p);
    w.put<uint64_t>(r.sampling.seed);
    w.put<int64_t>(r.max_tokens);
    w.tokens(r.stop_tokens);
    w.put<uint8_t>(r.full_logprobs ? 1 : 0);
    w.put<int32_t>(r.top_logprobs);
    w.put<uint8_t>(r.prompt_logprobs ? 1 : 0);
  }
  return std::move(w.out);
}

MirrorMessage decode_mirror(std::span<const uint8_t> bytes) {
  if (bytes.size() < kMagic.size() || std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0)
    throw InputError("[mirror] not an engine mirror message (bad magic)");
  Reader in(bytes);
  in.at = kMagic.size();
  MirrorMessage m;
  const auto kind = in.get<uint8_t>("its kind");
  if (kind != 1 && kind != 2) throw InputError(fmt::format("[mirror] a message of unknown kind {}", kind));
  m.stop = kind == 2;
  const auto n = in.get<uint64_t>("its operation count");
  if (n > bytes.size()) throw InputError("[mirror] an operation count past the message's end");
  for (uint64_t i = 0; i < n; ++i) {
    EngineOp op;
    const auto type = in.get<uint8_t>("an operation");
    if (type != 1 && type != 2) throw InputError(fmt::format("[mirror] an operation of unknown type {}", type));
    op.type = static_cast<EngineOp::Type>(type);
    op.id = in.get<int64_t>("an operation's id");
    if (op.type == EngineOp::Type::submit) {
      Request& r = op.request;
      r.prompt = in.tokens("a prompt");
      r.sampling.temperature = in.get<float>("a request");
      r.sampling.top_k = in.get<int32_t>("a request");
      r.sampling.top_p = in.get<float>("a request");
      r.sampling.min_p = in.get<float>("a request");
      r.sampling.seed = in.get<uint64_t>("a request");
      r.max_tokens = in.get<int64_t>("a request");
      r.stop_tokens = in.tokens("a request's stop tokens");
      r.full_logprobs = in.get<uint8_t>("a request") != 0;
      r.top_logprobs = in.get<int32_t>("a request");
      r.prompt_logprobs = in.get<uint8_t>("a request") != 0;
    }
    m.ops.push_back(std::move(op));
  }
  if (in.at != bytes.size()) throw InputError("[mirror] trailing bytes after a message's operations");
  return m;
}

std::vector<uint8_t> EngineLog::take(bool stop) {
  pending_.stop = stop;
  std::vector<uint8_t> out = encode_mirror(pending_);
  pending_ = {};
  return out;
}

int64_t follow_engine(Engine& engine, const std::function<std::vector<uint8_t>()>& receive) {
  std::set<int64_t> live;
  int64_t steps = 0;
  while (true) {
    const MirrorMessage m = decode_mirror(receive());
    for (const EngineOp& op : m.ops) {
      if (op.type == EngineOp::Type::submit) {
        const int64_t id = engine.submit(op.request);
        if (id != op.id)
          throw InputError(fmt::format("[mirror] rank 0's engine gave a request id {}, this one {}: the engines diverged",
                                       op.id, id));
        live.insert(id);
      } else {
        engine.cancel(op.id);
      }
    }
    if (m.stop) return steps;
    if (engine.waiting() + engine.running() == 0)
      throw InputError("[mirror] rank 0 steps its engine and this one has nothing to run: the engines diverged");
    engine.step();
    ++steps;
    for (auto it = live.begin(); it != live.end();) {
      if (engine.finished(*it)) {
        (void)engine.take(*it);
        it = live.erase(it);
      } else {
        ++it;
      }
    }
  }
}

}  // namespace concord::serve
