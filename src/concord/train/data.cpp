// Corpus loading, the byte tokenizer, the train/validation split and the batch samplers
// (see data.h).
#include "concord/train/data.h"

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include <fmt/format.h>

#include "concord/io/atomic_file.h"
#include "concord/io/utf8.h"
#include "concord/numerics/check.h"
#include "concord/numerics/philox.h"

namespace concord::train {
namespace fs = std::filesystem;

namespace {

// The whole Bible as a reference range; `-f` turns bible's pretty-printing off: one verse per
// line, prefixed by its reference, with no line wrapping.
constexpr std::string_view kWholeBible = "Gen1:1-Rev22:21";
constexpr std::string_view kFirstVerse =
    "Ge1:1 In the beginning God created the heaven and the earth.\n";
constexpr std::string_view kLastVerse =
    "Rev22:21 The grace of our Lord Jesus Christ be with you all. Amen.\n";
constexpr size_t kKjvMinBytes = 4'000'000;

// Reads the whole file into `out`; false when it cannot be opened or read.
bool read_file(const fs::path& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return false;
  out = std::move(buffer).str();
  return true;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string run_bible(const fs::path& tool) {
  std::error_code ec;
  if (!fs::exists(tool, ec)) {
    throw InputError(fmt::format(
        "[corpus] kjv: {} not found; install bible-kjv: run scripts/setup", tool.string()));
  }
  const std::string command =
      fmt::format("{} -f {} </dev/null", shell_quote(tool.string()), kWholeBible);
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    throw InputError(fmt::format("[corpus] kjv: cannot run {}: {}", tool.string(),
                                 std::strerror(errno)));
  }
  std::string text;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) text.append(buffer, n);
  const int status = ::pclose(pipe);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw InputError(fmt::format(
        "[corpus] kjv: '{}' failed (status {}); reinstall bible-kjv: run scripts/setup", command,
        status == -1 ? -1 : (WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status))));
  }
  if (!is_complete_kjv(text)) {
    throw InputError(fmt::format(
        "[corpus] kjv: '{}' printed {} bytes that are not the whole King James Bible (Genesis "
        "1:1 to Revelation 22:21); reinstall bible-kjv-text: run scripts/setup",
        command, text.size()));
  }
  return text;
}

}  // namespace

std::string load_python_docs(const fs::path& sources) {
  std::error_code ec;
  if (!fs::is_directory(sources, ec))
    throw InputError(fmt::format("[corpus] python-docs: {} not found; install python3.11-doc: run scripts/setup",
                                 sources.string()));
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(sources, ec))
    if (e.is_regular_file() && e.path().string().ends_with(".rst.txt")) files.push_back(e.path());
  std::sort(files.begin(), files.end());  // a fixed order: the same corpus on every machine
  std::string text;
  for (const fs::path& f : files) {
    std::string part;
    if (!read_file(f, part))
      throw InputError(fmt::format("[corpus] python-docs: cannot read {} ({})", f.string(), std::strerror(errno)));
    text += part;
    if (!text.empty() && text.back() != '\n') text += '\n';
  }
  if (text.size() < (1 << 20))
    throw InputError(fmt::format("[corpus] python-docs: {} holds {} files, {} bytes: not the Python documentation; "
                                 "reinstall python3.11-doc: run scripts/setup",
                                 sources.string(), files.size(), text.size()));
  if (const size_t bad = io::invalid_utf8_offset(text); bad != std::string_view::npos)
    throw InputError(fmt::format("[corpus] python-docs: not UTF-8 text (offset {})", bad));
  return text;
}

bool is_complete_kjv(std::string_view text) {
  return text.size() > kKjvMinBytes && text.starts_with(kFirstVerse) && text.ends_with(kLastVerse);
}

fs::path corpus_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return fs::path(xdg) / "concord";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') return fs::path(home) / ".cache" / "concord";
  return {};
}

std::string load_kjv(const fs::path& bible_tool, const fs::path& cache_file) {
  std::string text;
  if (!cache_file.empty() && read_file(cache_file, text) && is_complete_kjv(text)) return text;
  text = run_bible(bible_tool);
  if (!cache_file.empty()) {
    // A cache is an optimization: a read-only home directory must not stop training.
    try {
      fs::create_directories(cache_file.parent_path());
      io::write_file_atomic(cache_file, std::string_view(text));
    } catch (const std::exception&) {
    }
  }
  return text;
}

