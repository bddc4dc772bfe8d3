// Logit dumps: files built byte by byte here from the NumPy and safetensors format definitions
// (independent of concord's writer), round trips of every row field through both containers,
// every hostile input with its own one-line error, and truncation at every offset.
#include "concord/audit/dump.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "concord/io/safetensors.h"
#include "concord/numerics/check.h"

namespace concord::audit {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("concord_dump_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// ---- byte builders, from the format definitions ----------------------------------------------

std::string le(uint64_t v, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xFF);
  return out;
}

template <typename T>
std::string raw(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }

// A .npy file: magic, version, header length, the dict padded with spaces and '\n' so that the
// data starts at a multiple of `align` (numpy.lib.format), then `data`.
std::string npy_file(const std::string& dict, const std::string& data, int major = 1,
                     size_t align = 64) {
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t prefix = 6 + 2 + length_bytes;
  std::string header = dict;
  while ((prefix + header.size() + 1) % align != 0) header += ' ';
  header += '\n';
  return std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0' +
         le(header.size(), static_cast<int>(length_bytes)) + header + data;
}

std::string npy_dict(const std::string& descr, int64_t rows, int64_t vocab) {
  return "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + std::to_string(rows) +
         ", " + std::to_string(vocab) + "), }";
}

// A safetensors file from a header written out here (8-byte length, JSON, buffer).
std::string safetensors_file(const std::string& header_json, const std::string& buffer) {
  return le(header_json.size(), 8) + header_json + buffer;
}

struct Entry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// Header and buffer for `entries` laid out in order.
std::string safetensors_of(const std::vector<Entry>& entries, const std::string& metadata_json) {
  std::string header = "{";
  if (!metadata_json.empty()) header += "\"__metadata__\":" + metadata_json;
  std::string buffer;
  for (const Entry& e : entries) {
    if (header.size() > 1) header += ",";
    std::string shape;
    for (int64_t d : e.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    header += "\"" + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":[" + shape +
              "],\"data_offsets\":[" + std::to_string(buffer.size()) + "," +
              std::to_string(buffer.size() + e.bytes.size()) + "]}";
    buffer += e.bytes;
  }
  return safetensors_file(header + "}", buffer);
}

// The InputError message of reading `image` as `label`, or "" when it loads.
std::string error_of(const std::string& image, const std::string& label,
                     std::optional<std::string> sidecar = std::nullopt) {
  try {
    LogitDump::from_bytes(to_bytes(image), label, std::move(sidecar));
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

void expect_error(const std::string& image, const std::string& label, const std::string& fragment,
                  std::optional<std::string> sidecar = std::nullopt,
                  const std::string& prefix_layer = "audit") {
  const std::string message = error_of(image, label, std::move(sidecar));
  ASSERT_FALSE(message.empty()) << "expected an error containing: " << fragment;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_EQ(message.rfind("[" + prefix_layer + "] " + label, 0), 0u) << message;
  EXPECT_NE(message.find(fragment), std::string::npos) << message;
}

// Independent decoders of the 16-bit formats (IEEE binary16; bfloat16 = the top half of fp32).
double bf16_value(uint16_t code) { return std::bit_cast<float>(static_cast<uint32_t>(code) << 16); }
double f16_value(uint16_t code) {
  const double sign = (code & 0x8000) ? -1.0 : 1.0;
  const int exponent = (code >> 10) & 0x1F;
  const int mantissa = code & 0x3FF;
  if (exponent == 0x1F) {
    return mantissa ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  }
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

std::vector<double> row_as_double(const LogitDump& d, int64_t r) {
  std::vector<double> out(static_cast<size_t>(d.vocab()));
  d.row(r, std::span<double>(out));
  return out;
}
std::vector<float> row_as_float(const LogitDump& d, int64_t r) {
  std::vector<float> out(static_cast<size_t>(d.vocab()));
  d.row(r, std::span<float>(out));
  return out;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(a[i]), std::bit_cast<uint32_t>(b[i])) << "index " << i;
  }
}

// ---- reading files built by hand ------------------------------------------------------------

TEST(LogitDumpNpy, ReadsHandBuiltF32AndF64InEveryVersion) {
  const std::vector<float> f32 = {1.5f, -0.0f, 3.25e-7f, -1e30f, 7.0f, 0.125f};
  const std::vector<double> f64 = {0.1, -2.5, 1e-300, 4.0, 1.0 + 0x1p-30, -7.75};
  for (int major : {1, 2, 3}) {
    for (size_t align : {size_t{64}, size_t{16}}) {
      const LogitDump a = LogitDump::from_bytes(
          to_bytes(npy_file(npy_dict("<f4", 2, 3), raw(f32), major, align)), "a.npy");
      EXPECT_EQ(a.rows(), 2);
      EXPECT_EQ(a.vocab(), 3);
      EXPECT_EQ(a.dtype(), "F32");
      EXPECT_FALSE(a.is_f64());
      expect_same_bits(row_as_float(a, 1), {f32[3], f32[4], f32[5]});
      EXPECT_EQ(row_as_double(a, 0), (std::vector<double>{1.5, -0.0, double(3.25e-7f)}));
      const LogitDump b = LogitDump::from_bytes(
          to_bytes(npy_file(npy_dict("<f8", 3, 2), raw(f64), major, align)), "b.npy");
      EXPECT_EQ(b.rows(), 3);
      EXPECT_EQ(b.dtype(), "F64");
      EXPECT_TRUE(b.is_f64());
      EXPECT_EQ(row_as_double(b, 2), (std::vector<double>{f64[4], f64[5]}));
      // Rows without a sidecar: sequence = row index, everything else unknown.
      for (int64_t r = 0; r < 3; ++r) {
        RowInfo expected;
        expected.sequence = r;
        EXPECT_EQ(b.info(r), expected);
      }
    }
  }
}

TEST(LogitDumpNpy, DictVariantsPythonWrites) {
  const std::string data = raw(std::vector<float>{1, 2});
  // Key order, double quotes, no trailing comma, extra spaces: all the same literal.
  for (const std::string& dict :
       {std::string("{'shape': (1, 2), 'fortran_order': False, 'descr': '<f4'}"),
        std::string("{\"descr\":\"<f4\",\"fortran_order\":False,\"shape\":(1,2,)}"),
        std::string("{ 'descr' : '<f4' , 'fortran_order' : False , 'shape' : ( 1 , 2 ) , }")}) {
    const LogitDump d = LogitDump::from_bytes(to_bytes(npy_file(dict, data)), "v.npy");
    EXPECT_EQ(d.vocab(), 2) << dict;
    EXPECT_EQ(row_as_float(d, 0), (std::vector<float>{1, 2}));
  }
  // Zero rows is a valid (empty) dump.
  const LogitDump empty =
      LogitDump::from_bytes(to_bytes(npy_file(npy_dict("<f4", 0, 5), "")), "e.npy");
  EXPECT_EQ(empty.rows(), 0);
  EXPECT_EQ(empty.vocab(), 5);
}

TEST(LogitDumpNpy, F64ToFloatRoundsToNearestEven) {
  const float one_up = std::bit_cast<float>(0x3F800001u);  // 1 + 2^-23
  const std::vector<double> values = {
      1.0 + 0x1p-24,            // a tie: to even (1)
      1.0 + 0x1p-24 + 0x1p-40,  // above the tie: up
      1.0 + 0x1p-23 + 0x1p-24,  // a tie between odd 1+2^-23 and even 1+2^-22: up
      -(1.0 + 0x1p-24 - 0x1p-45),  // below the tie: toward -1
      1e300,                    // overflows to +inf
      0x1p-150,                 // half the smallest subnormal: a tie to 0
  };
  const LogitDump d = LogitDump::from_bytes(
      to_bytes(npy_file(npy_dict("<f8", 1, static_cast<int64_t>(values.size())), raw(values))),
      "r.npy");
  const std::vector<float> expected = {1.0f, one_up, 1.0f + 0x1p-22f, -1.0f,
                                       std::numeric_limits<float>::infinity(), 0.0f};
  expect_same_bits(row_as_float(d, 0), expected);
  EXPECT_EQ(row_as_double(d, 0), values);  // the double path is exact
}

TEST(LogitDumpNpy, SidecarSetsEveryFieldAndDefaultsTheRest) {
  const std::string image = npy_file(npy_dict("<f4", 3, 4), raw(std::vector<float>(12, 0.5f)));
  const std::string sidecar = R"({"sequence": [7, 7, 9], "position": [0, 1, 0],
    "prompt_length": [2, 2, 5], "token": [3, 0, -1], "next": [0, -1, 3],
    "task": ["gsm8k", "gsm8k", ""], "label": ["", "caf\u00e9", "b"]})";
  const LogitDump d = LogitDump::from_bytes(to_bytes(image), "s.npy", sidecar);
  EXPECT_EQ(d.info(0), (RowInfo{7, 0, 2, 3, 0, "gsm8k", ""}));
  EXPECT_EQ(d.info(1), (RowInfo{7, 1, 2, 0, -1, "gsm8k", "caf\xc3\xa9"}));
  EXPECT_EQ(d.info(2), (RowInfo{9, 0, 5, -1, 3, "", "b"}));
  const LogitDump partial =
      LogitDump::from_bytes(to_bytes(image), "p.npy", R"({"position": [4, 5, 6]})");
  EXPECT_EQ(partial.info(2), (RowInfo{2, 6, 0, -1, -1, "", ""}));
  const LogitDump none = LogitDump::from_bytes(to_bytes(image), "n.npy", "{}");
  EXPECT_EQ(none.info(1), (RowInfo{1, 0, 0, -1, -1, "", ""}));
}

TEST(LogitDumpSafetensors, ReadsHandBuiltFilesOfEveryLogitDtype) {
  const std::vector<uint16_t> bf16 = {0x3FC0, 0xC000, 0x0001, 0x7F80, 0x8000, 0x4049};
  const std::vector<uint16_t> f16 = {0x3C00, 0x0001, 0xFBFF, 0x7C00, 0x8000, 0x3555};
  const std::vector<float> f32 = {1, -2, 0.1f, 1e-40f, 5, 6};
  const std::vector<double> f64 = {1, -2, 0.1, 1e-310, 5, 6};
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"BF16", raw(bf16)}, {"F16", raw(f16)}, {"F32", raw(f32)}, {"F64", raw(f64)}};
  for (const auto& [dtype, bytes] : cases) {
    const std::string image = safetensors_of({{"logits", dtype, {2, 3}, bytes}}, "");
    const LogitDump d = LogitDump::from_bytes(to_bytes(image), "x.safetensors");
    EXPECT_EQ(d.dtype(), dtype);
    EXPECT_EQ(d.rows(), 2);
    EXPECT_EQ(d.vocab(), 3);
    for (int64_t r = 0; r < 2; ++r) {
      const std::vector<double> got = row_as_double(d, r);
      const std::vector<float> got_f = row_as_float(d, r);
      for (size_t i = 0; i < 3; ++i) {
        const size_t k = static_cast<size_t>(r) * 3 + i;
        const double want = dtype == "BF16"  ? bf16_value(bf16[k])
                            : dtype == "F16" ? f16_value(f16[k])
                            : dtype == "F32" ? double(f32[k])
                                             : f64[k];
        EXPECT_EQ(got[i], want) << dtype << " element " << k;
        EXPECT_EQ(got_f[i], static_cast<float>(want)) << dtype << " element " << k;
      }
    }
  }
}

