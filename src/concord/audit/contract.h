// Kernel contracts: per slice of traffic, how far a candidate serving kernel's logits may
// deviate from a reference's (the oscillation osc of their difference, bounds.h), and the
// guarantees that bound implies. Measuring turns compared rows into per-slice statistics;
// fitting turns statistics into a contract; checking compares a new measurement against one.
//
// Slices (a row belongs to one slice of each dimension, and to "all"):
//   all
//   prompt_len:[lo,hi)   the sequence's prompt length, cut at SliceOptions::prompt_length_edges
//   position:[lo,hi)     the row's position, cut at position_edges
//   margin:undecided     the reference's top-1 margin ≤ decided_margin (nats)
//   margin:decided       margin > decided_margin
//   task:NAME            rows of task NAME (rows without a task: no task slice)
//   label:NAME           rows with a user label
//   depth:R              rows of a depth-recurrent model run at R core iterations (the drift of
//                        the iterates under a precision as depth grows; docs/recurrence.md)
// e.g. "position:[64,inf)". Names are stable: a contract fitted on one run checks another.
//
// Contract JSON (docs/contracts.md):
//   {"format": "concord-contract/1", "metric": "osc", "ref": "...", "cand": "...",
//    "slices": [{"slice": "position:[64,inf)", "rows": 812, "quantile": 0.99,
//                "osc_quantile": 0.031, "osc_max": 0.052,
//                "guarantees": {"logp_abs_max": ..., "tv_max": ..., "kl_max": ...,
//                               "ratio_min": ..., "ratio_max": ..., "greedy_stable_margin": ...}}]}
// A slice passes when its measured osc quantile ≤ osc_quantile and its max osc ≤ osc_max. The
// guarantees follow from osc_max (bounds.h) and hold for every row of a passing slice.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "concord/audit/bounds.h"
#include "concord/audit/rows.h"

namespace concord::audit {

struct RowRecord {
  RowInfo info;
  RowDivergence div;
};

struct SliceOptions {
  std::vector<int32_t> prompt_length_edges{16, 64};
  std::vector<int32_t> position_edges{16, 64};
  double decided_margin = 1.0;  // nats
  // Margin bins (upper edges; the last bin is open) for flip rate vs margin.
  std::vector<double> margin_bins{1e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3};
};

// Flip statistics of one margin bin: rows with margin_ref in [lo, hi).
struct MarginBin {
  double lo = 0, hi = 0;
  int64_t rows = 0, flips = 0, predicted = 0;  // predicted: flip_possible rows
};

struct SliceStats {
  std::string slice;
  int64_t rows = 0;
  double osc_p50 = 0, osc_p90 = 0, osc_p99 = 0, osc_max = 0;
  double linf_max = 0, max_abs_dlogp = 0;
  double tv_mean = 0, tv_max = 0, kl_mean = 0, kl_max = 0;
  int64_t flips = 0;            // greedy token changed
  int64_t predicted_flips = 0;  // rows the predictor flagged (margin ≤ osc)
  int64_t missed_flips = 0;     // flips the predictor did not flag: must be 0
  int64_t bound_violations = 0; // rows where a bounds.h guarantee failed: must be 0
                                // (|Δlog p| and KL within a relative slack of 1e-9, all
                                // within 1e-12 absolute; a missed flip counts; contract.cpp)
  std::vector<MarginBin> by_margin;
  std::vector<double> osc_sorted;  // every row's osc, ascending (for quantiles and plots)
  double osc_quantile(double q) const;  // nearest-rank quantile of osc_sorted
};

struct Measurement {
  std::string ref, cand;  // what was compared (kernel names or dump paths)
  int64_t vocab = 0;
  SliceOptions options;
  std::vector<SliceStats> slices;  // "all" first, then by dimension in the order above
  const SliceStats* find(std::string_view slice) const;
  // Everything but osc_sorted:
  //   {"format": "concord-measurement/1", "ref", "cand", "vocab", "rows",
  //    "options": {"prompt_length_edges", "position_edges", "decided_margin", "margin_bins"},
  //    "slices": [{"slice", "rows", "osc": {"p50", "p90", "p99", "max"}, "linf_max",
  //                "max_abs_dlogp", "tv": {"mean", "max"}, "kl": {"mean", "max"}, "flips",
  //                "flip_rate", "predicted_flips", "missed_flips", "bound_violations",
  //                "by_margin": [{"lo", "hi", "rows", "flips", "predicted"}]}]}
  // ("hi" of the open last margin bin is null: JSON has no infinity.)
  nlohmann::json to_json() const;
};

// Slice names of a row under options, "all" first.
std::vector<std::string> slices_of(const RowInfo& info, const RowDivergence& div,
                                   const SliceOptions& options);
Measurement measure(std::span<const RowRecord> rows, const SliceOptions& options,
                    std::string ref, std::string cand, int64_t vocab);

struct SliceContract {
  std::string slice;
  int64_t rows = 0;          // rows the contract was fitted on (informational)
  double quantile = 0.99;
  double osc_quantile = 0;   // allowed osc at `quantile`
  double osc_max = 0;        // allowed maximum osc
};

struct Contract {
  std::string ref, cand;
  std::vector<SliceContract> slices;
  nlohmann::json to_json() const;  // with the derived guarantees per slice
  static Contract from_json(const nlohmann::json& j, const std::string& source);
  static Contract load(const std::string& path);  // InputError naming the file
  void save(const std::string& path) const;        // atomic
};

// Per slice: osc_quantile = headroom · measured quantile, osc_max = headroom · measured max
// (a floor of min_osc keeps bitwise-equal kernels from getting a zero budget).
Contract fit_contract(const Measurement& m, double headroom = 2.0, double quantile = 0.99,
                      double min_osc = 1e-6);

struct Violation {
  std::string slice;
  std::string what;  // "osc p99" or "osc max"
  double measured = 0, allowed = 0;
  int64_t rows_over = 0;  // rows of the slice whose osc exceeds osc_max
};

struct CheckResult {
  bool pass = true;
  std::vector<Violation> violations;
  std::vector<std::string> not_exercised;  // contract slices with no rows in the measurement
  // {"format": "concord-check/1", "pass", "violations": [{"slice", "what", "measured",
  //  "allowed", "rows_over"}], "not_exercised": [...]}
  nlohmann::json to_json() const;
};
CheckResult check_contract(const Contract& contract, const Measurement& m);

}  // namespace concord::audit
