// GGUF reader/writer: round trips of every metadata and tensor type, the byte layout against a
// file assembled by hand, hostile files (each with its own one-line error, none crashing), and
// the codecs (Q4_0/Q4_1/Q8_0/MXFP4/F16/BF16 encode; every legacy and k-quant decode) against
// scalar re-implementations written here from the format definitions (ggml-quants.c, their
// loops transliterated), sharing no code with src/; hand-built blocks pin the layouts.
#include "concord/io/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "concord/numerics/check.h"

namespace concord::io {
namespace {

namespace fs = std::filesystem;

// A little-endian byte builder for files assembled by hand.
struct Builder {
  std::string bytes;
  Builder& u8(uint8_t v) { return raw(&v, 1); }
  Builder& u32(uint32_t v) { return raw(&v, 4); }
  Builder& u64(uint64_t v) { return raw(&v, 8); }
  Builder& f32(float v) { return raw(&v, 4); }
  Builder& str(const std::string& s) {
    u64(s.size());
    bytes += s;
    return *this;
  }
  Builder& raw(const void* p, size_t n) {
    bytes.append(static_cast<const char*>(p), n);
    return *this;
  }
  Builder& pad(size_t alignment) {
    bytes.append((alignment - bytes.size() % alignment) % alignment, '\0');
    return *this;
  }
  // header: magic, version, counts
  static Builder header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    Builder b;
    b.bytes = "GGUF";
    b.u32(version).u64(tensors).u64(kvs);
    return b;
  }
  std::vector<uint8_t> image() const { return {bytes.begin(), bytes.end()}; }
};

std::string error_of(std::vector<uint8_t> image) {
  try {
    GgufFile::from_bytes(std::move(image), "bad.gguf");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

void expect_error(const Builder& b, const std::string& fragment) {
  const std::string message = error_of(b.image());
  ASSERT_FALSE(message.empty()) << "expected an error containing: " << fragment;
  EXPECT_EQ(message.rfind("[gguf] bad.gguf: ", 0), 0u) << message;
  EXPECT_NE(message.find(fragment), std::string::npos) << message << " (expected: " << fragment << ")";
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

// A tensor info entry.
Builder& tensor_info(Builder& b, const std::string& name, std::vector<uint64_t> dims,
                     uint32_t type, uint64_t offset) {
  b.str(name).u32(static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) b.u64(d);
  return b.u32(type).u64(offset);
}

// --- the size table ---

TEST(GgufTypes, SizeTableMatchesGgml) {
  struct Expected {
    uint32_t type;
    const char* name;
    int64_t block, bytes;
  };
  // ggml.c type_traits: block size and sizeof(block_*).
  const Expected expected[] = {
      {0, "F32", 1, 4},        {1, "F16", 1, 2},        {2, "Q4_0", 32, 18},
      {3, "Q4_1", 32, 20},     {6, "Q5_0", 32, 22},     {7, "Q5_1", 32, 24},
      {8, "Q8_0", 32, 34},     {9, "Q8_1", 32, 40},     {10, "Q2_K", 256, 84},
      {11, "Q3_K", 256, 110},  {12, "Q4_K", 256, 144},  {13, "Q5_K", 256, 176},
      {14, "Q6_K", 256, 210},  {15, "Q8_K", 256, 292},  {16, "IQ2_XXS", 256, 66},
      {17, "IQ2_XS", 256, 74}, {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
      {20, "IQ4_NL", 32, 18},  {21, "IQ3_S", 256, 110}, {22, "IQ2_S", 256, 82},
      {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},       {25, "I16", 1, 2},
      {26, "I32", 1, 4},       {27, "I64", 1, 8},       {28, "F64", 1, 8},
      {29, "IQ1_M", 256, 56},  {30, "BF16", 1, 2},      {34, "TQ1_0", 256, 54},
      {35, "TQ2_0", 256, 66},  {39, "MXFP4", 32, 17},   {40, "NVFP4", 64, 36},
      {41, "Q1_0", 128, 18},
  };
  for (const Expected& e : expected) {
    const auto t = ggml_type_traits(e.type);
    ASSERT_TRUE(t.has_value()) << e.name;
    EXPECT_EQ(t->name, e.name);
    EXPECT_EQ(t->block_size, e.block) << e.name;
    EXPECT_EQ(t->type_size, e.bytes) << e.name;
    EXPECT_EQ(ggml_type_from_name(e.name), static_cast<GgmlType>(e.type));
  }
  for (uint32_t removed : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 42u, 1000u}) {
    EXPECT_FALSE(ggml_type_traits(removed).has_value()) << removed;
  }
  EXPECT_EQ(ggml_type_from_name("mxfp4"), GgmlType::mxfp4);
  EXPECT_EQ(ggml_type_from_name("q4_k"), GgmlType::q4_k);
  EXPECT_FALSE(ggml_type_from_name("Q4_2").has_value());
  const std::vector<int64_t> ok{64, 3}, bad_row{48, 3}, huge{1LL << 40, 1LL << 40};
  EXPECT_EQ(gguf_tensor_byte_size(GgmlType::q8_0, ok), 2u * 3u * 34u);
  EXPECT_FALSE(gguf_tensor_byte_size(GgmlType::q8_0, bad_row).has_value());
  EXPECT_FALSE(gguf_tensor_byte_size(GgmlType::f32, huge).has_value());
}

// --- round trips ---

GgufMetadata every_metadata_type() {
  GgufMetadata m;
  auto scalar = [&m](const std::string& key, GgufType t, int64_t v) {
    GgufValue x;
    x.type = t;
    x.ints = {v};
    m.emplace_back(key, x);
  };
  m.emplace_back("general.architecture", GgufValue::of_string("llama"));
  scalar("t.u8", GgufType::uint8, 255);
  scalar("t.i8", GgufType::int8, -128);
  scalar("t.u16", GgufType::uint16, 65535);
  scalar("t.i16", GgufType::int16, -32768);
  m.emplace_back("t.u32", GgufValue::of_uint32(4294967295u));
  m.emplace_back("t.i32", GgufValue::of_int32(-2147483647 - 1));
  m.emplace_back("t.u64", GgufValue::of_uint64(18446744073709551615ull));
  scalar("t.i64", GgufType::int64, std::numeric_limits<int64_t>::min());
  m.emplace_back("t.f32", GgufValue::of_float32(0.1f));
  GgufValue f64;
  f64.type = GgufType::float64;
  f64.floats = {-0.0};
  m.emplace_back("t.f64", f64);
  m.emplace_back("t.bool", GgufValue::of_bool(true));
  m.emplace_back("t.str", GgufValue::of_string(std::string("caf\xc3\xa9 \0 x", 9)));
  m.emplace_back("t.strs", GgufValue::of_strings({"a", "", "\xe2\x82\xac"}));
  m.emplace_back("t.a_u8", GgufValue::of_ints(GgufType::uint8, {0, 1, 255}));
  m.emplace_back("t.a_i8", GgufValue::of_ints(GgufType::int8, {-128, 127}));
  m.emplace_back("t.a_u16", GgufValue::of_ints(GgufType::uint16, {65535}));
  m.emplace_back("t.a_i16", GgufValue::of_ints(GgufType::int16, {-32768, 7}));
  m.emplace_back("t.a_u32", GgufValue::of_ints(GgufType::uint32, {4294967295}));
  m.emplace_back("t.a_i32", GgufValue::of_ints(GgufType::int32, {-5, 5}));
  m.emplace_back("t.a_u64", GgufValue::of_ints(GgufType::uint64, {-1, 0}));
  m.emplace_back("t.a_i64", GgufValue::of_ints(GgufType::int64, {std::numeric_limits<int64_t>::max()}));
  m.emplace_back("t.a_bool", GgufValue::of_ints(GgufType::boolean, {1, 0, 1}));
  m.emplace_back("t.a_f32", GgufValue::of_floats(GgufType::float32, {1.5, -0.375}));
  m.emplace_back("t.a_f64", GgufValue::of_floats(GgufType::float64, {1e300, -1e-300}));
  m.emplace_back("t.empty", GgufValue::of_ints(GgufType::int32, {}));
  return m;
}

void expect_same_value(const GgufValue& a, const GgufValue& b, const std::string& key) {
  EXPECT_EQ(a.type, b.type) << key;
  EXPECT_EQ(a.element_type(), b.element_type()) << key;
  EXPECT_EQ(a.ints, b.ints) << key;
  EXPECT_EQ(a.strings, b.strings) << key;
  ASSERT_EQ(a.floats.size(), b.floats.size()) << key;
  for (size_t i = 0; i < a.floats.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint64_t>(a.floats[i]), std::bit_cast<uint64_t>(b.floats[i])) << key;
  }
}

TEST(GgufRoundTrip, EveryMetadataType) {
  const GgufMetadata m = every_metadata_type();
  const GgufFile f = GgufFile::from_bytes(serialize_gguf(m, {}), "meta.gguf");
  ASSERT_EQ(f.metadata().size(), m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(f.metadata()[i].first, m[i].first);
    expect_same_value(f.metadata()[i].second, m[i].second, m[i].first);
  }
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_TRUE(f.tensors().empty());
}

TEST(GgufRoundTrip, TypedGetters) {
  const GgufFile f = GgufFile::from_bytes(serialize_gguf(every_metadata_type(), {}), "meta.gguf");
  EXPECT_EQ(f.get_int("t.u8"), 255);
  EXPECT_EQ(f.get_int("t.i16"), -32768);
  EXPECT_EQ(f.get_int("t.u32"), 4294967295);
  EXPECT_EQ(f.get_int("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get_float("t.f32"), static_cast<double>(0.1f));
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  auto error = [&f](auto get) -> std::string {
    try {
      get(f);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error([](const GgufFile& g) { g.get_int("t.u64"); }).find("does not fit in int64"),
            std::string::npos);
  EXPECT_NE(error([](const GgufFile& g) { g.get_int("t.bool"); }).find("is bool, expected an integer"),
            std::string::npos);
  EXPECT_NE(error([](const GgufFile& g) { g.get_int("t.a_i32"); }).find("an array of int32"),
            std::string::npos);
  EXPECT_NE(error([](const GgufFile& g) { g.get_float("t.u8"); }).find("expected float32 or float64"),
            std::string::npos);
  EXPECT_NE(error([](const GgufFile& g) { g.get_string("t.f32"); }).find("expected a string"),
            std::string::npos);
  EXPECT_NE(error([](const GgufFile& g) { g.get_int("nope"); }).find("[gguf] meta.gguf: no metadata key 'nope'"),
            std::string::npos);
  EXPECT_NE(error([](const GgufFile& g) { g.get("w"); }).find("no tensor named 'w'"),
            std::string::npos);
}

std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(GgufRoundTrip, EveryTensorTypeKeepsItsBytes) {
  // Encodable types go through encode_gguf_tensor; the others are raw bytes of the right size.
  std::vector<std::vector<uint8_t>> storage;
  std::vector<GgufTensorToWrite> tensors;
  int index = 0;
  for (uint32_t number = 0; number < 64; ++number) {
    const auto traits = ggml_type_traits(number);
    if (!traits) continue;
    const auto type = static_cast<GgmlType>(number);
    const std::vector<int64_t> dims{traits->block_size * 2, 3};
    const auto bytes = *gguf_tensor_byte_size(type, dims);
    if (type == GgmlType::f32 || type == GgmlType::f16 || type == GgmlType::bf16 ||
        type == GgmlType::q8_0 || type == GgmlType::mxfp4) {
      storage.push_back(encode_gguf_tensor(type, random_values(static_cast<size_t>(dims[0] * 3), number)));
    } else {
      std::vector<uint8_t> raw(bytes);
      for (size_t i = 0; i < raw.size(); ++i) raw[i] = static_cast<uint8_t>(i * 7 + number);
      storage.push_back(raw);
    }
    ASSERT_EQ(storage.back().size(), bytes) << traits->name;
    tensors.push_back({"t" + std::to_string(index++) + "." + std::string(traits->name), dims, type,
                       storage.back()});
  }
  for (uint32_t alignment : {32u, 1u, 64u, 4096u}) {
    const GgufFile f = GgufFile::from_bytes(serialize_gguf({}, tensors, alignment), "t.gguf");
    EXPECT_EQ(f.alignment(), alignment);
    ASSERT_EQ(f.tensors().size(), tensors.size());
    EXPECT_EQ(f.data_offset() % alignment, 0u);
    for (size_t i = 0; i < tensors.size(); ++i) {
      const GgufTensorInfo& t = f.tensors()[i];
      EXPECT_EQ(t.name, tensors[i].name);
      EXPECT_EQ(t.dims, tensors[i].dims);
      EXPECT_EQ(t.type, tensors[i].type);
      EXPECT_EQ(t.offset % alignment, 0u);
      EXPECT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(), tensors[i].bytes.begin(),
                             tensors[i].bytes.end()))
          << t.name;
    }
    if (alignment != 32) {
      EXPECT_EQ(f.get_int("general.alignment"), alignment);
    } else {
      EXPECT_EQ(f.find_value("general.alignment"), nullptr);
    }
  }
}

TEST(GgufRoundTrip, DecodedValuesOfEncodedTensors) {
  const std::vector<float> x = random_values(64, 5);
  for (GgmlType type : {GgmlType::f32, GgmlType::f16, GgmlType::bf16, GgmlType::q4_0,
                        GgmlType::q4_1, GgmlType::q8_0, GgmlType::mxfp4}) {
    const std::vector<uint8_t> bytes = encode_gguf_tensor(type, x);
    const GgufFile f = GgufFile::from_bytes(serialize_gguf({}, {{"w", {32, 2}, type, bytes}}), "d.gguf");
    const std::vector<float> y = gguf_tensor_to_floats(f.get("w"));
    ASSERT_EQ(y.size(), x.size());
    const double tolerance = type == GgmlType::f32    ? 0.0
                             : type == GgmlType::mxfp4 ? 0.5
                             : type == GgmlType::q4_0 || type == GgmlType::q4_1 ? 0.4
                             : type == GgmlType::q8_0  ? 0.03
                                                       : 0.01;
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_LE(std::fabs(y[i] - x[i]), tolerance * std::max(1.0f, std::fabs(x[i])))
          << ggml_type_traits(static_cast<uint32_t>(type))->name << " " << i;
    }
  }
}

// The writer's bytes equal a file assembled here from the format description (GGUFWriter's
// layout: header, KVs, tensor infos, zero padding, each tensor padded to the alignment).
TEST(GgufLayout, MatchesHandAssembledFile) {
  const std::vector<uint8_t> a(12, 0xAB), b(34, 0xCD);
  GgufMetadata m;
  m.emplace_back("general.architecture", GgufValue::of_string("llama"));
  m.emplace_back("n", GgufValue::of_uint32(7));
  m.emplace_back("v", GgufValue::of_floats(GgufType::float32, {1.0, 2.0}));
  const std::vector<uint8_t> written =
      serialize_gguf(m, {{"a", {3}, GgmlType::f32, a}, {"b", {32, 1}, GgmlType::q8_0, b}});
  Builder e = Builder::header(2, 3);
  e.str("general.architecture").u32(8).str("llama");
  e.str("n").u32(4).u32(7);
  e.str("v").u32(9).u32(6).u64(2).f32(1.0f).f32(2.0f);
  tensor_info(e, "a", {3}, 0, 0);
  tensor_info(e, "b", {32, 1}, 8, 32);  // a's 12 bytes padded to 32
  e.pad(32);
  e.raw(a.data(), a.size()).pad(32).raw(b.data(), b.size()).pad(32);
  EXPECT_EQ(written, e.image());
}

TEST(GgufWrite, AtomicFileAndOpen) {
  const fs::path dir = fs::temp_directory_path() / ("concord_gguf_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path path = dir / "w.gguf";
  const std::vector<uint8_t> w = encode_gguf_tensor(GgmlType::q8_0, random_values(64, 3));
  write_gguf(path, every_metadata_type(), {{"w", {64}, GgmlType::q8_0, w}}, 64);
  {
    const GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.path(), path.string());
    EXPECT_EQ(f.alignment(), 64u);
    EXPECT_EQ(f.get("w").bytes.size(), 68u);  // two Q8_0 blocks
    EXPECT_EQ(fs::file_size(path), f.data_offset() + 128);  // padded to the 64-byte alignment
    std::vector<uint8_t> expected = serialize_gguf(every_metadata_type(), {{"w", {64}, GgmlType::q8_0, w}}, 64);
    EXPECT_EQ(fs::file_size(path), expected.size());
  }
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1u);  // no temporary left behind
  try {
    GgufFile::open(dir / "missing.gguf");
    ADD_FAILURE() << "expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("[gguf] "), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos);
  }
  fs::remove_all(dir);
}

TEST(GgufWrite, RejectsWhatTheReaderWouldReject) {
  const std::vector<uint8_t> four(4, 0);
  auto error = [](const GgufMetadata& m, const std::vector<GgufTensorToWrite>& t, uint32_t alignment) {
    try {
      serialize_gguf(m, t, alignment);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error({}, {{"a", {1}, GgmlType::f32, four}, {"a", {1}, GgmlType::f32, four}}, 32)
                .find("two tensors have this name"),
            std::string::npos);
  EXPECT_NE(error({}, {{"a", {2}, GgmlType::f32, four}}, 32).find("do not match its 4 bytes"),
            std::string::npos);
  EXPECT_NE(error({}, {{std::string(64, 'x'), {1}, GgmlType::f32, four}}, 32).find("at most 63"),
            std::string::npos);
  EXPECT_NE(error({}, {}, 48).find("not a power of two"), std::string::npos);
  GgufMetadata dup{{"k", GgufValue::of_bool(true)}, {"k", GgufValue::of_bool(false)}};
  EXPECT_NE(error(dup, {}, 32).find("appears twice"), std::string::npos);
  GgufMetadata range{{"k", GgufValue::of_ints(GgufType::uint8, {256})}};
  EXPECT_NE(error(range, {}, 32).find("out of range for uint8"), std::string::npos);
  GgufMetadata wrong_alignment{{"general.alignment", GgufValue::of_uint32(16)}};
  EXPECT_NE(error(wrong_alignment, {}, 32).find("general.alignment"), std::string::npos);
  EXPECT_NE(error({{"", GgufValue::of_bool(true)}}, {}, 32).find("empty"), std::string::npos);
}

// --- hostile files ---

// A small valid file with metadata of several kinds and two tensors.
std::vector<uint8_t> small_valid_file() {
  GgufMetadata m;
  m.emplace_back("general.architecture", GgufValue::of_string("llama"));
  m.emplace_back("a", GgufValue::of_ints(GgufType::int16, {1, 2, 3}));
  m.emplace_back("s", GgufValue::of_strings({"x", "yz"}));
  m.emplace_back("f", GgufValue::of_float32(2.5f));
  const std::vector<uint8_t> q = encode_gguf_tensor(GgmlType::mxfp4, random_values(32, 9));
  const std::vector<uint8_t> h = encode_gguf_tensor(GgmlType::f16, random_values(6, 8));
  return serialize_gguf(m, {{"q", {32}, GgmlType::mxfp4, q}, {"h", {3, 2}, GgmlType::f16, h}});
}

TEST(GgufHostile, TruncatedAtEveryOffset) {
  const std::vector<uint8_t> valid = small_valid_file();
  GgufFile::from_bytes(valid, "ok.gguf");
  // The data section ends with padding after the last tensor's bytes; cutting into that padding
  // still leaves a complete file.
  const GgufFile f = GgufFile::from_bytes(valid, "ok.gguf");
  size_t data_end = 0;
  for (const auto& t : f.tensors()) data_end = std::max<size_t>(data_end, f.data_offset() + t.offset + t.bytes.size());
  for (size_t n = 0; n < valid.size(); ++n) {
    std::vector<uint8_t> cut(valid.begin(), valid.begin() + static_cast<ptrdiff_t>(n));
    const std::string message = error_of(cut);
    if (n >= data_end) {
      EXPECT_EQ(message, "") << n;
      continue;
    }
    ASSERT_FALSE(message.empty()) << "truncated at " << n << " should fail";
    EXPECT_EQ(message.rfind("[gguf] bad.gguf: ", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(GgufHostile, HeaderProblems) {
  Builder magic;
  magic.bytes = "GGML";
  magic.u32(3).u64(0).u64(0);
  expect_error(magic, "bad magic 47 47 4d 4c");
  expect_error(Builder::header(0, 0, 1), "GGUF version 1 is not supported");
  expect_error(Builder::header(0, 0, 4), "GGUF version 4 is not supported");
  EXPECT_EQ(error_of(Builder::header(0, 0, 2).image()), "");  // v2 has the v3 layout
  expect_error(Builder::header(1ull << 60, 0), "tensor count 1152921504606846976 cannot fit");
  expect_error(Builder::header(0, 1ull << 60), "metadata count 1152921504606846976 cannot fit");
  expect_error(Builder::header(0, UINT64_MAX), "metadata count 18446744073709551615 cannot fit");
  Builder tiny;
  tiny.bytes = "GG";
  expect_error(tiny, "magic at byte 0 needs 4 bytes");
}

TEST(GgufHostile, MetadataProblems) {
  auto kv_file = [](auto&& add) {
    Builder b = Builder::header(0, 1);
    add(b);
    b.bytes.append(64, '\0');  // room so that count checks pass
    return b;
  };
  expect_error(kv_file([](Builder& b) { b.u64(1ull << 60).bytes += "k"; }),
               "metadata key 0 at byte 24 claims 1152921504606846976 bytes");
  expect_error(kv_file([](Builder& b) { b.str("k").u32(8).u64(UINT64_MAX); }),
               "metadata 'k': string at byte 37 claims 18446744073709551615 bytes");
  expect_error(kv_file([](Builder& b) { b.str("k").u32(9).u32(4).u64(1ull << 60); }),
               "array of 1152921504606846976 uint32 at byte 41 cannot fit");
  expect_error(kv_file([](Builder& b) { b.str("k").u32(9).u32(8).u64(100); }),
               "array of 100 string");
  expect_error(kv_file([](Builder& b) { b.str("k").u32(9).u32(9).u32(0).u64(0); }),
               "nested array at byte 37");
  expect_error(kv_file([](Builder& b) { b.str("k").u32(13).u32(0); }), "unknown value type 13");
  expect_error(kv_file([](Builder& b) { b.str("k").u32(9).u32(77).u64(0); }),
               "unknown array element type 77");
  expect_error(kv_file([](Builder& b) { b.str("").u32(4).u32(0); }), "metadata key 0 at byte 24 is empty");
  expect_error(kv_file([](Builder& b) { b.str("k\xff").u32(4).u32(0); }), "is not valid UTF-8");
  expect_error(kv_file([](Builder& b) { b.str("k").u32(7).u8(2); }), "bool at byte 37 is 2");
  Builder dup = Builder::header(0, 2);
  dup.str("k").u32(4).u32(1).str("k").u32(4).u32(2);
  expect_error(dup, "metadata key 'k' appears twice");
  Builder align48 = Builder::header(0, 1);
  align48.str("general.alignment").u32(4).u32(48);
  expect_error(align48, "general.alignment 48 is not a power of two");
  Builder align0 = Builder::header(0, 1);
  align0.str("general.alignment").u32(4).u32(0);
  expect_error(align0, "general.alignment 0 is not a power of two");
  Builder align64 = Builder::header(0, 1);
  align64.str("general.alignment").u32(10).u64(64);
  expect_error(align64, "general.alignment is uint64, expected uint32");
}

// A file with the given tensor infos and `data` bytes after the 32-aligned header.
Builder tensor_file(const std::vector<std::tuple<std::string, std::vector<uint64_t>, uint32_t, uint64_t>>& infos,
                    size_t data) {
  Builder b = Builder::header(infos.size(), 0);
  for (const auto& [name, dims, type, offset] : infos) tensor_info(b, name, dims, type, offset);
  b.pad(32);
  b.bytes.append(data, '\0');
  return b;
}

TEST(GgufHostile, TensorProblems) {
  EXPECT_EQ(error_of(tensor_file({{"a", {8}, 0, 0}, {"b", {4}, 0, 32}}, 48).image()), "");
  expect_error(tensor_file({{"a", {8}, 0, 0}, {"b", {4}, 0, 16}}, 64), "offset 16 is not a multiple of the alignment 32");
  expect_error(tensor_file({{"a", {16}, 0, 0}, {"b", {4}, 0, 32}}, 64), "tensors 'a' [0, 64) and 'b' [32, 48) overlap");
  expect_error(tensor_file({{"a", {16}, 0, 0}, {"b", {16}, 0, 0}}, 64), "overlap");
  expect_error(tensor_file({{"a", {8}, 0, 0}, {"b", {8}, 0, 32}}, 40), "tensor 'b': bytes [32, 64) of the data section run past its end (40 bytes");
  expect_error(tensor_file({{"a", {8}, 0, UINT64_MAX - 31}}, 64), "run past its end");
  expect_error(tensor_file({{"a", {8}, 99, 0}}, 64), "tensor 'a' has unknown ggml type 99");
  expect_error(tensor_file({{"a", {8}, 4, 0}}, 64), "unknown ggml type 4");
  expect_error(tensor_file({{"a", {1ull << 40, 1ull << 40}, 0, 0}}, 64), "the element count overflows int64");
  expect_error(tensor_file({{"a", {1ull << 30, 1ull << 30}, 0, 0}}, 64), "run past its end");
  expect_error(tensor_file({{"a", {1ull << 31, 1ull << 31}, 0, 0}}, 64), "the byte count overflows 64 bits");
  expect_error(tensor_file({{"a", {1ull << 62}, 0, 0}}, 64), "the byte count overflows 64 bits");
  expect_error(tensor_file({{"a", {0}, 0, 0}}, 64), "dimension 0 is 0");
  expect_error(tensor_file({{"a", {1ull << 63}, 0, 0}}, 64), "dimension 0 is -9223372036854775808");
  expect_error(tensor_file({{"a", std::vector<uint64_t>{}, 0, 0}}, 64), "tensor 'a' has 0 dimensions");
  expect_error(tensor_file({{"a", {1, 1, 1, 1, 1}, 0, 0}}, 64), "has 5 dimensions");
  expect_error(tensor_file({{"a", {16, 2}, 8, 0}}, 128), "row length ne0 = 16 is not a multiple of the 32-element Q8_0 block");
  expect_error(tensor_file({{"a", {48}, 39, 0}}, 128), "32-element MXFP4 block");
  expect_error(tensor_file({{std::string(64, 'n'), {8}, 0, 0}}, 64), "is 64 bytes; ggml allows at most 63");
  expect_error(tensor_file({{"a", {8}, 0, 0}, {"a", {8}, 0, 32}}, 64), "tensor 'a' appears twice");
  Builder counted = Builder::header(2, 0);  // claims two tensors, holds one
  tensor_info(counted, "a", {8}, 0, 0);
  expect_error(counted, "tensor count 2 cannot fit in the 33 bytes left");
  counted.bytes.append(40, '\0');  // room for a second entry, but it is zeros
  expect_error(counted, "tensor '' has 0 dimensions");
}

TEST(GgufHostile, RandomCorruptionNeverCrashes) {
  const std::vector<uint8_t> valid = small_valid_file();
  std::mt19937 rng(11);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<uint8_t> image = valid;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) image[rng() % image.size()] = static_cast<uint8_t>(rng());
    try {
      const GgufFile f = GgufFile::from_bytes(image, "fuzz.gguf");
      for (const auto& t : f.tensors()) {
        try {
          gguf_tensor_to_floats(t);
        } catch (const InputError&) {
        }
      }
    } catch (const InputError& e) {
      ++rejected;
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
  EXPECT_GT(rejected, 100);
}

// --- codecs against scalar references written from the format definitions ---

// fp16 -> double, from the IEEE binary16 definition.
double ref_f16_value(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  double v;
  if (exponent == 0x1F) {
    v = mantissa != 0 ? std::nan("") : INFINITY;
  } else if (exponent == 0) {
    v = std::ldexp(mantissa, -24);
  } else {
    v = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return sign ? -v : v;
}

// double -> fp16 code, round to nearest even, overflow to Inf (finite inputs).
uint16_t ref_f16_code(double x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7C00;  // 65504 + half an ulp rounds to Inf
  int e = 0;
  std::frexp(a, &e);                      // a = m * 2^e, m in [0.5, 1)
  const int quantum_exp = std::max(e - 11, -24);  // 11 significant bits; subnormals at 2^-24
  const double q = std::nearbyint(std::ldexp(a, -quantum_exp));  // ties to even
  const double rounded = std::ldexp(q, quantum_exp);
  // Reassemble: find the code by scanning the monotonic positive codes near the value.
  uint16_t lo = 0, hi = 0x7C00;
  while (lo < hi) {
    const auto mid = static_cast<uint16_t>((lo + hi) / 2);
    if (ref_f16_value(mid) < rounded) {
      lo = static_cast<uint16_t>(mid + 1);
    } else {
      hi = mid;
    }
  }
  return sign | lo;
}

// Q8_0 (ggml-quants.c quantize_row_q8_0_ref): d = amax/127, id = 1/d, q = roundf(x*id).
std::vector<uint8_t> ref_q8_0(const std::vector<float>& x) {
  std::vector<uint8_t> out;
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    const uint16_t dh = ref_f16_code(d);
    out.push_back(static_cast<uint8_t>(dh));
    out.push_back(static_cast<uint8_t>(dh >> 8));
    for (size_t j = 0; j < 32; ++j) {
      const float v = x[b * 32 + j] * id;  // |v| <= 127
      const double r = std::isfinite(id) ? std::trunc(v + std::copysign(0.5, v)) : 0.0;  // half away
      out.push_back(static_cast<uint8_t>(static_cast<int8_t>(r)));
    }
  }
  return out;
}

// E2M1 values by code (OCP MX): sign bit 3, then 0, 0.5, 1, 1.5, 2, 3, 4, 6. ggml's table has
// +0 for code 8.
constexpr double kE2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6};

// MXFP4 (ggml-quants.c quantize_row_mxfp4_ref) with concord's clamp of the scale at 0:
// e = floor(log2f(amax)) - 2 + 127, each element the first code of minimal error.
std::vector<uint8_t> ref_mxfp4(const std::vector<float>& x) {
  std::vector<uint8_t> out;
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* v = x.data() + b * 32;
    float amax = 0;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
    const int e = amax > 0 ? std::max(0, static_cast<int>(std::floor(log2f(amax))) - 2 + 127) : 0;
    out.push_back(static_cast<uint8_t>(e));
    const double scale = std::ldexp(1.0, e - 127);
    auto code = [&](double value) {
      int best = 0;
      for (int c = 1; c < 16; ++c) {
        if (std::fabs(kE2m1[c] * scale - value) < std::fabs(kE2m1[best] * scale - value)) best = c;
      }
      return best;
    };
    for (size_t j = 0; j < 16; ++j) out.push_back(static_cast<uint8_t>(code(v[j]) | (code(v[j + 16]) << 4)));
  }
  return out;
}

std::vector<float> codec_test_values() {
  std::vector<float> x;
  std::mt19937 rng(2026);
  std::uniform_int_distribution<int> exponent(-30, 30);
  for (int block = 0; block < 200; ++block) {  // random blocks over many magnitudes
    const std::vector<float> r = random_values(32, static_cast<uint32_t>(block), std::ldexp(1.0f, exponent(rng)));
    x.insert(x.end(), r.begin(), r.end());
  }
  auto block_of = [&x](std::vector<float> v) {
    v.resize(32, 0.0f);
    x.insert(x.end(), v.begin(), v.end());
  };
  block_of({});                                          // zeros
  block_of({-0.0f, -0.0f, 0.0f});                        // negative zero
  block_of({1e-40f, -3e-39f, 1e-45f});                   // subnormal amax
  block_of({std::ldexp(1.0f, -125), 1e-38f});            // smallest unclamped MXFP4 scale
  block_of({3.4e38f, -3.0e38f, 1.0f});                   // huge
  block_of({65504.0f * 127.0f, 1.0f});                   // d at the f16 limit
  block_of({65520.0f * 127.0f, -1.0f});                  // d overflows f16
  block_of({1.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.25f, -0.75f, -5.0f, 7.0f, 8.0f - 1e-6f});
  block_of({127.0f, 0.5f, -0.5f, 1.5f, -1.5f, 2.5f, 63.5f});  // Q8_0 ties
  for (int k = -20; k <= 20; k += 5) {                   // amax just below powers of two
    for (int n : {1, 2, 3}) {
      block_of({std::ldexp(1.0f - static_cast<float>(n) * 5.9604645e-08f, k), 0.3f});
    }
  }
  return x;
}

TEST(GgufCodec, Q8_0MatchesScalarReference) {
  const std::vector<float> x = codec_test_values();
  EXPECT_EQ(encode_gguf_tensor(GgmlType::q8_0, x), ref_q8_0(x));
}

TEST(GgufCodec, Mxfp4MatchesScalarReference) {
  const std::vector<float> x = codec_test_values();
  const std::vector<uint8_t> got = encode_gguf_tensor(GgmlType::mxfp4, x), want = ref_mxfp4(x);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], want[i]) << "byte " << i << " (block " << i / 17 << ")";
  }
}

TEST(GgufCodec, Mxfp4DecodeEveryScaleAndCode) {
  // Every scale byte (0xFF is 2^128 in ggml, not NaN) with every code in both nibbles.
  std::vector<uint8_t> bytes;
  for (int e = 0; e < 256; ++e) {
    bytes.push_back(static_cast<uint8_t>(e));
    for (int j = 0; j < 16; ++j) bytes.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  }
  GgufTensorInfo t;
  t.name = "m";
  t.type = GgmlType::mxfp4;
  t.dims = {256 * 32};
  t.bytes = bytes;
  const std::vector<float> y = gguf_tensor_to_floats(t);
  for (int e = 0; e < 256; ++e) {
    for (int j = 0; j < 32; ++j) {
      const int code = j < 16 ? j : 15 - (j - 16);
      const auto want = static_cast<float>(kE2m1[code] * std::ldexp(1.0, e - 127));
      const float got = y[static_cast<size_t>(e * 32 + j)];
      EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
          << "e=" << e << " code=" << code << " got " << got << " want " << want;
    }
  }
}

TEST(GgufCodec, Q8_0DecodeIsScaleTimesCode) {
  std::vector<uint8_t> bytes(34 * 64);
  std::mt19937 rng(4);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  for (size_t blk = 0; blk < 64; ++blk) {  // keep d finite except in a few blocks
    if (blk % 16 != 0) bytes[blk * 34 + 1] &= 0x7B;
  }
  GgufTensorInfo t;
  t.name = "q";
  t.type = GgmlType::q8_0;
  t.dims = {32 * 64};
  t.bytes = bytes;
  const std::vector<float> y = gguf_tensor_to_floats(t);
  for (size_t i = 0; i < y.size(); ++i) {
    const uint8_t* block = bytes.data() + (i / 32) * 34;
    const auto d = static_cast<float>(ref_f16_value(static_cast<uint16_t>(block[0] | (block[1] << 8))));
    const float want = static_cast<float>(static_cast<int8_t>(block[2 + i % 32])) * d;
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(y[i])) << i;
    } else {
      EXPECT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(want)) << i;
    }
  }
}