std::string addition_problems(int64_t count, int min_digits, int max_digits, uint64_t seed, SumOrder order) {
  if (min_digits < 1 || max_digits > 18 || min_digits > max_digits || count < 0)
    throw InputError(fmt::format("[corpus] addition: digits {}..{} must lie within 1..18 and count {} >= 0",
                                 min_digits, max_digits, count));
  const numerics::RandomStream rng{seed, 0x41444431u /* "ADD1" */};
  std::string text;
  uint64_t counter = 0;
  auto uniform = [&](uint64_t n) {  // in [0, n), from 64 bits (bias below 2^-40 for n < 2^24)
    const numerics::PhiloxBlock w = rng.block(counter++);
    return ((static_cast<uint64_t>(w[0]) << 32) | w[1]) % n;
  };
  auto operand = [&]() {
    const auto digits = static_cast<int>(min_digits + static_cast<int>(uniform(static_cast<uint64_t>(max_digits - min_digits + 1))));
    uint64_t v = 1 + uniform(9);  // no leading zero (1-digit operands: 1..9 and 0 below)
    for (int d = 1; d < digits; ++d) v = v * 10 + uniform(10);
    if (digits == 1 && uniform(10) == 0) v = 0;
    return v;
  };
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t a = operand(), b = operand();
    std::string sum = std::to_string(a + b);
    if (order == SumOrder::lsb_first) std::reverse(sum.begin(), sum.end());
    text += fmt::format("{}+{}={}\n", a, b, sum);
  }
  return text;
}

std::optional<AdditionCorpus> addition_corpus(std::string_view spec) {
  AdditionCorpus c;
  std::string_view digits;
  if (spec.starts_with("addition:")) {
    digits = spec.substr(9);
  } else if (spec.starts_with("addition-reversed:")) {
    digits = spec.substr(18);
    c.order = SumOrder::lsb_first;
  } else {
    return std::nullopt;
  }
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), c.max_digits);
  if (ec != std::errc() || end != digits.data() + digits.size() || c.max_digits < 1 || c.max_digits > 18)
    throw InputError(fmt::format("[corpus] '{}': give addition:N or addition-reversed:N with N in 1..18 (the most "
                                 "digits per operand)", spec));
  return c;
}

std::string load_corpus(std::string_view spec) {
  if (const std::optional<AdditionCorpus> add = addition_corpus(spec))
    return addition_problems(400000, 1, add->max_digits, 1, add->order);
  if (spec == "kjv") {
    const fs::path dir = corpus_cache_dir();
    return load_kjv(fs::path(kBibleTool), dir.empty() ? fs::path() : dir / "kjv.txt");
  }
  if (spec == "python-docs") return load_python_docs(fs::path(kPythonDocSources));
  const fs::path path{std::string(spec)};
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw InputError(fmt::format("[corpus] {}: is a directory; give a text file or 'kjv'",
                                 path.string()));
  }
  std::string text;
  if (!read_file(path, text)) {
    throw InputError(fmt::format("[corpus] {}: cannot read ({}); give a UTF-8 text file or 'kjv'",
                                 path.string(), std::strerror(errno)));
  }
  if (text.empty()) throw InputError(fmt::format("[corpus] {}: the file is empty", path.string()));
  if (const size_t bad = io::invalid_utf8_offset(text); bad != std::string_view::npos) {
    throw InputError(fmt::format("[corpus] {}: not UTF-8 text (invalid byte 0x{:02X} at offset {})",
                                 path.string(), static_cast<unsigned char>(text[bad]), bad));
  }
  return text;
}

// --- tokenizer ------------------------------------------------------------------------------

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id >= 0 && id < 256) {
      out += static_cast<char>(static_cast<unsigned char>(id));
    } else {
      out += token_name(id);
    }
  }
  return out;
}

std::string ByteTokenizer::token_name(int32_t id) const {
  switch (id) {
    case kBos: return "<|bos|>";
    case kEos: return "<|eos|>";
    case kPad: return "<|pad|>";
    default: break;
  }
  if (id < 0 || id >= vocab_size()) {
    throw InputError(fmt::format("[tokenizer] id {} is outside the byte vocabulary (0..{})", id,
                                 vocab_size() - 1));
  }
  if (id >= 0x21 && id <= 0x7E) return std::string(1, static_cast<char>(id));
  return fmt::format("<0x{:02X}>", id);
}

// --- split ----------------------------------------------------------------------------------

