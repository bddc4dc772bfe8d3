// concord quant / concord dequant: quantize the floating tensors of a safetensors checkpoint
// (codes + scales + metadata, layout in io/quantized_safetensors.h and docs/safetensors.md),
// print the error of each tensor, and turn such a file back into F32 tensors.
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "concord/cli/commands.h"
#include "concord/cli/flags.h"
#include "concord/cli/quant_checkpoint.h"
#include "concord/io/gguf.h"
#include "concord/io/quantized_safetensors.h"
#include "concord/io/safetensors.h"
#include "concord/numerics/block.h"
#include "concord/numerics/check.h"

namespace concord::cli {
namespace {

using io::Dtype;
using numerics::QuantDesc;

struct QuantOptions {
  std::string input;
  std::string output;
  std::string format;
  std::string skip;
  std::string scale_rule;
  std::string round = "rne";
  uint64_t seed = 0;
};

QuantDesc desc_of(const QuantOptions& o) {
  auto desc = QuantDesc::from_name(o.format);
  if (!desc) {
    throw InputError("[quant] unknown --format '" + o.format + "' (use one of: " +
                     std::string(numerics::block_format_names()) +
                     ", or an element format: bf16, fp16, e4m3, e5m2, e2m3, e3m2, e2m1, int8, int4)");
  }
  if (!o.scale_rule.empty()) {
    if (!desc->is_mx()) {
      throw InputError("[quant] --scale-rule applies to MX formats only (mxfp8-*, mxfp6-*, "
                       "mxfp4); '" + o.format + "' has no power-of-two block scale");
    }
    auto rule = numerics::scale_rule_from_name(o.scale_rule);
    if (!rule) {
      throw InputError("[quant] unknown --scale-rule '" + o.scale_rule +
                       "' (use floor, ceil, even or rceil)");
    }
    desc->scale_rule = *rule;
  }
  auto rounding = numerics::rounding_from_name(o.round);
  if (!rounding) throw InputError("[quant] unknown --round '" + o.round + "' (use rne, rtz or sr)");
  desc->rounding = *rounding;
  return *desc;
}

// quant and dequant read safetensors; a GGUF file (by name or magic) is named as one rather
// than reported as a damaged safetensors file.
void require_safetensors(const std::string& command, const std::string& path) {
  if (io::is_gguf_path(path))
    throw InputError(fmt::format("[{}] {}: a GGUF file; {} reads safetensors files (concord inspect "
                                 "reads both)", command, path, command));
}

void run_quant(const QuantOptions& o) {
  require_safetensors("quant", o.input);
  QuantCheckpointOptions options;
  options.desc = desc_of(o);
  options.format_name = o.format;
  options.skip = o.skip;
  options.seed = o.seed;
  quant_checkpoint(o.input, o.output, options, /*print_table=*/true);
}

void run_dequant(const QuantOptions& o) {
  require_safetensors("dequant", o.input);
  const io::SafetensorsFile in = io::SafetensorsFile::open(o.input);
  const std::vector<io::QuantizedEntry> entries = io::quantized_entries(in);
  std::set<std::string> replaced;
  for (const auto& e : entries) {
    replaced.insert(e.name);
    replaced.insert(io::quant_scales_name(e.name));
    replaced.insert(io::quant_tensor_scale_name(e.name));
  }
  std::vector<std::vector<float>> values;  // outlive the write
  values.reserve(entries.size());
  std::vector<io::TensorToWrite> out;
  for (const auto& e : entries) {
    const numerics::QuantizedTensor q = io::load_quantized(in, e);
    values.emplace_back(static_cast<size_t>(q.numel()));
    numerics::dequantize(q, values.back().data());
    const auto* bytes = reinterpret_cast<const uint8_t*>(values.back().data());
    out.push_back({e.name, Dtype::F32, e.shape, {bytes, values.back().size() * sizeof(float)}});
  }
  for (const io::TensorInfo& t : in.tensors()) {
    if (!replaced.contains(t.name)) out.push_back({t.name, t.dtype, t.shape, t.bytes});
  }
  std::map<std::string, std::string> metadata;
  for (const auto& [key, value] : in.metadata()) {
    if (key.rfind(io::kQuantMetadataPrefix, 0) != 0) metadata.emplace(key, value);
  }
  const size_t copied = out.size() - entries.size();
  io::write_safetensors(o.output, std::move(out), metadata);
  fmt::print("dequantized {} tensors to F32, copied {} unchanged -> {}\n", entries.size(), copied,
             o.output);
}

constexpr const char* kQuantHelp = R"(
Quantizes every F32/F16/BF16 tensor of IN (tensors matching --skip, non-floating and empty
tensors are copied unchanged). A tensor of shape [..., cols] is quantized as a
(product of leading dims) x cols matrix; blocks run along the last dim (nvfp4-2d: 16x16 tiles).
OUT holds, per quantized tensor W: "W" (the codes), "W.scales" (block scales),
"W.tensor_scale" (F32 [1], nvfp4 and fp8-tensor), and __metadata__["concord.quant.W"] =
{"format": <descriptor>, "dtype": <original dtype>, "shape": <original shape>}.
Code dtypes: F8_E4M3 / F8_E5M2 / BF16 / F16 / I8 where the format is native, else U8
(6-bit: one code per byte; 4-bit: two per byte, low nibble first, last dim halved, so it
must be even). Scale dtypes: F8_E8M0 (MX), F8_E4M3 (nvfp4). See docs/safetensors.md.
Prints per tensor: SQNR = 10 log10(sum x^2 / sum (x - deq)^2) in dB (inf when exact),
max |x - deq|, ||x - deq|| / ||x||, and totals over all quantized elements.
Stochastic rounding (--round sr) uses Philox stream i for the i-th tensor in name order.)";

}  // namespace

void add_quant_command(CLI::App& app) {
  auto opts = std::make_shared<QuantOptions>();
  auto* quant = app.add_subcommand("quant", "Quantize a safetensors checkpoint and report its error");
  quant->footer(kQuantHelp);
  quant->add_option("input", opts->input, "Input .safetensors")->required();
  quant->add_option("output", opts->output, "Output .safetensors (written atomically)")->required();
  quant->add_option("--format,-f", opts->format,
                    "mxfp8-e4m3, mxfp8-e5m2, mxfp6-e2m3, mxfp6-e3m2, mxfp4, nvfp4, nvfp4-2d, "
                    "fp8-tensor, or an element format (bf16, e4m3, ...)")
      ->required();
  quant->add_option("--skip", opts->skip,
                    "Keep tensors whose name matches this regex (ECMAScript, search), "
                    "e.g. 'norm|router|lm_head'");
  quant->add_option("--scale-rule", opts->scale_rule, "MX scale rule: floor (default), ceil, even, rceil");
  quant->add_option("--round", opts->round, "Rounding: rne (default), rtz, sr");
  add_seed_flag(quant, "--seed", opts->seed, "Seed for --round sr (default 0)");
  quant->callback([opts] { run_quant(*opts); });

  auto* dequant = app.add_subcommand(
      "dequant", "Turn the concord-quantized tensors of a safetensors file back into F32");
  dequant->footer("\nEvery tensor W with __metadata__[\"concord.quant.W\"] is dequantized to F32 "
                  "with its original shape;\nits companions W.scales and W.tensor_scale are "
                  "dropped; other tensors are copied unchanged.");
  dequant->add_option("input", opts->input, "Quantized .safetensors (from concord quant)")->required();
  dequant->add_option("output", opts->output, "Output .safetensors (written atomically)")->required();
  dequant->callback([opts] { run_dequant(*opts); });
}

}  // namespace concord::cli
