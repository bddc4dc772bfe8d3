// Errors: InputError for bad input a user can fix (the CLI prints it on one line, exits 2), and
// CONCORD_CHECK for internal invariants (always on, also in Release builds).
#pragma once

#include <stdexcept>
#include <string>

namespace concord {

// Bad input: a file, a flag, a value. The message names the operation and says what to do.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A broken internal invariant: a bug in concord, not in the input.
class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] inline void check_failed(const char* condition, const std::string& message,
                                      const char* file, int line) {
  throw InternalError(std::string("internal check failed: ") + message + " (" + condition +
                      " at " + file + ":" + std::to_string(line) + ")");
}

}  // namespace concord

#define CONCORD_CHECK(cond, msg)                                          \
  do {                                                                    \
    if (!(cond)) ::concord::check_failed(#cond, (msg), __FILE__, __LINE__); \
  } while (0)