TEST(LogitDumpSafetensors, ReadsEveryRowFieldInI32AndI64) {
  const std::string logits = raw(std::vector<float>{0, 1, 2, 3, 4, 5});
  for (const std::string dtype : {"I32", "I64"}) {
    auto column = [&](std::vector<int64_t> v) {
      if (dtype == "I64") return raw(v);
      std::vector<int32_t> narrow(v.begin(), v.end());
      return raw(narrow);
    };
    const std::string image = safetensors_of(
        {{"logits", "F32", {3, 2}, logits},
         {"sequence", dtype, {3}, column({0, 0, int64_t{1} << 31})},
         {"position", dtype, {3}, column({0, 1, 2147483647})},
         {"prompt_length", dtype, {3}, column({1, 1, 0})},
         {"token", dtype, {3}, column({1, 0, -1})},
         {"next", dtype, {3}, column({0, -1, 1})},
         {"task", dtype, {3}, column({1, -1, 0})},
         {"label", dtype, {3}, column({-1, 0, 0})}},
        R"({"concord.format":"logit-dump/1","concord.tasks":"[\"gsm8k\",\"mbpp\"]",)"
        R"("concord.labels":"[\"\u00fcber\"]","other":"ignored"})");
    if (dtype == "I32") {
      // I32 cannot hold 2^31: the sequence column is the one I64 tensor of this file.
      expect_error(image, "f.safetensors", "row 2: sequence -2147483648 is outside");
      continue;
    }
    const LogitDump d = LogitDump::from_bytes(to_bytes(image), "f.safetensors");
    EXPECT_EQ(d.info(0), (RowInfo{0, 0, 1, 1, 0, "mbpp", ""}));
    EXPECT_EQ(d.info(1), (RowInfo{0, 1, 1, 0, -1, "", "\xc3\xbc" "ber"}));
    EXPECT_EQ(d.info(2), (RowInfo{int64_t{1} << 31, 2147483647, 0, -1, 1, "gsm8k", "\xc3\xbc" "ber"}));
  }
  // Mixed widths and a subset of the fields.
  const std::string image = safetensors_of(
      {{"logits", "F32", {3, 2}, logits},
       {"position", "I32", {3}, raw(std::vector<int32_t>{5, 6, 7})},
       {"token", "I64", {3}, raw(std::vector<int64_t>{1, 1, 0})}},
      "");
  const LogitDump d = LogitDump::from_bytes(to_bytes(image), "g.safetensors");
  EXPECT_EQ(d.info(2), (RowInfo{2, 7, 0, 0, -1, "", ""}));
}

