// Writes the fuzzers' seed corpus with concord's own writers: fuzz_seeds DIR creates
// DIR/gguf/ and DIR/safetensors/ with a few small valid files covering every metadata type,
// the dequantizable tensor types (every legacy and k-quant among them), custom alignment, and
// the safetensors dtypes, two damaged GGUFs (a quant tensor cut short, an unknown tensor type),
// and DIR/dump/ with logit dumps (.npy with and without its rows.json sidecar, safetensors) in
// dump_fuzz's input layout.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "concord/audit/dump.h"
#include "concord/io/atomic_file.h"

#include "concord/io/gguf.h"
#include "concord/io/safetensors.h"

namespace {

using namespace concord::io;
namespace fs = std::filesystem;

std::vector<float> ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = (static_cast<float>(i % 17) - 8.0f) * 0.37f;
  return v;
}

void gguf_seeds(const fs::path& dir) {
  GgufMetadata m;
  m.emplace_back("general.architecture", GgufValue::of_string("llama"));
  m.emplace_back("u32", GgufValue::of_uint32(7));
  m.emplace_back("i32", GgufValue::of_int32(-7));
  m.emplace_back("u64", GgufValue::of_uint64(1ull << 40));
  m.emplace_back("f32", GgufValue::of_float32(0.5f));
  m.emplace_back("b", GgufValue::of_bool(true));
  m.emplace_back("strs", GgufValue::of_strings({"a", "bc", ""}));
  m.emplace_back("u8s", GgufValue::of_ints(GgufType::uint8, {1, 2, 3}));
  m.emplace_back("i16s", GgufValue::of_ints(GgufType::int16, {-1, 2}));
  m.emplace_back("f64s", GgufValue::of_floats(GgufType::float64, {1.5, -2.0}));
  std::vector<std::vector<uint8_t>> storage;
  std::vector<GgufTensorToWrite> tensors;
  for (GgmlType type : {GgmlType::f32, GgmlType::f16, GgmlType::bf16, GgmlType::q8_0, GgmlType::mxfp4}) {
    storage.push_back(encode_gguf_tensor(type, ramp(64)));
    tensors.push_back({"t" + std::to_string(tensors.size()), {32, 2}, type, storage.back()});
  }
  storage.emplace_back(144, 0x5A);
  tensors.push_back({"k", {256}, GgmlType::q4_k, storage.back()});
  write_gguf(dir / "all.gguf", m, tensors);
  write_gguf(dir / "aligned64.gguf", {m.front()}, {tensors[3]}, 64);
  write_gguf(dir / "metadata_only.gguf", m, {});
  write_gguf(dir / "one_tensor.gguf", {}, {tensors[4]}, 1);

  // One tensor of each legacy and k-quant type: Q4_0/Q4_1 encoded, the others byte patterns
  // (two blocks each, so scales, codes and high bits all vary).
  std::vector<std::vector<uint8_t>> quant_storage;
  std::vector<GgufTensorToWrite> quants;
  for (GgmlType type : {GgmlType::q4_0, GgmlType::q4_1, GgmlType::q5_0, GgmlType::q5_1,
                        GgmlType::q2_k, GgmlType::q3_k, GgmlType::q4_k, GgmlType::q5_k,
                        GgmlType::q6_k, GgmlType::q8_k}) {
    const GgmlTypeTraits traits = *ggml_type_traits(static_cast<uint32_t>(type));
    if (type == GgmlType::q4_0 || type == GgmlType::q4_1) {
      quant_storage.push_back(encode_gguf_tensor(type, ramp(2 * 32)));
    } else {
      std::vector<uint8_t> bytes(static_cast<size_t>(2 * traits.type_size));
      for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
      quant_storage.push_back(std::move(bytes));
    }
    quants.push_back({std::string(traits.name), {traits.block_size, 2}, type, quant_storage.back()});
  }
  write_gguf(dir / "quants.gguf", {m.front()}, quants);

  // Damaged: the last Q6_K block cut short (the file ends inside the tensor), and a tensor whose
  // type number (4, a removed ggml type) is unknown.
  std::vector<uint8_t> cut = serialize_gguf({m.front()}, {quants[8]});
  const uint64_t data_end = GgufFile::from_bytes(cut, "cut").data_offset() + quants[8].bytes.size();
  cut.resize(static_cast<size_t>(data_end) - 17);
  write_file_atomic(dir / "truncated_quant.gguf", std::span<const uint8_t>(cut));
  std::vector<uint8_t> unknown = serialize_gguf({m.front()}, {quants[0]});
  // the tensor info: name (u64 length + "Q4_0"), n_dims u32, dims 2 x u64, then the type u32
  const std::string name = "Q4_0";
  auto at = std::search(unknown.begin(), unknown.end(), name.begin(), name.end());
  const auto type_offset = static_cast<size_t>(at - unknown.begin()) + name.size() + 4 + 2 * 8;
  unknown[type_offset] = 4;
  write_file_atomic(dir / "unknown_type.gguf", std::span<const uint8_t>(unknown));
}

