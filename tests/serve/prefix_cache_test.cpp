// The prefix snapshot cache (serve/prefix_cache.h): restored rows equal the rows a prefill writes,
// bit for bit; an engine with the cache gives every request the tokens, log-probs and full
// distributions of an engine without it (repeated prompts, shared prefixes with other tails,
// unrelated prompts; chunk sizes that cut the blocks anywhere; NVFP4, whose blocks must be whole
// prefill chunks, refused otherwise); the
// budget holds and least recently used entries go first; changed weights change the keys;
// prompt-scoring requests and recurrent models stay out.
#include "concord/serve/prefix_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "concord/model/model.h"
#include "concord/numerics/check.h"
#include "concord/serve/engine.h"

#include <fmt/format.h>
#include <unistd.h>

namespace concord::serve {
namespace {

using model::CachedInput;
using model::KvCache;
using model::LogitRows;
using model::Model;
using model::ModelConfig;
using model::PrecisionPolicy;

ModelConfig config() {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 256;
  return c;
}

std::vector<int32_t> tokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % 97);
  return t;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The prompts a server sees: one repeated, others sharing its first 70 tokens (a system prompt)
// with their own tails, one unrelated, one shorter than a block, and the first again.
std::vector<std::vector<int32_t>> prompts() {
  const std::vector<int32_t> system = tokens(70, 1);
  return {concat(system, tokens(45, 2)), concat(system, tokens(45, 2)), concat(system, tokens(30, 3)),
          tokens(90, 4),                 concat(system, tokens(1, 5)),  tokens(9, 6),
          system,                        concat(system, tokens(45, 2))};
}

PrefixCacheOptions blocks(int64_t block, size_t max_bytes = size_t{256} << 20) {
  PrefixCacheOptions o;
  o.block = block;
  o.max_bytes = max_bytes;
  return o;
}

Request request(const std::vector<int32_t>& prompt, uint64_t seed) {
  Request r;
  r.prompt = prompt;
  r.max_tokens = 12;
  r.sampling.temperature = 0.9f;
  r.sampling.seed = seed;
  r.top_logprobs = 3;
  r.full_logprobs = true;
  return r;
}

TEST(PrefixCache, RestoredRowsAreThePrefillsRowsBitForBit) {
  Model m(config(), PrecisionPolicy::preset("bf16"));
  m.init_random(7, 0.08f);
  const std::vector<int32_t> prompt = tokens(150, 9);
  KvCache a(m.config(), 1), b(m.config(), 1);
  const int sa = a.allocate(), sb = b.allocate();
  std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
  const CachedInput in{sa, prompt, LogitRows::last};
  m.forward_cached(a, {&in, 1}, logits);
  PrefixCache cache(m.config(), PrefixCache::fingerprint_of(m), blocks(32));
  cache.store(prompt, a, sa);
  EXPECT_EQ(cache.stats().stored, 5);  // [0,32) .. [96,128), and the tail [128, 149)
  EXPECT_EQ(cache.restore(prompt, b, sb), 149);
  EXPECT_EQ(b.length(sb), 149);
  const int64_t w = a.row_width();
  for (int64_t l = 0; l < a.num_layers(); ++l) {
    EXPECT_EQ(std::memcmp(a.keys(sa, l), b.keys(sb, l), static_cast<size_t>(149 * w) * sizeof(float)), 0) << l;
    EXPECT_EQ(std::memcmp(a.values(sa, l), b.values(sb, l), static_cast<size_t>(149 * w) * sizeof(float)), 0) << l;
  }
  // A prompt that shares 100 tokens resumes from the last whole block inside them.
  std::vector<int32_t> other = prompt;
  other[100] = (other[100] + 1) % 97;
  b.release(sb);
  const int sc = b.allocate();
  EXPECT_EQ(cache.restore(other, b, sc), 96);
  EXPECT_EQ(cache.stats().hits, 2);
  EXPECT_EQ(cache.stats().tokens_reused, 149 + 96);
}

TEST(PrefixCache, AnEngineWithTheCacheGivesEveryRequestTheSameBits) {
  for (const std::string preset : {"fp32", "bf16", "mxfp8", "nvfp4"}) {
    // NVFP4 shares an activation scale across a prefill chunk's rows: its blocks must be whole
    // chunks (below); the row-local presets take any chunk.
    const bool row_local = preset != "nvfp4";
    for (const int64_t chunk : row_local ? std::vector<int64_t>{512, 24, 7} : std::vector<int64_t>{16, 8}) {
      Model m(config(), PrecisionPolicy::preset(preset));
      m.init_random(7, 0.08f);
      EngineOptions o;
      o.max_sequences = 3;
      o.prefill_chunk = chunk;
      Engine plain(m, o), cached(m, o);
      auto cache = std::make_shared<PrefixCache>(m.config(), PrefixCache::fingerprint_of(m),
                                                 blocks(16));
      cached.set_prefix_cache(cache);
      const auto ps = prompts();
      // One at a time (later prompts find what earlier ones stored), then all together.
      std::vector<Request> all;
      for (size_t i = 0; i < ps.size(); ++i) {
        all.push_back(request(ps[i], 100 + i));
        const Completion want = plain.generate({request(ps[i], 100 + i)})[0];
        const Completion got = cached.generate({request(ps[i], 100 + i)})[0];
        const std::string where = preset + " chunk " + std::to_string(chunk) + " prompt " + std::to_string(i);
        EXPECT_EQ(got.tokens, want.tokens) << where;
        EXPECT_EQ(got.logprobs, want.logprobs) << where;
        ASSERT_EQ(got.full_logprobs.size(), want.full_logprobs.size()) << where;
        for (size_t t = 0; t < got.full_logprobs.size(); ++t)
          EXPECT_EQ(got.full_logprobs[t], want.full_logprobs[t]) << where << " token " << t;
      }
      // Prompts 1 and 7 repeat 0 (114 tokens resumed each: its blocks and its tail), 2, 4 and 6
      // share 64 of its 70 system tokens (four 16-token blocks; 6 is the system prompt alone).
      // NVFP4 keeps no tail that ends inside a chunk: 112 for the repeats.
      const int64_t repeat = row_local ? 114 : 112;
      EXPECT_EQ(cache->stats().hits, 5) << preset << " chunk " << chunk;
      EXPECT_EQ(cache->stats().tokens_reused, repeat + 64 + 64 + 64 + repeat) << preset << " chunk " << chunk;
      EXPECT_EQ(cached.stats().prefix_reused_tokens, cache->stats().tokens_reused);
      const std::vector<Completion> want = plain.generate(all), got = cached.generate(all);
      for (size_t i = 0; i < all.size(); ++i) {
        EXPECT_EQ(got[i].tokens, want[i].tokens) << preset << " batch " << i;
        EXPECT_EQ(got[i].logprobs, want[i].logprobs) << preset << " batch " << i;
      }
    }
  }
}

// The disaggregated hand-over (concord generate --disaggregate): a prefill worker's engine
// computes the prompt, exports its rows as one message; a decode worker's engine of its own (its
// own cache, as another process would have) imports them and generates: the same bits as one engine
// doing both. A record that fails its checks is left out and prefilled again (same bits); a
// malformed message is an error.
TEST(PrefixCache, AHandedOverPromptDecodesToTheSameBits) {
  for (const std::string preset : {"fp32", "bf16", "nvfp4"}) {
    const bool row_local = preset != "nvfp4";
    Model m(config(), PrecisionPolicy::preset(preset));
    m.init_random(7, 0.08f);
    EngineOptions o;
    o.max_sequences = 1;
    o.prefill_chunk = row_local ? 24 : 16;
    const int64_t align = row_local ? 1 : o.prefill_chunk;
    const std::vector<int32_t> prompt = tokens(row_local ? 115 : 113, 3);
    const Completion want = Engine(m, o).generate({request(prompt, 5)})[0];

    Engine prefill(m, o), decode(m, o);
    auto sent = std::make_shared<PrefixCache>(m.config(), PrefixCache::fingerprint_of(m), blocks(16));
    auto got_cache = std::make_shared<PrefixCache>(m.config(), PrefixCache::fingerprint_of(m), blocks(16));
    prefill.set_prefix_cache(sent);
    decode.set_prefix_cache(got_cache);
    Request first = request(prompt, 5);
    first.max_tokens = 1;  // the prefill worker: the prompt's rows (its one token is dropped)
    (void)prefill.generate({first});
    const std::vector<uint8_t> message = sent->export_prompt(prompt, align);
    EXPECT_EQ(got_cache->import_prompt(message, "hand-over"), sent->stats().stored) << preset;
    const Completion got = decode.generate({request(prompt, 5)})[0];
    EXPECT_EQ(got.tokens, want.tokens) << preset;
    EXPECT_EQ(got.logprobs, want.logprobs) << preset;
    ASSERT_EQ(got.full_logprobs.size(), want.full_logprobs.size());
    for (size_t t = 0; t < got.full_logprobs.size(); ++t) EXPECT_EQ(got.full_logprobs[t], want.full_logprobs[t]) << preset << " " << t;
    // The decode worker prefilled nothing but the last prompt token (NVFP4: from the last whole chunk).
    const int64_t resumed = row_local ? static_cast<int64_t>(prompt.size()) - 1 : 112;
    EXPECT_EQ(decode.stats().prefix_reused_tokens, resumed) << preset;
    EXPECT_EQ(decode.stats().prefill_tokens, static_cast<int64_t>(prompt.size()) - resumed) << preset;

    // One flipped byte in the third record's rows: that record is named and left out, its positions
    // (and every later one) prefilled again; still the same bits.
    std::vector<std::string> warnings;
    PrefixCacheOptions wo = blocks(16);
    wo.warn = [&](const std::string& w) { warnings.push_back(w); };
    Engine again(m, o);
    auto partial = std::make_shared<PrefixCache>(m.config(), PrefixCache::fingerprint_of(m), wo);
    again.set_prefix_cache(partial);
    std::vector<uint8_t> bad = message;
    size_t at = 16;
    for (int r = 0; r < 2; ++r) {
      uint64_t n;
      std::memcpy(&n, bad.data() + at, 8);
      at += 8 + n;
    }
    bad[at + 8 + 72 + 4 * 16 + 3] ^= 0x40;  // record 3: past its length, header and tokens, into the rows
    EXPECT_EQ(partial->import_prompt(bad, "hand-over"), sent->stats().stored - 1);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find("hand-over: record 3 of"), std::string::npos) << warnings[0];
    EXPECT_NE(warnings[0].find("checksum mismatch"), std::string::npos) << warnings[0];
    const Completion redo = again.generate({request(prompt, 5)})[0];
    EXPECT_EQ(redo.tokens, want.tokens) << preset;
    EXPECT_EQ(redo.logprobs, want.logprobs) << preset;
    EXPECT_EQ(again.stats().prefix_reused_tokens, 32) << preset;  // the two blocks before the bad one

    // Malformed messages.
    PrefixCache c(m.config(), PrefixCache::fingerprint_of(m), blocks(16));
    std::vector<uint8_t> truncated(message.begin(), message.end() - 5);
    EXPECT_THROW(c.import_prompt(truncated, "hand-over"), InputError);
    std::vector<uint8_t> magic = message;
    magic[0] = 'X';
    EXPECT_THROW(c.import_prompt(magic, "hand-over"), InputError);
    std::vector<uint8_t> longer = message;
    longer.push_back(0);
    EXPECT_THROW(c.import_prompt(longer, "hand-over"), InputError);
    // Another model's message: every record is refused, nothing is held.
    Model other(config(), PrecisionPolicy::preset(preset));
    other.init_random(8, 0.08f);
    PrefixCacheOptions quiet = blocks(16);
    quiet.warn = [](const std::string&) {};
    PrefixCache foreign(other.config(), PrefixCache::fingerprint_of(other), quiet);
    EXPECT_EQ(foreign.import_prompt(message, "hand-over"), 0);
  }
}