// ---- round trips through the writer ----------------------------------------------------------

std::vector<RowInfo> sample_rows() {
  return {
      {0, 0, 3, 5, 2, "gsm8k", ""},
      {0, 1, 3, 2, -1, "gsm8k", "long-context"},
      {int64_t{1} << 40, 2147483647, 0, -1, 0, "", "caf\xc3\xa9"},
      {3, 0, 1, 0, 6, "mbpp", "long-context"},
  };
}

std::vector<float> sample_logits(int64_t rows, int64_t vocab) {
  std::vector<float> out;
  for (int64_t i = 0; i < rows * vocab; ++i) {
    out.push_back(static_cast<float>(std::sin(static_cast<double>(i) * 1.7) * 30.0));
  }
  out[1] = -0.0f;
  out[2] = std::numeric_limits<float>::denorm_min();
  out[3] = std::numeric_limits<float>::max();
  out[4] = std::numeric_limits<float>::quiet_NaN();  // the reader does not require finite logits
  return out;
}

TEST(LogitDumpWriter, RoundTripsEveryFieldThroughBothContainers) {
  const int64_t vocab = 7;
  const std::vector<RowInfo> rows = sample_rows();
  const std::vector<float> logits = sample_logits(static_cast<int64_t>(rows.size()), vocab);
  LogitDumpWriter writer(vocab);
  for (size_t r = 0; r < rows.size(); ++r) {
    writer.add(rows[r], std::span<const float>(logits).subspan(r * vocab, vocab));
  }
  EXPECT_EQ(writer.rows(), 4);
  TempDir dir;
  for (const std::string name : {"d.npy", "d.safetensors"}) {
    const std::string path = dir.file(name);
    writer.write(path);
    const LogitDump d = LogitDump::open(path);
    EXPECT_EQ(d.path(), path);
    EXPECT_EQ(d.dtype(), "F32");
    EXPECT_EQ(d.rows(), 4);
    EXPECT_EQ(d.vocab(), vocab);
    for (size_t r = 0; r < rows.size(); ++r) {
      EXPECT_EQ(d.info(static_cast<int64_t>(r)), rows[r]) << name << " row " << r;
      expect_same_bits(row_as_float(d, static_cast<int64_t>(r)),
                       {logits.begin() + static_cast<long>(r * vocab),
                        logits.begin() + static_cast<long>((r + 1) * vocab)});
    }
  }
  // The npy file is numpy's layout: version 1.0, header padded to 64 bytes, then the floats.
  std::ifstream in(dir.file("d.npy"), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  const size_t header_length = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
  EXPECT_EQ((10 + header_length) % 64, 0u);
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 7), }";
  EXPECT_EQ(bytes.substr(10, header_length), dict + std::string(header_length - dict.size() - 1, ' ') + "\n");
  EXPECT_EQ(bytes[10 + header_length - 1], '\n');
  EXPECT_EQ(bytes.size(), 10 + header_length + logits.size() * 4);
  EXPECT_EQ(bytes.substr(10 + header_length), raw(logits));
  // The sidecar holds every field, P long.
  std::ifstream sidecar_in(dir.file("d.npy.rows.json"));
  const auto sidecar = nlohmann::json::parse(sidecar_in);
  EXPECT_EQ(sidecar["sequence"], nlohmann::json({0, 0, int64_t{1} << 40, 3}));
  EXPECT_EQ(sidecar["label"], nlohmann::json({"", "long-context", "caf\xc3\xa9", "long-context"}));
  EXPECT_EQ(sidecar.size(), 7u);
  // The safetensors file: the documented tensors, dtypes and metadata.
  const io::SafetensorsFile st = io::SafetensorsFile::open(dir.file("d.safetensors"));
  EXPECT_EQ(st.get("logits").dtype, io::Dtype::F32);
  EXPECT_EQ(st.get("sequence").dtype, io::Dtype::I64);
  for (const char* name : {"position", "prompt_length", "token", "next", "task", "label"}) {
    EXPECT_EQ(st.get(name).dtype, io::Dtype::I32) << name;
    EXPECT_EQ(st.get(name).shape, (std::vector<int64_t>{4})) << name;
  }
  EXPECT_EQ(st.metadata().at("concord.format"), "logit-dump/1");
  EXPECT_EQ(st.metadata().at("concord.tasks"), R"(["gsm8k","mbpp"])");
  EXPECT_EQ(st.metadata().at("concord.labels"), "[\"long-context\",\"caf\xc3\xa9\"]");
  std::vector<int32_t> task(4);
  std::memcpy(task.data(), st.get("task").bytes.data(), 16);
  EXPECT_EQ(task, (std::vector<int32_t>{0, 0, -1, 1}));
  // No temporary files are left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}), 3);
}

