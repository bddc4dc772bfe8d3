// One row of a logit comparison: which sequence and position it is, and its labels. Shared by
// logit dumps (dump.h), measurements and contracts (contract.h).
#pragma once

#include <cstdint>
#include <string>

namespace concord::audit {

struct RowInfo {
  int64_t sequence = 0;       // index of the sequence the row belongs to
  int32_t position = 0;       // position of `token` in its sequence; the row is the next-token
                              // distribution after tokens 0..position
  int32_t prompt_length = 0;  // the sequence's prompt length in tokens
  int32_t token = -1;         // the input token at `position` (-1: unknown)
  int32_t next = -1;          // the token that follows (teacher-forced or sampled; -1: none)
  std::string task;           // task name ("" when none)
  std::string label;          // any user label ("" when none)
  int32_t depth = 0;          // a depth-recurrent model's core iterations for the row (0: none)
  friend bool operator==(const RowInfo&, const RowInfo&) = default;
};

}  // namespace concord::audit
