// Verifiable tasks: exact prompt texts (golden), answers against independent computations written
// here (__int128 arithmetic parsed back from the prompt, std algorithms on the letters),
// determinism and order independence, the exact reward, and the errors.
#include "concord/rl/tasks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "concord/numerics/check.h"

namespace concord::rl {
namespace {

__extension__ typedef __int128 Int128;  // GCC/Clang; __extension__ quiets -Wpedantic

Int128 parse_int(const std::string& s) {
  Int128 v = 0;
  for (char c : s) {
    EXPECT_TRUE(c >= '0' && c <= '9') << s;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::string int_to_string(Int128 v) {
  if (v == 0) return "0";
  std::string s;
  while (v > 0) {
    s.push_back(static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  return {s.rbegin(), s.rend()};
}

// Splits "Q: <a><op><b>=\nA: " into a and b, checking the frame of the prompt.
std::pair<std::string, std::string> operands(const std::string& prompt, char op) {
  EXPECT_EQ(prompt.rfind("Q: ", 0), 0u) << prompt;
  const std::string tail = "=\nA: ";
  EXPECT_TRUE(prompt.size() > tail.size() &&
              prompt.compare(prompt.size() - tail.size(), tail.size(), tail) == 0)
      << prompt;
  const std::string body = prompt.substr(3, prompt.size() - 3 - tail.size());
  const size_t at = body.find(op);
  EXPECT_NE(at, std::string::npos) << prompt;
  return {body.substr(0, at), body.substr(at + 1)};
}

// The letters after `word ` in "Q: <word> <letters>\nA: ".
std::string letters_after(const std::string& prompt, const std::string& word) {
  const std::string head = "Q: " + word + " ", tail = "\nA: ";
  EXPECT_EQ(prompt.rfind(head, 0), 0u) << prompt;
  EXPECT_EQ(prompt.compare(prompt.size() - tail.size(), tail.size(), tail), 0) << prompt;
  return prompt.substr(head.size(), prompt.size() - head.size() - tail.size());
}

bool is_canonical_number(const std::string& s) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool all_lowercase(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 'a' && c <= 'z'; });
}

TEST(Tasks, RegistryNamesAndDescriptions) {
  EXPECT_EQ(task_names(), (std::vector<std::string>{"add", "mul", "reverse", "sort", "count"}));
  for (const std::string& name : task_names()) {
    const Task& t = task(name);
    EXPECT_EQ(t.name(), name);
    EXPECT_FALSE(t.description().empty());
    EXPECT_GE(t.max_difficulty(), 8);
  }
  // __int128 holds the largest answers the independent checks below compute.
  EXPECT_EQ(task("add").max_difficulty(), 30);
  EXPECT_EQ(task("mul").max_difficulty(), 18);
}

// The exact texts: every recorded result depends on them (docs/tasks.md shows these).
TEST(Tasks, GoldenPromptsAndAnswers) {
  struct Golden {
    const char* task;
    uint64_t index;
    const char* prompt;
    const char* answer;
  };
  const Golden goldens[] = {
      {"add", 0, "Q: 5905+8594=\nA: ", "14499"},
      {"add", 1, "Q: 7844+2384=\nA: ", "10228"},
      {"mul", 0, "Q: 714*5233=\nA: ", "3736362"},
      {"mul", 1, "Q: 4184*1768=\nA: ", "7397312"},
      {"reverse", 0, "Q: reverse ybtsxe\nA: ", "exstby"},
      {"sort", 1, "Q: sort iiexaw\nA: ", "aeiiwx"},
      {"count", 0, "Q: count u in mulsmb\nA: ", "1"},
      {"count", 1, "Q: count j in jjjiew\nA: ", "3"},
  };
  for (const Golden& g : goldens) {
    const TaskExample e = task(g.task).generate(0, g.index, 4);
    EXPECT_EQ(e.task, g.task);
    EXPECT_EQ(e.difficulty, 4);
    EXPECT_EQ(e.prompt, g.prompt) << g.task << " " << g.index;
    EXPECT_EQ(e.answer, g.answer) << g.task << " " << g.index;
  }
}

TEST(Tasks, AdditionAndMultiplicationAgreeWithInt128) {
  for (const char* name : {"add", "mul"}) {
    const Task& t = task(name);
    const char op = std::string(name) == "add" ? '+' : '*';
    for (int d = 1; d <= t.max_difficulty(); ++d) {
      const Int128 limit = [&] {
        Int128 p = 1;
        for (int i = 0; i < d; ++i) p *= 10;
        return p;
      }();
      bool saw_full_width = false;
      for (uint64_t i = 0; i < 40; ++i) {
        const TaskExample e = t.generate(7, i, d);
        const auto [a, b] = operands(e.prompt, op);
        ASSERT_TRUE(is_canonical_number(a)) << e.prompt;
        ASSERT_TRUE(is_canonical_number(b)) << e.prompt;
        const Int128 x = parse_int(a), y = parse_int(b);
        EXPECT_TRUE(x < limit && y < limit) << e.prompt;
        saw_full_width |= static_cast<int>(a.size()) == d;
        EXPECT_EQ(e.answer, int_to_string(op == '+' ? x + y : x * y)) << e.prompt;
      }
      // P(no d-digit operand among 80) = (1/10)^80 for d > 1 (and 0 for d = 1, where "0" counts).
      EXPECT_TRUE(saw_full_width) << name << " d=" << d;
    }
  }
}

TEST(Tasks, MultiplicationEdgeOperands) {
  // Zero operands appear at difficulty 1 (P(no zero among 400 draws) = 0.9^800 ~ 1e-37).
  int zero_products = 0;
  for (uint64_t i = 0; i < 400; ++i) {
    const TaskExample e = task("mul").generate(3, i, 1);
    const auto [a, b] = operands(e.prompt, '*');
    if (a == "0" || b == "0") {
      ++zero_products;
      EXPECT_EQ(e.answer, "0");
    }
  }
  EXPECT_GT(zero_products, 0);
}

TEST(Tasks, LetterTasksAgreeWithStdAlgorithms) {
  for (int d = 1; d <= 30; ++d) {
    for (uint64_t i = 0; i < 20; ++i) {
      const TaskExample r = task("reverse").generate(11, i, d);
      const std::string s = letters_after(r.prompt, "reverse");
      EXPECT_EQ(static_cast<int>(s.size()), d + 2);
      EXPECT_TRUE(all_lowercase(s)) << s;
      EXPECT_EQ(r.answer, std::string(s.rbegin(), s.rend()));

      const TaskExample so = task("sort").generate(11, i, d);
      const std::string u = letters_after(so.prompt, "sort");
      EXPECT_EQ(static_cast<int>(u.size()), d + 2);
      EXPECT_TRUE(all_lowercase(u)) << u;
      // Counting sort as the reference: 26 buckets, written out in order.
      int buckets[26] = {};
      for (char c : u) ++buckets[c - 'a'];
      std::string expect;
      for (int c = 0; c < 26; ++c)
        expect.append(static_cast<size_t>(buckets[c]), static_cast<char>('a' + c));
      EXPECT_EQ(so.answer, expect);

      const TaskExample c = task("count").generate(11, i, d);
      const std::string head = "Q: count ";
      ASSERT_EQ(c.prompt.rfind(head, 0), 0u);
      const char target = c.prompt[head.size()];
      EXPECT_TRUE(target >= 'a' && target <= 'z');
      EXPECT_EQ(c.prompt.substr(head.size() + 1, 4), " in ");
      const std::string letters =
          c.prompt.substr(head.size() + 5, c.prompt.size() - head.size() - 5 - 4);
      EXPECT_EQ(c.prompt.substr(c.prompt.size() - 4), "\nA: ");
      EXPECT_EQ(static_cast<int>(letters.size()), d + 2);
      EXPECT_TRUE(all_lowercase(letters)) << letters;
      EXPECT_EQ(c.answer, std::to_string(std::count(letters.begin(), letters.end(), target)));
    }
  }
}

TEST(Tasks, CountIsSpreadAroundAQuarter) {
  // 12 letters, each the target with p = 1/4: mean count 3, sd of the mean of 4000 is
  // 1.5 / sqrt(4000) ~ 0.024; the 0.15 window is ~6 sd (false failure ~ 2e-9).
  double sum = 0;
  std::set<int> seen;
  for (uint64_t i = 0; i < 4000; ++i) {
    const int n = std::stoi(task("count").generate(5, i, 10).answer);
    sum += n;
    seen.insert(n);
  }
  EXPECT_NEAR(sum / 4000, 3.0, 0.15);
  EXPECT_TRUE(seen.count(0) && seen.count(6));
}

TEST(Tasks, DigitsAreUniform) {
  // Chi-square over the 10 digits of 2000 six-digit additions (24000 digits, leading zeros
  // included by re-padding): 9 degrees of freedom, 33.7 is the 0.9999 quantile (false failure
  // 1e-4 for a uniform source; this fixed seed passes).
  int counts[10] = {};
  for (uint64_t i = 0; i < 2000; ++i) {
    const auto [a, b] = operands(task("add").generate(99, i, 6).prompt, '+');
    for (const std::string& s : {a, b}) {
      const std::string padded = std::string(6 - s.size(), '0') + s;
      for (char c : padded) ++counts[c - '0'];
    }
  }
  double chi2 = 0;
  for (int c : counts) chi2 += (c - 2400.0) * (c - 2400.0) / 2400.0;
  EXPECT_LT(chi2, 33.7);
}

TEST(Tasks, DeterministicAndOrderIndependent) {
  for (const std::string& name : task_names()) {
    const Task& t = task(name);
    std::vector<TaskExample> forward;
    for (uint64_t i = 0; i < 64; ++i) forward.push_back(t.generate(42, i, 5));
    std::set<std::string> distinct;
    for (uint64_t i = 64; i-- > 0;) {
      const TaskExample again = t.generate(42, i, 5);
      EXPECT_EQ(again.prompt, forward[i].prompt);
      EXPECT_EQ(again.answer, forward[i].answer);
      distinct.insert(again.prompt);
    }
    // 64 prompts over >= 26^7 or 10^10 possibilities are (almost surely) distinct.
    EXPECT_EQ(distinct.size(), 64u) << name;
    // Another seed gives other prompts.
    int same = 0;
    for (uint64_t i = 0; i < 64; ++i) same += t.generate(43, i, 5).prompt == forward[i].prompt;
    EXPECT_LT(same, 2) << name;
    // Indices far apart (the high counter word) are independent too.
    EXPECT_NE(t.generate(42, uint64_t{1} << 40, 5).prompt, t.generate(42, 0, 5).prompt);
  }
  // Tasks draw from their own streams: add and mul with the same seed/index use other digits.
  const auto add = operands(task("add").generate(1, 0, 9).prompt, '+');
  const auto mul = operands(task("mul").generate(1, 0, 9).prompt, '*');
  EXPECT_NE(add, mul);
}

TEST(Tasks, GenerateExamplesAndMixed) {
  const std::vector<TaskExample> adds = generate_examples("add", 8, 10, 3);
  ASSERT_EQ(adds.size(), 10u);
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(adds[i].prompt, task("add").generate(8, i, 3).prompt);

  const std::vector<TaskExample> mixed = generate_examples("mixed", 8, 12, 3);
  ASSERT_EQ(mixed.size(), 12u);
  const std::vector<std::string> names = task_names();
  for (size_t i = 0; i < mixed.size(); ++i) {
    EXPECT_EQ(mixed[i].task, names[i % names.size()]);
    const TaskExample direct = task(names[i % names.size()]).generate(8, i, 3);
    EXPECT_EQ(mixed[i].prompt, direct.prompt);
    EXPECT_EQ(mixed[i].answer, direct.answer);
  }
  EXPECT_TRUE(generate_examples("sort", 8, 0, 3).empty());
}

TEST(Tasks, RewardIsExact) {
  const TaskExample e = task("add").generate(0, 0, 4);  // 5905+8594 = 14499
  const Task& t = task("add");
  EXPECT_EQ(t.reward(e, "14499"), 1.0);
  EXPECT_EQ(t.reward(e, "14499\n"), 1.0);
  EXPECT_EQ(t.reward(e, "14499\nQ: 1+1=\nA: 2"), 1.0);  // only the first line counts
  for (const char* miss : {"14498", "14500", "1449", "144990", "014499", " 14499", "14499 ",
                           "14499\r\n", "14,499", "+14499", "", "\n14499", "14499.0"}) {
    EXPECT_EQ(t.reward(e, miss), 0.0) << "'" << miss << "'";
  }
  const TaskExample r = task("reverse").generate(0, 0, 4);  // ybtsxe -> exstby
  EXPECT_EQ(task("reverse").reward(r, "exstby\n"), 1.0);
  EXPECT_EQ(task("reverse").reward(r, "Exstby"), 0.0);
  EXPECT_EQ(task("reverse").reward(r, "ybtsxe"), 0.0);
  // A completion is scored by the example's own task only.
  EXPECT_THROW(task("mul").reward(e, "14499"), InputError);
}

// The instruction an instruct model is asked (docs/tasks.md pins these texts: seed 0, difficulty
// 4, index 0 — sort index 1, as the completion-form table).
TEST(Tasks, InstructionsAskTheSameQuestion) {
  EXPECT_EQ(task("add").generate(0, 0, 4).instruction, "What is 5905 + 8594? Reply with only the number.");
  EXPECT_EQ(task("mul").generate(0, 0, 4).instruction, "What is 714 * 5233? Reply with only the number.");
  EXPECT_EQ(task("reverse").generate(0, 0, 4).instruction,
            "Write the letters ybtsxe in reverse order. Reply with only the letters, without spaces.");
  EXPECT_EQ(task("sort").generate(0, 1, 4).instruction,
            "Sort the letters iiexaw in alphabetical order. Reply with only the letters, without spaces.");
  EXPECT_EQ(task("count").generate(0, 0, 4).instruction,
            "How many times does the letter u appear in mulsmb? Reply with only the number.");
  // Every task's instruction names the prompt's operands, for many examples.
  for (const std::string& name : task_names()) {
    for (uint64_t i = 0; i < 50; ++i) {
      const TaskExample e = task(name).generate(3, i, 3);
      EXPECT_FALSE(e.instruction.empty());
      EXPECT_NE(e.instruction.find("Reply with only the"), std::string::npos) << e.instruction;
    }
  }
}

// The `last` form: the reply's last number (numeric tasks) or last lowercase word (letter tasks).
TEST(Tasks, LastFormReadsTheLastNumberOrWord) {
  const TaskExample e = task("add").generate(0, 0, 4);  // 14499
  const Task& t = task("add");
  for (const char* hit : {"14499", "5905 + 8594 = 14499", "The answer is 14499.", "14499\n", " **14499**",
                          "x14499", "-14499"}) {
    EXPECT_EQ(t.reward(e, hit, AnswerForm::last), 1.0) << "'" << hit << "'";
  }
  for (const char* miss : {"14499 is 5905 + 8594", "14498", "14,499", "14499.0", "144990", "", "no number",
                           "014499"}) {
    EXPECT_EQ(t.reward(e, miss, AnswerForm::last), 0.0) << "'" << miss << "'";
  }
  const TaskExample r = task("reverse").generate(0, 0, 4);  // exstby
  const Task& rev = task("reverse");
  for (const char* hit : {"exstby", "The reversed letters are exstby.", "EXSTBY exstby", "\"exstby\""})
    EXPECT_EQ(rev.reward(r, hit, AnswerForm::last), 1.0) << "'" << hit << "'";
  for (const char* miss : {"Exstby", "exstby is the answer", "e x s t b y", "ybtsxe", "exstby1x"})
    EXPECT_EQ(rev.reward(r, miss, AnswerForm::last), 0.0) << "'" << miss << "'";
  // The numeric tasks read digits, the letter tasks letters.
  for (const std::string& name : task_names()) {
    const bool numeric = name == "add" || name == "mul" || name == "count";
    EXPECT_EQ(task(name).numeric_answer(), numeric) << name;
  }
}

TEST(Tasks, Errors) {
  try {
    task("divide");
    FAIL() << "no error";
  } catch (const InputError& err) {
    EXPECT_STREQ(err.what(), "[rl] unknown task 'divide' (known: add, mul, reverse, sort, count, mixed)");
  }
  EXPECT_THROW(task("mixed"), InputError);  // "mixed" is a generate_examples mode, not a task
  EXPECT_EQ(task_choices().back(), "mixed");
  EXPECT_EQ(task_choices().size(), task_names().size() + 1);
  for (const std::string& name : task_names()) {
    const Task& t = task(name);
    EXPECT_THROW(t.generate(0, 0, 0), InputError);
    EXPECT_THROW(t.generate(0, 0, -3), InputError);
    EXPECT_THROW(t.generate(0, 0, t.max_difficulty() + 1), InputError);
    EXPECT_NO_THROW(t.generate(0, 0, t.max_difficulty()));
  }
  try {
    task("mul").generate(0, 0, 19);
    FAIL() << "no error";
  } catch (const InputError& err) {
    EXPECT_STREQ(err.what(), "[rl] task 'mul': difficulty 19 outside [1, 18]");
  }
  // mixed needs a difficulty every task accepts, even for few examples.
  EXPECT_THROW(generate_examples("mixed", 0, 1, 19), InputError);
  EXPECT_NO_THROW(generate_examples("mixed", 0, 1, 18));
  EXPECT_THROW(generate_examples("add", 0, -1, 1), InputError);
  EXPECT_THROW(generate_examples("nope", 0, 1, 1), InputError);
}

}  // namespace
}  // namespace concord::rl
