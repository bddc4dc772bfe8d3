// concord.sync's C++ half: the RL loop's weight-sync comparisons (rl/sync.h: checks 2, 3, 4 and
// 6) on tensors a Python caller holds, through the very functions WeightReceiver runs, so a
// check on two state dicts gives the RL loop's verdict and message. python/concord/sync.py walks
// the state dicts and calls these.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bindings.h"
#include "concord/model/model.h"
#include "concord/model/policy.h"
#include "concord/numerics/check.h"
#include "concord/numerics/format.h"
#include "concord/numerics/quant_desc.h"
#include "concord/rl/sync.h"
#include "names.h"

namespace concord::python {
namespace {

using json = nlohmann::json;
using namespace nb::literals;

json from_python(nb::handle obj) {
  return json::parse(nb::cast<std::string>(nb::module_::import_("json").attr("dumps")(obj)));
}

rl::SyncCheck check_named(const std::string& name) {
  for (int i = 1; i <= rl::kSyncChecks; ++i) {
    const auto c = static_cast<rl::SyncCheck>(i);
    if (rl::sync_check_name(c) == name) return c;
  }
  throw InputError(fmt::format("[sync] unknown check '{}' (checks: version, manifest, precision_plan, "
                               "content, derived_state, scale_sanity, probe)", name));
}

// (name, shape, dtype) triples as manifest entries.
using EntryTuple = std::tuple<std::string, std::vector<int64_t>, std::string>;
std::vector<rl::ManifestEntry> entries(const std::vector<EntryTuple>& in) {
  std::vector<rl::ManifestEntry> out;
  out.reserve(in.size());
  for (const auto& [name, shape, dtype] : in) out.push_back({name, shape, dtype, std::nullopt});
  return out;
}

rl::PrecisionPlan plan_of(nb::handle plan, const char* arg) {
  try {
    return rl::PrecisionPlan::from_json(from_python(plan));
  } catch (const json::exception& e) {
    throw InputError(fmt::format("[sync] {}: not a precision plan (concord.sync.plan: norms, "
                                 "embedding_lookup, high_precision_last_layers, weights) ({})", arg, e.what()));
  }
}

// A numerics.QuantizedArray's parts: its desc (a numerics.QuantDesc), shape, packed codes, block
// scales and tensor scale (the attributes bind_numerics.cpp gives it).
struct QuantizedParts {
  numerics::QuantDesc desc;
  int64_t rows = 0, cols = 0;
  ArrayView<const uint8_t> codes, scales;
  float tensor_scale = 1.0f;
};
QuantizedParts quantized_parts(nb::handle q, const char* op) {
  if (!nb::hasattr(q, "packed") || !nb::hasattr(q, "scales") || !nb::hasattr(q, "desc"))
    throw nb::type_error(fmt::format("[{}] expected a numerics.QuantizedArray", op).c_str());
  QuantizedParts p;
  p.desc = nb::cast<numerics::QuantDesc>(q.attr("desc"));
  const auto shape = nb::cast<std::vector<int64_t>>(q.attr("shape"));
  p.rows = shape.size() == 2 ? shape[0] : 1;
  p.cols = shape.empty() ? 1 : shape.back();
  p.codes = array_in<uint8_t>(q.attr("packed"), op, "packed", 1, 1);
  p.scales = array_in<uint8_t>(q.attr("scales"), op, "scales", 1, 2);
  p.tensor_scale = nb::cast<float>(q.attr("tensor_scale"));
  return p;
}

// max |x|, NaN when an element is NaN (the amax the RL loop takes of installed values).
float amax_of(std::span<const float> v) {
  uint32_t top = 0;
  for (const float x : v) {
    const uint32_t a = std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu;
    top = a > top ? a : top;
  }
  return top > 0x7F800000u ? std::numeric_limits<float>::quiet_NaN() : std::bit_cast<float>(top);
}

// A learner's publisher for a sampler of `config` at `policy`: the served values a caller hands
// over are installed in a model of its own, and rl::WeightPublisher makes the sync payload
// (manifest, plan, content hashes, probe reference) from it — the payload `concord rl`'s learner
// sends and `concord serve`'s POST /v1/weights checks.
struct PyPublisher {
  model::Model model;
  model::PrecisionPolicy policy;
  std::unique_ptr<rl::WeightPublisher> publisher;
};

}  // namespace

void bind_sync(nb::module_& m) {
  nb::class_<PyPublisher>(
      m, "Publisher",
      "Makes sync payloads (rl/sync.h) from state dicts for a sampler of one config and policy.")
      .def(
          "__init__",
          [](PyPublisher* self, nb::handle config, const std::string& policy, int64_t probe_sequences,
             int64_t probe_length, uint64_t probe_seed) {
            const model::ModelConfig c = model::ModelConfig::from_json(from_python(config), "config");
            const model::PrecisionPolicy pol = model::PrecisionPolicy::from_name_or_file(policy);
            if (probe_sequences < 1 || probe_length < 2)
              throw InputError(fmt::format("[sync.Publisher] the probe needs >= 1 sequence of >= 2 tokens, "
                                           "not {} x {}", probe_sequences, probe_length));
            new (self) PyPublisher{model::Model(c, pol), pol, nullptr};
            rl::ProbeOptions probe;
            probe.sequences = probe_sequences;
            probe.length = probe_length;
            probe.seed = probe_seed;
            self->publisher = std::make_unique<rl::WeightPublisher>(self->model, pol, probe);
          },
          "config"_a, "policy"_a, "probe_sequences"_a = 4, "probe_length"_a = 32, "probe_seed"_a = 7,
          nb::sig("def __init__(self, config: dict[str, typing.Any], policy: str, probe_sequences: int = 4, "
                  "probe_length: int = 32, probe_seed: int = 7) -> None"),
          "config: the model's config.json content; policy: the sampler's precision policy (a preset "
          "name or policy JSON file): what its kernels read of each weight. The probe: a fixed batch "
          "of token ids whose log-probs the payload carries for check 7.")
      .def_prop_ro("served_format",
                   [](const PyPublisher& p) { return std::string(numerics::traits(p.policy.served_weights).name); },
                   "The element format the sampler holds its weights in (the payload's dtype: bf16, f32, ...): "
                   "what a Fair Cast export should round to.")
      .def_prop_ro("shapes", [](const PyPublisher& p) {
            std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
            for (const model::ParamSpec& spec : p.model.params()) shapes.emplace_back(spec.name, spec.shape);
            return shapes;
          }, "The tensors a state dict must hold: (HF name, shape) in order.")
      .def_prop_ro("tied", [](const PyPublisher& p) { return p.model.config().tie_word_embeddings; },
                   "Whether lm_head is tied to the embedding (a state dict's lm_head.weight is then ignored).")
      .def(
          "payload",
          [](PyPublisher& p, nb::dict state_dict, uint64_t version, std::optional<std::string> fault_name) {
            const char* op = "sync.Publisher.payload";
            rl::Fault fault = rl::Fault::none;
            if (fault_name) {
              fault = rl::fault_from_name(*fault_name);
              if (!rl::learner_side(fault))
                throw InputError(fmt::format("[{}] fault {} happens on the sampler's side (send it to the server)",
                                             op, *fault_name));
            }
            std::set<std::string> known;
            for (const model::ParamSpec& spec : p.model.params()) {
              known.insert(spec.name);
              if (!state_dict.contains(spec.name.c_str()))
                throw InputError(fmt::format("[{}] the state dict has no '{}'", op, spec.name));
              const ArrayView<const float> v = array_in<float>(state_dict[spec.name.c_str()], op, spec.name.c_str(), 1, 2);
              if (v.shape != spec.shape)
                throw InputError(fmt::format("[{}] '{}': shape {} where the model has {}", op, spec.name,
                                             shape_text(v.shape), shape_text(spec.shape)));
              const std::span<const float> from = v.span();
              std::copy(from.begin(), from.end(), p.model.param(spec.name).begin());
            }
            const bool tied = p.model.config().tie_word_embeddings;
            for (auto [key, value] : state_dict) {
              const std::string name = nb::cast<std::string>(key);
              if (known.count(name) || (tied && name == "lm_head.weight")) continue;  // a tied head: the embedding
              throw InputError(fmt::format("[{}] '{}' is not a tensor of this model", op, name));
            }
            p.model.weights_changed();
            std::vector<uint8_t> payload;
            {
              nb::gil_scoped_release release;
              payload = p.publisher->publish(version, fault);
            }
            return nb::bytes(reinterpret_cast<const char*>(payload.data()), payload.size());
          },
          "state_dict"_a, "version"_a, "fault"_a = nb::none(),
          nb::sig("def payload(self, state_dict: dict[str, numpy.typing.ArrayLike], version: int, "
                  "fault: str | None = None) -> bytes"),
          "The sync payload of `version` for the served values in state_dict ({HF name: float32 "
          "array}; a tied lm_head may be present and is ignored): a safetensors image with the "
          "concord.sync.* metadata, as `concord rl`'s learner publishes it. fault: a learner-side "
          "sync fault (concord rl --fault) put into the payload, for testing a sampler's checks.");
  m.def(
      "faults",
      [] {
        std::vector<std::pair<std::string, bool>> out;
        for (const std::string& name : rl::fault_names())
          out.emplace_back(name, rl::learner_side(rl::fault_from_name(name)));
        return out;
      },
      "The injectable sync faults of `concord rl --fault`: (name, happens on the learner's side).");

  m.doc() = "The RL loop's weight-sync comparisons (rl/sync.h) on tensors from Python; "
            "concord.sync builds the state-dict checks on them.";

  m.def(
      "check_message",
      [](const std::string& check, const std::string& problem) {
        return rl::sync_check_message(check_named(check), problem);
      },
      "check"_a, "problem"_a, "\"[sync] check N NAME: PROBLEM\", the message of a failed check.");
  m.def(
      "check_id", [](const std::string& check) { return static_cast<int>(check_named(check)); }, "check"_a,
      "The check's number (version 1, manifest 2, precision_plan 3, content 4, derived_state 5, "
      "scale_sanity 6, probe 7).");
  m.def(
      "manifest_problem",
      [](const std::vector<EntryTuple>& learner, const std::vector<EntryTuple>& sampler) {
        return rl::manifest_problem(entries(learner), entries(sampler));
      },
      "learner"_a, "sampler"_a,
      "Check 2's comparison of two manifests, each a list of (name, shape, dtype) in order: \"\" when "
      "every learner tensor maps to one sampler tensor of the same shape and dtype and nothing is "
      "missing or extra, else the problem (the RL loop's text).");
  m.def(
      "precision_plan_problem",
      [](nb::handle learner, nb::handle sampler) {
        return rl::precision_plan_problem(plan_of(learner, "learner plan"), plan_of(sampler, "sampler plan"));
      },
      "learner"_a, "sampler"_a,
      "Check 3's comparison of two precision plans (dicts as concord.sync.plan holds them): \"\" or "
      "the problem.");
  m.def(
      "plan_weight_high",
      [](const std::string& desc) {
        if (desc == "f32") return true;
        const numerics::QuantDesc d = desc_named(desc, "sync.plan_weight_high");
        return !d.has_scale && numerics::traits(d.element).bits >= 16;
      },
      "desc"_a, "Whether an operand format counts as high precision in a plan (f32, or an unscaled "
      "format of 16 bits or more).");
  m.def(
      "content_hash_values",
      [](nb::handle values, std::optional<std::string> desc) {
        const ArrayView<const float> v = array_in<float>(values, "sync.content_hash", "tensor", 1, 2);
        std::optional<numerics::QuantDesc> d;
        if (desc && *desc != "f32") d = desc_named(*desc, "sync.content_hash");
        const int64_t rows = v.ndim() == 2 ? v.shape[0] : 1, cols = v.shape.back();
        nb::gil_scoped_release release;
        return rl::sync_content_hash(v.span(), rows, cols, d);
      },
      "tensor"_a, "desc"_a = nb::none(),
      "Check 4's hash of a float32 weight (1-D: one row) as concord's forward GEMMs read it: "
      "quantized with `desc` (a QuantDesc name or text; None or 'f32': the fp32 values) as "
      "operand b of Y = X W^T, then XXH3-64 of the codes, continued over the block scales and "
      "the tensor scale's bits.");
  m.def(
      "content_hash_quantized",
      [](nb::handle q) {
        const QuantizedParts p = quantized_parts(q, "sync.content_hash");
        nb::gil_scoped_release release;
        return rl::sync_content_hash(p.codes.span(), p.scales.span(), p.tensor_scale);
      },
      "q"_a, "Check 4's hash of a numerics.QuantizedArray: XXH3-64 of its packed codes, continued over "
      "its block scales, then its tensor scale's bits.");
  m.def(
      "content_hash_bytes",
      [](nb::handle bytes) {
        const ArrayView<const uint8_t> b = array_in<uint8_t>(bytes, "sync.content_hash", "tensor", 1, 1);
        nb::gil_scoped_release release;
        return rl::sync_content_hash(std::span<const uint8_t>(b.data, static_cast<size_t>(b.size)), {}, 1.0f);
      },
      "data"_a, "The hash of a non-float tensor's raw bytes (uint8 view), as the codes of an unscaled tensor.");
  m.def(
      "content_problem",
      [](const std::vector<std::tuple<std::string, uint64_t, bool>>& sampler, nb::dict learner) {
        std::vector<rl::ContentHash> hashes;
        for (const auto& [name, hash, quantized] : sampler) hashes.push_back({name, hash, quantized});
        return rl::content_problem(
            hashes,
            [&](std::string_view name) -> std::optional<std::string> {
              const nb::str key(name.data(), name.size());
              if (!learner.contains(key)) return std::nullopt;
              return nb::cast<std::string>(learner[key]);
            },
            learner.size());
      },
      "sampler"_a, "learner"_a,
      "Check 4's comparison: the sampler's (name, hash, quantized) in order against the learner's "
      "{name: '0x<16 hex>'}: \"\" or the problem.");
  m.def(
      "scale_problem",
      [](nb::handle q, nb::handle values) {
        QuantizedParts p = quantized_parts(q, "sync.check_scales");
        std::optional<float> amax;
        if (!values.is_none()) amax = amax_of(array_in<float>(values, "sync.check_scales", "values", 1, 2).span());
        numerics::QuantizedTensor t;
        t.desc = p.desc;
        t.rows = p.rows;
        t.cols = p.cols;
        t.codes.assign(p.codes.data, p.codes.data + p.codes.size);
        t.scales.assign(p.scales.data, p.scales.data + p.scales.size);
        t.tensor_scale = p.tensor_scale;
        const std::string problem = rl::scale_problem(t, amax);
        return problem.empty() ? problem : fmt::format("({}): {}", p.desc.to_string(), problem);
      },
      "q"_a, "values"_a = nb::none(),
      "Check 6 on one numerics.QuantizedArray: \"\" or \"(DESC): PROBLEM\". values: the float32 "
      "values it was quantized from (their amax fixes the expected NVFP4 / per-tensor FP8 tensor "
      "scale); None skips those checks.");
}

}  // namespace concord::python
