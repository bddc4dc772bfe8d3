// concord.contract: divergence bounds, measurement and contract checks on logits from any engine
// (audit/bounds.h, contract.h, measure.h, dump.h) — the functions `concord contract` runs.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bindings.h"
#include "concord/audit/bounds.h"
#include "concord/audit/contract.h"
#include "concord/audit/dump.h"
#include "concord/audit/measure.h"
#include "concord/numerics/check.h"

namespace concord::python {
namespace {

using json = nlohmann::json;
using namespace nb::literals;

// JSON between C++ and Python goes through its text (the same text `concord contract` writes).
nb::object to_python(const json& j) { return nb::module_::import_("json").attr("loads")(j.dump()); }
json from_python(nb::handle obj) {
  const auto text = nb::cast<std::string>(nb::module_::import_("json").attr("dumps")(obj));
  return json::parse(text);
}

// SliceOptions from `slices=`: None (the defaults) or a dict of its fields.
audit::SliceOptions slice_options(nb::handle slices) {
  audit::SliceOptions o;
  if (slices.is_none()) return o;
  if (!nb::isinstance<nb::dict>(slices))
    throw nb::type_error("[contract] slices: expected a dict with keys prompt_length_edges, "
                         "position_edges, decided_margin, margin_bins");
  for (auto [key, value] : nb::borrow<nb::dict>(slices)) {
    const auto name = nb::cast<std::string>(key);
    if (name == "prompt_length_edges") o.prompt_length_edges = nb::cast<std::vector<int32_t>>(value);
    else if (name == "position_edges") o.position_edges = nb::cast<std::vector<int32_t>>(value);
    else if (name == "decided_margin") o.decided_margin = nb::cast<double>(value);
    else if (name == "margin_bins") o.margin_bins = nb::cast<std::vector<double>>(value);
    else
      throw nb::value_error(fmt::format("[contract] slices: unknown key '{}' (keys: prompt_length_edges, "
                                        "position_edges, decided_margin, margin_bins)", name).c_str());
  }
  return o;
}

// Per-row identities of `rows` rows: each field optional (the dump defaults, dump.h).
struct RowFields {
  std::optional<std::vector<int64_t>> sequence, position, prompt_length, token, next;
  std::optional<std::vector<std::string>> task, label;
};

std::vector<audit::RowInfo> row_infos(const RowFields& f, int64_t rows, const char* op) {
  auto check = [&](const char* name, size_t n) {
    if (static_cast<int64_t>(n) != rows)
      throw nb::value_error(fmt::format("[{}] argument '{}': {} entries for {} rows", op, name, n, rows).c_str());
  };
  auto as_int32 = [&](const char* name, int64_t v) {
    if (v < INT32_MIN || v > INT32_MAX)
      throw nb::value_error(fmt::format("[{}] argument '{}': {} does not fit int32", op, name, v).c_str());
    return static_cast<int32_t>(v);
  };
  if (f.sequence) check("sequence", f.sequence->size());
  if (f.position) check("position", f.position->size());
  if (f.prompt_length) check("prompt_length", f.prompt_length->size());
  if (f.token) check("token", f.token->size());
  if (f.next) check("next", f.next->size());
  if (f.task) check("task", f.task->size());
  if (f.label) check("label", f.label->size());
  std::vector<audit::RowInfo> infos(static_cast<size_t>(rows));
  for (size_t i = 0; i < infos.size(); ++i) {
    audit::RowInfo& r = infos[i];
    r.sequence = f.sequence ? (*f.sequence)[i] : static_cast<int64_t>(i);
    if (f.position) r.position = as_int32("position", (*f.position)[i]);
    if (f.prompt_length) r.prompt_length = as_int32("prompt_length", (*f.prompt_length)[i]);
    if (f.token) r.token = as_int32("token", (*f.token)[i]);
    if (f.next) r.next = as_int32("next", (*f.next)[i]);
    if (f.task) r.task = (*f.task)[i];
    if (f.label) r.label = (*f.label)[i];
  }
  return infos;
}

// Rows compared as compare_dumps compares them: row i of ref against row i of cand, in fp64 when
// the logits are float64, each with its row's `next` token.
template <class T>
std::vector<audit::RowRecord> compare_rows(const T* ref, const T* cand, int64_t rows, int64_t vocab,
                                           std::vector<audit::RowInfo> infos) {
  std::vector<audit::RowRecord> records(static_cast<size_t>(rows));
  const auto V = static_cast<size_t>(vocab);
  for (size_t i = 0; i < records.size(); ++i) {
    records[i].info = std::move(infos[i]);
    records[i].div = audit::row_divergence(std::span<const T>(ref + i * V, V), std::span<const T>(cand + i * V, V),
                                           records[i].info.next);
  }
  return records;
}

audit::Measurement measure_arrays(nb::handle ref_obj, nb::handle cand_obj, nb::handle slices,
                                  const RowFields& fields, const std::string& ref_name,
                                  const std::string& cand_name) {
  const char* op = "contract.measure";
  nb::ndarray<> ref = any_array_in(ref_obj, op, "ref_logits", 2, 2);
  nb::ndarray<> cand = any_array_in(cand_obj, op, "cand_logits", 2, 2);
  const bool wide = ref.dtype() == nb::dtype<double>();
  if (!wide && ref.dtype() != nb::dtype<float>())
    raise_dtype(op, "ref_logits", ref.dtype(), "float32 or float64");
  if (cand.dtype() != ref.dtype()) raise_dtype(op, "cand_logits", cand.dtype(), dtype_name(ref.dtype()).c_str());
  const auto rows = static_cast<int64_t>(ref.shape(0)), vocab = static_cast<int64_t>(ref.shape(1));
  if (cand.shape(0) != ref.shape(0) || cand.shape(1) != ref.shape(1))
    throw nb::value_error(fmt::format("[{}] ref_logits has shape ({}, {}) but cand_logits ({}, {})", op, rows,
                                      vocab, cand.shape(0), cand.shape(1)).c_str());
  const audit::SliceOptions options = slice_options(slices);
  std::vector<audit::RowInfo> infos = row_infos(fields, rows, op);
  const void* a = static_cast<const uint8_t*>(ref.data_handle()) + ref.byte_offset();
  const void* b = static_cast<const uint8_t*>(cand.data_handle()) + cand.byte_offset();
  nb::gil_scoped_release release;  // the views keep the arrays alive
  std::vector<audit::RowRecord> records =
      wide ? compare_rows(static_cast<const double*>(a), static_cast<const double*>(b), rows, vocab, std::move(infos))
           : compare_rows(static_cast<const float*>(a), static_cast<const float*>(b), rows, vocab, std::move(infos));
  return audit::measure(records, options, ref_name, cand_name, vocab);
}

audit::Contract contract_of(nb::handle obj) {
  if (nb::isinstance<audit::Contract>(obj)) return nb::cast<audit::Contract>(obj);
  if (nb::isinstance<nb::str>(obj)) return audit::Contract::load(nb::cast<std::string>(obj));
  if (nb::isinstance<nb::dict>(obj)) return audit::Contract::from_json(from_python(obj), "contract dict");
  throw nb::type_error("[contract.check] argument 'contract': expected a Contract, a contract.json path or "
                       "a dict in the concord-contract/1 format");
}

nb::dict divergence_dict(const audit::RowDivergence& d) {
  nb::dict out;
  out["osc"] = d.osc;
  out["linf"] = d.linf;
  out["max_abs_dlogp"] = d.max_abs_dlogp;
  out["tv"] = d.tv;
  out["kl"] = d.kl;
  out["kl_reverse"] = d.kl_reverse;
  out["top_ref"] = d.top_ref;
  out["top_cand"] = d.top_cand;
  out["margin_ref"] = d.margin_ref;
  out["flip"] = d.flip;
  out["flip_possible"] = d.flip_possible;
  out["token"] = d.token;
  out["dlogp_token"] = d.dlogp_token;
  out["dp_token"] = d.dp_token;
  out["logp_ref_token"] = d.logp_ref_token;
  return out;
}

const char* kRowFieldsDoc =
    "Row identities (each optional, one entry per row; the logit-dump defaults otherwise): "
    "sequence (default: the row index), position (0), prompt_length (0), token (-1: unknown), next "
    "(the token that follows, -1: none; it gives the per-token |dlogp|), task and label (\"\": none).";

}  // namespace

void bind_contract(nb::module_& m) {
  m.doc() = "Kernel contracts on logits from any engine (docs/contracts.md): divergence bounds, "
            "measurement over traffic slices, fitted contracts and their checks — the functions "
            "`concord contract` runs.";

  // ---- bounds ----
  m.def("tv_bound", &audit::tv_bound, "eps"_a,
        "TV(p_A, p_B) <= tanh(eps/4) for logits whose difference has oscillation osc <= eps.");
  m.def("kl_bound", &audit::kl_bound, "eps"_a, "KL (either direction) <= min(eps^2/8, eps*tanh(eps/4)).");
  m.def("logp_bound", &audit::logp_bound, "eps"_a, "|log p_A(y) - log p_B(y)| <= eps for every token y.");
  m.def("ratio_bounds", &audit::ratio_bounds, "eps"_a, "p_A(y)/p_B(y) lies in [e^-eps, e^eps]: returns that pair.");
  m.def("greedy_stable", &audit::greedy_stable, "margin_ref"_a, "eps"_a,
        "True when the reference's greedy token provably stays the candidate's (top-1 margin > eps, "
        "with a relative slack of 2^-40).");
  m.def(
      "sequence_tv_bound",
      [](nb::handle eps) {
        const ArrayView<const double> e = array_in<double>(eps, "contract.sequence_tv_bound", "eps", 1, 1);
        return audit::sequence_tv_bound(e.span());
      },
      "eps"_a, "Sequence TV <= 1 - prod_t (1 - tanh(eps_t/4)) for per-position bounds eps (float64 array).");
  m.def("reward_drift_bound", &audit::reward_drift_bound, "r_min"_a, "r_max"_a, "sequence_tv"_a,
        "|E_A[R] - E_B[R]| <= (r_max - r_min) * sequence_tv.");
  m.def("policy_gradient_bias_bound", &audit::policy_gradient_bias_bound, "g_max"_a, "sequence_tv"_a,
        "Bias of the uncorrected policy-gradient estimate <= 2 * g_max * sequence_tv.");
  m.def("tis_safe_truncation", &audit::tis_safe_truncation, "eps"_a,
        "The smallest token-level TIS truncation C (= e^eps) that never truncates under osc <= eps.");
  m.def(
      "row_divergence",
      [](nb::handle ref, nb::handle cand, int32_t token) {
        const char* op = "contract.row_divergence";
        nb::ndarray<> a = any_array_in(ref, op, "ref", 1, 1);
        if (a.dtype() == nb::dtype<double>()) {
          const auto r = array_in<double>(ref, op, "ref", 1, 1);
          const auto c = array_in<double>(cand, op, "cand", 1, 1);
          return divergence_dict(audit::row_divergence(r.span(), c.span(), token));
        }
        const auto r = array_in<float>(ref, op, "ref", 1, 1);
        const auto c = array_in<float>(cand, op, "cand", 1, 1);
        return divergence_dict(audit::row_divergence(r.span(), c.span(), token));
      },
      "ref"_a, "cand"_a, "token"_a = -1,
      "One position's divergence between a reference and a candidate row of logits (float32 or "
      "float64, 1-D): osc, linf, max_abs_dlogp, tv, kl, kl_reverse, the greedy tokens and flip, the "
      "reference's margin and the flip predictor, and for `token` its dlogp / dp / reference logp.");

  // ---- measurements ----
  nb::class_<audit::Measurement>(m, "Measurement",
                                 "Per-slice statistics of compared rows (the measurement.json of `concord "
                                 "contract measure`).")
      .def_ro("ref", &audit::Measurement::ref, "What the reference side was.")
      .def_ro("cand", &audit::Measurement::cand, "What the candidate side was.")
      .def_ro("vocab", &audit::Measurement::vocab, "Logits per row.")
      .def_prop_ro(
          "rows", [](const audit::Measurement& me) { return me.slices.empty() ? int64_t{0} : me.slices[0].rows; },
          "Rows compared (the 'all' slice).")
      .def_prop_ro(
          "slices",
          [](const audit::Measurement& me) {
            std::vector<std::string> names;
            for (const audit::SliceStats& s : me.slices) names.push_back(s.slice);
            return names;
          },
          "Slice names, 'all' first, then by dimension.")
      .def(
          "to_dict", [](const audit::Measurement& me) { return to_python(me.to_json()); },
          nb::sig("def to_dict(self) -> dict[str, typing.Any]"),
          "The concord-measurement/1 JSON as a dict (measurement.json's content).")
      .def(
          "__getitem__",
          [](const audit::Measurement& me, const std::string& slice) {
            const json j = me.to_json();
            for (const json& s : j.at("slices"))
              if (s.at("slice") == slice) return to_python(s);
            throw nb::key_error(slice.c_str());
          },
          "slice"_a, "One slice's statistics as in measurement.json (KeyError for a slice with no rows).")
      .def(
          "osc",
          [](const audit::Measurement& me, const std::string& slice) {
            const audit::SliceStats* s = me.find(slice);
            if (!s) throw nb::key_error(slice.c_str());
            std::vector<double> v = s->osc_sorted;
            const int64_t n = static_cast<int64_t>(v.size());
            return to_numpy(std::move(v), std::span<const int64_t>(&n, 1));
          },
          "slice"_a = "all", "Every row's osc in the slice, ascending (float64).")
      .def("__repr__", [](const audit::Measurement& me) {
        return fmt::format("Measurement(ref='{}', cand='{}', vocab={}, rows={}, slices={})", me.ref, me.cand,
                           me.vocab, me.slices.empty() ? 0 : me.slices[0].rows, me.slices.size());
      });

  m.def(
      "measure",
      [](nb::handle ref_logits, nb::handle cand_logits, nb::handle slices,
         std::optional<std::vector<int64_t>> sequence, std::optional<std::vector<int64_t>> position,
         std::optional<std::vector<int64_t>> prompt_length, std::optional<std::vector<int64_t>> token,
         std::optional<std::vector<int64_t>> next, std::optional<std::vector<std::string>> task,
         std::optional<std::vector<std::string>> label, const std::string& ref, const std::string& cand) {
        const RowFields f{std::move(sequence), std::move(position), std::move(prompt_length), std::move(token),
                          std::move(next), std::move(task), std::move(label)};
        return measure_arrays(ref_logits, cand_logits, slices, f, ref, cand);
      },
      "ref_logits"_a, "cand_logits"_a, nb::kw_only(), "slices"_a = nb::none(), "sequence"_a = nb::none(),
      "position"_a = nb::none(), "prompt_length"_a = nb::none(), "token"_a = nb::none(), "next"_a = nb::none(),
      "task"_a = nb::none(), "label"_a = nb::none(), "ref"_a = "ref", "cand"_a = "cand",
      nb::sig("def measure(ref_logits: numpy.typing.ArrayLike, cand_logits: numpy.typing.ArrayLike, *, "
              "slices: dict[str, typing.Any] | None = None, sequence: collections.abc.Sequence[int] | None = None, "
              "position: collections.abc.Sequence[int] | None = None, prompt_length: collections.abc.Sequence[int] | "
              "None = None, token: collections.abc.Sequence[int] | None = None, next: collections.abc.Sequence[int] | "
              "None = None, task: collections.abc.Sequence[str] | None = None, label: collections.abc.Sequence[str] | "
              "None = None, ref: str = 'ref', cand: str = 'cand') -> Measurement"),
      (std::string("Compares ref_logits with cand_logits row by row, (rows, V) float32 arrays "
                   "(float64: compared in fp64) read in place, from any engine, and returns the "
                   "per-slice Measurement, as `concord contract measure` does on two dumps. slices: "
                   "None or a dict of prompt_length_edges, position_edges, decided_margin (nats), "
                   "margin_bins. ") + kRowFieldsDoc)
          .c_str());
  m.def(
      "measure_dumps",
      [](const std::string& ref_path, const std::string& cand_path, nb::handle slices) {
        const audit::SliceOptions options = slice_options(slices);
        nb::gil_scoped_release release;
        const audit::LogitDump ref = audit::LogitDump::open(ref_path), cand = audit::LogitDump::open(cand_path);
        const std::vector<audit::RowRecord> rows = audit::compare_dumps(ref, cand);
        return audit::measure(rows, options, ref_path, cand_path, ref.vocab());
      },
      "ref_path"_a, "cand_path"_a, nb::kw_only(), "slices"_a = nb::none(),
      "Measures two logit dumps (.npy or .safetensors, dump.h): exactly `concord contract measure "
      "--ref REF --cand CAND` (the sides named by their paths).");

  // ---- contracts ----
  nb::class_<audit::Contract>(m, "Contract",
                              "A kernel contract (concord-contract/1): per slice, the allowed osc quantile "
                              "and maximum, and the guarantees they imply.")
      .def_static("load", &audit::Contract::load, "path"_a, "Reads a contract.json (as `concord contract` writes).")
      .def_static(
          "from_dict", [](nb::handle d) { return audit::Contract::from_json(from_python(d), "contract dict"); },
          "d"_a, nb::sig("def from_dict(d: dict[str, typing.Any]) -> Contract"), "A contract from its JSON as a dict.")
      .def("save", &audit::Contract::save, "path"_a, "Writes the contract JSON (atomic).")
      .def(
          "to_dict", [](const audit::Contract& c) { return to_python(c.to_json()); },
          "The contract JSON (with the derived guarantees per slice) as a dict.")
      .def_ro("ref", &audit::Contract::ref, "The reference it was fitted for.")
      .def_ro("cand", &audit::Contract::cand, "The candidate it was fitted for.")
      .def("__repr__", [](const audit::Contract& c) {
        return fmt::format("Contract(ref='{}', cand='{}', slices={})", c.ref, c.cand, c.slices.size());
      });
  m.def(
      "fit",
      [](const audit::Measurement& me, double headroom, double quantile, double min_osc) {
        return audit::fit_contract(me, headroom, quantile, min_osc);
      },
      "measurement"_a, nb::kw_only(), "headroom"_a = 2.0, "quantile"_a = 0.99, "min_osc"_a = 1e-6,
      "Fits a contract to a measurement: per slice, osc_quantile = headroom * the measured quantile, "
      "osc_max = headroom * the measured max (at least min_osc) — `concord contract measure`'s "
      "contract.json.");

  nb::class_<audit::CheckResult>(m, "CheckResult", "The verdict of a contract check (check.json).")
      .def_ro("passed", &audit::CheckResult::pass, "Every exercised slice is within the contract.")
      .def_prop_ro(
          "violations",
          [](const audit::CheckResult& r) { return to_python(r.to_json().at("violations")); },
          "Broken slices: dicts of slice, what ('osc p99' / 'osc max'), measured, allowed, rows_over.")
      .def_ro("not_exercised", &audit::CheckResult::not_exercised, "Contract slices with no rows measured.")
      .def(
          "to_dict", [](const audit::CheckResult& r) { return to_python(r.to_json()); },
          "The concord-check/1 JSON (check.json's content) as a dict.")
      .def("__bool__", [](const audit::CheckResult& r) { return r.pass; })
      .def("__repr__", [](const audit::CheckResult& r) {
        return fmt::format("CheckResult(passed={}, violations={})", r.pass ? "True" : "False", r.violations.size());
      });
  m.def(
      "check",
      [](nb::handle contract, const audit::Measurement& me) { return audit::check_contract(contract_of(contract), me); },
      "contract"_a, "measurement"_a,
      "Checks a measurement against a contract (a Contract, a contract.json path or its dict), as "
      "`concord contract check` does: a slice passes when its osc quantile and max are within the "
      "contract's.");

  // ---- logit dumps ----
  m.def(
      "load_dump",
      [](const std::string& path) {
        nb::dict rows;
        audit::LogitDump dump = [&] {
          nb::gil_scoped_release release;
          return audit::LogitDump::open(path);
        }();
        const int64_t P = dump.rows(), V = dump.vocab();
        const int64_t shape[2] = {P, V};
        std::vector<int64_t> sequence(static_cast<size_t>(P)), position(sequence.size()),
            prompt_length(sequence.size()), token(sequence.size()), next(sequence.size());
        std::vector<std::string> task(sequence.size()), label(sequence.size());
        nb::object logits;
        {
          nb::gil_scoped_release release;
          for (int64_t i = 0; i < P; ++i) {
            const audit::RowInfo& r = dump.info(i);
            const auto k = static_cast<size_t>(i);
            sequence[k] = r.sequence, position[k] = r.position, prompt_length[k] = r.prompt_length;
            token[k] = r.token, next[k] = r.next, task[k] = r.task, label[k] = r.label;
          }
        }
        if (dump.is_f64()) {
          std::vector<double> values(static_cast<size_t>(P * V));
          {
            nb::gil_scoped_release release;
            for (int64_t i = 0; i < P; ++i)
              dump.row(i, std::span<double>(values).subspan(static_cast<size_t>(i * V), static_cast<size_t>(V)));
          }
          logits = nb::cast(to_numpy(std::move(values), shape));
        } else {
          std::vector<float> values(static_cast<size_t>(P * V));
          {
            nb::gil_scoped_release release;
            for (int64_t i = 0; i < P; ++i)
              dump.row(i, std::span<float>(values).subspan(static_cast<size_t>(i * V), static_cast<size_t>(V)));
          }
          logits = nb::cast(to_numpy(std::move(values), shape));
        }
        const int64_t n = P;
        rows["sequence"] = to_numpy(std::move(sequence), std::span<const int64_t>(&n, 1));
        rows["position"] = to_numpy(std::move(position), std::span<const int64_t>(&n, 1));
        rows["prompt_length"] = to_numpy(std::move(prompt_length), std::span<const int64_t>(&n, 1));
        rows["token"] = to_numpy(std::move(token), std::span<const int64_t>(&n, 1));
        rows["next"] = to_numpy(std::move(next), std::span<const int64_t>(&n, 1));
        rows["task"] = task;
        rows["label"] = label;
        return nb::make_tuple(logits, rows);
      },
      "path"_a,
      nb::sig("def load_dump(path: str) -> tuple[numpy.typing.NDArray[numpy.float32] | "
              "numpy.typing.NDArray[numpy.float64], dict[str, typing.Any]]"),
      "Reads a logit dump (.npy [+ .rows.json] or .safetensors, dump.h): returns (logits, rows) — "
      "the (P, V) logits as float32 (float64 for an F64 dump; BF16/F16 widened exactly) and a dict "
      "of the row fields (sequence, position, prompt_length, token, next as int64 arrays; task, "
      "label as lists of str), ready for measure(..., **rows).");
  m.def(
      "save_dump",
      [](const std::string& path, nb::handle logits, std::optional<std::vector<int64_t>> sequence,
         std::optional<std::vector<int64_t>> position, std::optional<std::vector<int64_t>> prompt_length,
         std::optional<std::vector<int64_t>> token, std::optional<std::vector<int64_t>> next,
         std::optional<std::vector<std::string>> task, std::optional<std::vector<std::string>> label) {
        const ArrayView<const float> v = array_in<float>(logits, "contract.save_dump", "logits", 2, 2);
        const RowFields f{std::move(sequence), std::move(position), std::move(prompt_length), std::move(token),
                          std::move(next), std::move(task), std::move(label)};
        const std::vector<audit::RowInfo> infos = row_infos(f, v.shape[0], "contract.save_dump");
        nb::gil_scoped_release release;
        audit::LogitDumpWriter writer(v.shape[1]);
        const auto V = static_cast<size_t>(v.shape[1]);
        for (size_t i = 0; i < infos.size(); ++i) writer.add(infos[i], std::span<const float>(v.data + i * V, V));
        writer.write(path);
      },
      "path"_a, "logits"_a, nb::kw_only(), "sequence"_a = nb::none(), "position"_a = nb::none(),
      "prompt_length"_a = nb::none(), "token"_a = nb::none(), "next"_a = nb::none(), "task"_a = nb::none(),
      "label"_a = nb::none(),
      (std::string("Writes (P, V) float32 logits as a logit dump: .safetensors, or .npy with its "
                   "<path>.rows.json sidecar (atomic), readable by `concord contract --ref/--cand`. ") +
       kRowFieldsDoc)
          .c_str());
}

}  // namespace concord::python
