// Writes the fuzzers' seed corpus with concord's own writers: fuzz_seeds DIR creates
// DIR/gguf/ and DIR/safetensors/ with a few small valid files covering every metadata type,
// the dequantizable tensor types (every legacy and k-quant among them), custom alignment, and
// the safetensors dtypes, two damaged GGUFs (a quant tensor cut short, an unknown tensor type),
// a GGUF tokenizer and five inconsistent ones (tokenizer_from_gguf),
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

// GPT-2's byte-level alphabet, byte 0 to 255 (printable Latin-1 bytes stand for themselves,
// the others U+0100 onwards), as UTF-8.
std::vector<std::string> byte_level_characters() {
  std::vector<std::string> out;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
    std::string c;
    if (cp < 0x80) {
      c += static_cast<char>(cp);
    } else {
      c += static_cast<char>(0xC0 | (cp >> 6));
      c += static_cast<char>(0x80 | (cp & 0x3F));
    }
    out.push_back(c);
  }
  return out;
}

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

  // Tokenizer metadata (issue 15): a small byte-level vocabulary with merges, control tokens and
  // the smollm split, and the same made inconsistent in each way tokenizer_from_gguf names.
  GgufMetadata tok;
  tok.emplace_back("general.architecture", GgufValue::of_string("llama"));
  std::vector<std::string> tokens = {"<|endoftext|>", "<|im_start|>"};
  for (const std::string& c : byte_level_characters()) tokens.push_back(c);
  tokens.push_back("\u0120t");
  tokens.push_back("he");
  std::vector<int64_t> types(tokens.size(), 1);
  types[0] = types[1] = 3;
  const auto tokenizer = [&](const std::vector<std::string>& t, const std::vector<int64_t>& ty,
                             const std::vector<std::string>& merges, int64_t bos,
                             const std::string& pre) {
    GgufMetadata m2 = tok;
    m2.emplace_back("tokenizer.ggml.model", GgufValue::of_string("gpt2"));
    m2.emplace_back("tokenizer.ggml.pre", GgufValue::of_string(pre));
    m2.emplace_back("tokenizer.ggml.tokens", GgufValue::of_strings(t));
    m2.emplace_back("tokenizer.ggml.token_type", GgufValue::of_ints(GgufType::int32, ty));
    m2.emplace_back("tokenizer.ggml.merges", GgufValue::of_strings(merges));
    m2.emplace_back("tokenizer.ggml.bos_token_id", GgufValue::of_uint32(static_cast<uint32_t>(bos)));
    m2.emplace_back("tokenizer.ggml.add_bos_token", GgufValue::of_bool(true));
    return m2;
  };
  const std::vector<std::string> merges = {"\u0120 t", "h e"};
  write_gguf(dir / "tokenizer.gguf", tokenizer(tokens, types, merges, 1, "smollm"), {});
  write_gguf(dir / "tokenizer_types_short.gguf",
             tokenizer(tokens, std::vector<int64_t>(types.begin() + 1, types.end()), merges, 1,
                       "smollm"),
             {});
  write_gguf(dir / "tokenizer_merge_unknown.gguf",
             tokenizer(tokens, types, {"\u0120 t", "zz t"}, 1, "smollm"), {});
  write_gguf(dir / "tokenizer_bos_out_of_range.gguf",
             tokenizer(tokens, types, merges, static_cast<int64_t>(tokens.size()), "smollm"), {});
  std::vector<std::string> duplicated = tokens;
  duplicated.back() = duplicated[duplicated.size() - 2];
  write_gguf(dir / "tokenizer_duplicate.gguf", tokenizer(duplicated, types, merges, 1, "smollm"),
             {});
  write_gguf(dir / "tokenizer_pre_unknown.gguf", tokenizer(tokens, types, merges, 1, "tekken"),
             {});
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
