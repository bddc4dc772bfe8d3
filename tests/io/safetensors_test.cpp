// safetensors reader/writer: round trips of every dtype, the reference library's layout,
// atomic writes, and corrupt files (each with its own one-line error, none crashing).
#include "concord/io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "concord/numerics/check.h"

namespace concord::io {
namespace {

namespace fs = std::filesystem;

// Built through a string: GCC 12 warns falsely on vector::insert after a sized vector.
std::string length_prefix(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return out;
}

std::vector<uint8_t> image_of(const std::string& header, const std::vector<uint8_t>& buffer = {}) {
  const std::string s = length_prefix(header.size()) + header + std::string(buffer.begin(), buffer.end());
  return {s.begin(), s.end()};
}

std::vector<uint8_t> with_length(uint64_t n, const std::string& rest) {
  const std::string s = length_prefix(n) + rest;
  return {s.begin(), s.end()};
}

// The InputError message of parsing `image`, or "" when it loads.
std::string error_of(std::vector<uint8_t> image) {
  try {
    SafetensorsFile::from_bytes(std::move(image), "bad.safetensors");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

void expect_error(std::vector<uint8_t> image, const std::string& fragment) {
  const std::string message = error_of(std::move(image));
  ASSERT_FALSE(message.empty()) << "expected an error containing: " << fragment;
  EXPECT_EQ(message.rfind("[safetensors] bad.safetensors: ", 0), 0u) << message;
  EXPECT_NE(message.find(fragment), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

std::string u8_entry(const std::string& name, uint64_t begin, uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"U8\",\"shape\":[" + std::to_string(end - begin) +
         "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(end) + "]}";
}

std::vector<uint8_t> bytes_pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(seed + 37 * i);
  return out;
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("concord_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

TEST(SafetensorsDtype, TableMatchesEnumAndNamesRoundTrip) {
  for (int i = 0; i < kDtypeCount; ++i) {
    const DtypeTraits& t = kDtypeTable[static_cast<size_t>(i)];
    EXPECT_EQ(static_cast<int>(t.dtype), i);
    EXPECT_EQ(dtype_from_name(t.name), t.dtype);
  }
  EXPECT_FALSE(dtype_from_name("F7"));
  EXPECT_FALSE(dtype_from_name("f32"));  // names are case-sensitive, as in the spec
}

TEST(SafetensorsDtype, ByteSizes) {
  const std::vector<int64_t> s24{2, 3, 4};
  EXPECT_EQ(tensor_byte_size(Dtype::F32, s24), 96u);
  EXPECT_EQ(tensor_byte_size(Dtype::F4, s24), 12u);
  EXPECT_EQ(tensor_byte_size(Dtype::F6_E2M3, s24), 18u);
  EXPECT_EQ(tensor_byte_size(Dtype::F4, std::vector<int64_t>{3}), std::nullopt);
  EXPECT_EQ(tensor_byte_size(Dtype::F32, std::vector<int64_t>{}), 4u);  // a scalar
  EXPECT_EQ(tensor_byte_size(Dtype::F32, std::vector<int64_t>{0, 7}), 0u);
  EXPECT_EQ(tensor_byte_size(Dtype::U8, std::vector<int64_t>{int64_t{1} << 32, int64_t{1} << 32}),
            std::nullopt);
  EXPECT_EQ(tensor_byte_size(Dtype::U64, std::vector<int64_t>{int64_t{1} << 62}), std::nullopt);
}

TEST(Safetensors, RoundTripEveryDtypeInMemoryAndOnDisk) {
  // 8 elements fill whole bytes for every dtype (F6: 48 bits, F4: 32 bits).
  std::vector<std::vector<uint8_t>> data;
  std::vector<TensorToWrite> tensors;
  for (const DtypeTraits& t : kDtypeTable) {
    data.push_back(bytes_pattern(static_cast<size_t>(8 * t.bits / 8), static_cast<uint8_t>(t.bits)));
  }
  for (size_t i = 0; i < kDtypeTable.size(); ++i) {
    tensors.push_back({"t_" + std::string(kDtypeTable[i].name), kDtypeTable[i].dtype, {2, 4}, data[i]});
  }
  const std::map<std::string, std::string> metadata{{"format", "pt"}, {"note", "caf\xc3\xa9 \"q\""}};
  TempDir dir;
  const fs::path path = dir.path() / "all.safetensors";
  write_safetensors(path, tensors, metadata);
  const auto image = serialize_safetensors(tensors, metadata);
  for (const SafetensorsFile& f :
       {SafetensorsFile::open(path), SafetensorsFile::from_bytes(image, "memory")}) {
    ASSERT_EQ(f.tensors().size(), kDtypeTable.size());
    EXPECT_EQ(f.metadata(), metadata);
    EXPECT_EQ(f.header_size() % 8, 0u);
    for (size_t i = 0; i < kDtypeTable.size(); ++i) {
      const TensorInfo& t = f.get("t_" + std::string(kDtypeTable[i].name));
      EXPECT_EQ(t.dtype, kDtypeTable[i].dtype);
      EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 4}));
      EXPECT_EQ(std::vector<uint8_t>(t.bytes.begin(), t.bytes.end()), data[i]) << t.name;
    }
  }
  EXPECT_EQ(fs::file_size(path), image.size());
}

TEST(Safetensors, WriterMatchesReferenceLibraryLayout) {
  // Bytes written by safetensors 0.8 (Python: safetensors.numpy.save) for these tensors:
  // dtype descending in the reference enum order, then name; __metadata__ first; spaces pad
  // the header to a multiple of 8.
  const std::string expected_header =
      R"({"__metadata__":{"k":"v"},"m":{"dtype":"F64","shape":[3],"data_offsets":[0,24]},)"
      R"("z":{"dtype":"F32","shape":[2],"data_offsets":[24,32]},)"
      R"("bf":{"dtype":"F16","shape":[2],"data_offsets":[32,36]},)"
      R"("b":{"dtype":"I16","shape":[1],"data_offsets":[36,38]},)"
      R"("a":{"dtype":"U8","shape":[2],"data_offsets":[38,40]}}    )";
  const std::vector<uint8_t> zeros(24, 0);
  const auto image = serialize_safetensors(
      {{"z", Dtype::F32, {2}, std::span(zeros).first(8)},
       {"a", Dtype::U8, {2}, std::span(zeros).first(2)},
       {"m", Dtype::F64, {3}, std::span(zeros).first(24)},
       {"b", Dtype::I16, {1}, std::span(zeros).first(2)},
       {"bf", Dtype::F16, {2}, std::span(zeros).first(4)}},
      {{"k", "v"}});
  ASSERT_GE(image.size(), 8 + expected_header.size());
  EXPECT_EQ(image[0] | (size_t{image[1]} << 8), expected_header.size());
  EXPECT_EQ(std::string(image.begin() + 8, image.begin() + 8 + static_cast<long>(expected_header.size())),
            expected_header);
  EXPECT_EQ(image.size(), 8 + expected_header.size() + 40);
}

TEST(Safetensors, EmptyFileHasPaddedEmptyHeader) {
  const auto image = serialize_safetensors({});
  EXPECT_EQ(image.size(), 16u);
  const auto f = SafetensorsFile::from_bytes(image, "empty");
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_TRUE(f.metadata().empty());
}

TEST(Safetensors, ZeroSizedAndScalarTensors) {
  const std::vector<uint8_t> four(4, 1);
  const auto f = SafetensorsFile::from_bytes(
      serialize_safetensors({{"empty", Dtype::F32, {0, 5}, {}}, {"scalar", Dtype::F32, {}, four}}),
      "memory");
  EXPECT_EQ(f.get("empty").numel(), 0);
  EXPECT_EQ(f.get("scalar").numel(), 1);
  EXPECT_EQ(f.get("scalar").bytes.size(), 4u);
}

TEST(Safetensors, FloatsFromF32F16Bf16) {
  const float f32[3] = {1.5f, -0.0f, 3.0e-41f};  // includes an fp32 subnormal
  const uint8_t f16[6] = {0x00, 0x3C, 0x00, 0xC0, 0x01, 0x00};    // 1, -2, 2^-24
  const uint8_t bf16[6] = {0x80, 0x3F, 0x80, 0xFF, 0x01, 0x00};   // 1, -inf, smallest subnormal
  const auto f = SafetensorsFile::from_bytes(
      serialize_safetensors({{"a", Dtype::F32, {3}, {reinterpret_cast<const uint8_t*>(f32), 12}},
                             {"b", Dtype::F16, {3}, f16},
                             {"c", Dtype::BF16, {3}, bf16}}),
      "memory");
  const auto a = tensor_to_floats(f.get("a"));
  EXPECT_EQ(std::memcmp(a.data(), f32, 12), 0);
  EXPECT_EQ(tensor_to_floats(f.get("b")), (std::vector<float>{1.0f, -2.0f, 0x1p-24f}));
  const auto c = tensor_to_floats(f.get("c"));
  EXPECT_EQ(c[0], 1.0f);
  EXPECT_TRUE(std::isinf(c[1]) && c[1] < 0);
  EXPECT_EQ(c[2], 0x1p-133f);
  const uint8_t i8[1] = {1};
  const auto g = SafetensorsFile::from_bytes(serialize_safetensors({{"i", Dtype::I8, {1}, i8}}), "m");
  EXPECT_THROW(tensor_to_floats(g.get("i")), InputError);
  EXPECT_THROW(g.get("missing"), InputError);
}

TEST(Safetensors, AtomicWriteLeavesOnlyTheFile) {
  TempDir dir;
  const std::vector<uint8_t> bytes(16, 7);
  write_safetensors(dir.path() / "a.safetensors", {{"t", Dtype::U8, {16}, bytes}});
  write_safetensors(dir.path() / "a.safetensors", {{"t", Dtype::U8, {4, 4}, bytes}});  // replace
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"a.safetensors"});
  EXPECT_EQ(SafetensorsFile::open(dir.path() / "a.safetensors").get("t").shape,
            (std::vector<int64_t>{4, 4}));
  // A rejected write leaves nothing behind.
  EXPECT_THROW(write_safetensors(dir.path() / "b.safetensors", {{"t", Dtype::F32, {16}, bytes}}),
               InputError);
  EXPECT_THROW(write_safetensors(dir.path() / "b.safetensors",
                                 {{"t", Dtype::U8, {16}, bytes}, {"t", Dtype::U8, {16}, bytes}}),
               InputError);
  EXPECT_THROW(write_safetensors(dir.path() / "b.safetensors", {{"__metadata__", Dtype::U8, {16}, bytes}}),
               InputError);
  names.clear();
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"a.safetensors"});
}

