// concord.numerics: element codecs, block quantization and descriptors on caller's arrays.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "concord/numerics/block.h"
#include "concord/numerics/check.h"
#include "concord/numerics/convert.h"
#include "concord/numerics/quant_desc.h"
#include "concord/numerics/scalar.h"
#include "names.h"

namespace concord::python {
namespace {

using numerics::Format;
using numerics::QuantDesc;
using numerics::QuantizedTensor;
using numerics::RandomStream;

// A quantized tensor as Python holds it: the C++ result (moved in, never copied) and the shape
// of the array it came from (1-D inputs quantize as one row).
struct QuantizedArray {
  QuantizedTensor q;
  std::vector<int64_t> shape;
};

// Element codes cross as one code per element in the smallest unsigned integer holding the
// format's storage (uint8 for the 8-, 6- and 4-bit formats, uint16 for bf16/fp16, uint32 for
// f32), right-aligned — the values encode_ref returns.
int storage_bytes(Format f) { return numerics::traits(f).storage_bytes(); }
bool is_4bit(Format f) { return numerics::traits(f).bits == 4; }
const char* code_dtype_name(Format f) {
  const int b = storage_bytes(f);
  return b == 1 ? "uint8" : b == 2 ? "uint16" : "uint32";
}

// Bits above a format's width are ignored by decode_ref; the fast kernels read codes as stored,
// so the stray bits are cleared first (6-bit formats only: 4-bit codes are masked by packing).
template <class C>
void encode_typed(Format f, numerics::Rounding r, numerics::Overflow o, const float* x, C* codes,
                  int64_t n, RandomStream rng, uint64_t first, bool reference) {
  if (reference) {
    const bool sr = r == numerics::Rounding::stochastic;
    for (int64_t i = 0; i < n; ++i)
      codes[i] = static_cast<C>(numerics::encode_ref(
          f, x[i], r, o, sr ? rng.word(first + static_cast<uint64_t>(i)) : 0u));
    return;
  }
  if (!is_4bit(f)) {
    numerics::encode_array(f, r, o, x, codes, static_cast<size_t>(n), rng, first);
    return;
  }
  // 4-bit formats pack two codes per byte; Python gets one per byte.
  std::vector<uint8_t> packed(numerics::code_bytes(f, n));
  numerics::encode_array(f, r, o, x, packed.data(), static_cast<size_t>(n), rng, first);
  for (int64_t i = 0; i < n; ++i)
    codes[i] = static_cast<C>((packed[static_cast<size_t>(i / 2)] >> (4 * (i % 2))) & 0xF);
}

template <class C>
void decode_typed(Format f, const C* codes, float* out, int64_t n, bool reference) {
  if (reference) {
    for (int64_t i = 0; i < n; ++i) out[i] = numerics::decode_ref(f, codes[i]);
    return;
  }
  const uint32_t mask = numerics::traits(f).code_mask();
  if (is_4bit(f)) {
    std::vector<uint8_t> packed(numerics::code_bytes(f, n), 0);
    for (int64_t i = 0; i < n; ++i)
      packed[static_cast<size_t>(i / 2)] |=
          static_cast<uint8_t>((codes[i] & mask) << (4 * (i % 2)));
    numerics::decode_array(f, packed.data(), out, static_cast<size_t>(n));
    return;
  }
  if (numerics::traits(f).bits == 6 &&
      std::any_of(codes, codes + n, [&](C c) { return (c & ~mask) != 0; })) {
    std::vector<C> masked(codes, codes + n);
    for (C& c : masked) c = static_cast<C>(c & mask);
    numerics::decode_array(f, masked.data(), out, static_cast<size_t>(n));
    return;
  }
  numerics::decode_array(f, codes, out, static_cast<size_t>(n));
}

template <class C>
array_result encode_as(Format f, numerics::Rounding r, numerics::Overflow o,
                     const ArrayView<const float>& x, RandomStream rng, uint64_t first,
                     bool reference, const array_arg& out) {
  OutArray<C> codes = out_or_new<C>(out, "numerics.encode", x.shape);
  {
    nb::gil_scoped_release release;
    encode_typed<C>(f, r, o, x.data, codes.view.data, x.size, rng, first, reference);
  }
  return codes.result;
}

array_result encode(const array_arg& x_obj, const std::string& format, const std::string& rounding,
                  const std::string& overflow, uint64_t seed, uint32_t stream,
                  uint64_t first_index, bool reference, const array_arg& out) {
  const char* op = "numerics.encode";
  const Format f = format_named(format, op);
  const auto r = rounding_named(rounding, op);
  const auto o = overflow_named(overflow, op);
  const auto x = array_in<float>(x_obj, op, "x");
  const RandomStream rng{seed, stream};
  switch (storage_bytes(f)) {
    case 1: return encode_as<uint8_t>(f, r, o, x, rng, first_index, reference, out);
    case 2: return encode_as<uint16_t>(f, r, o, x, rng, first_index, reference, out);
    default: return encode_as<uint32_t>(f, r, o, x, rng, first_index, reference, out);
  }
}

template <class C>
void decode_as(Format f, const nb::ndarray<>& codes_array, const ArrayView<float>& out,
               bool reference) {
  const auto codes = make_view<const C>(codes_array, "numerics.decode", "codes");
  nb::gil_scoped_release release;
  decode_typed<C>(f, codes.data, out.data, codes.size, reference);
}

array_result decode(const array_arg& codes_obj, const std::string& format, bool reference,
                  const array_arg& out_obj) {
  const char* op = "numerics.decode";
  const Format f = format_named(format, op);
  const nb::ndarray<> codes = any_array_in(codes_obj, op, "codes");
  // The dtype check before anything is allocated, with the dtype this format's codes use.
  const std::string want = code_dtype_name(f);
  if (dtype_name(codes.dtype()) != want)
    raise_dtype(op, "codes", codes.dtype(), (want + " (the storage of " + format + " codes)").c_str());
  const std::vector<int64_t> shape(codes.shape_ptr(), codes.shape_ptr() + codes.ndim());
  OutArray<float> out = out_or_new<float>(out_obj, op, shape);
  switch (storage_bytes(f)) {
    case 1: decode_as<uint8_t>(f, codes, out.view, reference); break;
    case 2: decode_as<uint16_t>(f, codes, out.view, reference); break;
    default: decode_as<uint32_t>(f, codes, out.view, reference); break;
  }
  return out.result;
}

// A descriptor from a QuantDesc or its text (preset name, canonical text or format name),
// with keyword overrides applied.
QuantDesc desc_with(const std::variant<QuantDesc, std::string>& desc,
                    const std::optional<std::string>& scale_rule,
                    const std::optional<std::string>& rounding,
                    const std::optional<std::string>& overflow, std::optional<int> axis,
                    const char* op) {
  QuantDesc d = std::holds_alternative<QuantDesc>(desc) ? std::get<QuantDesc>(desc)
                                                        : desc_named(std::get<std::string>(desc), op);
  if (scale_rule) d.scale_rule = scale_rule_named(*scale_rule, op);
  if (rounding) d.rounding = rounding_named(*rounding, op);
  if (overflow) d.overflow = overflow_named(*overflow, op);
  if (axis) d.axis = *axis;
  return d;
}

// rows x cols of a 1-D (one row) or 2-D input.
std::pair<int64_t, int64_t> matrix_shape(const std::vector<int64_t>& shape) {
  return shape.size() == 1 ? std::pair<int64_t, int64_t>{1, shape[0]}
                           : std::pair<int64_t, int64_t>{shape[0], shape[1]};
}

QuantizedArray quantize(const array_arg& x_obj, const std::variant<QuantDesc, std::string>& desc,
                        const std::optional<std::string>& scale_rule,
                        const std::optional<std::string>& rounding,
                        const std::optional<std::string>& overflow, std::optional<int> axis,
                        uint64_t seed, uint32_t stream, bool reference) {
  const char* op = "numerics.quantize";
  const QuantDesc d = desc_with(desc, scale_rule, rounding, overflow, axis, op);
  const auto x = array_in<float>(x_obj, op, "x", 1, 2);
  const auto [rows, cols] = matrix_shape(x.shape);
  numerics::validate(d, rows, cols);
  QuantizedArray result;
  result.shape = x.shape;
  {
    nb::gil_scoped_release release;
    result.q = reference ? numerics::quantize_ref(d, x.data, rows, cols, {seed, stream})
                         : numerics::quantize(d, x.data, rows, cols, {seed, stream});
  }
  return result;
}

array_result dequantize(const QuantizedArray& q, bool reference, const array_arg& out_obj) {
  OutArray<float> out = out_or_new<float>(out_obj, "numerics.dequantize", q.shape);
  nb::gil_scoped_release release;
  if (reference)
    numerics::dequantize_ref(q.q, out.view.data);
  else
    numerics::dequantize(q.q, out.view.data);
  return out.result;
}

array_result fake_quantize(const array_arg& x_obj, const std::variant<QuantDesc, std::string>& desc,
                         const std::optional<std::string>& scale_rule,
                         const std::optional<std::string>& rounding,
                         const std::optional<std::string>& overflow, std::optional<int> axis,
                         uint64_t seed, uint32_t stream, bool reference, const array_arg& out_obj) {
  const char* op = "numerics.fake_quantize";
  const QuantDesc d = desc_with(desc, scale_rule, rounding, overflow, axis, op);
  const auto x = array_in<float>(x_obj, op, "x", 1, 2);
  const auto [rows, cols] = matrix_shape(x.shape);
  numerics::validate(d, rows, cols);
  OutArray<float> out = out_or_new<float>(out_obj, op, x.shape);
  nb::gil_scoped_release release;
  if (reference) {
    const QuantizedTensor q = numerics::quantize_ref(d, x.data, rows, cols, {seed, stream});
    numerics::dequantize_ref(q, out.view.data);
  } else {
    numerics::fake_quantize(d, x.data, out.view.data, rows, cols, {seed, stream});
  }
  return out.result;
}

QuantizedArray quantized_from_arrays(const std::variant<QuantDesc, std::string>& desc,
                                     const std::vector<int64_t>& shape, const array_arg& packed_obj,
                                     const array_arg& scales_obj, float tensor_scale) {
  const char* op = "numerics.QuantizedArray.from_arrays";
  const QuantDesc d = desc_with(desc, {}, {}, {}, {}, op);
  if (shape.empty() || shape.size() > 2)
    throw InputError(std::string("[") + op + "] shape must have 1 or 2 dimensions, got " +
                     shape_text(shape));
  const auto [rows, cols] = matrix_shape(shape);
  numerics::validate(d, rows, cols);
  QuantizedArray a;
  a.shape = shape;
  a.q.desc = d;
  a.q.rows = rows;
  a.q.cols = cols;
  a.q.tensor_scale = tensor_scale;
  const auto packed = array_in<uint8_t>(packed_obj, op, "packed", 1, 1);
  const auto want_bytes = static_cast<int64_t>(numerics::code_bytes(d.element, rows * cols));
  if (packed.size != want_bytes)
    throw InputError(std::string("[") + op + "] packed holds " + std::to_string(packed.size) +
                     " bytes; a " + shape_text(shape) + " tensor of " +
                     std::string(numerics::traits(d.element).name) + " codes needs " +
                     std::to_string(want_bytes));
  const int64_t want_scales = d.has_scale && !d.is_per_tensor()
                                  ? a.q.block_grid_rows() * a.q.block_grid_cols()
                                  : 0;
  const auto scales = array_in<uint8_t>(scales_obj, op, "scales", 1, 2);
  if (scales.size != want_scales)
    throw InputError(std::string("[") + op + "] scales holds " + std::to_string(scales.size) +
                     " values; " + d.to_string() + " on " + shape_text(shape) + " needs " +
                     std::to_string(want_scales));
  // The one copy of the package: QuantizedTensor owns its buffers (the C++ dequantizers take it).
  a.q.codes.assign(packed.data, packed.data + packed.size);
  a.q.scales.assign(scales.data, scales.data + scales.size);
  return a;
}

nb::dict format_info(const std::string& name) {
  const auto& t = numerics::traits(format_named(name, "numerics.format_info"));
  nb::dict d;
  d["name"] = std::string(t.name);
  d["bits"] = t.bits;
  d["signed"] = t.is_signed;
  d["exponent_bits"] = t.exponent_bits;
  d["mantissa_bits"] = t.mantissa_bits;
  d["bias"] = t.bias;
  d["max_finite"] = t.max_finite;
  d["min_normal"] = t.min_normal;
  d["min_subnormal"] = t.min_subnormal;
  d["emax"] = t.emax;
  d["emin"] = t.emin;
  d["has_inf"] = t.has_inf();
  d["has_nan"] = t.has_nan();
  d["is_integer"] = t.is_integer();
  d["code_dtype"] = std::string(code_dtype_name(t.format));
  return d;
}

}  // namespace

void bind_numerics(nb::module_& m) {
  m.def("formats", &format_names, "The element format names: f32, bf16, fp16, e4m3, ...");
  m.def("block_formats", &block_format_list,
        "The block-format preset names (mxfp8-e4m3, ..., nvfp4, nvfp4-2d, fp8-tensor).");
  m.def("rounding_modes", [] { return std::vector<std::string>{"rne", "rtz", "sr"}; },
        "Rounding mode names (\"stochastic\" is accepted as another name of \"sr\").");
  m.def("overflow_modes", [] { return std::vector<std::string>{"saturate", "ieee"}; },
        "Overflow policy names.");
  m.def("scale_rules", [] { return std::vector<std::string>{"floor", "ceil", "even", "rceil"}; },
        "MX scale rule names (torchao's).");
  m.def("format_info", &format_info, nb::arg("format"),
        "The traits of an element format: bits, exponent/mantissa bits, bias, max_finite, "
        "min_normal, min_subnormal, specials, and code_dtype (the NumPy dtype of its codes).");
  m.def("active_isa", [] { return std::string(numerics::active_isa_name()); },
        "The SIMD kernels the fast paths dispatch to (avx512, avx2 or generic).");

  m.def("encode", &encode, nb::arg("x"), nb::arg("format"), nb::kw_only(),
        nb::arg("rounding") = "rne", nb::arg("overflow") = "saturate", nb::arg("seed") = 0,
        nb::arg("stream") = 0, nb::arg("first_index") = 0, nb::arg("reference") = false,
        nb::arg("out") = nb::none(),
        "Encodes a float32 array into element codes of `format`.\n\n"
        "x: C-contiguous float32 CPU array of any shape (viewed, not copied).\n"
        "Returns one code per element, same shape, dtype uint8 (8/6/4-bit formats), uint16\n"
        "(bf16, fp16) or uint32 (f32), right-aligned as concord's encode_ref returns them; or\n"
        "writes them into `out` (that dtype and shape) and returns `out`.\n"
        "rounding: rne | rtz | sr. sr draws element i's random word from Philox4x32-10 keyed\n"
        "by (seed, stream) at index first_index + i. overflow: saturate | ieee (the library's\n"
        "default is saturate; the CLI `concord codec encode` uses ieee unless --saturate).\n"
        "reference=True runs the scalar reference instead of the SIMD fast path (bit-identical).");
  m.def("decode", &decode, nb::arg("codes"), nb::arg("format"), nb::kw_only(),
        nb::arg("reference") = false, nb::arg("out") = nb::none(),
        "Decodes element codes (dtype as encode returns them) to float32, same shape; into\n"
        "`out` when given. Bits above the format's width are ignored.");

  nb::class_<QuantDesc>(m, "QuantDesc",
                        "A quantized-tensor descriptor: element format x block shape x scale "
                        "format x scale rule x rounding x overflow x axis.")
      .def(
          "__init__",
          [](QuantDesc* self, const std::string& name, const std::optional<std::string>& scale_rule,
             const std::optional<std::string>& rounding, const std::optional<std::string>& overflow,
             std::optional<int> axis) {
            new (self) QuantDesc(desc_with(name, scale_rule, rounding, overflow, axis,
                                           "numerics.QuantDesc"));
          },
          nb::arg("name"), nb::kw_only(), nb::arg("scale_rule") = nb::none(),
          nb::arg("rounding") = nb::none(), nb::arg("overflow") = nb::none(),
          nb::arg("axis") = nb::none(),
          "From a preset name (mxfp8-e4m3, mxfp8-e5m2, mxfp6-e2m3, mxfp6-e3m2, mxfp4, nvfp4,\n"
          "nvfp4-2d, fp8-tensor), an element format name (a plain cast) or the canonical text\n"
          "(element=e4m3;block=1x32;scale=e8m0;rule=floor;axis=1;rounding=rne;overflow=saturate),\n"
          "with optional overrides.")
      .def_prop_rw(
          "element", [](const QuantDesc& d) { return std::string(numerics::traits(d.element).name); },
          [](QuantDesc& d, const std::string& v) { d.element = format_named(v, "numerics.QuantDesc"); },
          "Element format name.")
      .def_prop_rw(
          "block", [](const QuantDesc& d) { return std::pair<int, int>(d.block.rows, d.block.cols); },
          [](QuantDesc& d, std::pair<int, int> v) { d.block = {v.first, v.second}; },
          "Block shape (rows, cols); (0, 0) for per-tensor and plain casts.")
      .def_prop_rw(
          "scale",
          [](const QuantDesc& d) -> std::optional<std::string> {
            if (!d.has_scale) return std::nullopt;
            return std::string(numerics::traits(d.scale).name);
          },
          [](QuantDesc& d, const std::optional<std::string>& v) {
            d.has_scale = v.has_value();
            d.scale = v ? format_named(*v, "numerics.QuantDesc") : Format::f32;
          },
          "Scale format: e8m0 (MX), ue4m3 (NVFP4), f32 (per-tensor), or None (plain cast).")
      .def_prop_rw(
          "scale_rule", [](const QuantDesc& d) { return std::string(numerics::scale_rule_name(d.scale_rule)); },
          [](QuantDesc& d, const std::string& v) { d.scale_rule = scale_rule_named(v, "numerics.QuantDesc"); },
          "MX scale rule: floor | ceil | even | rceil.")
      .def_prop_rw(
          "rounding", [](const QuantDesc& d) { return std::string(numerics::rounding_name(d.rounding)); },
          [](QuantDesc& d, const std::string& v) { d.rounding = rounding_named(v, "numerics.QuantDesc"); },
          "Rounding: rne | rtz | sr.")
      .def_prop_rw(
          "overflow", [](const QuantDesc& d) { return std::string(numerics::overflow_name(d.overflow)); },
          [](QuantDesc& d, const std::string& v) { d.overflow = overflow_named(v, "numerics.QuantDesc"); },
          "Overflow: saturate | ieee.")
      .def_rw("axis", &QuantDesc::axis, "Axis a 1-D block runs along (1: along a row).")
      .def("to_string", &QuantDesc::to_string, "The canonical text (stored in file metadata).")
      .def("__str__", &QuantDesc::to_string)
      .def("__repr__", [](const QuantDesc& d) { return "QuantDesc('" + d.to_string() + "')"; })
      .def("__eq__", [](const QuantDesc& a, const QuantDesc& b) { return a == b; })
      .def("__hash__", [](const QuantDesc& d) { return nb::hash(nb::str(d.to_string().c_str())); });

  nb::class_<QuantizedArray>(m, "QuantizedArray",
                             "The result of quantize(): codes, block scales and tensor scale, "
                             "owned by C++ and seen from NumPy without a copy.")
      .def_static("from_arrays", &quantized_from_arrays, nb::arg("desc"), nb::arg("shape"),
                  nb::arg("packed"), nb::arg("scales"), nb::arg("tensor_scale") = 1.0f,
                  "Rebuilds a quantized tensor from its stored arrays (copied into C++): packed\n"
                  "codes (uint8, block.h layout), block scales (uint8) and the tensor scale.")
      .def_prop_ro("desc", [](const QuantizedArray& a) { return a.q.desc; }, "The descriptor.")
      .def_prop_ro("shape", [](const QuantizedArray& a) { return a.shape; },
                   "Shape of the quantized array (as given to quantize).")
      .def_prop_ro("tensor_scale", [](const QuantizedArray& a) { return a.q.tensor_scale; },
                   "fp32 decode multiplier after the block scale (NVFP4: 1/S_enc; "
                   "fp8-tensor: 1/S; else 1).")
      .def_prop_ro(
          "packed",
          [](nb::handle self) {
            auto& a = nb::cast<QuantizedArray&>(self);
            const int64_t n = static_cast<int64_t>(a.q.codes.size());
            return numpy_view<const uint8_t>(a.q.codes.data(), std::span<const int64_t>(&n, 1), self);
          },
          "The codes as stored (block.h): 16-bit formats 2 bytes little-endian, 8/6-bit one\n"
          "byte each, 4-bit two per byte (element 2k in the low nibble). Read-only view.")
      .def_prop_ro(
          "scales",
          [](nb::handle self) {
            auto& a = nb::cast<QuantizedArray&>(self);
            const std::vector<int64_t> grid =
                a.q.scales.empty() ? std::vector<int64_t>{0}
                                   : std::vector<int64_t>{a.q.block_grid_rows(), a.q.block_grid_cols()};
            return numpy_view<const uint8_t>(a.q.scales.data(), grid, self);
          },
          "Block scale codes (e8m0 or ue4m3), shape (block grid rows, block grid cols); empty\n"
          "without block scales. Read-only view.")
      .def_prop_ro(
          "codes",
          [](nb::handle self) -> array_result {
            auto& a = nb::cast<QuantizedArray&>(self);
            const Format f = a.q.desc.element;
            if (is_4bit(f)) {
              std::vector<uint8_t> codes(static_cast<size_t>(a.q.numel()));
              for (int64_t i = 0; i < a.q.numel(); ++i)
                codes[static_cast<size_t>(i)] = static_cast<uint8_t>(numerics::get_code(f, a.q.codes, i));
              return nb::borrow<array_result>(nb::cast(to_numpy(std::move(codes), a.shape)));
            }
            switch (storage_bytes(f)) {
              case 1: return nb::borrow<array_result>(nb::cast(numpy_view<const uint8_t>(a.q.codes.data(), a.shape, self)));
              case 2:
                return nb::borrow<array_result>(nb::cast(numpy_view<const uint16_t>(
                    reinterpret_cast<const uint16_t*>(a.q.codes.data()), a.shape, self)));
              default:
                return nb::borrow<array_result>(nb::cast(numpy_view<const uint32_t>(
                    reinterpret_cast<const uint32_t*>(a.q.codes.data()), a.shape, self)));
            }
          },
          "One code per element, shape as the input, dtype as encode() returns them: a view of\n"
          "`packed` except for 4-bit formats (unpacked into a new array).")
      .def("dequantize", &dequantize, nb::kw_only(), nb::arg("reference") = false,
           nb::arg("out") = nb::none(), "Same as numerics.dequantize(self, ...).")
      .def("__repr__", [](const QuantizedArray& a) {
        return "QuantizedArray(" + a.q.desc.to_string() + ", shape=" + shape_text(a.shape) + ")";
      });

  m.def("quantize", &quantize, nb::arg("x"), nb::arg("desc"), nb::kw_only(),
        nb::arg("scale_rule") = nb::none(), nb::arg("rounding") = nb::none(),
        nb::arg("overflow") = nb::none(), nb::arg("axis") = nb::none(), nb::arg("seed") = 0,
        nb::arg("stream") = 0, nb::arg("reference") = false,
        "Quantizes a 1-D (one row) or 2-D float32 array with a block descriptor (QuantDesc or\n"
        "its text: 'mxfp8-e4m3', 'mxfp4', 'nvfp4', 'nvfp4-2d', 'fp8-tensor', a format name, or\n"
        "the canonical text); scale_rule/rounding/overflow/axis override the descriptor's.\n"
        "sr: element (r, c) uses Philox word r*cols + c of (seed, stream). reference=True runs\n"
        "quantize_ref; the default is the dispatching fast path (bit-identical).");
  m.def("dequantize", &dequantize, nb::arg("q"), nb::kw_only(), nb::arg("reference") = false,
        nb::arg("out") = nb::none(),
        "x = element * block_scale * tensor_scale in fp32, shape as quantized; into `out` when "
        "given.");
  m.def("fake_quantize", &fake_quantize, nb::arg("x"), nb::arg("desc"), nb::kw_only(),
        nb::arg("scale_rule") = nb::none(), nb::arg("rounding") = nb::none(),
        nb::arg("overflow") = nb::none(), nb::arg("axis") = nb::none(), nb::arg("seed") = 0,
        nb::arg("stream") = 0, nb::arg("reference") = false, nb::arg("out") = nb::none(),
        "dequantize(quantize(x, desc, ...)): the values a quantized GEMM would see.");

  m.def(
      "_quantize_seconds",
      [](const array_arg& x_obj, const std::string& desc, int iterations) {
        // The C++ loop of bench/python_quant_bench.py: quantize() called `iterations` times
        // from C++ on the same view the Python calls use, so that the bench can tell the
        // binding's cost from differences of data and process between it and numerics_bench.
        const char* op = "numerics._quantize_seconds";
        const QuantDesc d = desc_named(desc, op);
        const auto x = array_in<float>(x_obj, op, "x", 2, 2);
        nb::gil_scoped_release release;
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < iterations; ++i) {
          const QuantizedTensor q = numerics::quantize(d, x.data, x.shape[0], x.shape[1]);
          if (q.codes.empty() && x.size > 0) throw InternalError("quantize returned no codes");
        }
        const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
        return elapsed.count() / std::max(iterations, 1);
      },
      nb::arg("x"), nb::arg("desc"), nb::arg("iterations"),
      "Benchmark helper: seconds per numerics::quantize() call timed in C++ on x's view.");
  m.def(
      "_data_pointer",
      [](const array_arg& x) {
        const nb::ndarray<> a = checked_array(x, "numerics._data_pointer", "x", false, 0, 32);
        return reinterpret_cast<uintptr_t>(static_cast<uint8_t*>(a.data_handle()) + a.byte_offset());
      },
      nb::arg("x"),
      "Debug: the address of the first element the C++ sees for `x` (the zero-copy tests "
      "compare it with the array's own data pointer).");
}

}  // namespace concord::python
