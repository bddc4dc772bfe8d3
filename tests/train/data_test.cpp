// Training data: the byte tokenizer, the interleaved split, the stateless batch sampler, the
// evaluation windows, and the corpus loader (the real King James Bible when it is installed).
#include "concord/train/data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "concord/numerics/check.h"
#include "temp_dir.h"

namespace concord::train {
namespace {

namespace fs = std::filesystem;


void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Tokens 0, 1, ..., n-1: each value is its own position, so a split or a window shows where its
// tokens came from.
std::vector<int32_t> positions(int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST(ByteTokenizer, RoundTripsEveryByte) {
  const ByteTokenizer tok;
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::vector<int32_t> ids = tok.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tok.decode(ids), all);
  const std::string text = "In the beginning — Αρχή, 始め\n";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
  EXPECT_EQ(tok.encode(text).size(), text.size());
}

TEST(ByteTokenizer, SpecialTokens) {
  const ByteTokenizer tok;
  EXPECT_EQ(ByteTokenizer::vocab_size(), 259);
  const std::vector<int32_t> ids = {ByteTokenizer::kBos, 'H', 'i', ByteTokenizer::kEos,
                                    ByteTokenizer::kPad};
  EXPECT_EQ(tok.decode(ids), "<|bos|>Hi<|eos|><|pad|>");
  EXPECT_EQ(tok.token_name(256), "<|bos|>");
  EXPECT_EQ(tok.token_name(257), "<|eos|>");
  EXPECT_EQ(tok.token_name(258), "<|pad|>");
  EXPECT_EQ(tok.token_name('A'), "A");
  EXPECT_EQ(tok.token_name('\n'), "<0x0A>");
  EXPECT_EQ(tok.token_name(' '), "<0x20>");
  EXPECT_EQ(tok.token_name(0xFF), "<0xFF>");
  EXPECT_THROW(tok.token_name(259), InputError);
  EXPECT_THROW(tok.token_name(-1), InputError);
  const std::vector<int32_t> bad = {65, 300};
  EXPECT_THROW(tok.decode(bad), InputError);
}

TEST(SplitTokens, InterleavedDisjointCoveringDeterministic) {
  const int32_t n = 10'050;
  const int64_t chunk = 100;
  const TokenSplit split = split_tokens(positions(n), 0.1, chunk);
  const TokenSplit again = split_tokens(positions(n), 0.1, chunk);
  EXPECT_EQ(split.train, again.train);
  EXPECT_EQ(split.validation, again.validation);

  // Disjoint, and together every token exactly once.
  ASSERT_EQ(split.train.size() + split.validation.size(), static_cast<size_t>(n));
  std::vector<int32_t> all = split.train;
  all.insert(all.end(), split.validation.begin(), split.validation.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, positions(n));

  // k = 10: chunks 9, 19, ..., 99 are validation (10 chunks of 100), both in text order.
  EXPECT_EQ(split.validation.size(), 1000u);
  EXPECT_TRUE(std::is_sorted(split.train.begin(), split.train.end()));
  EXPECT_TRUE(std::is_sorted(split.validation.begin(), split.validation.end()));
  for (const int32_t p : split.validation) EXPECT_EQ((p / chunk) % 10, 9) << p;
  // Both halves span the whole text, not one end of it.
  EXPECT_EQ(split.validation.front(), 900);
  EXPECT_EQ(split.validation.back(), 9999);
  EXPECT_EQ(split.train.front(), 0);
  EXPECT_EQ(split.train.back(), n - 1);  // the short last chunk (50 tokens) is chunk 100: train
}

TEST(SplitTokens, RoundsTheFractionAndRejectsBadArguments) {
  const TokenSplit third = split_tokens(positions(900), 0.3, 100);  // k = round(3.33) = 3
  EXPECT_EQ(third.validation.size(), 300u);
  EXPECT_EQ(third.validation.front(), 200);
  EXPECT_THROW(split_tokens(positions(100), 0.0, 10), InputError);
  EXPECT_THROW(split_tokens(positions(100), 0.6, 10), InputError);
  EXPECT_THROW(split_tokens(positions(100), 0.1, 0), InputError);
  EXPECT_THROW(split_tokens(positions(100), 0.1, 20), InputError);  // 5 chunks < k = 10
}

TEST(BatchSampler, DeterministicBySeedAndStep) {
  const std::vector<int32_t> tokens = positions(5000);
  const BatchSampler a(tokens, 4, 32, 1234), b(tokens, 4, 32, 1234), other_seed(tokens, 4, 32, 99);
  // The same (seed, step) from another sampler and in another order: the same batch.
  const Batch late = b.at(77);
  for (int64_t s = 0; s < 100; ++s) {
    const Batch x = a.at(s), y = b.at(s);
    EXPECT_EQ(x.inputs, y.inputs);
    EXPECT_EQ(x.offsets, y.offsets);
  }
  EXPECT_EQ(a.at(77).offsets, late.offsets);
  EXPECT_NE(a.at(0).offsets, a.at(1).offsets);
  EXPECT_NE(a.at(0).offsets, other_seed.at(0).offsets);
  // Rows of one step differ (they use different Philox counters).
  const Batch x = a.at(3);
  EXPECT_EQ(std::set<int64_t>(x.offsets.begin(), x.offsets.end()).size(), 4u);
}

TEST(BatchSampler, WindowsInRangeAndTargetsShifted) {
  const int64_t T = 16, B = 8;
  const std::vector<int32_t> tokens = positions(200);
  const BatchSampler sampler(tokens, B, T, 5);
  int64_t lowest = 1 << 30, highest = -1;
  for (int64_t s = 0; s < 500; ++s) {
    const Batch batch = sampler.at(s);
    ASSERT_EQ(batch.B, B);
    ASSERT_EQ(batch.T, T);
    ASSERT_EQ(batch.inputs.size(), static_cast<size_t>(B * T));
    ASSERT_EQ(batch.targets.size(), static_cast<size_t>(B * T));
    for (int64_t b = 0; b < B; ++b) {
      const int64_t off = batch.offsets[b];
      ASSERT_GE(off, 0);
      ASSERT_LE(off + T + 1, 200);
      lowest = std::min(lowest, off);
      highest = std::max(highest, off);
      for (int64_t t = 0; t < T; ++t) {
        ASSERT_EQ(batch.inputs[b * T + t], off + t);
        ASSERT_EQ(batch.targets[b * T + t], off + t + 1);
      }
    }
  }
  // 4000 draws over 184 start positions: both ends are reached (each is missed with
  // probability (183/184)^4000 < 1e-9).
  EXPECT_EQ(lowest, 0);
  EXPECT_EQ(highest, 200 - T - 1);
}

TEST(BatchSampler, OffsetsAreUniform) {
  // Chi-square over 10 equal bins of 1000 start positions, 20,000 draws, fixed seed. Under
  // uniformity the statistic exceeds 45 (9 degrees of freedom) with probability < 1e-6.
  const std::vector<int32_t> tokens = positions(1000 + 8);
  const BatchSampler sampler(tokens, 10, 8, 42);
  std::vector<double> bins(10, 0.0);
  for (int64_t s = 0; s < 2000; ++s) {
    for (const int64_t off : sampler.at(s).offsets) bins[off / 100] += 1;
  }
  double chi2 = 0.0;
  for (const double c : bins) chi2 += (c - 2000.0) * (c - 2000.0) / 2000.0;
  EXPECT_LT(chi2, 45.0);
}

TEST(BatchSampler, RejectsTooFewTokens) {
  const std::vector<int32_t> tokens = positions(16);
  EXPECT_THROW(BatchSampler(tokens, 1, 16, 0), InputError);
  EXPECT_NO_THROW(BatchSampler(tokens, 1, 15, 0));
  EXPECT_THROW(BatchSampler(tokens, 0, 4, 0), InputError);
}

TEST(ValidationBatches, NonOverlappingWindowsEachTargetOnce) {
  const int64_t T = 10, B = 3;
  const std::vector<int32_t> tokens = positions(1000);  // 99 windows -> 33 batches
  const std::vector<Batch> all = validation_batches(tokens, B, T, 1000);
  ASSERT_EQ(all.size(), 33u);
  std::vector<int32_t> targets;
  for (const Batch& batch : all) {
    for (int64_t b = 0; b < B; ++b) {
      EXPECT_EQ(batch.offsets[b] % T, 0);
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(batch.inputs[b * T + t], batch.offsets[b] + t);
        EXPECT_EQ(batch.targets[b * T + t], batch.offsets[b] + t + 1);
      }
    }
    targets.insert(targets.end(), batch.targets.begin(), batch.targets.end());
  }
  // Every token but the first is a target exactly once (tokens 991..999 fit no full window).
  std::vector<int32_t> want(990);
  std::iota(want.begin(), want.end(), 1);
  EXPECT_EQ(targets, want);
  // Deterministic.
  EXPECT_EQ(validation_batches(tokens, B, T, 1000)[5].inputs, all[5].inputs);
}

TEST(ValidationBatches, FewBatchesSpreadOverTheSplit) {
  const std::vector<int32_t> tokens = positions(10'001);  // 1000 windows of 10
  const std::vector<Batch> some = validation_batches(tokens, 2, 10, 2);
  ASSERT_EQ(some.size(), 2u);
  const std::vector<int64_t> offsets = {some[0].offsets[0], some[0].offsets[1],
                                        some[1].offsets[0], some[1].offsets[1]};
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 2500, 5000, 7500}));
  EXPECT_THROW(validation_batches(positions(30), 4, 10, 5), InputError);  // 2 windows < B
  EXPECT_THROW(validation_batches(tokens, 2, 10, 0), InputError);
}