TEST(PrefixCache, TheBudgetHoldsAndTheLeastRecentlyUsedGoFirst) {
  Model m(config(), PrecisionPolicy::preset("fp32"));
  m.init_random(7, 0.08f);
  KvCache kv(m.config(), 1);
  std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
  // One 16-token block of this model: 3 layers x 2 x 16 x 32 floats + its tokens and bookkeeping.
  auto fill = [&](const std::vector<int32_t>& p) {
    const int slot = kv.allocate();
    const CachedInput in{slot, p, LogitRows::last};
    m.forward_cached(kv, {&in, 1}, logits);
    return slot;
  };
  PrefixCache probe(m.config(), 1, blocks(16));
  const std::vector<int32_t> a = tokens(17, 1), b = tokens(17, 2), c = tokens(17, 3);
  int s = fill(a);
  probe.store(a, kv, s);
  const size_t one = probe.stats().bytes;  // a's single block [0, 16)
  kv.release(s);
  PrefixCache cache(m.config(), 1, blocks(16, 2 * one));
  for (const auto* p : {&a, &b}) {
    s = fill(*p);
    cache.store(*p, kv, s);
    kv.release(s);
  }
  EXPECT_EQ(cache.stats().bytes, 2 * one);
  s = kv.allocate();
  EXPECT_EQ(cache.restore(a, kv, s), 16);  // a is now the most recently used
  kv.release(s);
  s = fill(c);
  cache.store(c, kv, s);  // evicts b
  kv.release(s);
  EXPECT_EQ(cache.stats().evicted, 1);
  EXPECT_LE(cache.stats().bytes, 2 * one);
  for (const auto& [p, want] : {std::pair{&a, 16}, {&b, 0}, {&c, 16}}) {
    s = kv.allocate();
    EXPECT_EQ(cache.restore(*p, kv, s), want);
    kv.release(s);
  }
}

