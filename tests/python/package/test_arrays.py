"""Zero-copy array exchange and the one error style of the package (python/src/bindings.h).

Zero-copy in: the address the C++ reads (numerics._data_pointer) is the caller's own buffer,
for NumPy (DLPack and buffer protocol), an object exposing only __dlpack__/__dlpack_device__,
memoryview, and CPU torch tensors where torch is importable. Zero-copy out: results own the C++
buffer (no copy on return), out= arrays are written in place and returned as themselves, and
results travel on through DLPack. Errors: wrong dtype -> TypeError, wrong strides / device /
dimensions / read-only out -> ValueError, each naming the argument and what it got.
"""

import array
import gc

import numpy as np
import pytest

from concord import export as ce
from concord import numerics as cn


class DLPackOnly:
    """Exposes an array only through the DLPack protocol (as a framework tensor does)."""

    def __init__(self, a, device=(1, 0)):
        self._a = a
        self._device = device

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._device


def test_input_is_viewed_not_copied():
    x = np.arange(64, dtype=np.float32)
    assert cn._data_pointer(x) == x.ctypes.data
    view = x[8:]  # an offset into the same buffer
    assert cn._data_pointer(view) == x.ctypes.data + 8 * 4
    assert cn._data_pointer(DLPackOnly(x)) == x.ctypes.data
    assert cn._data_pointer(memoryview(x)) == x.ctypes.data
    buf = array.array("f", [1.0, 2.0, 3.0])
    assert cn._data_pointer(buf) == buf.buffer_info()[0]
    # what the C++ computes from the view is what it computes from the array
    np.testing.assert_array_equal(cn.encode(DLPackOnly(x), "bf16"), cn.encode(x, "bf16"))
    np.testing.assert_array_equal(cn.encode(buf, "e4m3"),
                                  cn.encode(np.array([1, 2, 3], np.float32), "e4m3"))
    ro = x.copy()
    ro.setflags(write=False)  # read-only inputs are fine
    assert cn._data_pointer(ro) == ro.ctypes.data
    cn.quantize(ro, "mxfp8-e4m3")


def test_results_own_the_cpp_buffer():
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    codes = cn.encode(x, "bf16")
    assert not codes.flags.owndata and codes.base is not None  # owned by the C++ capsule
    q = cn.quantize(x, "mxfp8-e4m3")
    packed, codes8, scales = q.packed, q.codes, q.scales
    assert np.shares_memory(packed, codes8)
    assert cn._data_pointer(packed) == cn._data_pointer(q.packed)  # the same C++ vector each time
    expected = packed.copy()
    del q
    gc.collect()
    np.testing.assert_array_equal(packed, expected)  # the views keep the C++ object alive
    assert scales.shape == (8, 2)


def test_out_arrays_are_written_in_place():
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    out = np.empty((4, 32), np.uint8)
    got = cn.encode(x, "e5m2", out=out)
    assert got is out and np.shares_memory(got, out)
    y = np.empty_like(x)
    assert cn.fake_quantize(x, "nvfp4", out=y) is y
    z = np.empty_like(x)
    assert cn.decode(out, "e5m2", out=z) is z
    served = {"w": np.empty_like(x)}
    assert ce.Exporter("sr", "bf16").export({"w": x}, out=served)["w"] is served["w"]


def test_results_travel_through_dlpack():
    x = np.linspace(-3, 3, 96, dtype=np.float32).reshape(3, 32)
    y = cn.fake_quantize(x, "mxfp4")
    z = np.from_dlpack(y)
    assert np.shares_memory(y, z)
    back = cn.fake_quantize(DLPackOnly(z), "mxfp4")
    np.testing.assert_array_equal(back, y)


def test_torch_tensors_zero_copy():
    torch = pytest.importorskip("torch")  # not in the project venv (CUDA-sized wheel)
    t = torch.randn(16, 64)
    assert cn._data_pointer(t) == t.data_ptr()
    out = torch.empty(16, 64)
    cn.fake_quantize(t, "mxfp8-e4m3", out=out)
    np.testing.assert_array_equal(out.numpy(), cn.fake_quantize(t.numpy(), "mxfp8-e4m3"))
    served = ce.Exporter("sr", "bf16", seed=3).export({"w": t}, output="codes")["w"]
    as_bf16 = torch.from_numpy(served).view(torch.bfloat16)
    np.testing.assert_array_equal(as_bf16.float().numpy(),
                                  ce.Exporter("sr", "bf16", seed=3).export({"w": t.numpy()})["w"])
    with pytest.raises(TypeError, match="expected a float32 array, got float64"):
        cn.encode(t.double(), "bf16")
    with pytest.raises(ValueError, match="C-contiguous"):
        cn.encode(t.t(), "bf16")