TEST(Corpus, TextFiles) {
  TempDir dir;
  const fs::path good = dir.path / "good.txt", empty = dir.path / "empty.txt",
                 binary = dir.path / "binary.bin";
  write_bytes(good, "Blessed are the meek: for they shall inherit the earth. é\n");
  write_bytes(empty, "");
  write_bytes(binary, std::string("ok\xC3(", 4));
  EXPECT_EQ(load_corpus(good.string()),
            "Blessed are the meek: for they shall inherit the earth. é\n");
  auto message_of = [](const std::string& spec) -> std::string {
    try {
      load_corpus(spec);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message_of(empty.string()).find("empty"), std::string::npos);
  EXPECT_NE(message_of(binary.string()).find("not UTF-8"), std::string::npos);
  EXPECT_NE(message_of((dir.path / "missing.txt").string()).find("cannot read"), std::string::npos);
  EXPECT_NE(message_of(dir.path.string()).find("directory"), std::string::npos);
}

TEST(Corpus, MissingBibleToolSaysHowToInstall) {
  TempDir dir;
  try {
    load_kjv(dir.path / "no-such-bible", dir.path / "cache" / "kjv.txt");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("install bible-kjv: run scripts/setup"),
              std::string::npos)
        << e.what();
  }
  // A tool that prints something else is caught too.
  const fs::path fake = dir.path / "fake-bible";
  write_bytes(fake, "#!/bin/sh\necho 'not a bible'\n");
  fs::permissions(fake, fs::perms::owner_all);
  EXPECT_THROW(load_kjv(fake, {}), InputError);
}