TEST(LogitDumpWriter, EmptyDumpAndOverwrite) {
  TempDir dir;
  for (const std::string name : {"e.npy", "e.safetensors"}) {
    LogitDumpWriter empty(3);
    empty.write(dir.file(name));
    EXPECT_EQ(LogitDump::open(dir.file(name)).rows(), 0);
    LogitDumpWriter one(2);
    one.add(RowInfo{}, std::vector<float>{1, 2});
    one.write(dir.file(name));  // replaces the file (and the sidecar)
    const LogitDump d = LogitDump::open(dir.file(name));
    EXPECT_EQ(d.rows(), 1);
    EXPECT_EQ(d.vocab(), 2);
  }
}

TEST(LogitDumpWriter, RejectsBadRowsAndPaths) {
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message([] { LogitDumpWriter w(0); }).find("vocabulary size 0"), std::string::npos);
  LogitDumpWriter w(3);
  const std::vector<float> three{1, 2, 3};
  EXPECT_NE(message([&] { w.add(RowInfo{}, std::vector<float>{1, 2}); }).find("has 2 logits"),
            std::string::npos);
  RowInfo bad_token;
  bad_token.token = 3;
  EXPECT_NE(message([&] { w.add(bad_token, three); }).find("token 3 is outside [-1, 2]"),
            std::string::npos);
  RowInfo bad_next;
  bad_next.next = -2;
  EXPECT_NE(message([&] { w.add(bad_next, three); }).find("next -2"), std::string::npos);
  RowInfo negative;
  negative.position = -1;
  EXPECT_NE(message([&] { w.add(negative, three); }).find("position -1"), std::string::npos);
  RowInfo not_utf8;
  not_utf8.label = "a\xff";
  EXPECT_NE(message([&] { w.add(not_utf8, three); }).find("label 'a"), std::string::npos);
  EXPECT_EQ(w.rows(), 0);  // nothing bad was added
  TempDir dir;
  EXPECT_NE(message([&] { w.write(dir.file("d.csv")); }).find("extension '.csv'"),
            std::string::npos);
  EXPECT_NE(message([&] { w.write(dir.file("missing/d.npy")); }), "");
}