# ---- errors ----

def test_wrong_dtype_is_a_type_error_naming_the_argument():
    with pytest.raises(TypeError, match=r"\[numerics.encode\] argument 'x': expected a float32 "
                                        r"array, got float64 \(convert with"):
        cn.encode(np.zeros(4), "bf16")
    with pytest.raises(TypeError, match="expected a float32 array, got int32"):
        cn.quantize(np.zeros((2, 32), np.int32), "mxfp4")
    with pytest.raises(TypeError, match=r"argument 'codes': expected a uint16 \(the storage of "
                                        r"bf16 codes\) array, got uint8"):
        cn.decode(np.zeros(4, np.uint8), "bf16")
    with pytest.raises(TypeError, match="argument 'out': expected a uint8 array, got float32"):
        cn.encode(np.zeros(4, np.float32), "e4m3", out=np.zeros(4, np.float32))
    with pytest.raises(TypeError, match=r"expected an array \(buffer protocol or __dlpack__\), "
                                        r"got an object of type list"):
        cn.encode([1.0, 2.0], "bf16")

    class RefusesExport:  # as a torch tensor that requires grad
        def __dlpack__(self, **kwargs):
            raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(TypeError, match=r"whose __dlpack__\(\) failed: RuntimeError: Can't export "
                                        r"tensors that require gradient, use tensor.detach\(\)"):
        cn.encode(RefusesExport(), "bf16")


def test_strides_are_checked():
    x = np.zeros((8, 64), np.float32)
    with pytest.raises(ValueError, match=r"argument 'x': expected a C-contiguous array, got shape "
                                         r"\(8, 32\) with element strides \(64, 2\)"):
        cn.encode(x[:, ::2], "bf16")
    with pytest.raises(ValueError, match="C-contiguous"):
        cn.quantize(x.T, "mxfp8-e4m3")
    with pytest.raises(ValueError, match="argument 'out': expected a C-contiguous"):
        cn.fake_quantize(x, "mxfp4", out=np.zeros((8, 128), np.float32)[:, ::2])
    # extent-1 dimensions and single elements may have any stride
    cn.encode(x[:1, :], "bf16")
    cn.encode(x[:, :1].reshape(8, 1)[:1], "bf16")


def test_dimensions_are_checked():
    with pytest.raises(ValueError, match=r"argument 'x': expected at least 1 dimension\(s\), got 0"):
        cn.encode(np.float32(1.0) * np.ones((), np.float32), "bf16")
    with pytest.raises(ValueError, match=r"expected 1 to 2 dimension\(s\), got 3 \(shape "
                                         r"\(2, 2, 32\)\)"):
        cn.quantize(np.zeros((2, 2, 32), np.float32), "mxfp4")
    with pytest.raises(ValueError, match=r"argument 'out': expected shape \(4,\), got \(5,\)"):
        cn.encode(np.zeros(4, np.float32), "bf16", out=np.zeros(5, np.uint16))


def test_device_is_checked():
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match=r"argument 'x': expected a CPU array, got one on cuda:0 "
                                         r"\(move it first: tensor.cpu\(\)\)"):
        cn.encode(DLPackOnly(x, device=(2, 0)), "bf16")
    with pytest.raises(ValueError, match="got one on rocm:1"):
        cn.quantize(DLPackOnly(np.zeros((1, 32), np.float32), device=(10, 1)), "mxfp4")
    with pytest.raises(ValueError, match=r"argument 'state\['w'\]': expected a CPU array"):
        ce.Exporter("rne").export({"w": DLPackOnly(np.zeros((2, 2), np.float32), (2, 0))})


def test_read_only_out_is_rejected():
    out = np.zeros(4, np.uint16)
    out.setflags(write=False)
    with pytest.raises(ValueError, match="argument 'out': the array is read-only"):
        cn.encode(np.zeros(4, np.float32), "bf16", out=out)


def test_cpp_input_errors_are_value_errors_with_concords_message():
    import concord
    assert issubclass(concord.InputError, ValueError)
    d = cn.QuantDesc("mxfp8-e4m3")
    d.element = "int8"
    with pytest.raises(concord.InputError, match=r"^\[quantize\] element=int8;block=1x32;.*: "
                                                 r"element format int8 cannot be block-scaled"):
        cn.quantize(np.zeros((2, 32), np.float32), d)
    assert cn.quantize(np.zeros((0, 32), np.float32), "mxfp4").packed.shape == (0,)
