"""ctypes binding of concord's C ABI (src/concord/capi/capi.h) for the reference tests.

Arrays go in and come out as NumPy arrays; a nonzero status raises ConcordError with the
library's last-error message.
"""

import ctypes
import enum
import os

import numpy as np


class Format(enum.IntEnum):
    """Stable ids of concord::numerics::Format (format.h)."""

    f32 = 0
    bf16 = 1
    fp16 = 2
    e4m3 = 3
    e5m2 = 4
    e2m3 = 5
    e3m2 = 6
    e2m1 = 7
    e8m0 = 8
    ue4m3 = 9
    int8 = 10
    int4 = 11


class Rounding(enum.IntEnum):
    rne = 0
    rtz = 1
    stochastic = 2


class Overflow(enum.IntEnum):
    saturate = 0
    ieee = 1


class ScaleRule(enum.IntEnum):
    floor = 0
    ceil = 1
    even = 2
    rceil = 3


class ConcordError(RuntimeError):
    pass


_F32P = ctypes.POINTER(ctypes.c_float)
_U32P = ctypes.POINTER(ctypes.c_uint32)
_U8P = ctypes.POINTER(ctypes.c_uint8)
_I32P = ctypes.POINTER(ctypes.c_int32)
_SIZEP = ctypes.POINTER(ctypes.c_size_t)


def _ptr(array, ctype):
    return array.ctypes.data_as(ctype) if array is not None else None