TEST(Safetensors, OpenErrorsNameTheFile) {
  TempDir dir;
  try {
    SafetensorsFile::open(dir.path() / "missing.safetensors");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.safetensors: cannot open"), std::string::npos);
  }
  std::ofstream(dir.path() / "tiny.safetensors") << "abc";
  try {
    SafetensorsFile::open(dir.path() / "tiny.safetensors");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tiny.safetensors: file is 3 bytes"), std::string::npos);
  }
  std::ofstream(dir.path() / "zero.safetensors").close();
  EXPECT_THROW(SafetensorsFile::open(dir.path() / "zero.safetensors"), InputError);
}

// ---- corrupt files: each its own clear error ----

TEST(SafetensorsCorrupt, TruncatedFile) { expect_error({1, 2, 3}, "file is 3 bytes"); }

TEST(SafetensorsCorrupt, TruncatedHeader) {
  auto image = image_of("{" + u8_entry("a", 0, 4) + "}", {1, 2, 3, 4});
  image.resize(20);
  expect_error(image, "runs past the end of the file");
}

TEST(SafetensorsCorrupt, TruncatedData) {
  auto image = image_of("{" + u8_entry("a", 0, 4) + "}", {1, 2, 3, 4});
  image.pop_back();
  expect_error(image, "past the end of the data buffer (3 bytes)");
}