// ---- hostile input ---------------------------------------------------------------------------

TEST(LogitDumpNpy, RejectsHostileFiles) {
  const std::string f32 = raw(std::vector<float>{1, 2, 3, 4, 5, 6});
  const std::string good = npy_file(npy_dict("<f4", 2, 3), f32);
  ASSERT_EQ(error_of(good, "x.npy"), "");
  struct Case {
    std::string image, fragment;
  };
  std::string bad_magic = good;
  bad_magic[1] = 'M';
  std::string version_4 = good;
  version_4[6] = 4;
  std::string minor_1 = good;
  minor_1[7] = 1;
  std::string no_newline = good;
  no_newline[127] = ' ';
  std::string high_byte = good;
  high_byte[100] = '\xe9';
  const std::vector<Case> cases = {
      {"", "not a .npy file"},
      {"\x93NUMP", "not a .npy file"},
      {bad_magic, "not a .npy file"},
      {version_4, "version 4.0"},
      {minor_1, "version 1.1"},
      {std::string("\x93NUMPY\x02\x00\x10\x00", 8), "ends inside the header length"},
      {std::string("\x93NUMPY\x01\x00\xff\x00", 8) + "{}", "runs past the end of the file"},
      {std::string("\x93NUMPY\x02\x00", 8) + le(0xFFFFFFFFu, 4), "runs past the end of the file"},
      {npy_file(npy_dict("<f4", 2, 3), f32, 1, 8), "not a multiple of 16"},
      {no_newline, "does not end with '\\n'"},
      {high_byte, "non-ASCII byte 0xe9"},
      {npy_file("['descr']", f32), "expected the header to start with '{'"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", f32),
       "expected ',' or '}'"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} x", f32),
       "unexpected text after the dictionary"},
      {npy_file("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", f32),
       "the key 'descr' appears twice"},
      {npy_file("{'descr': '<f4', 'shape': (2, 3)}", f32), "no 'fortran_order'"},
      {npy_file("{'fortran_order': False, 'shape': (2, 3)}", f32), "no 'descr'"},
      {npy_file("{'descr': '<f4', 'fortran_order': False}", f32), "no 'shape'"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", f32),
       "unknown key 'x'"},
      {npy_file("{descr: '<f4'}", f32), "expected a quoted key"},
      {npy_file("{'descr: '<f4'}", f32), "expected ':'"},
      {npy_file("{'descr': '<f\\x34', 'fortran_order': False, 'shape': (2, 3)}", f32),
       "escape sequences"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'd': '", f32),
       "runs past the end of its line"},
      {npy_file(npy_dict("<f2", 2, 3), f32), "dtype '<f2' is not supported"},
      {npy_file(npy_dict(">f4", 2, 3), f32), "dtype '>f4' is not supported"},
      {npy_file(npy_dict("<i4", 2, 3), f32), "dtype '<i4'"},
      {npy_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 3)}", f32),
       "a list value (a structured dtype"},
      {npy_file("{'descr': {'a': 1}, 'fortran_order': False, 'shape': (2, 3)}", f32),
       "unsupported value"},
      {npy_file("{'descr': None, 'fortran_order': False, 'shape': (2, 3)}", f32),
       "dtype None is not supported"},
      {npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3)}", f32),
       "Fortran (column-major) order"},
      {npy_file("{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3)}", f32),
       "'fortran_order' is 0"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': 6}", f32),
       "'shape' is 6, expected a tuple"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", f32),
       "shape [6]; a logit dump is 2-D"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3)}", f32),
       "shape [1, 2, 3]"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': ()}", f32), "shape []"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3)}", f32),
       "a shape dimension is negative"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (02, 3)}", f32),
       "leading zero"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 0x3)}", f32),
       "',' or ')' in a tuple"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3.0)}", f32),
       "',' or ')' in a tuple"},
      {npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 3)}",
                f32),
       "does not fit in 63 bits"},
      {npy_file(npy_dict("<f4", int64_t{1} << 40, INT32_MAX), f32), "overflows 64 bits"},
      {npy_file(npy_dict("<f4", 2, 0), ""), "vocabulary size 0"},
      {npy_file(npy_dict("<f4", 1, int64_t{1} << 31), ""), "vocabulary size 2147483648"},
      {npy_file(npy_dict("<f4", 2, 3), f32.substr(0, 20)), "holds 20 bytes but shape [2, 3] of "
                                                           "'<f4' needs 24 (file truncated?)"},
      {npy_file(npy_dict("<f4", 2, 3), f32 + "x"), "holds 25 bytes"},
      {npy_file(npy_dict("<f8", 2, 3), f32), "needs 48"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fragment);
    expect_error(c.image, "x.npy", c.fragment);
  }
}

