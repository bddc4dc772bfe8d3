// Verifiable tasks with exact rewards: a seeded prompt generator with a difficulty knob and an
// exact checker per task. RL (issue 5) trains on them; kernel contracts slice traffic by them.
//
// Each example also carries `instruction`, the question as an instruct model is asked it in a
// chat turn ("What is 4821 + 375? Reply with only the number."), scored in the reply form.
//
//   add       "Q: 4821+375=\nA: "          → "5196"      difficulty = digits per operand
//   mul       "Q: 48*37=\nA: "             → "1776"      difficulty = digits per operand
//   reverse   "Q: reverse kqzpa\nA: "      → "apzqk"     difficulty = letters (difficulty + 2)
//   sort      "Q: sort kqzpa\nA: "         → "akpqz"     letters sorted by byte value
//   count     "Q: count a in kaqaza\nA: "  → "3"         occurrences of one letter
// (exact prompt texts are documented in docs/tasks.md and fixed by tests: changing one changes
// every recorded result).
//
// An example is a pure function of (seed, index, difficulty): Philox keyed by the seed, stream
// = the task's id, counter = the index — independent of thread count and call order.
// Reward: 1 when the completion, up to its first newline (and with an end-of-text marker
// removed by the caller), equals the answer exactly; else 0. No partial credit, so the
// reward is exact.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace concord::rl {

struct TaskExample {
  std::string task;
  std::string prompt;       // the completion form: "Q: 4821+375=\nA: "
  std::string instruction;  // the same question as a user message for an instruct model
  std::string answer;
  int difficulty = 1;
};

// How a completion is read (docs/tasks.md, "Reward"):
//   line   the completion up to its first newline, byte for byte (the "Q: ..\nA: " form);
//   last   an instruct model's reply to `instruction`, which answers in a sentence ("3 + 4 = 7",
//          "The sorted letters are jlt."): its last number (a maximal run of ASCII digits) for
//          the numeric tasks (add, mul, count), its last word of lowercase ASCII letters for the
//          letter tasks (reverse, sort), byte for byte; no such run scores 0.
enum class AnswerForm : uint8_t { line, last };

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string_view name() const = 0;
  virtual std::string_view description() const = 0;
  virtual int max_difficulty() const = 0;
  // Whether answers are numbers (add, mul, count) or lowercase words (reverse, sort).
  virtual bool numeric_answer() const = 0;
  // difficulty in [1, max_difficulty()], else InputError.
  virtual TaskExample generate(uint64_t seed, uint64_t index, int difficulty) const = 0;
  // 1.0 or 0.0 (see above).
  double reward(const TaskExample& example, std::string_view completion,
                AnswerForm form = AnswerForm::line) const;
};

// The task name that selects every task in turn.
inline constexpr std::string_view kMixedTask = "mixed";
// The tasks of the registry, in its order (add, mul, reverse, sort, count).
std::vector<std::string> task_names();
// What a "task" setting accepts: task_names() and then "mixed".
std::vector<std::string> task_choices();
// InputError "[rl] unknown task 'x' (known: add, mul, reverse, sort, count, mixed)".
const Task& task(std::string_view name);
// n examples of one task (or of every task in turn when name == kMixedTask).
std::vector<TaskExample> generate_examples(std::string_view name, uint64_t seed, int64_t n,
                                           int difficulty);

}  // namespace concord::rl