class Capi:
    """The loaded library. Every method mirrors one function of capi.h."""

    def __init__(self, path):
        if not path or not os.path.isfile(path):
            raise FileNotFoundError(
                f"concord C API library not found at {path!r}: build target concord_capi and "
                "set CONCORD_CAPI to its path (ctest sets it)"
            )
        lib = ctypes.CDLL(path)
        self._lib = lib
        sig = {
            "concord_capi_version": (ctypes.c_uint32, []),
            "concord_last_error": (ctypes.c_char_p, []),
            "concord_format_bits": (ctypes.c_int32, [ctypes.c_int32]),
            "concord_format_name": (ctypes.c_char_p, [ctypes.c_int32]),
            "concord_encode_ref": (
                ctypes.c_int32,
                [ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, _F32P, ctypes.c_size_t,
                 ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64, _U32P],
            ),
            "concord_encode_ref_words": (
                ctypes.c_int32,
                [ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, _F32P, _U32P, ctypes.c_size_t,
                 _U32P],
            ),
            "concord_decode_ref": (
                ctypes.c_int32, [ctypes.c_int32, _U32P, ctypes.c_size_t, _F32P]),
            "concord_philox_words": (
                ctypes.c_int32,
                [ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_size_t, _U32P],
            ),
            "concord_mx_scale_code": (
                ctypes.c_int32,
                [_F32P, ctypes.c_size_t, ctypes.c_int32, ctypes.c_int32, _U8P, _I32P],
            ),
            "concord_nvfp4_global_encode_scale": (ctypes.c_int32, [ctypes.c_float, _F32P]),
            "concord_nvfp4_block_scale_code": (
                ctypes.c_int32, [_F32P, ctypes.c_size_t, ctypes.c_float, _U8P]),
            "concord_quant_desc_from_name": (
                ctypes.c_int32, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
            "concord_quantized_sizes": (
                ctypes.c_int32, [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, _SIZEP, _SIZEP]),
            "concord_quantize": (
                ctypes.c_int32,
                [ctypes.c_char_p, _F32P, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint64,
                 ctypes.c_uint32, ctypes.c_int32, _U32P, _U8P, _U8P, _F32P],
            ),
            "concord_dequantize": (
                ctypes.c_int32,
                [ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64, _U8P, _U8P, ctypes.c_float,
                 ctypes.c_int32, _F32P],
            ),
        }
        for name, (restype, argtypes) in sig.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        if lib.concord_capi_version() != 1:
            raise ConcordError(f"unexpected concord_capi_version {lib.concord_capi_version()}")

    def _check(self, status):
        if status != 0:
            raise ConcordError(self._lib.concord_last_error().decode())

    def format_bits(self, fmt):
        return self._lib.concord_format_bits(int(fmt))

    def format_name(self, fmt):
        name = self._lib.concord_format_name(int(fmt))
        return None if name is None else name.decode()

    def encode(self, fmt, x, rounding=Rounding.rne, overflow=Overflow.saturate, seed=0, stream=0,
               first_index=0):
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty(x.shape, np.uint32)
        self._check(self._lib.concord_encode_ref(
            int(fmt), int(rounding), int(overflow), _ptr(x, _F32P), x.size, seed, stream,
            first_index, _ptr(out, _U32P)))
        return out

    def encode_words(self, fmt, x, words, rounding=Rounding.stochastic,
                     overflow=Overflow.saturate):
        x = np.ascontiguousarray(x, dtype=np.float32)
        words = None if words is None else np.ascontiguousarray(words, dtype=np.uint32)
        if words is not None and words.shape != x.shape:
            raise ValueError("words must have the shape of x")
        out = np.empty(x.shape, np.uint32)
        self._check(self._lib.concord_encode_ref_words(
            int(fmt), int(rounding), int(overflow), _ptr(x, _F32P), _ptr(words, _U32P), x.size,
            _ptr(out, _U32P)))
        return out

    def decode(self, fmt, codes):
        codes = np.ascontiguousarray(codes, dtype=np.uint32)
        out = np.empty(codes.shape, np.float32)
        self._check(self._lib.concord_decode_ref(
            int(fmt), _ptr(codes, _U32P), codes.size, _ptr(out, _F32P)))
        return out

    def philox_words(self, seed, stream, first_index, n):
        out = np.empty(n, np.uint32)
        self._check(self._lib.concord_philox_words(seed, stream, first_index, n,
                                                   _ptr(out, _U32P)))
        return out

    def mx_scale(self, amax, element, rule):
        """(e8m0 codes, unbiased exponents) for an array of block amax values."""
        amax = np.ascontiguousarray(amax, dtype=np.float32)
        codes = np.empty(amax.shape, np.uint8)
        exps = np.empty(amax.shape, np.int32)
        self._check(self._lib.concord_mx_scale_code(
            _ptr(amax, _F32P), amax.size, int(element), int(rule), _ptr(codes, _U8P),
            _ptr(exps, _I32P)))
        return codes, exps

    def nvfp4_global_encode_scale(self, tensor_amax):
        out = ctypes.c_float()
        self._check(self._lib.concord_nvfp4_global_encode_scale(float(tensor_amax),
                                                                ctypes.byref(out)))
        return np.float32(out.value)

    def nvfp4_block_scale_code(self, block_amax, global_encode_scale):
        amax = np.ascontiguousarray(block_amax, dtype=np.float32)
        out = np.empty(amax.shape, np.uint8)
        self._check(self._lib.concord_nvfp4_block_scale_code(
            _ptr(amax, _F32P), amax.size, float(global_encode_scale), _ptr(out, _U8P)))
        return out

    def desc_from_name(self, name):
        buf = ctypes.create_string_buffer(512)
        self._check(self._lib.concord_quant_desc_from_name(name.encode(), buf, len(buf)))
        return buf.value.decode()

    def sizes(self, desc, rows, cols):
        code_bytes, scale_count = ctypes.c_size_t(), ctypes.c_size_t()
        self._check(self._lib.concord_quantized_sizes(
            desc.encode(), rows, cols, ctypes.byref(code_bytes), ctypes.byref(scale_count)))
        return code_bytes.value, scale_count.value

    def quantize(self, desc, x, fast=False, seed=0, stream=0):
        """Returns dict(codes=uint32 (rows, cols), packed=uint8, scales=uint8 (grid),
        tensor_scale=float32)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2:
            raise ValueError("quantize takes a 2-D array")
        rows, cols = x.shape
        code_bytes, scale_count = self.sizes(desc, rows, cols)
        codes = np.empty((rows, cols), np.uint32)
        packed = np.empty(code_bytes, np.uint8)
        scales = np.empty(scale_count, np.uint8)
        tensor_scale = ctypes.c_float()
        self._check(self._lib.concord_quantize(
            desc.encode(), _ptr(x, _F32P), rows, cols, seed, stream, 1 if fast else 0,
            _ptr(codes, _U32P), _ptr(packed, _U8P), _ptr(scales, _U8P),
            ctypes.byref(tensor_scale)))
        return {"codes": codes, "packed": packed, "scales": scales,
                "tensor_scale": np.float32(tensor_scale.value)}

    def dequantize(self, desc, rows, cols, packed, scales, tensor_scale, fast=False):
        packed = np.ascontiguousarray(packed, dtype=np.uint8)
        scales = np.ascontiguousarray(scales, dtype=np.uint8)
        out = np.empty((rows, cols), np.float32)
        self._check(self._lib.concord_dequantize(
            desc.encode(), rows, cols, _ptr(packed, _U8P), _ptr(scales, _U8P),
            float(tensor_scale), 1 if fast else 0, _ptr(out, _F32P)))
        return out
