// The extension module `concord._concord`: one submodule per concord layer exposed to Python.
#include "bindings.h"

#include "concord/numerics/check.h"

NB_MODULE(_concord, m) {
  namespace nb = nanobind;
  using namespace concord::python;
  m.doc() = "concord's C++ engine (numerics, Fair Cast export, sync checks, contracts, models)";

  // concord::InputError -> concord.InputError, a ValueError with concord's own message; an
  // internal invariant failing (a concord bug) -> RuntimeError.
  static nb::exception<concord::InputError> input_error(m, "InputError", PyExc_ValueError);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const concord::InternalError& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  nb::module_ numerics = m.def_submodule("numerics", "Element formats and block quantization");
  nb::module_ export_ = m.def_submodule("export", "Fair Cast export of fp32 weights");
  nb::module_ sync = m.def_submodule("sync", "Weight-sync checks on a pair of state dicts");
  nb::module_ contract = m.def_submodule("contract", "Divergence contracts on logits");
  nb::module_ model = m.def_submodule("model", "Models and the inference engine");
  bind_numerics(numerics);
  bind_export(export_);
  bind_sync(sync);
  bind_contract(contract);
  bind_model(model);
}