TokenSplit split_tokens(std::vector<int32_t> tokens, double validation_fraction, int64_t chunk) {
  if (!(validation_fraction > 0.0 && validation_fraction <= 0.5)) {
    throw InputError(fmt::format(
        "[split] validation fraction {} must lie in (0, 0.5]", validation_fraction));
  }
  if (chunk < 1) throw InputError(fmt::format("[split] chunk size {} must be >= 1", chunk));
  const int64_t k = std::llround(1.0 / validation_fraction);
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks < k) {
    throw InputError(fmt::format(
        "[split] {} tokens make {} chunks of {}; a validation fraction of {} needs at least {} "
        "(use a smaller chunk or a larger corpus)",
        n, chunks, chunk, validation_fraction, k));
  }
  TokenSplit split;
  split.validation.reserve(static_cast<size_t>(n / k + chunk));
  split.train.reserve(static_cast<size_t>(n - n / k + chunk));
  for (int64_t c = 0; c < chunks; ++c) {
    const auto begin = tokens.begin() + c * chunk;
    const auto end = tokens.begin() + std::min(n, (c + 1) * chunk);
    auto& dst = (c % k == k - 1) ? split.validation : split.train;
    dst.insert(dst.end(), begin, end);
  }
  return split;
}

// --- batches --------------------------------------------------------------------------------

namespace {

void check_shape(std::string_view op, size_t tokens, int64_t batch, int64_t seq_len) {
  if (batch < 1 || seq_len < 1) {
    throw InputError(fmt::format("[{}] batch {} and seq_len {} must be >= 1", op, batch, seq_len));
  }
  if (static_cast<int64_t>(tokens) < seq_len + 1) {
    throw InputError(fmt::format("[{}] {} tokens cannot hold one window of seq_len + 1 = {}", op,
                                 tokens, seq_len + 1));
  }
}

// Fills row b of `batch` from the window starting at `offset`.
void fill_row(Batch& batch, int64_t b, std::span<const int32_t> tokens, int64_t offset) {
  const int64_t T = batch.T;
  for (int64_t t = 0; t < T; ++t) {
    batch.inputs[static_cast<size_t>(b * T + t)] = tokens[static_cast<size_t>(offset + t)];
    batch.targets[static_cast<size_t>(b * T + t)] = tokens[static_cast<size_t>(offset + t + 1)];
  }
  batch.offsets[static_cast<size_t>(b)] = offset;
}

Batch empty_batch(int64_t B, int64_t T) {
  Batch batch;
  batch.B = B;
  batch.T = T;
  batch.inputs.resize(static_cast<size_t>(B * T));
  batch.targets.resize(static_cast<size_t>(B * T));
  batch.offsets.resize(static_cast<size_t>(B));
  return batch;
}

}  // namespace

BatchSampler::BatchSampler(std::span<const int32_t> tokens, int64_t batch, int64_t seq_len,
                           uint64_t seed)
    : tokens_(tokens), B_(batch), T_(seq_len), seed_(seed) {
  check_shape("sampler", tokens.size(), batch, seq_len);
}

Batch BatchSampler::at(int64_t step) const {
  if (step < 0) throw InputError(fmt::format("[sampler] step {} is negative", step));
  Batch batch = empty_batch(B_, T_);
  // Start positions 0 .. N - (T + 1): a window of T + 1 tokens fits at each.
  const auto starts = static_cast<uint64_t>(static_cast<int64_t>(tokens_.size()) - T_);
  const auto s = static_cast<uint64_t>(step);
  const std::array<uint32_t, 2> key = {static_cast<uint32_t>(seed_),
                                       static_cast<uint32_t>(seed_ >> 32)};
  for (int64_t b = 0; b < B_; ++b) {
    const numerics::PhiloxBlock r = numerics::philox4x32_10(
        {static_cast<uint32_t>(b), static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32), 0u},
        key);
    const uint64_t word = (static_cast<uint64_t>(r[1]) << 32) | r[0];
    fill_row(batch, b, tokens_, static_cast<int64_t>(word % starts));
  }
  return batch;
}

std::vector<Batch> validation_batches(std::span<const int32_t> tokens, int64_t batch,
                                      int64_t seq_len, int64_t max_batches) {
  check_shape("validation", tokens.size(), batch, seq_len);
  if (max_batches < 1) {
    throw InputError(fmt::format("[validation] max_batches {} must be >= 1", max_batches));
  }
  const int64_t windows = (static_cast<int64_t>(tokens.size()) - 1) / seq_len;
  if (windows < batch) {
    throw InputError(fmt::format(
        "[validation] {} tokens hold {} windows of {} + 1, fewer than one batch of {}; use a "
        "larger validation fraction or a smaller batch",
        tokens.size(), windows, seq_len, batch));
  }
  const int64_t used = std::min(windows / batch, max_batches) * batch;
  std::vector<Batch> batches;
  for (int64_t i = 0; i < used; i += batch) {
    Batch out = empty_batch(batch, seq_len);
    for (int64_t b = 0; b < batch; ++b) {
      // Spread over all windows; exact in integers (used <= windows, so indices are distinct).
      const int64_t window = (i + b) * windows / used;
      fill_row(out, b, tokens, window * seq_len);
    }
    batches.push_back(std::move(out));
  }
  return batches;
}

}  // namespace concord::train
