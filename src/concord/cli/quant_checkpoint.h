// Quantize a whole safetensors checkpoint (the work behind `concord quant`, also used by
// `concord demo`): each floating tensor not matching the skip regex becomes codes + scales +
// metadata (layout in io/quantized_safetensors.h), and the error of each is measured.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "concord/numerics/error_stats.h"
#include "concord/numerics/quant_desc.h"

namespace concord::cli {

struct QuantCheckpointOptions {
  numerics::QuantDesc desc;
  std::string format_name;  // shown in the table's format column; desc.to_string() if empty
  std::string skip;         // ECMAScript regex, search semantics; empty = skip nothing
  uint64_t seed = 0;        // stochastic rounding: Philox(seed, stream = tensor index by name)
};

struct QuantCheckpointSummary {
  numerics::ErrorStats total;  // over every quantized element
  int quantized_tensors = 0;
  int kept_tensors = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
};

// Reads `in`, writes `out` atomically, and (when print_table) prints the per-tensor table:
// name, shape, dtype, format, SQNR dB, max abs error, relative error, totals, bytes in/out.
// Throws InputError naming the file or tensor on bad input.
QuantCheckpointSummary quant_checkpoint(const std::filesystem::path& in,
                                        const std::filesystem::path& out,
                                        const QuantCheckpointOptions& options, bool print_table);

}  // namespace concord::cli
