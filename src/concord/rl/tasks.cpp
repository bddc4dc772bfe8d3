// The verifiable tasks of tasks.h: prompt generators (Philox-keyed, pure functions of seed,
// index and difficulty), exact answers (decimal arithmetic on digit strings, so no width limit)
// and the exact reward.
#include "concord/rl/tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "concord/numerics/check.h"
#include "concord/numerics/philox.h"

namespace concord::rl {
namespace {

// The random words of one example: word j is word (j mod 4) of Philox4x32-10 at counter
// (index low, index high, stream, j / 4) with key = seed. So an example never shares words with
// another index, another task (stream) or another seed, whatever order examples are made in.
class ExampleRandom {
 public:
  ExampleRandom(uint64_t seed, uint32_t stream, uint64_t index)
      : seed_(seed), stream_(stream), index_(index) {}

  uint32_t next_word() {
    if (used_ % 4 == 0) {
      block_ = numerics::philox4x32_10(
          {static_cast<uint32_t>(index_), static_cast<uint32_t>(index_ >> 32), stream_,
           static_cast<uint32_t>(used_ / 4)},
          {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)});
    }
    return block_[used_++ % 4];
  }
  // Uniform in [0, n) by multiply-shift of one 32-bit word (bias below n / 2^32).
  uint32_t below(uint32_t n) {
    return static_cast<uint32_t>((static_cast<uint64_t>(next_word()) * n) >> 32);
  }
  char digit() { return static_cast<char>('0' + below(10)); }
  char letter() { return static_cast<char>('a' + below(26)); }

 private:
  uint64_t seed_;
  uint32_t stream_;
  uint64_t index_;
  uint64_t used_ = 0;
  numerics::PhiloxBlock block_{};
};

// A number uniform in [0, 10^digits): `digits` uniform decimal digits, leading zeros dropped.
std::string random_number(ExampleRandom& rng, int digits) {
  std::string s;
  for (int i = 0; i < digits; ++i) s.push_back(rng.digit());
  const size_t first = s.find_first_not_of('0');
  return first == std::string::npos ? std::string("0") : s.substr(first);
}

std::string random_letters(ExampleRandom& rng, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(rng.letter());
  return s;
}

// Schoolbook decimal arithmetic on canonical digit strings (no leading zeros but "0").
std::string strip_zeros(std::string s) {
  const size_t first = s.find_first_not_of('0');
  return first == std::string::npos ? std::string("0") : s.substr(first);
}

std::string decimal_add(const std::string& a, const std::string& b) {
  std::string out;
  int carry = 0;
  for (size_t i = 0; i < std::max(a.size(), b.size()) || carry; ++i) {
    int sum = carry;
    if (i < a.size()) sum += a[a.size() - 1 - i] - '0';
    if (i < b.size()) sum += b[b.size() - 1 - i] - '0';
    out.push_back(static_cast<char>('0' + sum % 10));
    carry = sum / 10;
  }
  std::reverse(out.begin(), out.end());
  return strip_zeros(out);
}

std::string decimal_mul(const std::string& a, const std::string& b) {
  std::vector<int> acc(a.size() + b.size(), 0);  // little-endian digits
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < b.size(); ++j)
      acc[i + j] += (a[a.size() - 1 - i] - '0') * (b[b.size() - 1 - j] - '0');
  }
  std::string out;
  int carry = 0;
  for (int d : acc) {
    const int v = d + carry;
    out.push_back(static_cast<char>('0' + v % 10));
    carry = v / 10;
  }
  CONCORD_CHECK(carry == 0, "decimal product overflows its digit count");
  std::reverse(out.begin(), out.end());
  return strip_zeros(out);
}

TaskExample example(std::string prompt, std::string instruction, std::string answer) {
  TaskExample e;
  e.prompt = std::move(prompt);
  e.instruction = std::move(instruction);
  e.answer = std::move(answer);
  return e;
}

// Stable stream ids: changing one changes every generated example of the task.
enum class TaskId : uint32_t { add = 1, mul = 2, reverse = 3, sort = 4, count = 5 };

class TaskBase : public Task {
 public:
  TaskBase(TaskId id, std::string_view name, std::string_view description, int max_difficulty)
      : id_(id), name_(name), description_(description), max_difficulty_(max_difficulty) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  int max_difficulty() const override { return max_difficulty_; }

  TaskExample generate(uint64_t seed, uint64_t index, int difficulty) const override {
    if (difficulty < 1 || difficulty > max_difficulty_)
      throw InputError(fmt::format("[rl] task '{}': difficulty {} outside [1, {}]", name_,
                                   difficulty, max_difficulty_));
    ExampleRandom rng(seed, static_cast<uint32_t>(id_), index);
    TaskExample e = make(rng, difficulty);
    e.task = std::string(name_);
    e.difficulty = difficulty;
    return e;
  }

 protected:
  virtual TaskExample make(ExampleRandom& rng, int difficulty) const = 0;

 private:
  TaskId id_;
  std::string_view name_, description_;
  int max_difficulty_;
};

class AddTask final : public TaskBase {
 public:
  AddTask() : TaskBase(TaskId::add, "add", "a+b of two numbers below 10^difficulty", 30) {}
  bool numeric_answer() const override { return true; }
  TaskExample make(ExampleRandom& rng, int difficulty) const override {
    const std::string a = random_number(rng, difficulty), b = random_number(rng, difficulty);
    return example(fmt::format("Q: {}+{}=\nA: ", a, b),
                   fmt::format("What is {} + {}? Reply with only the number.", a, b), decimal_add(a, b));
  }
};