TEST(SafetensorsCorrupt, HeaderLengthLargerThanFile) {
  expect_error(with_length(1000, "{}"), "header length 1000 runs past the end of the file (10 bytes)");
}

TEST(SafetensorsCorrupt, OversizedHeader) {
  expect_error(with_length(100'000'001, "{}"), "exceeds the 100000000-byte limit");
  expect_error(with_length(UINT64_MAX, "{}"), "exceeds the 100000000-byte limit");
}

TEST(SafetensorsCorrupt, HeaderNotUtf8) { expect_error(image_of("{\"\xff\":1}"), "not valid UTF-8"); }

TEST(SafetensorsCorrupt, HeaderNotJson) {
  expect_error(image_of("{\"a\":"), "not valid JSON");
  expect_error(image_of("hello\nworld"), "not valid JSON");
}

TEST(SafetensorsCorrupt, JsonNotAnObject) { expect_error(image_of("[1, 2]"), "header is a JSON array, not an object"); }

TEST(SafetensorsCorrupt, TooDeep) {
  expect_error(image_of("{\"a\":{\"shape\":[[1]]}}"), "nests containers 4 deep");
  expect_error(image_of(std::string(5000, '[') + std::string(5000, ']')), "nests containers");
}

TEST(SafetensorsCorrupt, EntryNotAnObject) { expect_error(image_of("{\"a\":5}"), "tensor 'a': entry is number"); }