TEST(GgufCodec, HalfFormatsMatchDefinitions) {
  std::vector<float> x = codec_test_values();
  for (float s : {65504.0f, 65519.0f, 65520.0f, 1e-8f, 2.98e-8f, 5.96e-8f, 3.39e38f, 3.4e38f}) {
    x.push_back(s);
    x.push_back(-s);
  }
  x.push_back(INFINITY);
  x.push_back(-INFINITY);
  const std::vector<uint8_t> h = encode_gguf_tensor(GgmlType::f16, x);
  const std::vector<uint8_t> b = encode_gguf_tensor(GgmlType::bf16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    const auto hc = static_cast<uint16_t>(h[2 * i] | (h[2 * i + 1] << 8));
    EXPECT_EQ(hc, std::isinf(x[i]) ? (x[i] > 0 ? 0x7C00 : 0xFC00) : ref_f16_code(x[i])) << x[i];
    // bf16: round the fp32 bit pattern to its top 16 bits, ties to even.
    const uint32_t bits = std::bit_cast<uint32_t>(x[i]);
    const auto want = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
    EXPECT_EQ(static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8)), want) << x[i];
  }
  // NaN: bf16 keeps the top bits and sets the quiet bit; f16 keeps a nonzero payload.
  const float snan = std::bit_cast<float>(0x7F800001u), payload = std::bit_cast<float>(0xFFA12345u);
  const std::vector<float> nans{snan, payload};
  const std::vector<uint8_t> bn = encode_gguf_tensor(GgmlType::bf16, nans);
  EXPECT_EQ(bn, (std::vector<uint8_t>{0xC0, 0x7F, 0xE1, 0xFF}));
  const std::vector<uint8_t> hn = encode_gguf_tensor(GgmlType::f16, nans);
  EXPECT_EQ(hn, (std::vector<uint8_t>{0x01, 0x7C, 0x09, 0xFD}));
}