class MulTask final : public TaskBase {
 public:
  MulTask() : TaskBase(TaskId::mul, "mul", "a*b of two numbers below 10^difficulty", 18) {}
  bool numeric_answer() const override { return true; }
  TaskExample make(ExampleRandom& rng, int difficulty) const override {
    const std::string a = random_number(rng, difficulty), b = random_number(rng, difficulty);
    return example(fmt::format("Q: {}*{}=\nA: ", a, b),
                   fmt::format("What is {} * {}? Reply with only the number.", a, b), decimal_mul(a, b));
  }
};

class ReverseTask final : public TaskBase {
 public:
  ReverseTask()
      : TaskBase(TaskId::reverse, "reverse", "reverse difficulty+2 lowercase letters", 30) {}
  bool numeric_answer() const override { return false; }
  TaskExample make(ExampleRandom& rng, int difficulty) const override {
    const std::string s = random_letters(rng, difficulty + 2);
    return example(fmt::format("Q: reverse {}\nA: ", s),
                   fmt::format("Write the letters {} in reverse order. Reply with only the letters, "
                               "without spaces.", s),
                   {s.rbegin(), s.rend()});
  }
};

class SortTask final : public TaskBase {
 public:
  SortTask()
      : TaskBase(TaskId::sort, "sort", "sort difficulty+2 lowercase letters by byte value", 30) {}
  bool numeric_answer() const override { return false; }
  TaskExample make(ExampleRandom& rng, int difficulty) const override {
    const std::string s = random_letters(rng, difficulty + 2);
    std::string sorted = s;
    std::sort(sorted.begin(), sorted.end());
    return example(fmt::format("Q: sort {}\nA: ", s),
                   fmt::format("Sort the letters {} in alphabetical order. Reply with only the letters, "
                               "without spaces.", s),
                   sorted);
  }
};

class CountTask final : public TaskBase {
 public:
  CountTask()
      : TaskBase(TaskId::count, "count",
                 "occurrences of one letter in difficulty+2 letters (each is it with p = 1/4)",
                 30) {}
  bool numeric_answer() const override { return true; }
  TaskExample make(ExampleRandom& rng, int difficulty) const override {
    const char target = rng.letter();
    std::string s;
    int count = 0;
    for (int i = 0; i < difficulty + 2; ++i) {
      // The target with probability 1/4, else one of the 25 other letters uniformly, so that
      // counts spread over 0..n instead of sitting at 0.
      if (rng.below(4) == 0) {
        s.push_back(target);
        ++count;
      } else {
        const auto other = static_cast<char>('a' + rng.below(25));
        s.push_back(other >= target ? static_cast<char>(other + 1) : other);
      }
    }
    return example(fmt::format("Q: count {} in {}\nA: ", target, s),
                   fmt::format("How many times does the letter {} appear in {}? Reply with only the number.",
                               target, s),
                   std::to_string(count));
  }
};

const std::array<const Task*, 5>& registry() {
  static const AddTask add;
  static const MulTask mul;
  static const ReverseTask reverse;
  static const SortTask sort;
  static const CountTask count;
  static const std::array<const Task*, 5> tasks{&add, &mul, &reverse, &sort, &count};
  return tasks;
}

}  // namespace

double Task::reward(const TaskExample& example, std::string_view completion, AnswerForm form) const {
  if (example.task != name())
    throw InputError(
        fmt::format("[rl] task '{}' asked to score an example of task '{}'", name(), example.task));
  if (form == AnswerForm::last) {
    const bool numeric = numeric_answer();
    auto in_run = [numeric](char c) { return numeric ? (c >= '0' && c <= '9') : (c >= 'a' && c <= 'z'); };
    size_t end = completion.size();
    while (end > 0 && !in_run(completion[end - 1])) --end;
    size_t begin = end;
    while (begin > 0 && in_run(completion[begin - 1])) --begin;
    return begin < end && completion.substr(begin, end - begin) == example.answer ? 1.0 : 0.0;
  }
  const size_t newline = completion.find('\n');
  const std::string_view answer =
      newline == std::string_view::npos ? completion : completion.substr(0, newline);
  return answer == example.answer ? 1.0 : 0.0;
}

std::vector<std::string> task_names() {
  std::vector<std::string> names;
  for (const Task* t : registry()) names.emplace_back(t->name());
  return names;
}

std::vector<std::string> task_choices() {
  std::vector<std::string> names = task_names();
  names.emplace_back(kMixedTask);
  return names;
}

const Task& task(std::string_view name) {
  for (const Task* t : registry()) {
    if (t->name() == name) return *t;
  }
  if (name == kMixedTask)
    throw InputError(fmt::format("[rl] '{}' is every task in turn, not one task", kMixedTask));
  throw InputError(
      fmt::format("[rl] unknown task '{}' (known: {})", name, fmt::join(task_choices(), ", ")));
}

std::vector<TaskExample> generate_examples(std::string_view name, uint64_t seed, int64_t n,
                                           int difficulty) {
  if (n < 0) throw InputError(fmt::format("[rl] example count {} must be >= 0", n));
  std::vector<const Task*> tasks;
  if (name == kMixedTask) {
    tasks.assign(registry().begin(), registry().end());
  } else {
    tasks.push_back(&task(name));
  }
  // Every task is checked up front so that a bad difficulty fails even when n is small.
  for (const Task* t : tasks) {
    if (difficulty < 1 || difficulty > t->max_difficulty())
      throw InputError(fmt::format("[rl] task '{}': difficulty {} outside [1, {}]", t->name(),
                                   difficulty, t->max_difficulty()));
  }
  std::vector<TaskExample> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const Task& t = *tasks[static_cast<size_t>(i) % tasks.size()];
    out.push_back(t.generate(seed, static_cast<uint64_t>(i), difficulty));
  }
  return out;
}

}  // namespace concord::rl