TEST(Corpus, KingJamesBible) {
  if (!fs::exists(std::string(kBibleTool))) GTEST_SKIP() << "bible-kjv is not installed";
  TempDir dir;
  const char* saved = std::getenv("XDG_CACHE_HOME");
  const std::string saved_value = saved ? saved : "";
  ::setenv("XDG_CACHE_HOME", dir.path.c_str(), 1);
  const std::string text = load_corpus("kjv");
  const fs::path cache = dir.path / "concord" / "kjv.txt";
  const bool cached = fs::exists(cache);
  // The cache is read instead of running the tool: a missing tool does not matter any more.
  const std::string from_cache = load_kjv(dir.path / "no-such-bible", cache);
  if (saved) {
    ::setenv("XDG_CACHE_HOME", saved_value.c_str(), 1);
  } else {
    ::unsetenv("XDG_CACHE_HOME");
  }
  EXPECT_GT(text.size(), 4'000'000u);
  EXPECT_TRUE(text.starts_with("Ge1:1 In the beginning God created the heaven and the earth.\n"));
  EXPECT_TRUE(text.ends_with("Rev22:21 The grace of our Lord Jesus Christ be with you all. Amen.\n"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 31'102);  // the KJV's verse count
  EXPECT_TRUE(is_complete_kjv(text));
  EXPECT_TRUE(cached);
  EXPECT_EQ(from_cache, text);
  // A truncated cache is not trusted.
  EXPECT_FALSE(is_complete_kjv(std::string_view(text).substr(0, text.size() / 2)));
}

}  // namespace
}  // namespace concord::train

namespace concord::train {
namespace {

// python-docs: every *.rst.txt under the sources folder, in sorted path order, each ending in a
// newline; a missing folder says which package to install.
TEST(Corpus, PythonDocsConcatenatesTheSourcesInSortedOrder) {
  const TempDir tmp;
  std::filesystem::create_directories(tmp.path / "library");
  std::string big(1 << 20, 'x');
  std::ofstream(tmp.path / "library" / "b.rst.txt") << "second";
  std::ofstream(tmp.path / "a.rst.txt") << big;
  std::ofstream(tmp.path / "z.html") << "not a source";
  EXPECT_EQ(load_python_docs(tmp.path), big + "\nsecond\n");
  try {
    load_python_docs(tmp.path / "missing");
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("python3.11-doc"), std::string::npos) << e.what();
  }
  if (std::filesystem::exists(kPythonDocSources)) {
    const std::string docs = load_corpus("python-docs");
    EXPECT_GT(docs.size(), size_t{5} << 20);
    EXPECT_NE(docs.find("The Python Tutorial"), std::string::npos);
  }
}

}  // namespace
}  // namespace concord::train

