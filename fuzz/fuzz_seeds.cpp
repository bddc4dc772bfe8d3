// Writes the fuzzers' seed corpus with concord's own writers: fuzz_seeds DIR creates
// DIR/gguf/ and DIR/safetensors/ with a few small valid files covering every metadata type,
// the dequantizable tensor types, a raw k-quant, custom alignment, and the safetensors dtypes.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

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

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds DIR\n");
    return 2;
  }
  const fs::path root = argv[1];
  fs::create_directories(root / "gguf");
  fs::create_directories(root / "safetensors");
  gguf_seeds(root / "gguf");
  safetensors_seeds(root / "safetensors");
  return 0;
}