TEST(PrefixCache, ChangedWeightsChangeTheFingerprintAndScoringRequestsStayOut) {
  Model m(config(), PrecisionPolicy::preset("fp32"));
  m.init_random(7, 0.08f);
  const uint64_t before = PrefixCache::fingerprint_of(m);
  m.param("model.layers.0.mlp.up_proj.weight")[5] += 1e-3f;
  EXPECT_NE(PrefixCache::fingerprint_of(m), before);
  m.init_random(7, 0.08f);
  EXPECT_EQ(PrefixCache::fingerprint_of(m), before);
  EXPECT_NE(PrefixCache::fingerprint_of(m), [&] {
    Model q(config(), PrecisionPolicy::preset("bf16"));
    q.init_random(7, 0.08f);
    return PrefixCache::fingerprint_of(q);
  }());

  Engine e(m, {});
  auto cache = std::make_shared<PrefixCache>(m.config(), before, blocks(8));
  e.set_prefix_cache(cache);
  Request r = request(tokens(40, 3), 1);
  r.prompt_logprobs = true;
  e.generate({r, r});
  EXPECT_EQ(cache->stats().lookups, 0);
  EXPECT_EQ(cache->stats().stored, 0);
}

TEST(PrefixCache, UnderNvfp4ABlockThatIsNotWholeChunksIsRefused) {
  // A row's keys depend on every row of its prefill chunk (the shared activation scale), so a
  // block that ends inside a chunk would hold rows that depend on tokens past its key.
  Model m(config(), PrecisionPolicy::preset("nvfp4"));
  Engine e(m, {.prefill_chunk = 24});
  try {
    e.set_prefix_cache(std::make_shared<PrefixCache>(m.config(), 1, blocks(16)));
    ADD_FAILURE() << "block 16 with chunk 24 under nvfp4 was accepted";
  } catch (const InputError& err) {
    EXPECT_NE(std::string(err.what()).find("multiple of the prefill chunk (24)"), std::string::npos) << err.what();
  }
  e.set_prefix_cache(std::make_shared<PrefixCache>(m.config(), 1, blocks(48)));
  Model f(config(), PrecisionPolicy::preset("fp32"));
  Engine any(f, {.prefill_chunk = 24});
  any.set_prefix_cache(std::make_shared<PrefixCache>(f.config(), 1, blocks(16)));
}