TEST(SafetensorsCorrupt, MissingFields) {
  expect_error(image_of(R"({"a":{"shape":[1],"data_offsets":[0,1]}})", {0}), "missing \"dtype\"");
  expect_error(image_of(R"({"a":{"dtype":"U8","data_offsets":[0,1]}})", {0}), "missing \"shape\"");
  expect_error(image_of(R"({"a":{"dtype":"U8","shape":[1]}})", {0}), "missing \"data_offsets\"");
  expect_error(image_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", {0}),
               "missing \"data_offsets\"");
}

TEST(SafetensorsCorrupt, UnknownDtype) {
  expect_error(image_of(R"({"a":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})", {0}),
               "tensor 'a': unknown dtype 'F7' (known: BOOL, F4,");
}

TEST(SafetensorsCorrupt, NegativeOrNonIntegerShape) {
  expect_error(image_of(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", {0}),
               "shape [-1] must hold non-negative integers");
  expect_error(image_of(R"({"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})", {0}),
               "must hold non-negative integers");
  expect_error(image_of(R"({"a":{"dtype":"U8","shape":["1"],"data_offsets":[0,1]}})", {0}),
               "must hold non-negative integers");
  expect_error(image_of(R"({"a":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,1]}})", {0}),
               "below 2^63");
}

TEST(SafetensorsCorrupt, BadOffsets) {
  expect_error(image_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", {0}),
               "must be two non-negative integers");
  expect_error(image_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,99]}})", {0}),
               "data_offsets end 99 is past the end of the data buffer (1 bytes)");
  expect_error(image_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,18446744073709551615]}})", {0}),
               "past the end of the data buffer");
}

TEST(SafetensorsCorrupt, BeginAfterEnd) {
  expect_error(image_of(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}})", {0}),
               "data_offsets [1, 0] has begin > end");
}

