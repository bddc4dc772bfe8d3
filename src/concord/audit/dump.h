// Logit dumps: the logits a serving program produced, one row per position, with the row's
// sequence, position, tokens and labels — so that any two programs (concord's kernels, another
// engine) can be compared position by position. Written by `concord contract dump`, read by
// `concord contract measure/check --ref/--cand FILE`.
//
// Two containers (chosen by the file's extension):
//   .safetensors  tensor "logits" (P, V) F32 | F64 | BF16 | F16, required; optional per-row
//                 integer tensors (P) I32 | I64: "sequence", "position", "prompt_length",
//                 "token", "next", "task", "label" — "task"/"label" are indices into the JSON
//                 string arrays in the metadata keys "concord.tasks" / "concord.labels"
//                 (-1: none). The header's metadata also carries "concord.format" = "logit-dump/1".
//   .npy          the logits (P, V), '<f4' or '<f8', C order (NumPy format 1.0/2.0/3.0), with an
//                 optional sidecar "<file>.rows.json": {"sequence": [...], "position": [...],
//                 "prompt_length": [...], "token": [...], "next": [...], "task": [...strings],
//                 "label": [...strings]} — each key optional, each array P long.
// Missing row fields default to: sequence = row index, position = 0, prompt_length = 0,
// token = next = -1, task = label = "".
// Every read is validated (shapes, dtypes, offsets, lengths, finite logits are NOT required by
// the reader — row_divergence rejects non-finite rows); errors are InputError naming the file.
// Writes are atomic (temp file + rename).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "concord/audit/rows.h"

namespace concord::audit {

class LogitDump {
 public:
  // Opens path (.npy or .safetensors); the logits stay memory-mapped.
  static LogitDump open(const std::string& path);
  // The same from an in-memory image (tests, fuzzing): `label`'s extension picks the container
  // and stands for the path in errors; `sidecar` is the .npy's rows.json text, if any.
  static LogitDump from_bytes(std::vector<uint8_t> image, const std::string& label,
                              std::optional<std::string> sidecar = std::nullopt);
  LogitDump(LogitDump&&) noexcept;
  LogitDump& operator=(LogitDump&&) noexcept;
  ~LogitDump();

  const std::string& path() const;
  int64_t rows() const;
  int64_t vocab() const;
  std::string_view dtype() const;  // "F32", "F64", "BF16", "F16"
  bool is_f64() const;
  const RowInfo& info(int64_t row) const;
  // Row `row`'s logits, converted (exactly; F64 → float rounds to nearest).
  void row(int64_t row, std::span<double> out) const;
  void row(int64_t row, std::span<float> out) const;

  struct Impl;

 private:
  explicit LogitDump(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Collects rows in memory and writes them as a dump (float32 logits).
class LogitDumpWriter {
 public:
  explicit LogitDumpWriter(int64_t vocab);
  void add(const RowInfo& info, std::span<const float> logits);  // InputError on a wrong length
  int64_t rows() const { return static_cast<int64_t>(infos_.size()); }
  // .safetensors, or .npy (+ "<path>.rows.json"); InputError for another extension.
  void write(const std::string& path) const;

 private:
  int64_t vocab_;
  std::vector<float> logits_;
  std::vector<RowInfo> infos_;
};

}  // namespace concord::audit