// On disk: a new cache (as in a new process) of the same model restores from the files bit for
// bit; a corrupt, truncated or misnamed file is a miss with a warning naming it and its problem,
// then rewritten; another model's cache does not see the files; the disk budget holds.
TEST(PrefixCache, SnapshotFilesOutliveTheCacheAndBadOnesAreRecomputed) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("concord-prefix-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  Model m(config(), PrecisionPolicy::preset("bf16"));
  m.init_random(7, 0.08f);
  const uint64_t fp = PrefixCache::fingerprint_of(m);
  const std::vector<int32_t> prompt = tokens(100, 4);
  KvCache kv(m.config(), 2);
  const int full = kv.allocate();
  std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
  const CachedInput in{full, prompt, LogitRows::last};
  m.forward_cached(kv, {&in, 1}, logits);
  std::vector<std::string> warnings;
  PrefixCacheOptions o = blocks(32);
  o.dir = dir.string();
  o.warn = [&](const std::string& message) { warnings.push_back(message); };
  const int64_t w = kv.row_width();
  auto restore_and_compare = [&](PrefixCache& c) {
    const int slot = kv.allocate();
    const int64_t n = c.restore(prompt, kv, slot);
    for (int64_t l = 0; l < kv.num_layers() && n > 0; ++l) {
      EXPECT_EQ(std::memcmp(kv.keys(slot, l), kv.keys(full, l), static_cast<size_t>(n * w) * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(kv.values(slot, l), kv.values(full, l), static_cast<size_t>(n * w) * sizeof(float)), 0);
    }
    kv.release(slot);
    return n;
  };
  {
    PrefixCache a(m.config(), fp, o);
    a.store(prompt, kv, full);
    EXPECT_EQ(a.stats().disk_writes, 4);  // [0,32) [32,64) [64,96) and the tail [96,99)
  }
  const fs::path files = dir / fmt::format("{:016x}", fp);
  std::vector<fs::path> snaps;
  for (const auto& f : fs::directory_iterator(files)) snaps.push_back(f.path());
  ASSERT_EQ(snaps.size(), 4u);
  {
    PrefixCache b(m.config(), fp, o);
    EXPECT_EQ(restore_and_compare(b), 99);
    EXPECT_EQ(b.stats().disk_reads, 4);
  }
  // Another model (fingerprint) has its own directory: nothing to read, nothing to warn about.
  {
    PrefixCache other(m.config(), fp + 1, o);
    EXPECT_EQ(restore_and_compare(other), 0);
  }
  EXPECT_TRUE(warnings.empty());
  // Corrupt the second block's rows, truncate the tail.
  PrefixCache probe(m.config(), fp, blocks(32));
  auto file_for = [&](int64_t end) {  // the file whose header says it ends at `end`
    for (const fs::path& p : snaps) {
      std::ifstream f(p, std::ios::binary);
      char header[72];
      f.read(header, 72);
      int64_t e = 0;
      std::memcpy(&e, header + 40, 8);
      if (e == end) return p;
    }
    return fs::path();
  };
  const fs::path second = file_for(64), tail = file_for(99);
  ASSERT_FALSE(second.empty());
  ASSERT_FALSE(tail.empty());
  {
    std::fstream f(second, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(fs::file_size(second) - 100));
    f.put('\x55');
  }
  fs::resize_file(tail, fs::file_size(tail) - 8);
  {
    PrefixCache c(m.config(), fp, o);
    EXPECT_EQ(restore_and_compare(c), 32);  // the first block only
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find(second.string() + ": checksum mismatch (corrupt)"), std::string::npos) << warnings[0];
    c.store(prompt, kv, full);  // rewrites the second block and the tail (not read: replaced)
    EXPECT_EQ(warnings.size(), 1u);
  }
  // A truncated file, read: rejected as such.
  fs::resize_file(tail, fs::file_size(tail) - 8);
  {
    PrefixCache c(m.config(), fp, o);
    EXPECT_EQ(restore_and_compare(c), 96);  // the blocks, not the tail
    ASSERT_EQ(warnings.size(), 2u);
    EXPECT_NE(warnings[1].find(tail.string() + ": "), std::string::npos) << warnings[1];
    EXPECT_NE(warnings[1].find("(truncated)"), std::string::npos) << warnings[1];
    c.store(prompt, kv, full);
  }
  warnings.clear();
  {
    PrefixCache d(m.config(), fp, o);
    EXPECT_EQ(restore_and_compare(d), 99);
    EXPECT_TRUE(warnings.empty()) << warnings.front();
  }
  // A file under another entry's name.
  fs::copy_file(file_for(32), second, fs::copy_options::overwrite_existing);
  {
    PrefixCache e(m.config(), fp, o);
    EXPECT_EQ(restore_and_compare(e), 32);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_NE(warnings[0].find("not the one its name says"), std::string::npos) << warnings[0];
  }
  // The disk budget: one block's file at most, the older ones removed.
  warnings.clear();
  fs::remove_all(dir);
  {
    PrefixCacheOptions small = o;
    small.max_disk_bytes = 1;  // less than any file
    PrefixCache f(m.config(), fp, small);
    f.store(prompt, kv, full);
    EXPECT_EQ(f.stats().disk_writes, 4);
    EXPECT_EQ(f.stats().disk_evicted, 3);  // the newest file always stays
    size_t n = 0;
    for ([[maybe_unused]] const auto& x : fs::directory_iterator(dir / fmt::format("{:016x}", fp))) ++n;
    EXPECT_EQ(n, 1u);
  }
  fs::remove_all(dir);
}

TEST(PrefixCache, ARecurrentModelIsRefused) {
  ModelConfig c = config();
  c.architecture = "ConcordRecurrentForCausalLM";
  EXPECT_THROW(PrefixCache(c, 1), InputError);
}

}  // namespace
}  // namespace concord::serve
