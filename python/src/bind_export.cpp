// concord.export: the Fair Cast export rules (train/export.h) applied to a Python state dict.
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/numerics/convert.h"
#include "concord/numerics/scalar.h"
#include "concord/train/export.h"
#include "names.h"

namespace concord::python {
namespace {

using numerics::Format;

// What export() returns for each tensor.
enum class Output { float32, codes };

Output output_named(const std::string& name) {
  if (name == "float32") return Output::float32;
  if (name == "codes") return Output::codes;
  throw InputError("[export.Exporter.export] unknown output '" + name +
                   "' (use float32 or codes)");
}

// The C++ rule over named tensors. Parameter numbers (the random stream of sr, the key of ef's
// carried error) are given in the order names are first seen, as the trainer numbers its
// parameters in model order; a state dict's order is the model's.
class Exporter {
 public:
  Exporter(const std::string& rule, const std::string& format, uint64_t seed)
      : format_(format_named(format, "export.Exporter")),
        rule_(train::make_export_rule(rule, format_, seed)),
        seed_(seed) {}

  std::string rule() const { return std::string(rule_->name()); }
  std::string format() const { return std::string(numerics::traits(format_).name); }
  uint64_t seed() const { return seed_; }
  uint64_t next_step() const { return next_step_; }
  const std::vector<std::string>& names() const { return names_; }

  int param_index(const std::string& name, const std::vector<int64_t>& shape) {
    auto it = index_.find(name);
    if (it == index_.end()) {
      it = index_.emplace(name, static_cast<int>(names_.size())).first;
      names_.push_back(name);
      shapes_.push_back(shape);
    } else if (shapes_[static_cast<size_t>(it->second)] != shape) {
      throw InputError("[export] tensor '" + name + "' has shape " + shape_text(shape) +
                       ", but was exported before with shape " +
                       shape_text(shapes_[static_cast<size_t>(it->second)]) +
                       " (a new Exporter starts over)");
    }
    return it->second;
  }

  // rows x cols as the rule sees a tensor: 1-D and 0-d tensors are one row (served in fp32,
  // as the policy keeps norms); an N-D tensor is shape[0] x (the rest).
  static std::pair<int64_t, int64_t> rows_cols(const std::vector<int64_t>& shape, int64_t size) {
    if (shape.size() < 2) return {1, size};
    return {shape[0], shape[0] == 0 ? 0 : size / shape[0]};
  }

  // Exports one tensor into served (float32, same size).
  void apply_one(const std::string& name, const ArrayView<const float>& master,
                 const ArrayView<float>& served, uint64_t step) {
    const int param = param_index(name, master.shape);
    const auto [rows, cols] = rows_cols(master.shape, master.size);
    nb::gil_scoped_release release;
    rule_->apply(param, master.span(), served.span(), rows, cols, step);
  }

  nb::typed<nb::dict, nb::str, array_result> export_dict(const array_dict& state, std::optional<uint64_t> step, const std::string& output,
                       const std::optional<array_dict>& out_dict) {
    const char* op = "export.Exporter.export";
    const Output how = output_named(output);
    if (out_dict && how != Output::float32)
      throw InputError(std::string("[") + op + "] out= takes float32 served arrays; use "
                       "output='float32' with it");
    const uint64_t at = step.value_or(next_step_);
    nb::typed<nb::dict, nb::str, array_result> result;
    for (auto [key, value] : state) {
      const std::string name = nb::cast<std::string>(nb::str(key));
      const std::string arg = "state['" + name + "']";
      const auto master = array_in<float>(value, op, arg.c_str(), 0, 32);
      if (out_dict) {
        if (!out_dict->contains(key))
          throw InputError(std::string("[") + op + "] out= has no entry '" + name + "'");
        const std::string out_arg = "out['" + name + "']";
        const nb::object target = (*out_dict)[key];
        const auto served = array_out<float>(target, op, out_arg.c_str(), master.shape);
        apply_one(name, master, served, at);
        result[key] = target;
        continue;
      }
      OutArray<float> served = out_or_new<float>(nb::none(), op, master.shape);
      apply_one(name, master, served.view, at);
      result[key] = how == Output::float32 || master.shape.size() < 2
                        ? served.result
                        : encode_codes(served.view);
    }
    next_step_ = at + 1;
    return result;
  }

  array_result apply(const std::string& name, const array_arg& master_obj,
                     std::optional<uint64_t> step, const array_arg& out_obj) {
    const char* op = "export.Exporter.apply";
    const auto master = array_in<float>(master_obj, op, "master", 0, 32);
    OutArray<float> served = out_or_new<float>(out_obj, op, master.shape);
    apply_one(name, master, served.view, step.value_or(next_step_));
    return served.result;
  }

  // ef's carried error of each tensor exported so far (empty for rne and sr), copied out.
  nb::typed<nb::dict, nb::str, array_result> state() const {
    nb::typed<nb::dict, nb::str, array_result> d;
    for (auto& [param, values] : rule_->state()) {
      const std::string& name = names_[static_cast<size_t>(param)];
      d[name.c_str()] = to_numpy(std::move(values), shapes_[static_cast<size_t>(param)]);
    }
    return d;
  }

