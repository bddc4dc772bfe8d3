// Training data: the corpus (the King James Bible by default), a byte-level tokenizer, a
// train/validation split, and a stateless batch sampler.
//
// The sampler is a pure function of (seed, step): batch k of a run is the same whether the run
// went straight through or was resumed from a checkpoint, so the checkpoint only needs the seed.
// The rationale for the split is in docs/training-data.md.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace concord::train {

// --- corpus ---------------------------------------------------------------------------------

// "kjv": the King James Bible, from Debian's bible-kjv (`/usr/bin/bible -f Gen1:1-Rev22:21`:
// one verse per line, "Ge1:1 In the beginning God created the heaven and the earth.", 31,102
// lines, 4,404,412 bytes), cached in corpus_cache_dir()/kjv.txt after the first call.
// "addition:N": the arithmetic task of docs/recurrence.md, generated (addition_problems, seed 1):
// 400,000 lines "a+b=c", the digit count of each operand uniform in 1..N (1 <= N <= 18).
// "addition-reversed:N": the same problems with the sum written least significant digit first
// ("57+68=521" for 125), the order in which a left-to-right decoder can carry.
// "python-docs": the Python 3.11 documentation's reStructuredText sources from Debian's
// python3.11-doc (every *.rst.txt under /usr/share/doc/python3.11/html/_sources, in sorted path
// order; about 11 MB) — the new domain of the binary-weight adaptation run (docs/binary.md).
// Anything else: the path of a UTF-8 text file.
// Throws InputError when the tool is missing ("install bible-kjv: run scripts/setup"), fails or
// prints something other than the whole Bible, or when the file is unreadable, empty or not
// UTF-8.
std::string load_corpus(std::string_view spec);

// The order the sum of an addition problem is written in.
enum class SumOrder { msb_first, lsb_first };

// `count` lines "a+b=c\n" in decimal: each operand has a digit count uniform in
// [min_digits, max_digits] (no leading zeros; 1..18 digits) and uniform digits, drawn from a
// Philox stream keyed by `seed`; c in `order` (the operands always most significant digit first;
// both orders draw the same problems). A problem's prompt is the line up to '=' inclusive.
std::string addition_problems(int64_t count, int min_digits, int max_digits, uint64_t seed,
                              SumOrder order = SumOrder::msb_first);

// The addition corpus a spec names ("addition:N", "addition-reversed:N"), or nullopt for any
// other spec; throws InputError for an addition spec with a bad N.
struct AdditionCorpus {
  int max_digits = 0;
  SumOrder order = SumOrder::msb_first;
};
std::optional<AdditionCorpus> addition_corpus(std::string_view spec);

// The pieces of load_corpus("kjv"), exposed for tests: runs `bible_tool`, checks the text and
// writes it atomically to `cache_file` (an empty path: no cache); a valid cache is read instead
// of running the tool. A cache that cannot be written is not an error (the text is still right).
inline constexpr std::string_view kBibleTool = "/usr/bin/bible";
std::string load_kjv(const std::filesystem::path& bible_tool,
                     const std::filesystem::path& cache_file);
// $XDG_CACHE_HOME/concord, else $HOME/.cache/concord; empty when neither variable is set.
std::filesystem::path corpus_cache_dir();
inline constexpr const char* kPythonDocSources = "/usr/share/doc/python3.11/html/_sources";
// The pieces of load_corpus("python-docs"), for tests: the sources' *.rst.txt files in sorted
// order, concatenated (each ending in a newline).
std::string load_python_docs(const std::filesystem::path& sources);
// Whether `text` is the whole KJV as load_kjv produces it (starts with Genesis 1:1, ends with
// Revelation 22:21, over 4 MB).
bool is_complete_kjv(std::string_view text);

// --- tokenizer ------------------------------------------------------------------------------

// Ids 0..255 are the bytes themselves; three special tokens follow. No merges: every UTF-8 text
// round-trips exactly, and the vocabulary is small enough for a model trained on one book.
class ByteTokenizer {
 public:
  static constexpr int32_t kBos = 256;  // <|bos|>
  static constexpr int32_t kEos = 257;  // <|eos|>
  static constexpr int32_t kPad = 258;  // <|pad|>

  static constexpr int32_t vocab_size() { return 259; }
  // One id per byte; no special tokens are added.
  std::vector<int32_t> encode(std::string_view text) const;
  // Bytes for ids 0..255, names for the specials; InputError for ids outside the vocabulary.
  std::string decode(std::span<const int32_t> ids) const;
  // A readable name: the character for printable ASCII (0x21..0x7E), "<0x0A>" for the other
  // bytes, "<|bos|>"/"<|eos|>"/"<|pad|>" for the specials; InputError outside the vocabulary.
  std::string token_name(int32_t id) const;
};

// --- train/validation split -----------------------------------------------------------------

struct TokenSplit {
  std::vector<int32_t> train, validation;
};

// Cuts `tokens` into consecutive chunks of `chunk` tokens (the last may be shorter); chunk c goes
// to validation when c % k == k - 1, k = round(1 / validation_fraction), else to train. Both
// halves keep their chunks in text order. Interleaving (instead of holding out the tail) makes
// both halves sample the whole book, so validation loss measures generalization, not the shift
// from Genesis to Revelation. Needs 0 < validation_fraction <= 0.5 and at least k chunks.
TokenSplit split_tokens(std::vector<int32_t> tokens, double validation_fraction, int64_t chunk);

// --- batches --------------------------------------------------------------------------------

// B rows of T tokens, row-major; targets[b, t] = the token after inputs[b, t].
struct Batch {
  std::vector<int32_t> inputs, targets;  // (B, T)
  int64_t B = 0, T = 0;
  std::vector<int64_t> offsets;  // (B): where each row's window starts in the token stream
};

// Random windows of T + 1 tokens. Row b of step s starts at an offset drawn from
// philox4x32_10(counter = {b, s_lo, s_hi, 0}, key = seed): no state, so at(s) is the same batch
// in every run with this seed, resumed or not. The offset is a 64-bit word reduced modulo the
// number of start positions (bias below 2^-30 for any corpus under 2^34 tokens).
// `tokens` must outlive the sampler.
class BatchSampler {
 public:
  BatchSampler(std::span<const int32_t> tokens, int64_t batch, int64_t seq_len, uint64_t seed);
  Batch at(int64_t step) const;
  int64_t batch() const { return B_; }
  int64_t seq_len() const { return T_; }

 private:
  std::span<const int32_t> tokens_;
  int64_t B_, T_;
  uint64_t seed_;
};

// Fixed evaluation batches: windows of T + 1 tokens starting at multiples of T, so each token
// after the first is a target exactly once (windows share only their boundary token). When there
// are more than max_batches * B windows, the ones used are spread evenly over the whole split
// (window floor(i * W / (max_batches * B)) for i = 0, 1, ...), not the first ones. Only full
// batches; InputError when the split holds fewer than B windows.
std::vector<Batch> validation_batches(std::span<const int32_t> tokens, int64_t batch,
                                      int64_t seq_len, int64_t max_batches);

}  // namespace concord::train
