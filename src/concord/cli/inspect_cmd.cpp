// concord inspect: list the tensors, metadata and concord quantization formats of a
// safetensors or GGUF file (validating it strictly), or print one tensor's values with --dump.
// The format is told by the file's first bytes ("GGUF" magic), not by its name.
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "concord/cli/commands.h"
#include "concord/io/gguf.h"
#include "concord/io/quantized_safetensors.h"
#include "concord/io/safetensors.h"
#include "concord/numerics/check.h"

namespace concord::cli {
namespace {

using io::Dtype;
using numerics::QuantDesc;

struct InspectOptions {
  std::string path;
  std::string dump;
};

// "MX: e4m3 elements in 1x32 blocks, e8m0 power-of-two scales (rule floor); rounding rne,
// overflow saturate"
std::string describe(const QuantDesc& d) {
  const std::string element(numerics::traits(d.element).name);
  const auto block = numerics::effective_block(d);
  std::string s;
  if (d.is_mx()) {
    s = fmt::format("MX: {} elements in {}x{} blocks, e8m0 power-of-two scales (rule {})", element,
                    block.rows, block.cols, numerics::scale_rule_name(d.scale_rule));
  } else if (d.is_nvfp4()) {
    s = fmt::format("NVFP4: {} elements in {}x{} blocks, ue4m3 block scales, fp32 tensor scale",
                    element, block.rows, block.cols);
  } else if (d.is_per_tensor()) {
    s = fmt::format("per-tensor: {} elements, one fp32 scale", element);
  } else {
    s = fmt::format("element-wise cast to {}", element);
  }
  return s + fmt::format("; rounding {}, overflow {}", numerics::rounding_name(d.rounding),
                         numerics::overflow_name(d.overflow));
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// One value per line: floats as the shortest decimal that reads back exactly, integers in
// decimal, BOOL as 0/1; dtypes without a C++ scalar (F8, F6, F4, C64) as hex bytes.
void dump_tensor(const io::TensorInfo& t) {
  const uint8_t* p = t.bytes.data();
  const auto n = static_cast<size_t>(t.numel());
  std::string out;
  auto add = [&out](const auto& v) { out += fmt::format("{}\n", v); };
  switch (t.dtype) {
    case Dtype::F32:
    case Dtype::F16:
    case Dtype::BF16:
      for (float v : io::tensor_to_floats(t)) add(v);
      break;
    case Dtype::F64: for (size_t i = 0; i < n; ++i) add(load<double>(p + 8 * i)); break;
    case Dtype::I64: for (size_t i = 0; i < n; ++i) add(load<int64_t>(p + 8 * i)); break;
    case Dtype::U64: for (size_t i = 0; i < n; ++i) add(load<uint64_t>(p + 8 * i)); break;
    case Dtype::I32: for (size_t i = 0; i < n; ++i) add(load<int32_t>(p + 4 * i)); break;
    case Dtype::U32: for (size_t i = 0; i < n; ++i) add(load<uint32_t>(p + 4 * i)); break;
    case Dtype::I16: for (size_t i = 0; i < n; ++i) add(load<int16_t>(p + 2 * i)); break;
    case Dtype::U16: for (size_t i = 0; i < n; ++i) add(load<uint16_t>(p + 2 * i)); break;
    case Dtype::I8: for (size_t i = 0; i < n; ++i) add(static_cast<int>(load<int8_t>(p + i))); break;
    case Dtype::U8:
    case Dtype::BOOL:
      for (size_t i = 0; i < n; ++i) add(static_cast<int>(p[i]));
      break;
    default:
      for (uint8_t b : t.bytes) out += fmt::format("0x{:02X}\n", b);
      break;
  }
  fmt::print("{}", out);
}

// --- GGUF ---

// One metadata element on one line: strings JSON-quoted, floats as the shortest decimal that
// reads back exactly in their own width, uint64 unsigned, bool true/false.
std::string gguf_element_text(const io::GgufValue& v, size_t i) {
  using io::GgufType;
  switch (v.element_type()) {
    case GgufType::string:
      return nlohmann::json(v.strings[i]).dump(-1, ' ', false,
                                               nlohmann::json::error_handler_t::replace);
    case GgufType::float32: return fmt::format("{}", static_cast<float>(v.floats[i]));
    case GgufType::float64: return fmt::format("{}", v.floats[i]);
    case GgufType::boolean: return v.ints[i] != 0 ? "true" : "false";
    case GgufType::uint64: return fmt::format("{}", static_cast<uint64_t>(v.ints[i]));
    default: return fmt::format("{}", v.ints[i]);
  }
}

// "uint32 = 7", "string = \"llama\"", "array<float32>[1000] = [0.5, 1, ...]" (first 8 shown).
std::string gguf_value_text(const io::GgufValue& v) {
  constexpr size_t kShown = 8;
  if (!v.is_array()) return fmt::format("{} = {}", io::gguf_type_name(v.type), gguf_element_text(v, 0));
  std::string items;
  for (size_t i = 0; i < std::min(v.size(), kShown); ++i) {
    items += (i > 0 ? ", " : "") + gguf_element_text(v, i);
  }
  if (v.size() > kShown) items += ", ...";
  return fmt::format("array<{}>[{}] = [{}]", io::gguf_type_name(v.array_type), v.size(), items);
}

void dump_gguf_tensor(const io::GgufTensorInfo& t) {
  using io::GgmlType;
  const uint8_t* p = t.bytes.data();
  const auto n = static_cast<size_t>(t.numel());
  std::string out;
  auto add = [&out](const auto& v) { out += fmt::format("{}\n", v); };
  switch (t.type) {
    case GgmlType::f64: for (size_t i = 0; i < n; ++i) add(load<double>(p + 8 * i)); break;
    case GgmlType::i64: for (size_t i = 0; i < n; ++i) add(load<int64_t>(p + 8 * i)); break;
    case GgmlType::i32: for (size_t i = 0; i < n; ++i) add(load<int32_t>(p + 4 * i)); break;
    case GgmlType::i16: for (size_t i = 0; i < n; ++i) add(load<int16_t>(p + 2 * i)); break;
    case GgmlType::i8: for (size_t i = 0; i < n; ++i) add(static_cast<int>(load<int8_t>(p + i))); break;
    default:  // io::gguf_type_converts_to_floats types; InputError naming the tensor for others
      for (float v : io::gguf_tensor_to_floats(t)) add(v);
      break;
  }
  fmt::print("{}", out);
}

void inspect_gguf(const InspectOptions& o) {
  const io::GgufFile f = io::GgufFile::open(o.path);
  if (!o.dump.empty()) {
    dump_gguf_tensor(f.get(o.dump));
    return;
  }
  fmt::print("{}: GGUF v{}, alignment {}, data at byte {}, {} tensors, {} metadata entries\n",
             f.path(), f.version(), f.alignment(), f.data_offset(), f.tensors().size(),
             f.metadata().size());
  fmt::print("metadata:\n");
  for (const auto& [key, value] : f.metadata()) {
    fmt::print("  {}: {}\n", key, gguf_value_text(value));
  }
  size_t name_width = 6, dims_width = 4;
  auto dims_text = [](const io::GgufTensorInfo& t) { return io::shape_text(t.dims); };
  for (const auto& t : f.tensors()) {
    name_width = std::max(name_width, t.name.size());
    dims_width = std::max(dims_width, dims_text(t).size());
  }
  fmt::print("{:<{}}  {:<7}  {:<{}}  {:>12}  {:>12}\n", "tensor", name_width, "type", "dims",
             dims_width, "bytes", "data offset");
  for (const auto& t : f.tensors()) {
    fmt::print("{:<{}}  {:<7}  {:<{}}  {:>12}  {:>12}\n", t.name, name_width,
               io::ggml_type_traits(static_cast<uint32_t>(t.type))->name, dims_text(t),
               dims_width, t.bytes.size(), t.offset);
  }
}

void run_inspect(const InspectOptions& o) {
  if (io::is_gguf_path(o.path)) {
    inspect_gguf(o);
    return;
  }
  const io::SafetensorsFile f = io::SafetensorsFile::open(o.path);
  if (!o.dump.empty()) {
    dump_tensor(f.get(o.dump));
    return;
  }
  const std::vector<io::QuantizedEntry> quantized = io::quantized_entries(f);
  for (const auto& e : quantized) io::load_quantized(f, e);  // companions must be consistent

  fmt::print("{}: {} bytes, header {} bytes, {} tensors, {} metadata entries\n", f.path(),
             f.file_size(), f.header_size(), f.tensors().size(), f.metadata().size());
  size_t name_width = 6, shape_width = 5;
  for (const auto& t : f.tensors()) {
    name_width = std::max(name_width, t.name.size());
    shape_width = std::max(shape_width, io::shape_text(t.shape).size());
  }
  fmt::print("{:<{}}  {:<11}  {:<{}}  {:>12}  {:>12}\n", "tensor", name_width, "dtype", "shape",
             shape_width, "bytes", "file offset");
  for (const auto& t : f.tensors()) {
    fmt::print("{:<{}}  {:<11}  {:<{}}  {:>12}  {:>12}\n", t.name, name_width,
               io::dtype_name(t.dtype), io::shape_text(t.shape), shape_width, t.end - t.begin,
               f.data_offset() + t.begin);
  }
  if (!f.metadata().empty()) {
    fmt::print("metadata:\n");
    for (const auto& [key, value] : f.metadata()) fmt::print("  {} = {}\n", key, value);
  }
  if (!quantized.empty()) {
    fmt::print("concord-quantized tensors:\n");
    for (const auto& e : quantized) {
      fmt::print("  {}: {}; from {} {}\n", e.name, describe(e.desc), io::dtype_name(e.original_dtype),
                 io::shape_text(e.shape));
    }
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto opts = std::make_shared<InspectOptions>();
  auto* inspect = app.add_subcommand(
      "inspect",
      "List the tensors, metadata and quantization formats of a safetensors or GGUF file");
  inspect->footer(
      "\nA file named *.gguf or starting with the \"GGUF\" magic is read as GGUF (docs/gguf.md), any "
      "other as\nsafetensors (docs/safetensors.md). The file is validated strictly first; a corrupt file "
      "prints one line naming\nthe file and the problem, and exits 2. With --dump NAME, prints "
      "the values of tensor NAME one per\nline (floats: shortest decimal that reads back exactly; "
      "integers in decimal; BOOL 0/1; F8, F6, F4\nand C64 as hex bytes; GGUF F16, BF16, the legacy quants "
      "Q4_0..Q8_0,\nthe k-quants Q2_K..Q8_K and MXFP4 dequantized to fp32 as ggml does).");
  inspect->add_option("file", opts->path, "A .safetensors or .gguf file")->required();
  inspect->add_option("--dump", opts->dump, "Print the values of this tensor, one per line");
  inspect->callback([opts] { run_inspect(*opts); });
}

}  // namespace concord::cli