  std::optional<array_result> error(const std::string& name) const {
    auto it = index_.find(name);
    if (it == index_.end())
      throw InputError("[export.Exporter.error] no tensor '" + name + "' was exported");
    for (auto& [param, values] : rule_->state())
      if (param == it->second)
        return nb::borrow<array_result>(
            nb::cast(to_numpy(std::move(values), shapes_[static_cast<size_t>(param)])));
    return std::nullopt;  // a 1-D tensor (served in fp32), or a stateless rule
  }

  void load_state(const array_dict& state) {
    const char* op = "export.Exporter.load_state";
    for (auto [key, value] : state) {
      const std::string name = nb::cast<std::string>(nb::str(key));
      const std::string arg = "state['" + name + "']";
      const auto e = array_in<float>(value, op, arg.c_str(), 0, 32);
      const int param = param_index(name, e.shape);
      const auto [rows, cols] = rows_cols(e.shape, e.size);
      rule_->restore_state(param, e.span(), rows, cols);
    }
  }

  bool keeps_state() const { return rule_->keeps_state(); }

 private:
  // The served values as codes of the served format (exact: every served value is one).
  array_result encode_codes(const ArrayView<float>& served) const {
    const int bytes = numerics::traits(format_).storage_bytes();
    auto run = [&](auto* codes) {
      nb::gil_scoped_release release;
      if (numerics::traits(format_).bits == 4) {
        for (int64_t i = 0; i < served.size; ++i)
          codes[i] = static_cast<std::remove_pointer_t<decltype(codes)>>(
              numerics::encode_ref(format_, served.data[i]));
      } else {
        numerics::encode_array(format_, numerics::Rounding::rne, numerics::Overflow::saturate,
                               served.data, codes, static_cast<size_t>(served.size));
      }
    };
    if (bytes == 1) {
      OutArray<uint8_t> c = out_or_new<uint8_t>(nb::none(), "export", served.shape);
      run(c.view.data);
      return c.result;
    }
    if (bytes == 2) {
      OutArray<uint16_t> c = out_or_new<uint16_t>(nb::none(), "export", served.shape);
      run(c.view.data);
      return c.result;
    }
    OutArray<uint32_t> c = out_or_new<uint32_t>(nb::none(), "export", served.shape);
    run(c.view.data);
    return c.result;
  }

  Format format_;
  std::unique_ptr<train::ExportRule> rule_;
  uint64_t seed_;
  uint64_t next_step_ = 0;
  std::unordered_map<std::string, int> index_;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
};

}  // namespace

void bind_export(nb::module_& m) {
  m.def("rules", [] { return train::export_rule_names(); }, "The export rule names: rne, sr, ef.");

  nb::class_<Exporter>(m, "Exporter",
                       "Fair Cast export of fp32 master weights to the served copy, as the "
                       "trainer and the RL loop do it (train/export.h), on named tensors.")
      .def(nb::init<const std::string&, const std::string&, uint64_t>(), nb::arg("rule") = "rne",
           nb::arg("format") = "bf16", nb::arg("seed") = 0,
           "rule: rne | sr | ef. format: the served element format (bf16, fp16, e4m3, ...; f32\n"
           "makes every rule a copy). seed keys sr's random bits: tensor number p at step s\n"
           "uses Philox stream p of seed ^ (0x9E3779B97F4A7C15 * (s + 1)).")
      .def_prop_ro("rule", &Exporter::rule, "The rule's name.")
      .def_prop_ro("format", &Exporter::format, "The served format.")
      .def_prop_ro("seed", &Exporter::seed, "sr's seed.")
      .def_prop_ro("next_step", &Exporter::next_step,
                   "The step export() uses when none is given (one after the last export).")
      .def_prop_ro("names", &Exporter::names,
                   "Tensor names in the order they were first seen: the parameter numbers.")
      .def_prop_ro("keeps_state", &Exporter::keeps_state,
                   "Whether the rule carries state between steps (ef into a format below f32).")
      .def("export", &Exporter::export_dict, nb::arg("state_dict"), nb::kw_only(),
           nb::arg("step") = nb::none(), nb::arg("output") = "float32", nb::arg("out") = nb::none(),
           "Exports every tensor of a state dict {name: float32 array} (NumPy, CPU torch;\n"
           "viewed, not copied) and returns {name: served}. 1-D tensors (norms) are served in\n"
           "fp32, as the precision policy keeps them. output='float32': the served values in\n"
           "fp32 (what the forward pass reads); output='codes': matrices as codes of the served\n"
           "format (bf16/fp16: uint16, 8-bit and narrower: uint8 one per element), viewable as\n"
           "ml_dtypes / torch dtypes. out={name: float32 array}: written in place and returned.\n"
           "step: the training step (sr's random draw); default next_step.")
      .def("apply", &Exporter::apply, nb::arg("name"), nb::arg("master"), nb::kw_only(),
           nb::arg("step") = nb::none(), nb::arg("out") = nb::none(),
           "Exports one tensor; returns its served float32 copy (into `out` when given). Does\n"
           "not advance next_step.")
      .def("state", &Exporter::state,
           "ef's carried error {name: float32 array} (copies; empty for rne and sr): what a "
           "checkpoint saves.")
      .def("error", &Exporter::error, nb::arg("name"),
           "ef's carried error of one tensor (a copy), or None where the rule carries none.")
      .def("load_state", &Exporter::load_state, nb::arg("state"),
           "Restores state() from a checkpoint, so that the next export continues "
           "bit-identically.");
}

}  // namespace concord::python
