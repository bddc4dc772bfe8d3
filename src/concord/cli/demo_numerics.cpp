// `concord demo --numerics`: the numerics showcase — generate a transformer-shaped checkpoint,
// quantize it to every format and scale rule, print the error table, show why unbiased export
// matters, and write the checkpoint and one quantized copy.
#include "concord/cli/demo_numerics.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "concord/cli/commands.h"
#include "concord/cli/quant_checkpoint.h"
#include "concord/io/safetensors.h"
#include "concord/model/model.h"
#include "concord/numerics/block.h"
#include "concord/numerics/convert.h"
#include "concord/numerics/error_feedback.h"
#include "concord/numerics/error_stats.h"
#include "concord/numerics/scalar.h"

namespace concord::cli {
namespace {

using numerics::Format;
using numerics::QuantDesc;


struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
  model::ParamClass cls;
  int64_t rows() const { return shape.size() == 1 ? 1 : shape[0]; }
  int64_t cols() const { return shape.back(); }
};

// Weights shaped like a small Qwen3 model (its registered parameters, in order): N(0, 0.02) with
// a few outlier input channels per matrix (x8), the feature that makes per-tensor scaling lose
// to block scaling; RMSNorm weights near 1.
std::vector<Tensor> make_checkpoint(uint64_t seed, bool quick) {
  model::ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";  // q/k norms, no biases
  c.vocab_size = quick ? 1024 : 4096;
  c.hidden_size = quick ? 128 : 256;
  c.intermediate_size = 3 * c.hidden_size;
  c.num_hidden_layers = quick ? 2 : 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.tie_word_embeddings = true;
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<Tensor> out;
  for (const model::ParamSpec& spec : model::parameter_specs(c)) {
    Tensor t{spec.name, spec.shape, std::vector<float>(static_cast<size_t>(spec.numel())), spec.cls()};
    if (spec.is_matrix()) {
      const int64_t rows = spec.shape[0], cols = spec.shape[1];
      std::vector<float> channel_gain(static_cast<size_t>(cols), 1.0f);
      for (int k = 0; k < 4; ++k) channel_gain[gen() % static_cast<uint64_t>(cols)] = 8.0f;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t col = 0; col < cols; ++col)
          t.values[static_cast<size_t>(r * cols + col)] = normal(gen) * channel_gain[static_cast<size_t>(col)];
    } else {
      for (float& v : t.values) v = 1.0f + normal(gen);
    }
    out.push_back(std::move(t));
  }
  return out;
}

// Storage bits per weight: element bits plus the block scale's share plus the tensor scale.
double bits_per_weight(const QuantDesc& d, int64_t numel) {
  const double element = numerics::traits(d.element).bits;
  if (!d.has_scale) return element;
  if (d.is_per_tensor()) return element + 32.0 / static_cast<double>(numel);
  const double per_block = 8.0 / (d.block.rows * d.block.cols);
  return element + per_block + (d.is_nvfp4() ? 32.0 / static_cast<double>(numel) : 0.0);
}

struct Row {
  std::string name;
  numerics::ErrorStats stats;
  double bits = 0;
  int64_t elements = 0;
};

// Every tensor but the norms (kept in fp32).
Row measure(const std::string& label, const QuantDesc& desc, const std::vector<Tensor>& tensors) {
  Row row{label, {}, 0, 0};
  double weighted_bits = 0;
  std::vector<float> y;
  for (const Tensor& t : tensors) {
    if (t.cls == model::ParamClass::norm) continue;
    y.resize(t.values.size());
    const auto q = numerics::quantize(desc, t.values.data(), t.rows(), t.cols(),
                                      numerics::RandomStream{7, 0});
    numerics::dequantize(q, y.data());
    row.stats.add(t.values.data(), y.data(), static_cast<int64_t>(t.values.size()));
    weighted_bits += bits_per_weight(desc, q.numel()) * static_cast<double>(q.numel());
    row.elements += q.numel();
  }
  row.bits = weighted_bits / static_cast<double>(row.elements);
  return row;
}

void print_rows(const std::vector<Row>& rows) {
  std::printf("  %-24s %9s %9s %12s %11s %12s\n", "format", "bits/w", "SQNR dB", "max|err|",
              "rel err", "mean err");
  for (const Row& r : rows) {
    std::printf("  %-24s %9.3f %9.2f %12.3e %11.3e %12.3e\n", r.name.c_str(), r.bits,
                r.stats.sqnr_db(), r.stats.max_abs_error, r.stats.relative_error(),
                r.stats.mean_error());
  }
}