void safetensors_seeds(const fs::path& dir) {
  const std::vector<float> f = ramp(6);
  const std::vector<uint8_t> f32(reinterpret_cast<const uint8_t*>(f.data()),
                                 reinterpret_cast<const uint8_t*>(f.data() + f.size()));
  const std::vector<uint8_t> half(8, 0x3C), bytes{1, 2, 3, 4};
  write_safetensors(dir / "floats.safetensors",
                    {{"w", Dtype::F32, {2, 3}, f32}, {"h", Dtype::F16, {4}, half},
                     {"b", Dtype::BF16, {2, 2}, half}},
                    {{"format", "pt"}});
  write_safetensors(dir / "ints.safetensors",
                    {{"u", Dtype::U8, {4}, bytes}, {"f4", Dtype::F4, {8}, bytes}});
  write_safetensors(dir / "empty.safetensors", {});
}

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// dump_fuzz's layout: byte 0 (bit 0: safetensors; bit 1: a sidecar follows), then for a sidecar
// its 16-bit little-endian length and text, then the file image.
void write_dump_seed(const fs::path& path, const fs::path& image, const fs::path* sidecar) {
  std::vector<uint8_t> input;
  if (image.extension() == ".safetensors") {
    input.push_back(1);
  } else if (sidecar == nullptr) {
    input.push_back(0);
  } else {
    const std::vector<uint8_t> text = read_bytes(*sidecar);
    input.push_back(2);
    input.push_back(static_cast<uint8_t>(text.size() & 0xFF));
    input.push_back(static_cast<uint8_t>((text.size() >> 8) & 0xFF));
    input.insert(input.end(), text.begin(), text.end());
  }
  const std::vector<uint8_t> bytes = read_bytes(image);
  input.insert(input.end(), bytes.begin(), bytes.end());
  write_file_atomic(path, std::span<const uint8_t>(input));
}

void dump_seeds(const fs::path& dir) {
  using concord::audit::LogitDumpWriter;
  using concord::audit::RowInfo;
  LogitDumpWriter writer(5);
  for (int32_t r = 0; r < 4; ++r) {
    RowInfo info;
    info.sequence = r / 2;
    info.position = r % 2;
    info.prompt_length = 1;
    info.token = r;
    info.next = (r + 1) % 5;
    info.task = r < 2 ? "add" : "";
    info.label = r % 2 == 0 ? "even" : "";
    const std::vector<float> logits = ramp(5 + static_cast<size_t>(r));
    writer.add(info, std::span<const float>(logits.data() + r, 5));
  }
  const fs::path scratch = dir / "scratch";
  fs::create_directories(scratch);
  writer.write((scratch / "rows.npy").string());
  writer.write((scratch / "rows.safetensors").string());
  const fs::path sidecar = scratch / "rows.npy.rows.json";
  write_dump_seed(dir / "npy_sidecar", scratch / "rows.npy", &sidecar);
  write_dump_seed(dir / "npy_bare", scratch / "rows.npy", nullptr);
  write_dump_seed(dir / "safetensors", scratch / "rows.safetensors", nullptr);
  fs::remove_all(scratch);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  const fs::path root = argv[1];
  fs::create_directories(root / "gguf");
  fs::create_directories(root / "safetensors");
  fs::create_directories(root / "dump");
  gguf_seeds(root / "gguf");
  safetensors_seeds(root / "safetensors");
  dump_seeds(root / "dump");
  return 0;
}