TEST(SafetensorsCorrupt, SizeNotMatchingShape) {
  expect_error(image_of(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", {0, 0, 0, 0}),
               "shape [2] of F32 needs 8 bytes but data_offsets [0, 4] span 4");
  expect_error(image_of(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", {0, 0}),
               "do not fill whole bytes");
}

TEST(SafetensorsCorrupt, HugeShapeOverflows) {
  expect_error(image_of(R"({"a":{"dtype":"U8","shape":[4294967296,4294967296,2],"data_offsets":[0,0]}})"),
               "overflows 64 bits");
  expect_error(image_of(R"({"a":{"dtype":"U64","shape":[4611686018427387904],"data_offsets":[0,0]}})"),
               "overflows 64 bits");
}

TEST(SafetensorsCorrupt, OverlappingTensors) {
  expect_error(image_of("{" + u8_entry("a", 0, 4) + "," + u8_entry("b", 2, 6) + "}", bytes_pattern(6, 0)),
               "tensors 'a' [0, 4) and 'b' [2, 6) overlap");
  expect_error(image_of("{" + u8_entry("a", 0, 4) + "," + u8_entry("b", 0, 4) + "}", bytes_pattern(4, 0)),
               "overlap");
}

TEST(SafetensorsCorrupt, BufferNotFullyCovered) {
  expect_error(image_of("{" + u8_entry("a", 0, 2) + "," + u8_entry("b", 4, 6) + "}", bytes_pattern(6, 0)),
               "bytes [2, 4) of the data buffer belong to no tensor");
  expect_error(image_of("{" + u8_entry("a", 0, 2) + "}", bytes_pattern(5, 0)),
               "bytes [2, 5) at the end of the data buffer belong to no tensor");
  expect_error(image_of("{" + u8_entry("a", 1, 3) + "}", bytes_pattern(3, 0)),
               "bytes [0, 1) of the data buffer belong to no tensor");
}

TEST(SafetensorsCorrupt, DuplicateNames) {
  expect_error(image_of("{" + u8_entry("a", 0, 1) + "," + u8_entry("a", 1, 2) + "}", {0, 0}),
               "duplicate key 'a'");
  expect_error(image_of(R"({"__metadata__":{"k":"1","k":"2"}})"), "duplicate key 'k'");
}

TEST(SafetensorsCorrupt, MetadataNotStrings) {
  expect_error(image_of(R"({"__metadata__":{"k":1}})"), "__metadata__ value of 'k' is number");
  expect_error(image_of(R"({"__metadata__":["k"]})"), "__metadata__ is array");
}

TEST(SafetensorsCorrupt, ControlCharactersInNamesStayOnOneLine) {
  expect_error(image_of(R"({"a\nb":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})", {0}),
               "tensor 'a\\x0ab': unknown dtype");
}

// Random byte mutations of a valid file: each must load (with every span inside the image) or
// throw InputError — never crash, never throw anything else. Deterministic (fixed seed); runs
// under ASan + UBSan in CI.
TEST(SafetensorsCorrupt, RandomMutationsLoadOrThrowInputError) {
  std::vector<std::vector<uint8_t>> data{bytes_pattern(24, 1), bytes_pattern(6, 2), bytes_pattern(4, 3)};
  const auto valid = serialize_safetensors(
      {{"model.w", Dtype::F32, {2, 3}, data[0]},
       {"model.b", Dtype::BF16, {3}, data[1]},
       {"step", Dtype::I32, {}, data[2]}},
      {{"format", "pt"}, {"concord.quant.x", "{}"}});
  const size_t header_end = 8 + (valid[0] | (size_t{valid[1]} << 8));
  std::mt19937_64 rng(12345);
  int loaded = 0, rejected = 0;
  for (int trial = 0; trial < 600; ++trial) {
    std::vector<uint8_t> image = valid;
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0) {  // truncate anywhere
      image.resize(rng() % image.size());
    } else if (kind == 1) {  // corrupt the length field
      image[rng() % 8] = static_cast<uint8_t>(rng());
    } else {  // 1-4 bytes, mostly inside the header (where the parser is)
      const int count = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < count; ++k) {
        const size_t at = kind == 2 ? 8 + rng() % (header_end - 8) : rng() % image.size();
        image[at] = rng() % 2 ? static_cast<uint8_t>(rng()) : static_cast<uint8_t>("{}[]\":,0123456789-."[rng() % 20]);
      }
    }
    try {
      const auto f = SafetensorsFile::from_bytes(image, "mutant");
      uint64_t sum = 0;
      for (const TensorInfo& t : f.tensors()) {
        for (uint8_t b : t.bytes) sum += b;
        if (t.dtype == Dtype::F32 || t.dtype == Dtype::F16 || t.dtype == Dtype::BF16) {
          sum += tensor_to_floats(t).size();
        }
      }
      (void)sum;
      ++loaded;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
      ++rejected;
    }
  }
  // Both outcomes occur, so the test exercises the parser and not only the length check.
  EXPECT_GT(loaded, 10);
  EXPECT_GT(rejected, 300);
}

}  // namespace
}  // namespace concord::io
