// An engine mirrored on other processes (concord serve --expert-parallel; docs/moe.md): rank 0's
// server records what it does to its engine between two steps — the requests it submits (with
// their ids) and the ids it cancels, in order — and sends the record before each step; every other
// rank applies the same operations to an engine of its own and steps with it. An engine's steps
// depend only on those operations (the sampling is seeded per request), so every rank runs the
// same batches, which replicated attention with experts split over the ranks needs: the MoE
// layers' exchange is collective.
//
// A message: "CCDMIR01", u8 kind (1: step, 2: stop), u64 operations, then per operation u8 type
// (1: submit, 2: cancel), i64 engine id, and for a submit the request:
//   u64 n, n × i32 prompt; f32 temperature, i32 top_k, f32 top_p, f32 min_p, u64 seed;
//   i64 max_tokens; u64 n, n × i32 stop tokens; u8 full_logprobs; i32 top_logprobs;
//   u8 prompt_logprobs
// (little-endian). decode() checks every length against the message.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "concord/serve/engine.h"

namespace concord::serve {

struct EngineOp {
  enum class Type : uint8_t { submit = 1, cancel = 2 };
  Type type = Type::submit;
  int64_t id = 0;
  Request request;  // submit only
};

struct MirrorMessage {
  bool stop = false;  // the server is done: no step follows
  std::vector<EngineOp> ops;
};

std::vector<uint8_t> encode_mirror(const MirrorMessage& m);
// InputError "[mirror] ..." on a malformed message.
MirrorMessage decode_mirror(std::span<const uint8_t> bytes);

// Rank 0's record of the operations since the last step.
class EngineLog {
 public:
  void submitted(int64_t id, const Request& request) { pending_.ops.push_back({EngineOp::Type::submit, id, request}); }
  void cancelled(int64_t id) { pending_.ops.push_back({EngineOp::Type::cancel, id, {}}); }
  // The message for the next step (or the last: stop), the record emptied.
  std::vector<uint8_t> take(bool stop);

 private:
  MirrorMessage pending_;
};

// A mirroring rank: receives messages until a stop, applying each one's operations to `engine`
// (a submit must get the id rank 0's engine gave it) and then stepping; finished requests are
// taken (their completions are rank 0's to report). Returns the steps run. InputError when an id
// differs (the engines diverged).
int64_t follow_engine(Engine& engine, const std::function<std::vector<uint8_t>()>& receive);

}  // namespace concord::serve
