// quant_checkpoint: quantize every floating tensor of a safetensors file and measure its error
// (see quant_checkpoint.h).
#include "concord/cli/quant_checkpoint.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
// GCC 12 reports a false -Wmaybe-uninitialized inside <regex> at -O2 with sanitizers.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <regex>
#pragma GCC diagnostic pop
#include <string>
#include <vector>

#include <fmt/format.h>

#include "concord/io/quantized_safetensors.h"
#include "concord/io/safetensors.h"
#include "concord/numerics/block.h"
#include "concord/numerics/check.h"

namespace concord::cli {
namespace {

using io::Dtype;
using numerics::QuantDesc;

bool is_quantizable_dtype(Dtype d) { return d == Dtype::F32 || d == Dtype::F16 || d == Dtype::BF16; }

uint64_t file_size_of(const std::filesystem::path& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

std::string fit(const std::string& s, size_t width) {
  return s.size() <= width ? s : s.substr(0, width - 3) + "...";
}

std::string sqnr_text(double db) {
  if (std::isinf(db)) return db > 0 ? "inf" : "-inf";
  return fmt::format("{:.2f}", db);
}

// One row of the report.
struct Row {
  std::string name;
  std::string shape;
  std::string dtype;
  std::string format;  // the --format name, or why the tensor was kept
  std::optional<numerics::ErrorStats> stats;
};

void print_table(const std::vector<Row>& rows, const numerics::ErrorStats& total, int quantized,
                 uint64_t bytes_in, uint64_t bytes_out) {
  size_t name_width = 6;
  size_t shape_width = 5;
  for (const Row& r : rows) {
    name_width = std::max(name_width, std::min<size_t>(r.name.size(), 48));
    shape_width = std::max(shape_width, std::min<size_t>(r.shape.size(), 24));
  }
  auto line = [&](const std::string& name, const std::string& shape, const std::string& dtype,
                  const std::string& format, const std::string& sqnr, const std::string& maxabs,
                  const std::string& rel) {
    fmt::print("{:<{}}  {:<{}}  {:<5}  {:<12}  {:>9}  {:>11}  {:>10}\n", fit(name, 48), name_width,
               fit(shape, 24), shape_width, dtype, format, sqnr, maxabs, rel);
  };
  line("tensor", "shape", "dtype", "format", "SQNR dB", "max abs err", "rel err");
  for (const Row& r : rows) {
    if (r.stats) {
      line(r.name, r.shape, r.dtype, r.format, sqnr_text(r.stats->sqnr_db()),
           fmt::format("{:.3e}", r.stats->max_abs_error),
           fmt::format("{:.3e}", r.stats->relative_error()));
    } else {
      line(r.name, r.shape, r.dtype, r.format, "-", "-", "-");
    }
  }
  line(fmt::format("total ({} quantized)", quantized), fmt::format("{} el", total.count), "", "",
       sqnr_text(total.sqnr_db()), fmt::format("{:.3e}", total.max_abs_error),
       fmt::format("{:.3e}", total.relative_error()));
  if (total.nonfinite > 0) {
    fmt::print("note: {} NaN/Inf elements (input or output) are left out of the error sums\n",
               total.nonfinite);
  }
  fmt::print("bytes: in {}, out {} ({:.3f}x)\n", bytes_in, bytes_out,
             bytes_in == 0 ? 0.0 : static_cast<double>(bytes_out) / static_cast<double>(bytes_in));
}

std::regex skip_regex_of(const std::string& pattern) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw InputError("[quant] --skip '" + pattern + "' is not a valid regular expression (" +
                     e.what() + ")");
  }
}

}  // namespace

QuantCheckpointSummary quant_checkpoint(const std::filesystem::path& input,
                                        const std::filesystem::path& output,
                                        const QuantCheckpointOptions& o, bool print) {
  const QuantDesc& desc = o.desc;
  const std::string format_name = o.format_name.empty() ? desc.to_string() : o.format_name;
  const std::optional<std::regex> skip =
      o.skip.empty() ? std::nullopt : std::optional(skip_regex_of(o.skip));
  const io::SafetensorsFile in = io::SafetensorsFile::open(input);
  if (!io::quantized_entries(in).empty()) {
    throw InputError("[quant] " + in.path() + " already holds concord-quantized tensors (run "
                     "'concord dequant' first)");
  }

  std::vector<const io::TensorInfo*> order;
  for (const io::TensorInfo& t : in.tensors()) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const io::TensorInfo* a, const io::TensorInfo* b) { return a->name < b->name; });

  std::vector<std::unique_ptr<numerics::QuantizedTensor>> quantized;  // outlive the write
  std::vector<io::TensorToWrite> out;
  std::map<std::string, std::string> metadata = in.metadata();
  std::vector<Row> rows;
  numerics::ErrorStats total;
  uint32_t stream = 0;
  for (const io::TensorInfo* t : order) {
    Row row{t->name, io::shape_text(t->shape), std::string(io::dtype_name(t->dtype)), "", {}};
    const uint32_t tensor_stream = stream++;  // SR stream: the tensor's index in name order
    std::string kept;
    if (!is_quantizable_dtype(t->dtype)) {
      kept = "kept";
    } else if (skip && std::regex_search(t->name, *skip)) {
      kept = "kept (skip)";
    } else if (t->numel() == 0) {
      kept = "kept (empty)";
    }
    if (!kept.empty()) {
      row.format = kept;
      out.push_back({t->name, t->dtype, t->shape, t->bytes});
      rows.push_back(std::move(row));
      continue;
    }
    for (const std::string& companion :
         {io::quant_scales_name(t->name), io::quant_tensor_scale_name(t->name)}) {
      if (in.find(companion) != nullptr) {
        throw InputError("[quant] " + in.path() + ": tensor '" + companion + "' would clash with the "
                         "scales of '" + t->name + "' (use --skip to keep '" + t->name + "')");
      }
    }
    const std::vector<float> x = io::tensor_to_floats(*t);
    const io::MatrixView view = io::matrix_view(t->shape);
    // Checks the 4-bit even-cols rule before doing any work.
    io::quant_codes_shape(desc.element, t->shape, t->name);
    auto q = std::make_unique<numerics::QuantizedTensor>(numerics::quantize(
        desc, x.data(), view.rows, view.cols, numerics::RandomStream{o.seed, tensor_stream}));
    std::vector<float> y(x.size());
    numerics::dequantize(*q, y.data());
    numerics::ErrorStats stats;
    stats.add(x.data(), y.data(), static_cast<int64_t>(x.size()));
    total.merge(stats);
    metadata.insert(io::append_quantized_tensors(t->name, *q, t->dtype, t->shape, out));
    quantized.push_back(std::move(q));
    row.format = format_name;
    row.stats = stats;
    rows.push_back(std::move(row));
  }
  io::write_safetensors(output, std::move(out), metadata);
  QuantCheckpointSummary summary;
  summary.total = total;
  summary.quantized_tensors = static_cast<int>(quantized.size());
  summary.kept_tensors = static_cast<int>(rows.size() - quantized.size());
  summary.bytes_in = in.file_size();
  summary.bytes_out = file_size_of(output);
  if (print) print_table(rows, total, summary.quantized_tensors, summary.bytes_in, summary.bytes_out);
  return summary;
}

}  // namespace concord::cli