TEST(GgufCodec, BlockFormatsRejectNonFinite) {
  std::vector<float> x(32, 1.0f);
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    x[17] = bad;
    for (GgmlType type : {GgmlType::q4_0, GgmlType::q4_1, GgmlType::q8_0, GgmlType::mxfp4}) {
      try {
        encode_gguf_tensor(type, x);
        ADD_FAILURE() << "expected an error";
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("element 17 is"), std::string::npos) << e.what();
      }
    }
  }
  try {
    encode_gguf_tensor(GgmlType::q8_0, std::vector<float>(31, 1.0f));
    ADD_FAILURE() << "expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of its 32-element block"), std::string::npos);
  }
  try {
    encode_gguf_tensor(GgmlType::q4_k, std::vector<float>(256, 1.0f));
    ADD_FAILURE() << "expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot encode Q4_K"), std::string::npos);
  }
}

// --- legacy quants and k-quants (ggml-quants.c dequantize_row_*, quantize_row_q4_*_ref) ---

// fp16 -> fp32 from the binary16 definition; a NaN keeps its payload (shifted up 13 bits).
float ref_f16_to_f32(uint16_t h) {
  if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0) {
    return std::bit_cast<float>((static_cast<uint32_t>(h & 0x8000) << 16) | 0x7F800000u |
                                (static_cast<uint32_t>(h & 0x3FF) << 13));
  }
  return static_cast<float>(ref_f16_value(h));
}

uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// ggml's dequantize_row_* transliterated (their loops, pointer walks and masks), one block.
void ggml_q4_0(const uint8_t* x, float* y) {
  const float d = ref_f16_to_f32(le16(x));
  for (int j = 0; j < 16; ++j) {
    const int x0 = (x[2 + j] & 0x0F) - 8, x1 = (x[2 + j] >> 4) - 8;
    y[j] = static_cast<float>(x0) * d;
    y[j + 16] = static_cast<float>(x1) * d;
  }
}
void ggml_q4_1(const uint8_t* x, float* y) {
  const float d = ref_f16_to_f32(le16(x)), m = ref_f16_to_f32(le16(x + 2));
  for (int j = 0; j < 16; ++j) {
    const int x0 = x[4 + j] & 0x0F, x1 = x[4 + j] >> 4;
    y[j] = static_cast<float>(x0) * d + m;
    y[j + 16] = static_cast<float>(x1) * d + m;
  }
}
void ggml_q5_0(const uint8_t* x, float* y) {
  const float d = ref_f16_to_f32(le16(x));
  uint32_t qh;
  std::memcpy(&qh, x + 2, 4);
  for (int j = 0; j < 16; ++j) {
    const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
    const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
    const int32_t x0 = ((x[6 + j] & 0x0F) | xh_0) - 16;
    const int32_t x1 = ((x[6 + j] >> 4) | xh_1) - 16;
    y[j] = static_cast<float>(x0) * d;
    y[j + 16] = static_cast<float>(x1) * d;
  }
}
void ggml_q5_1(const uint8_t* x, float* y) {
  const float d = ref_f16_to_f32(le16(x)), m = ref_f16_to_f32(le16(x + 2));
  uint32_t qh;
  std::memcpy(&qh, x + 4, 4);
  for (int j = 0; j < 16; ++j) {
    const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
    const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
    const int x0 = (x[8 + j] & 0x0F) | xh_0, x1 = (x[8 + j] >> 4) | xh_1;
    y[j] = static_cast<float>(x0) * d + m;
    y[j + 16] = static_cast<float>(x1) * d + m;
  }
}
void ggml_q2_k(const uint8_t* x, float* y) {  // scales[16] qs[64] d dmin
  const float d = ref_f16_to_f32(le16(x + 80)), min = ref_f16_to_f32(le16(x + 82));
  const uint8_t* q = x + 16;
  int is = 0;
  for (int n = 0; n < 256; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      uint8_t sc = x[is++];
      float dl = d * static_cast<float>(sc & 0xF), ml = min * static_cast<float>(sc >> 4);
      for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l] >> shift) & 3)) - ml;
      sc = x[is++];
      dl = d * static_cast<float>(sc & 0xF), ml = min * static_cast<float>(sc >> 4);
      for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l + 16] >> shift) & 3)) - ml;
      shift += 2;
    }
    q += 32;
  }
}
void ggml_q3_k(const uint8_t* x, float* y) {  // hmask[32] qs[64] scales[12] d
  const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
  uint32_t aux[4];
  const auto* scales = reinterpret_cast<const int8_t*>(aux);
  const float d_all = ref_f16_to_f32(le16(x + 108));
  const uint8_t* q = x + 32;
  const uint8_t* hm = x;
  uint8_t m = 1;
  std::memcpy(aux, x + 96, 12);
  const uint32_t tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  int is = 0;
  for (int n = 0; n < 256; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      float dl = d_all * static_cast<float>(scales[is++] - 32);
      for (int l = 0; l < 16; ++l)
        *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
      dl = d_all * static_cast<float>(scales[is++] - 32);
      for (int l = 0; l < 16; ++l)
        *y++ = dl * static_cast<float>(static_cast<int8_t>((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
      shift += 2;
      m = static_cast<uint8_t>(m << 1);
    }
    q += 32;
  }
}
void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}
void ggml_q4_k(const uint8_t* x, float* y) {  // d dmin scales[12] qs[128]
  const float d = ref_f16_to_f32(le16(x)), min = ref_f16_to_f32(le16(x + 2));
  const uint8_t* q = x + 16;
  int is = 0;
  uint8_t sc, m;
  for (int j = 0; j < 256; j += 64) {
    get_scale_min_k4(is + 0, x + 4, &sc, &m);
    const float d1 = d * sc, m1 = min * m;
    get_scale_min_k4(is + 1, x + 4, &sc, &m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}
void ggml_q5_k(const uint8_t* x, float* y) {  // d dmin scales[12] qh[32] qs[128]
  const float d = ref_f16_to_f32(le16(x)), min = ref_f16_to_f32(le16(x + 2));
  const uint8_t* ql = x + 48;
  const uint8_t* qh = x + 16;
  int is = 0;
  uint8_t sc, m, u1 = 1, u2 = 2;
  for (int j = 0; j < 256; j += 64) {
    get_scale_min_k4(is + 0, x + 4, &sc, &m);
    const float d1 = d * sc, m1 = min * m;
    get_scale_min_k4(is + 1, x + 4, &sc, &m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    ql += 32;
    is += 2;
    u1 = static_cast<uint8_t>(u1 << 2);
    u2 = static_cast<uint8_t>(u2 << 2);
  }
}
void ggml_q6_k(const uint8_t* x, float* y) {  // ql[128] qh[64] scales[16] d
  const float d = ref_f16_to_f32(le16(x + 208));
  const uint8_t* ql = x;
  const uint8_t* qh = x + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(x + 192);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const auto q1 = static_cast<int8_t>(((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
      const auto q2 = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      const auto q3 = static_cast<int8_t>(((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      const auto q4 = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}
void ggml_q8_k(const uint8_t* x, float* y) {  // float d, qs[256], bsums[16]
  float d;
  std::memcpy(&d, x, 4);
  for (int j = 0; j < 256; ++j) y[j] = d * static_cast<float>(static_cast<int8_t>(x[4 + j]));
}

struct QuantCase {
  GgmlType type;
  void (*ref)(const uint8_t*, float*);
  std::vector<int> f16_fields;  // byte offsets of the fp16 scales in a block
};
std::vector<QuantCase> quant_cases() {
  return {{GgmlType::q4_0, ggml_q4_0, {0}},       {GgmlType::q4_1, ggml_q4_1, {0, 2}},
          {GgmlType::q5_0, ggml_q5_0, {0}},       {GgmlType::q5_1, ggml_q5_1, {0, 2}},
          {GgmlType::q2_k, ggml_q2_k, {80, 82}},  {GgmlType::q3_k, ggml_q3_k, {108}},
          {GgmlType::q4_k, ggml_q4_k, {0, 2}},    {GgmlType::q5_k, ggml_q5_k, {0, 2}},
          {GgmlType::q6_k, ggml_q6_k, {208}},     {GgmlType::q8_k, ggml_q8_k, {}}};
}

std::vector<float> decode_blocks(GgmlType type, const std::vector<uint8_t>& bytes) {
  const auto traits = *ggml_type_traits(static_cast<uint32_t>(type));
  GgufTensorInfo t;
  t.name = "q";
  t.type = type;
  t.dims = {static_cast<int64_t>(bytes.size()) / traits.type_size * traits.block_size};
  t.bytes = bytes;
  return gguf_tensor_to_floats(t);
}

// Random codes with fp16 scales drawn from random finite values and the edge cases: zeros of
// both signs, subnormals, the largest finite, negative, Inf and NaN (quiet, signalling).
TEST(GgufQuant, DecodersMatchGgmlLoopsBitForBit) {
  const uint16_t edges[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF,
                            0x3C00, 0xBC00, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE55, 0x7DFF};
  std::mt19937 rng(15);
  for (const QuantCase& c : quant_cases()) {
    const auto traits = *ggml_type_traits(static_cast<uint32_t>(c.type));
    const size_t blocks = 96, size = static_cast<size_t>(traits.type_size);
    std::vector<uint8_t> bytes(blocks * size);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    for (size_t blk = 0; blk < blocks; ++blk) {
      for (size_t k = 0; k < c.f16_fields.size(); ++k) {
        uint8_t* field = bytes.data() + blk * size + c.f16_fields[k];
        uint16_t h = static_cast<uint16_t>(field[0] | (field[1] << 8));
        if (blk < 64) {
          if ((blk + k) % 4 != 0) h = edges[(blk * 7 + k * 3) % 16];
          else h &= 0x7BFF;  // finite
        }
        field[0] = static_cast<uint8_t>(h);
        field[1] = static_cast<uint8_t>(h >> 8);
      }
    }
    if (c.type == GgmlType::q8_k) {  // fp32 scale: edge values too
      const float f32_edges[] = {0.0f, -0.0f, 1e-45f, -1e-40f, 3.4e38f, INFINITY, -INFINITY,
                                 std::bit_cast<float>(0x7FC01234u), std::bit_cast<float>(0xFF800001u)};
      for (size_t blk = 0; blk < 9; ++blk) std::memcpy(bytes.data() + blk * size, &f32_edges[blk], 4);
    }
    const std::vector<float> got = decode_blocks(c.type, bytes);
    ASSERT_EQ(got.size(), blocks * static_cast<size_t>(traits.block_size));
    std::vector<float> want(got.size());
    for (size_t blk = 0; blk < blocks; ++blk) {
      c.ref(bytes.data() + blk * size, want.data() + blk * static_cast<size_t>(traits.block_size));
    }
    int nans = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      nans += std::isnan(want[i]);
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
          << traits.name << " element " << i << ": " << got[i] << " vs " << want[i];
    }
    EXPECT_GT(nans, 0) << traits.name << ": the edge scales should produce NaN somewhere";
  }
}

std::vector<uint8_t> block_with(GgmlType type, std::initializer_list<std::pair<int, uint8_t>> set) {
  std::vector<uint8_t> b(static_cast<size_t>(ggml_type_traits(static_cast<uint32_t>(type))->type_size), 0);
  for (const auto& [offset, value] : set) b[static_cast<size_t>(offset)] = value;
  return b;
}

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }

// Hand-built blocks: the element each code lands on, the min/max codes, and the scale edge
// cases (zero of either sign, subnormal, negative, Inf, NaN payloads) in the legacy layouts.
TEST(GgufQuant, LegacyLayoutsByHand) {
  // Q4_0, d = 1: byte j's low nibble is element j, its high nibble element j+16; q - 8.
  std::vector<float> y = decode_blocks(GgmlType::q4_0, block_with(GgmlType::q4_0, {{1, 0x3C}, {2, 0xF0}, {17, 0x8F}}));
  EXPECT_EQ(y[0], -8.0f);   // code 0
  EXPECT_EQ(y[16], 7.0f);   // code 15
  EXPECT_EQ(y[15], 7.0f);
  EXPECT_EQ(y[31], 0.0f);   // code 8
  EXPECT_EQ(y[1], -8.0f);
  // subnormal d = 2^-24 (0x0001), negative d = -2 (0xC000)
  y = decode_blocks(GgmlType::q4_0, block_with(GgmlType::q4_0, {{0, 0x01}, {2, 0x0F}}));
  EXPECT_EQ(y[0], 7.0f * std::ldexp(1.0f, -24));
  EXPECT_EQ(y[16], -8.0f * std::ldexp(1.0f, -24));
  y = decode_blocks(GgmlType::q4_0, block_with(GgmlType::q4_0, {{1, 0xC0}, {2, 0x0F}}));
  EXPECT_EQ(y[0], -14.0f);
  EXPECT_EQ(y[16], 16.0f);
  // d = -0: code 15 gives -0, code 8 gives -0, code 0 gives +0.
  y = decode_blocks(GgmlType::q4_0, block_with(GgmlType::q4_0, {{1, 0x80}, {2, 0x8F}, {3, 0x00}}));
  EXPECT_EQ(bits(y[0]), 0x80000000u);
  EXPECT_EQ(bits(y[16]), 0x80000000u);
  EXPECT_EQ(bits(y[1]), 0x00000000u);
  // d = +Inf: code 8 is 0 * Inf = NaN, code 9 is +Inf, code 0 is -Inf.
  y = decode_blocks(GgmlType::q4_0, block_with(GgmlType::q4_0, {{1, 0x7C}, {2, 0x98}}));
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[16], INFINITY);
  EXPECT_EQ(y[1], -INFINITY);
  // NaN d: the payload widens unchanged and the product is the quiet NaN of it (IEEE), for a
  // quiet (0x7E01) and a signalling (0xFC01) fp16 NaN alike.
  y = decode_blocks(GgmlType::q4_0, block_with(GgmlType::q4_0, {{0, 0x01}, {1, 0x7E}, {2, 0x3C}}));
  EXPECT_EQ(bits(y[0]), 0x7FC02000u);
  y = decode_blocks(GgmlType::q4_0, block_with(GgmlType::q4_0, {{0, 0x01}, {1, 0xFC}, {2, 0x3C}}));
  EXPECT_EQ(bits(y[0]), 0xFFC02000u);

  // Q4_1, d = 0.5 (0x3800), m = -1 (0xBC00): q*d + m, codes 0..15 unsigned.
  y = decode_blocks(GgmlType::q4_1, block_with(GgmlType::q4_1, {{1, 0x38}, {3, 0xBC}, {4, 0xF0}, {19, 0x0F}}));
  EXPECT_EQ(y[0], -1.0f);
  EXPECT_EQ(y[16], 6.5f);
  EXPECT_EQ(y[15], 6.5f);
  EXPECT_EQ(y[31], -1.0f);
  // zero d, m = -0: every element is 0*q + (-0) = +0 + -0 = +0.
  y = decode_blocks(GgmlType::q4_1, block_with(GgmlType::q4_1, {{3, 0x80}, {4, 0xFF}}));
  EXPECT_EQ(bits(y[0]), 0u);
  // Q5_0, d = 1: element j's fifth bit is bit j of qh (element 16+j: bit 16+j); q - 16.
  y = decode_blocks(GgmlType::q5_0, block_with(GgmlType::q5_0, {{1, 0x3C}, {2, 0x01}, {4, 0x01}, {6, 0x0F}, {7, 0xF0}}));
  EXPECT_EQ(y[0], 15.0f);    // 31 - 16
  EXPECT_EQ(y[16], 0.0f);    // code 0 with qh bit 16 (byte 4, bit 0): 16 - 16
  EXPECT_EQ(y[1], -16.0f);
  EXPECT_EQ(y[17], -1.0f);   // code 15, no fifth bit
  // Q5_1, d = 1, m = 0.5: q + 0.5, code 31 = 31.5
  y = decode_blocks(GgmlType::q5_1, block_with(GgmlType::q5_1, {{1, 0x3C}, {3, 0x38}, {7, 0x80}, {8, 0x0F}, {23, 0xF0}}));
  EXPECT_EQ(y[0], 15.5f);
  EXPECT_EQ(y[31], 31.5f);  // qh bit 31, high nibble of byte 15
  EXPECT_EQ(y[16], 0.5f);
}

TEST(GgufQuant, KQuantLayoutsByHand) {
  // Q2_K: scale byte 0xF3 -> (d*3)*q - dmin*15; element 128 is qs[32] bits 0-1, element 32 is
  // qs[0] bits 2-3. d = 1, dmin = 0.5.
  std::vector<float> y = decode_blocks(GgmlType::q2_k, block_with(GgmlType::q2_k,
      {{0, 0xF3}, {2, 0x01}, {8, 0x20}, {16, 0x0C}, {48, 0x03}, {81, 0x3C}, {83, 0x38}}));
  EXPECT_EQ(y[0], -7.5f);        // q 0: 3*0 - 0.5*15
  EXPECT_EQ(y[32], 3.0f);        // qs[0] bits 2-3 = 3, scale 2 = 0x01: 1*3 - 0
  EXPECT_EQ(y[128], -1.0f);      // qs[32] bits 0-1 = 3, scale 8 = 0x20: 0*3 - 0.5*2
  // Q3_K: scale 0 all-zero bits -> -32; hmask bit clear subtracts 4. d = 1.
  y = decode_blocks(GgmlType::q3_k, block_with(GgmlType::q3_k, {{109, 0x3C}}));
  EXPECT_EQ(y[0], 128.0f);  // (0 - 32) * (0 - 4)
  // scale 15 = 63 (low: high nibble of byte 7, high: bits 6-7 of byte 11) -> +31; element 255
  // (h 1, r 3, l 31): qs[63] bits 6-7 = 3, hmask[31] bit 7 set -> q 3.
  y = decode_blocks(GgmlType::q3_k, block_with(GgmlType::q3_k,
      {{31, 0x80}, {32 + 63, 0xC0}, {96 + 7, 0xF0}, {96 + 11, 0xC0}, {109, 0x3C}}));
  EXPECT_EQ(y[255], 93.0f);   // 31 * 3
  EXPECT_EQ(y[240], -124.0f);  // 31 * (0 - 4): hmask[16] bit 7 clear
  // Q4_K: sub-block 7's scale = (byte 11 low nibble) | (byte 7 bits 6-7) << 4, min = (byte 11
  // high nibble) | (byte 11 bits 6-7) << 4; element 255 is the high nibble of qs[127].
  y = decode_blocks(GgmlType::q4_k, block_with(GgmlType::q4_k,
      {{1, 0x3C}, {3, 0x3C}, {4 + 3, 0xC0}, {4 + 7, 0xC0}, {4 + 11, 0xFF}, {16 + 127, 0xF0}}));
  EXPECT_EQ(y[255], 63.0f * 15.0f - 63.0f);
  EXPECT_EQ(y[224], -63.0f);  // code 0 of sub-block 7 (high nibble of qs[96])
  // Q5_K adds bit t of qh[l]: element 255 = sub-block 7, l 31 -> qh[31] bit 7.
  y = decode_blocks(GgmlType::q5_k, block_with(GgmlType::q5_k,
      {{1, 0x3C}, {4 + 0, 0x01}, {16 + 31, 0x80}, {4 + 3, 0x80}, {4 + 11, 0x01}, {48 + 127, 0xF0}, {48, 0x0F}, {16, 0x01}}));
  EXPECT_EQ(y[255], 31.0f * (1 + 32));  // scale 0x01 | (0x80>>6)<<4 = 33, q 31
  EXPECT_EQ(y[0], 31.0f);               // scale 1, q 15 + 16
  // Q6_K: int8 scale -128, q = 6 bits - 32: code 0 -> -32, code 63 -> 31. d = 1.
  y = decode_blocks(GgmlType::q6_k, block_with(GgmlType::q6_k,
      {{0, 0xFF}, {128, 0xFF}, {192, 0x80}, {192 + 6, 0x7F}, {192 + 15, 0x01}, {209, 0x3C}}));
  EXPECT_EQ(y[0], -128.0f * 31.0f);   // ql[0] low 15 | qh[0] bits 0-1 (3) << 4 = 63
  EXPECT_EQ(y[64], 0.0f);             // ql[0] high 15 | qh[0] bits 4-5 (3) << 4 = 63; scale 4 = 0
  EXPECT_EQ(y[96], 127.0f * 16.0f);   // ql[32] high 0 | qh[0] bits 6-7 (3) << 4 = 48; scale 6 = 127
  EXPECT_EQ(y[255], 1.0f * -32.0f);   // scale 15 = 1, code 0
  // Q8_K: fp32 d = -2.5, codes -128 and 127.
  std::vector<uint8_t> q8k(292, 0);
  const float d = -2.5f;
  std::memcpy(q8k.data(), &d, 4);
  q8k[4] = 0x80;
  q8k[4 + 255] = 0x7F;
  y = decode_blocks(GgmlType::q8_k, q8k);
  EXPECT_EQ(y[0], 320.0f);
  EXPECT_EQ(y[255], -317.5f);
  EXPECT_EQ(bits(y[1]), 0x80000000u);  // 0 * -2.5
}

// quantize_row_q4_0_ref / quantize_row_q4_1_ref transliterated; the C casts of Inf/NaN (1/d
// overflowed: undefined in C) taken as 0, which is what NumPy's cast gives.
uint8_t ref_q4_cast(float v) {
  if (!std::isfinite(v)) return 0;
  return static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(v)));
}
std::vector<uint8_t> ref_q4_0(const std::vector<float>& x) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i < x.size() / 32; ++i) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float v = x[i * 32 + j];
      if (amax < std::fabs(v)) {
        amax = std::fabs(v);
        max = v;
      }
    }
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const uint16_t dh = ref_f16_code(d);
    out.push_back(static_cast<uint8_t>(dh));
    out.push_back(static_cast<uint8_t>(dh >> 8));
    for (int j = 0; j < 16; ++j) {
      const float x0 = x[i * 32 + j] * id, x1 = x[i * 32 + 16 + j] * id;
      out.push_back(static_cast<uint8_t>(ref_q4_cast(x0 + 8.5f) | (ref_q4_cast(x1 + 8.5f) << 4)));
    }
  }
  return out;
}
std::vector<uint8_t> ref_q4_1(const std::vector<float>& x) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i < x.size() / 32; ++i) {
    float min = std::numeric_limits<float>::max(), max = -std::numeric_limits<float>::max();
    for (int j = 0; j < 32; ++j) {
      const float v = x[i * 32 + j];
      if (v < min) min = v;
      if (v > max) max = v;
    }
    const float d = (max - min) / ((1 << 4) - 1);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (uint16_t h : {ref_f16_code(d), ref_f16_code(min)}) {
      out.push_back(static_cast<uint8_t>(h));
      out.push_back(static_cast<uint8_t>(h >> 8));
    }
    for (int j = 0; j < 16; ++j) {
      const float x0 = (x[i * 32 + j] - min) * id, x1 = (x[i * 32 + 16 + j] - min) * id;
      out.push_back(static_cast<uint8_t>(ref_q4_cast(x0 + 0.5f) | (ref_q4_cast(x1 + 0.5f) << 4)));
    }
  }
  return out;
}