TEST(LogitDumpNpy, RejectsHostileSidecars) {
  const std::string image = npy_file(npy_dict("<f4", 2, 3), raw(std::vector<float>(6, 1.0f)));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "not valid JSON"},
      {"[1, 2]", "is a JSON array, expected an object"},
      {R"({"token": [1, 2]} x)", "not valid JSON"},
      {R"({"tokens": [1, 2]})", "unknown key 'tokens'"},
      {R"({"token": [1, 2], "token": [1, 2]})", "has the key 'token' twice"},
      {R"({"token": 1})", "\"token\" is a JSON number"},
      {R"({"token": [1]})", "\"token\" holds 1 entries but the logits have 2 rows"},
      {R"({"token": [1, 2, 0]})", "holds 3 entries"},
      {R"({"token": [1, [2]]})", "nests containers 3 deep"},
      {R"({"token": [1, 3]})", "row 1: token 3 is outside [-1, 2] (vocabulary 3"},
      {R"({"next": [-2, 0]})", "row 0: next -2 is outside"},
      {R"({"position": [0, -1]})", "row 1: position -1 is outside [0, 2147483647]"},
      {R"({"prompt_length": [2147483648, 0]})", "prompt_length 2147483648 is outside"},
      {R"({"sequence": [-1, 0]})", "row 0: sequence -1"},
      {R"({"sequence": [9223372036854775808, 0]})", "is not an integer"},
      {R"({"sequence": [1e3, 0]})", "row 0: sequence 1000.0 is not an integer"},
      {R"({"position": [1.0, 0]})", "is not an integer"},
      {R"({"position": ["1", 0]})", "row 0: position \"1\" is not an integer"},
      {R"({"position": [null, 0]})", "is not an integer"},
      {R"({"task": ["a", 1]})", "row 1: task 1 is not a string"},
      {R"({"label": [["a"], "b"]})", "nests containers"},
      {"{\"label\": [\"a\xff\", \"b\"]}", "not valid JSON"},
      {R"({"label": ["\udc00", "b"]})", "not valid JSON"},
  };
  for (const auto& [sidecar, fragment] : cases) {
    SCOPED_TRACE(fragment);
    const std::string message = error_of(image, "x.npy", sidecar);
    ASSERT_FALSE(message.empty());
    EXPECT_EQ(message.rfind("[audit] x.npy.rows.json: ", 0), 0u) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(LogitDumpSafetensors, RejectsHostileFiles) {
  const std::string logits = raw(std::vector<float>{1, 2, 3, 4, 5, 6});
  auto with = [&](std::vector<Entry> extra, const std::string& metadata = "") {
    std::vector<Entry> entries = {{"logits", "F32", {2, 3}, logits}};
    entries.insert(entries.end(), extra.begin(), extra.end());
    return safetensors_of(entries, metadata);
  };
  const std::string i32_01 = raw(std::vector<int32_t>{0, 1});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {safetensors_of({{"scores", "F32", {2, 3}, logits}}, ""), "no tensor \"logits\""},
      {safetensors_of({{"logits", "I32", {2, 3}, logits}}, ""), "\"logits\" has dtype I32"},
      {safetensors_of({{"logits", "F8_E4M3", {6}, logits.substr(0, 6)}}, ""), "dtype F8_E4M3"},
      {safetensors_of({{"logits", "F32", {6}, logits}}, ""), "shape [6]; a logit dump is 2-D"},
      {safetensors_of({{"logits", "F32", {1, 2, 3}, logits}}, ""), "shape [1, 2, 3]"},
      {safetensors_of({{"logits", "F32", {6, 0}, ""}}, ""), "vocabulary size 0"},
      {with({{"tokens", "I32", {2}, i32_01}}), "unknown tensor 'tokens'"},
      {with({{"token", "F32", {2}, i32_01}}), "tensor \"token\" has dtype F32; row fields are I32"},
      {with({{"token", "U32", {2}, i32_01}}), "dtype U32"},
      {with({{"token", "I32", {1}, i32_01.substr(0, 4)}}), "\"token\" has shape [1]; row fields "
                                                           "have shape [2]"},
      {with({{"token", "I32", {2, 1}, i32_01}}), "shape [2, 1]"},
      {with({{"token", "I32", {2}, raw(std::vector<int32_t>{0, 3})}}),
       "row 1: token 3 is outside [-1, 2]"},
      {with({{"next", "I64", {2}, raw(std::vector<int64_t>{-5, 0})}}), "row 0: next -5"},
      {with({{"position", "I64", {2}, raw(std::vector<int64_t>{0, int64_t{1} << 31})}}),
       "row 1: position 2147483648 is outside [0, 2147483647]"},
      {with({{"prompt_length", "I32", {2}, raw(std::vector<int32_t>{-1, 0})}}),
       "prompt_length -1"},
      {with({{"sequence", "I64", {2}, raw(std::vector<int64_t>{0, INT64_MIN})}}),
       "row 1: sequence -9223372036854775808"},
      {with({{"task", "I32", {2}, i32_01}}),
       "row 0: task 0 is outside [-1, -1] (an index into the 0 names"},
      {with({{"task", "I32", {2}, i32_01}}, R"({"concord.tasks":"[\"a\"]"})"),
       "row 1: task 1 is outside [-1, 0]"},
      {with({{"label", "I32", {2}, raw(std::vector<int32_t>{-2, 0})}},
            R"({"concord.labels":"[\"a\"]"})"),
       "row 0: label -2"},
      {with({}, R"({"concord.format":"logit-dump/2"})"), "\"concord.format\" is 'logit-dump/2'"},
      {with({}, R"({"concord.tasks":"a"})"), "metadata \"concord.tasks\" is not valid JSON"},
      {with({}, R"({"concord.tasks":"{\"a\":1}"})"), "is a JSON object, expected an array"},
      {with({}, R"({"concord.labels":"[1]"})"), "holds 1, expected strings"},
      {with({}, R"({"concord.labels":"[[\"a\"]]"})"), "nests containers 2 deep"},
      {with({}, R"({"concord.labels":"[\"a\",\"b\"] x"})"), "not valid JSON"},
  };
  for (const auto& [image, fragment] : cases) {
    SCOPED_TRACE(fragment);
    expect_error(image, "x.safetensors", fragment);
  }
  // Container problems come from io's strict reader, naming the file.
  expect_error(safetensors_file("{\"logits\":{\"dtype\":\"F32\"}}", ""), "x.safetensors",
               "missing \"shape\"", std::nullopt, "safetensors");
  expect_error(with({{"token", "I32", {2}, i32_01}}) + "xx", "x.safetensors", "trailing data",
               std::nullopt, "safetensors");
}

TEST(LogitDump, RejectsUnknownExtensionsAndMissingFiles) {
  expect_error("", "x.bin", "extension '.bin' (use .npy or .safetensors)");
  expect_error("", "npy", "extension ''");
  TempDir dir;
  for (const std::string name : {"missing.npy", "missing.safetensors"}) {
    try {
      LogitDump::open(dir.file(name));
      ADD_FAILURE() << "opened a missing file";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(dir.file(name) + ": cannot open"), std::string::npos)
          << e.what();
    }
  }
  // A sidecar problem names the sidecar, read from disk next to the .npy.
  LogitDumpWriter w(2);
  w.add(RowInfo{}, std::vector<float>{1, 2});
  w.write(dir.file("d.npy"));
  std::ofstream(dir.file("d.npy.rows.json")) << R"({"token": [5]})";
  try {
    LogitDump::open(dir.file("d.npy"));
    ADD_FAILURE() << "accepted a bad sidecar";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[audit] " + dir.file("d.npy.rows.json") +
                                              ": row 0: token 5",
                                          0),
              0u)
        << e.what();
  }
  fs::remove(dir.file("d.npy.rows.json"));
  EXPECT_EQ(LogitDump::open(dir.file("d.npy")).info(0), RowInfo{});
  fs::create_directory(dir.file("d.npy.rows.json"));
  EXPECT_THROW(LogitDump::open(dir.file("d.npy")), InputError);
}

TEST(LogitDump, EveryTruncationIsAnInputError) {
  LogitDumpWriter w(3);
  w.add(RowInfo{4, 1, 2, 0, 2, "t", "l"}, std::vector<float>{1, -2, 3});
  w.add(RowInfo{4, 2, 2, 2, -1, "", "l"}, std::vector<float>{0.5f, 0, -1});
  TempDir dir;
  for (const std::string name : {"t.npy", "t.safetensors"}) {
    w.write(dir.file(name));
    std::ifstream in(dir.file(name), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::optional<std::string> sidecar;
    if (name == "t.npy") {
      std::ifstream s(dir.file(name) + ".rows.json");
      sidecar.emplace((std::istreambuf_iterator<char>(s)), std::istreambuf_iterator<char>());
    }
    ASSERT_EQ(error_of(bytes, name, sidecar), "");
    for (size_t cut = 0; cut < bytes.size(); ++cut) {
      EXPECT_NE(error_of(bytes.substr(0, cut), name, sidecar), "") << name << " cut at " << cut;
    }
    if (sidecar) {
      for (size_t cut = 0; cut < sidecar->size(); ++cut) {
        // Cutting the trailing newline leaves valid JSON.
        if (cut + 1 == sidecar->size()) continue;
        EXPECT_NE(error_of(bytes, name, sidecar->substr(0, cut)), "") << "sidecar cut at " << cut;
      }
    }
  }
}

}  // namespace
}  // namespace concord::audit