// Fair Cast in miniature: bf16-initialized fp32 master weights drift by 1/50 of a bf16 ulp per
// step. Exported with round-to-nearest the served copy does not move for the first 25 steps;
// stochastic rounding delivers it in expectation from the first step, error feedback in total
// within a few steps.
void show_export_rules(uint64_t seed) {
  const int steps = 100;
  const int64_t n = 4096;
  const auto count = static_cast<size_t>(n);
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> start(0.5f, 1.0f);
  std::vector<float> master(count), ulp(count);
  for (size_t i = 0; i < count; ++i) {
    master[i] = numerics::decode_ref(Format::bf16, numerics::encode_ref(Format::bf16, start(gen)));
    ulp[i] = std::ldexp(1.0f, static_cast<int>(std::floor(std::log2(master[i]))) - 7);
  }
  const std::vector<float> initial = master;
  std::vector<float> rne(count), sr(count), ef_served(count);
  std::vector<uint16_t> codes(count);
  numerics::ErrorFeedbackQuantizer ef(QuantDesc::elementwise(Format::bf16), 1, n);
  std::printf("\nExport of fp32 master weights to bf16, each master drifting 1/50 ulp per step (%lld weights);\n"
              "drift the served copy delivered / drift of the master, summed over weights and steps 1..K:\n",
              static_cast<long long>(n));
  double master_drift = 0, rne_drift = 0, sr_drift = 0, ef_drift = 0;
  std::printf("  %6s %10s %10s %10s\n", "K", "rne", "sr", "ef");
  for (int s = 1; s <= steps; ++s) {
    for (size_t i = 0; i < count; ++i) master[i] += ulp[i] / 50.0f;
    numerics::encode_array(Format::bf16, numerics::Rounding::rne, numerics::Overflow::saturate,
                           master.data(), codes.data(), count);
    numerics::decode_array(Format::bf16, codes.data(), rne.data(), count);
    numerics::encode_array(Format::bf16, numerics::Rounding::stochastic,
                           numerics::Overflow::saturate, master.data(), codes.data(), count,
                           numerics::RandomStream{seed, static_cast<uint32_t>(s)});
    numerics::decode_array(Format::bf16, codes.data(), sr.data(), count);
    ef.step(master, ef_served);
    for (size_t i = 0; i < count; ++i) {
      master_drift += master[i] - initial[i];
      rne_drift += rne[i] - initial[i];
      sr_drift += sr[i] - initial[i];
      ef_drift += ef_served[i] - initial[i];
    }
    if (s == 5 || s == 10 || s == 20 || s == 30 || s == 50 || s == 100) {
      std::printf("  %6d %10.3f %10.3f %10.3f\n", s, rne_drift / master_drift,
                  sr_drift / master_drift, ef_drift / master_drift);
    }
  }
}

}  // namespace

void run_numerics_showcase(const NumericsShowcaseOptions& o) {
  const auto tensors = make_checkpoint(o.seed, o.quick);
  int64_t params = 0;
  for (const Tensor& t : tensors) params += static_cast<int64_t>(t.values.size());
  std::filesystem::create_directories(o.out);
  const std::filesystem::path model = std::filesystem::path(o.out) / "model.safetensors";
  {
    std::vector<io::TensorToWrite> to_write;
    for (const Tensor& t : tensors) {
      to_write.push_back({t.name, io::Dtype::F32, t.shape,
                          {reinterpret_cast<const uint8_t*>(t.values.data()), t.values.size() * 4}});
    }
    io::write_safetensors(model, std::move(to_write), {{"generator", "concord demo"}});
  }
  std::printf("concord demo: numerics showcase (SIMD path: %s)\n", std::string(numerics::active_isa_name()).c_str());
  std::printf("Generated %s: %zu tensors, %.2fM parameters (N(0,0.02) with x8 outlier channels)\n\n",
              model.string().c_str(), tensors.size(), static_cast<double>(params) / 1e6);

  std::printf("Quantization error over every matrix (norms kept in fp32), scale rule floor, RNE:\n");
  std::vector<Row> rows;
  for (const char* name : {"bf16", "fp16", "fp8-tensor", "mxfp8-e4m3", "mxfp8-e5m2", "mxfp6-e2m3",
                           "mxfp6-e3m2", "mxfp4", "nvfp4", "nvfp4-2d"}) {
    rows.push_back(measure(name, *QuantDesc::from_name(name), tensors));
  }
  print_rows(rows);

  std::printf("\nMX scale rules (same tensors):\n");
  rows.clear();
  for (const char* name : {"mxfp8-e4m3", "mxfp4"}) {
    for (auto rule : {numerics::ScaleRule::floor, numerics::ScaleRule::ceil,
                      numerics::ScaleRule::even, numerics::ScaleRule::rceil}) {
      QuantDesc d = *QuantDesc::from_name(name);
      d.scale_rule = rule;
      rows.push_back(measure(fmt::format("{} {}", name, numerics::scale_rule_name(rule)), d, tensors));
    }
  }
  print_rows(rows);

  show_export_rules(o.seed);

  const std::filesystem::path quantized = std::filesystem::path(o.out) / "model.mxfp8.safetensors";
  std::printf("\nconcord quant %s %s --format mxfp8-e4m3 --skip norm\n", model.string().c_str(),
              quantized.string().c_str());
  QuantCheckpointOptions qo;
  qo.desc = *QuantDesc::from_name("mxfp8-e4m3");
  qo.skip = "norm";
  quant_checkpoint(model, quantized, qo, /*print_table=*/false);
  std::printf("wrote %s (inspect it with: concord inspect %s)\n", quantized.string().c_str(),
              quantized.string().c_str());
}

}  // namespace concord::cli