TEST(GgufQuant, Q4EncodersMatchScalarReference) {
  const std::vector<float> x = codec_test_values();
  EXPECT_EQ(encode_gguf_tensor(GgmlType::q4_0, x), ref_q4_0(x));
  EXPECT_EQ(encode_gguf_tensor(GgmlType::q4_1, x), ref_q4_1(x));
}

TEST(GgufQuant, Q4EncoderEdgeBlocks) {
  std::vector<float> x(32, 0.0f);
  // All zero: Q4_0's max keeps its initial +0, d = 0/-8 = -0 (f16 0x8000), codes 8 (q = 0*0 +
  // 8.5); Q4_1: d = +0, m = the first zero (here -0), codes 0.
  x[0] = -0.0f;
  EXPECT_EQ(encode_gguf_tensor(GgmlType::q4_0, x),
            (std::vector<uint8_t>{0x00, 0x80, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88,
                                  0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88}));
  std::vector<uint8_t> q41 = encode_gguf_tensor(GgmlType::q4_1, x);
  EXPECT_EQ(q41[0] | (q41[1] << 8), 0x0000);
  EXPECT_EQ(q41[2] | (q41[3] << 8), 0x8000);
  // The element of largest |x| decodes exactly (code 0 = -8 * d), the one of opposite sign
  // saturates at code 15; Q4_1's min and max hit codes 0 and 15.
  x.assign(32, 0.0f);
  x[3] = -4.0f;
  x[20] = 3.9f;
  const std::vector<float> y0 = decode_blocks(GgmlType::q4_0, encode_gguf_tensor(GgmlType::q4_0, x));
  EXPECT_EQ(y0[3], -4.0f);
  EXPECT_EQ(y0[20], 3.5f);  // 7 * 0.5
  const std::vector<uint8_t> b1 = encode_gguf_tensor(GgmlType::q4_1, x);
  EXPECT_EQ(b1[4 + 3] & 0x0F, 0);
  EXPECT_EQ(b1[4 + 4] >> 4, 15);  // element 20 is the high nibble of byte 4
  // 1/d overflows (amax < 2^-125 or so): every code is 0, d is a signed f16 zero.
  x.assign(32, 0.0f);
  x[0] = 1e-39f;
  x[1] = -5e-40f;
  const std::vector<uint8_t> tiny = encode_gguf_tensor(GgmlType::q4_0, x);
  EXPECT_EQ(tiny[0] | (tiny[1] << 8), 0x8000);  // d = 1e-39/-8 rounds to -0
  for (size_t j = 2; j < tiny.size(); ++j) EXPECT_EQ(tiny[j], 0) << j;
  // Scales beyond fp16 become Inf as in ggml (d = 3e6/-8 > 65504 for Q4_0).
  x.assign(32, 1.0f);
  x[9] = 3e6f;
  const std::vector<uint8_t> big = encode_gguf_tensor(GgmlType::q4_0, x);
  EXPECT_EQ(big[0] | (big[1] << 8), 0xFC00);
}

TEST(GgufQuant, UnsupportedTypesNameTheList) {
  const std::vector<uint8_t> q81(40 * 2, 0);
  const GgufFile f = GgufFile::from_bytes(serialize_gguf({}, {{"q", {64}, GgmlType::q8_1, q81}}), "q.gguf");
  EXPECT_FALSE(gguf_type_converts_to_floats(GgmlType::q8_1));
  EXPECT_TRUE(gguf_type_converts_to_floats(GgmlType::q2_k));
  try {
    gguf_tensor_to_floats(f.get("q"));
    ADD_FAILURE() << "Q8_1 should not convert";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'q' has type Q8_1; only F32, F16, BF16, Q4_0"),
              std::string::npos) << e.what();
  }
  GgufTensorInfo t;  // bytes that do not match dims (a truncated Q4_K row)
  t.name = "k";
  t.type = GgmlType::q4_k;
  t.dims = {256};
  const std::vector<uint8_t> short_block(143, 0);
  t.bytes = short_block;
  try {
    gguf_tensor_to_floats(t);
    ADD_FAILURE() << "a short Q4_K block should not convert";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("143 bytes do not match dims [256] of Q4_K"),
              std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace concord::io
