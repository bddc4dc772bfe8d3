// The `concord._concord` extension: one bind_* function per submodule, and the array helpers
// every binding shares, so that all of them exchange arrays the same way and fail the same way.
//
// Arrays in (array_in / array_out):
//   Any object with __dlpack__ (NumPy, PyTorch, JAX, CuPy, ...) or the buffer protocol
//   (memoryview, array.array, ...) is viewed, never copied: the C++ reads and writes the
//   caller's memory. The view must be on the CPU, C-contiguous (dimensions of extent 1 and
//   arrays of at most one element may have any stride), of exactly the dtype asked for and of
//   an allowed number of dimensions. nanobind's implicit conversions (dtype casts,
//   contiguous copies) are switched off on purpose: a float64 array or a transposed view is an
//   error, not a silent copy.
// Errors (the one style of the package):
//   TypeError   not an array at all, or the wrong dtype:
//               "[numerics.encode] argument 'x': expected a float32 array, got float64 (convert
//               with x.astype(numpy.float32))"
//   ValueError  wrong device, non-contiguous strides, wrong number of dimensions or shape, a
//               read-only array where the result is written:
//               "[numerics.encode] argument 'x': expected a C-contiguous array, got shape (4, 3)
//               with element strides (1, 4) (use numpy.ascontiguousarray(x) / x.contiguous())"
//   concord.InputError (a ValueError subclass) carries concord::InputError's own message.
// Arrays out (to_numpy):
//   A std::vector built by the C++ is moved to the heap and handed to NumPy with a capsule that
//   deletes it: the NumPy array owns the C++ buffer, nothing is copied.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace concord::python {

namespace nb = nanobind;

// Argument and result types of the bound functions. They accept any object (the array helpers
// below do the checking, with the package's error messages); their names are what the type
// stubs show.
inline bool accept_any_object(PyObject*) { return true; }
class array_arg : public nb::object {
  NB_OBJECT_DEFAULT(array_arg, object, "numpy.typing.ArrayLike", accept_any_object)
};
class array_result : public nb::object {
  NB_OBJECT_DEFAULT(array_result, object, "numpy.typing.NDArray", accept_any_object)
};
// {name: array} as state dicts are.
using array_dict = nb::typed<nb::dict, nb::str, array_arg>;

void bind_numerics(nb::module_& m);
void bind_export(nb::module_& m);
void bind_sync(nb::module_& m);
void bind_contract(nb::module_& m);
void bind_model(nb::module_& m);

// A checked, zero-copy view of a caller's array. `owner` keeps the caller's object (and the
// DLPack capsule) alive while the view is used; data points at the caller's first element.
template <class T>
struct ArrayView {
  T* data = nullptr;
  std::vector<int64_t> shape;
  int64_t size = 0;  // number of elements
  nb::ndarray<> owner;

  int64_t ndim() const { return static_cast<int64_t>(shape.size()); }
  std::span<T> span() const { return {data, static_cast<size_t>(size)}; }
};

// The dtype's NumPy name ("float32", "uint8", "bfloat16", ...).
std::string dtype_name(nb::dlpack::dtype dt);
// "(3, 4)"
std::string shape_text(std::span<const int64_t> shape);
// "[numerics.encode] argument 'x': " — the prefix of every array error. `op` is the Python
// name of the function ("numerics.encode").
std::string arg_prefix(const char* op, const char* arg);

// The checks common to every view (device, conversion-free import, C-contiguity, ndim); dtype
// is checked by the typed wrappers below. writable: the array is written (an out= array).
nb::ndarray<> checked_array(nb::handle obj, const char* op, const char* arg, bool writable,
                            int min_ndim, int max_ndim);
[[noreturn]] void raise_dtype(const char* op, const char* arg, nb::dlpack::dtype got,
                              const char* expected);

template <class T>
ArrayView<T> make_view(nb::ndarray<> a, const char* op, const char* arg) {
  if (a.dtype() != nb::dtype<std::remove_const_t<T>>())
    raise_dtype(op, arg, a.dtype(), dtype_name(nb::dtype<std::remove_const_t<T>>()).c_str());
  ArrayView<T> v;
  v.data = static_cast<T*>(static_cast<void*>(static_cast<uint8_t*>(a.data_handle()) + a.byte_offset()));
  v.shape.assign(a.shape_ptr(), a.shape_ptr() + a.ndim());
  v.size = static_cast<int64_t>(a.size());
  v.owner = std::move(a);
  return v;
}

// An input array of dtype T (read only; read-only arrays are accepted).
template <class T>
ArrayView<const T> array_in(nb::handle obj, const char* op, const char* arg, int min_ndim = 1,
                            int max_ndim = 32) {
  return make_view<const T>(checked_array(obj, op, arg, false, min_ndim, max_ndim), op, arg);
}

void check_out_shape(const char* op, const char* arg, std::span<const int64_t> got,
                     std::span<const int64_t> expected);

// An out= array of dtype T that must have exactly `shape` (writable).
template <class T>
ArrayView<T> array_out(nb::handle obj, const char* op, const char* arg,
                       std::span<const int64_t> shape) {
  ArrayView<T> v = make_view<T>(checked_array(obj, op, arg, true, 0, 32), op, arg);
  check_out_shape(op, arg, v.shape, shape);
  return v;
}

// The dtype of an array-like without importing it as a typed view (for functions that accept
// several dtypes, e.g. codes as uint8 or uint16): the same checks as array_in.
inline nb::ndarray<> any_array_in(nb::handle obj, const char* op, const char* arg,
                                  int min_ndim = 1, int max_ndim = 32) {
  return checked_array(obj, op, arg, false, min_ndim, max_ndim);
}

// A NumPy array that owns `values` (moved to the heap, freed by a capsule): no copy.
template <class T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T>&& values, std::span<const int64_t> shape) {
  auto* heap = new std::vector<T>(std::move(values));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  std::vector<size_t> dims(shape.begin(), shape.end());
  return nb::ndarray<nb::numpy, T>(heap->data(), dims.size(), dims.data(), owner);
}

// A NumPy view of memory owned by a Python object `owner` (e.g. a bound C++ object's buffer):
// it keeps `owner` alive. Writable unless T is const.
template <class T>
nb::ndarray<nb::numpy, T> numpy_view(T* data, std::span<const int64_t> shape, nb::handle owner) {
  std::vector<size_t> dims(shape.begin(), shape.end());
  return nb::ndarray<nb::numpy, T>(data, dims.size(), dims.data(), owner);
}

// A new array of `shape`, or the caller's out= array checked against it. result is what the
// Python function returns: the out= object itself (so `result is out`) or the new array.
template <class T>
struct OutArray {
  ArrayView<T> view;
  array_result result;
};
template <class T>
OutArray<T> out_or_new(nb::handle out, const char* op, std::span<const int64_t> shape) {
  OutArray<T> o;
  if (!out.is_none()) {
    o.view = array_out<T>(out, op, "out", shape);
    o.result = nb::borrow<array_result>(out);
    return o;
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<T> values(static_cast<size_t>(n));
  T* data = values.data();
  o.result = nb::borrow<array_result>(nb::cast(to_numpy(std::move(values), shape)));
  o.view.data = data;
  o.view.shape.assign(shape.begin(), shape.end());
  o.view.size = n;
  return o;
}

}  // namespace concord::python
