// The shared array checks of bindings.h: one place that decides what an acceptable array is and
// how a rejected one is reported.
#include <string>

#include "bindings.h"

namespace concord::python {
namespace {

// DLPack device type numbers (dlpack.h's DLDeviceType) as "cuda:0".
std::string device_text(int64_t type, int64_t id) {
  const char* name = nullptr;
  switch (type) {
    case 1: return "cpu";
    case 2: name = "cuda"; break;
    case 3: name = "cuda_host"; break;
    case 4: name = "opencl"; break;
    case 7: name = "vulkan"; break;
    case 8: name = "metal"; break;
    case 10: name = "rocm"; break;
    case 13: name = "cuda_managed"; break;
    case 14: name = "oneapi"; break;
    default: return "DLPack device type " + std::to_string(type) + ":" + std::to_string(id);
  }
  return std::string(name) + ":" + std::to_string(id);
}

[[noreturn]] void raise_device(const char* op, const char* arg, int64_t type, int64_t id) {
  throw nb::value_error((arg_prefix(op, arg) + "expected a CPU array, got one on " +
                         device_text(type, id) + " (move it first: tensor.cpu())")
                            .c_str());
}

std::string object_type_name(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

// Why an object with __dlpack__ could not be imported (a torch tensor that requires grad
// refuses the export, for one): its own message, or "" when it has no __dlpack__.
std::string dlpack_failure(nb::handle obj) {
  if (!nb::hasattr(obj, "__dlpack__")) return "";
  try {
    obj.attr("__dlpack__")();
  } catch (nb::python_error& e) {
    return std::string(" whose __dlpack__() failed: ") + nb::type_name(e.type()).c_str() + ": " +
           nb::str(e.value()).c_str();
  }
  return " whose DLPack capsule could not be read";
}

}  // namespace

std::string dtype_name(nb::dlpack::dtype dt) {
  using code = nb::dlpack::dtype_code;
  std::string base;
  switch (static_cast<code>(dt.code)) {
    case code::Int: base = "int"; break;
    case code::UInt: base = "uint"; break;
    case code::Float: base = "float"; break;
    case code::Bfloat: base = "bfloat"; break;
    case code::Complex: base = "complex"; break;
    case code::Bool: return "bool";
    default: base = "dtype code " + std::to_string(dt.code) + " bits "; break;
  }
  std::string s = base + std::to_string(dt.bits);
  if (dt.lanes != 1) s += "x" + std::to_string(dt.lanes);
  return s;
}

std::string shape_text(std::span<const int64_t> shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

std::string arg_prefix(const char* op, const char* arg) {
  return std::string("[") + op + "] argument '" + arg + "': ";
}

void raise_dtype(const char* op, const char* arg, nb::dlpack::dtype got, const char* expected) {
  std::string hint = std::string(expected) == "float32"
                         ? " (convert with x.astype(numpy.float32) / tensor.float())"
                         : "";
  throw nb::type_error((arg_prefix(op, arg) + "expected a " + expected + " array, got " +
                        dtype_name(got) + hint)
                           .c_str());
}

nb::ndarray<> checked_array(nb::handle obj, const char* op, const char* arg, bool writable,
                            int min_ndim, int max_ndim) {
  // The device first: an object on a GPU may still hand out a capsule (or refuse to), and the
  // useful message is about where the data lives, not about what the import saw.
  if (nb::hasattr(obj, "__dlpack_device__")) {
    nb::object dev = obj.attr("__dlpack_device__")();
    const auto type = nb::cast<int64_t>(dev[0]);
    const auto id = nb::cast<int64_t>(dev[1]);
    if (type != 1) raise_device(op, arg, type, id);
  }
  nb::ndarray<> a;
  if (!nb::try_cast(obj, a, /*convert=*/false)) {
    nb::ndarray<nb::ro> ro;
    if (writable && nb::try_cast(obj, ro, false))
      throw nb::value_error(
          (arg_prefix(op, arg) + "the array is read-only; the result is written into it").c_str());
    if (!writable && nb::try_cast(obj, ro, false)) {
      a = nb::ndarray<>(ro);
    } else {
      throw nb::type_error((arg_prefix(op, arg) +
                            "expected an array (buffer protocol or __dlpack__), got an object "
                            "of type " +
                            object_type_name(obj) + dlpack_failure(obj))
                               .c_str());
    }
  }
  if (a.device_type() != 1) raise_device(op, arg, a.device_type(), a.device_id());
  const std::span<const int64_t> shape(a.shape_ptr(), a.ndim());
  const auto ndim = static_cast<int>(a.ndim());
  if (ndim < min_ndim || ndim > max_ndim) {
    std::string want = min_ndim == max_ndim ? std::to_string(min_ndim)
                       : max_ndim >= 32     ? "at least " + std::to_string(min_ndim)
                                            : std::to_string(min_ndim) + " to " +
                                                  std::to_string(max_ndim);
    throw nb::value_error((arg_prefix(op, arg) + "expected " + want + " dimension(s), got " +
                           std::to_string(ndim) + " (shape " + shape_text(shape) + ")")
                              .c_str());
  }
  // C-contiguous: element strides equal the row-major ones, except where they cannot matter
  // (extent-1 dimensions, arrays of at most one element).
  if (a.stride_ptr() != nullptr && a.size() > 1) {
    bool contiguous = true;
    int64_t expected = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[static_cast<size_t>(i)] != 1 && a.stride(static_cast<size_t>(i)) != expected)
        contiguous = false;
      expected *= shape[static_cast<size_t>(i)];
    }
    if (!contiguous) {
      std::vector<int64_t> strides(a.stride_ptr(), a.stride_ptr() + ndim);
      throw nb::value_error((arg_prefix(op, arg) + "expected a C-contiguous array, got shape " +
                             shape_text(shape) + " with element strides " + shape_text(strides) +
                             " (use numpy.ascontiguousarray(x) / tensor.contiguous())")
                                .c_str());
    }
  }
  return a;
}

void check_out_shape(const char* op, const char* arg, std::span<const int64_t> got,
                     std::span<const int64_t> expected) {
  bool same = got.size() == expected.size();
  for (size_t i = 0; same && i < got.size(); ++i) same = got[i] == expected[i];
  if (!same)
    throw nb::value_error((arg_prefix(op, arg) + "expected shape " + shape_text(expected) +
                           ", got " + shape_text(got))
                              .c_str());
}

}  // namespace concord::python
