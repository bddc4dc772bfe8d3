"""concord's GGUF reader, writer and codecs against the format's own package (gguf, PyPI).

(1) Files written by gguf.GGUFWriter, with every metadata type and F32/F16/BF16/Q8_0/MXFP4
    tensors, load in concord with the same metadata (through `concord inspect`) and the same
    values (`concord inspect --dump`, compared bit for bit with gguf.quants.dequantize).
(2) Files concord writes (C API concord_gguf_write -> io::write_gguf) load in gguf.GGUFReader
    with the same metadata, tensor bytes and shapes, and are byte-identical to what GGUFWriter
    writes for the same content.
(3) concord's encoders give the bytes of gguf.quants.quantize on random and edge data, and its
    decoders the values of gguf.quants.dequantize, bit for bit.
$CONCORD_BIN and $CONCORD_CAPI come from ctest.
"""

import ctypes
import json

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V
from gguf.constants import GGML_QUANT_SIZES

# gguf.quants warns (overflow, invalid cast) on the edge data below; its results are still the
# reference, compared byte for byte.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

_U8P = ctypes.POINTER(ctypes.c_uint8)
_F32P = ctypes.POINTER(ctypes.c_float)


class GgufCapi:
    """The concord_gguf_* and concord_ggml_type_traits functions of capi.h."""

    def __init__(self, path):
        lib = ctypes.CDLL(path)
        lib.concord_last_error.restype = ctypes.c_char_p
        lib.concord_ggml_type_traits.argtypes = [
            ctypes.c_uint32, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
            ctypes.c_char_p, ctypes.c_size_t]
        lib.concord_gguf_encode.argtypes = [
            ctypes.c_uint32, _F32P, ctypes.c_size_t, _U8P, ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t)]
        lib.concord_gguf_decode.argtypes = [
            ctypes.c_uint32, _U8P, ctypes.c_size_t, _F32P, ctypes.c_size_t]
        lib.concord_gguf_write.argtypes = [
            ctypes.c_char_p, ctypes.c_char_p, _U8P, ctypes.c_size_t, ctypes.c_uint32]
        for name in ("concord_ggml_type_traits", "concord_gguf_encode", "concord_gguf_decode",
                     "concord_gguf_write"):
            getattr(lib, name).restype = ctypes.c_int32
        self.lib = lib

    def _check(self, status):
        if status != 0:
            raise RuntimeError(self.lib.concord_last_error().decode())

    def type_traits(self, qtype):
        block, size = ctypes.c_int64(), ctypes.c_int64()
        name = ctypes.create_string_buffer(32)
        status = self.lib.concord_ggml_type_traits(int(qtype), block, size, name, 32)
        return None if status != 0 else (name.value.decode(), block.value, size.value)

    def encode(self, qtype, x):
        x = np.ascontiguousarray(x, dtype=np.float32).ravel()
        out = np.empty(x.size * 4 + 64, np.uint8)
        n = ctypes.c_size_t()
        self._check(self.lib.concord_gguf_encode(
            int(qtype), x.ctypes.data_as(_F32P), x.size, out.ctypes.data_as(_U8P), out.size, n))
        return out[:n.value]

    def decode(self, qtype, data, n):
        data = np.ascontiguousarray(data, dtype=np.uint8).ravel()
        out = np.empty(n, np.float32)
        self._check(self.lib.concord_gguf_decode(
            int(qtype), data.ctypes.data_as(_U8P), data.size, out.ctypes.data_as(_F32P), n))
        return out

    def write(self, path, metadata, tensors, alignment=32):
        """metadata: [(key, type name, value[, element type name])]; tensors: [(name, qtype,
        numpy shape, raw bytes)] — dims go to the file ne0 first, as GGUFWriter writes them."""
        spec = {"metadata": [], "tensors": []}
        for key, vtype, value, *element in metadata:
            entry = {"key": key, "type": vtype, "value": value}
            if element:
                entry["element_type"] = element[0]
            spec["metadata"].append(entry)
        blobs = []
        for name, qtype, shape, raw in tensors:
            raw = np.ascontiguousarray(raw).view(np.uint8).ravel()
            spec["tensors"].append({"name": name, "type": int(qtype), "dims": list(shape)[::-1],
                                    "nbytes": int(raw.size)})
            blobs.append(raw)
        data = np.concatenate(blobs) if blobs else np.zeros(0, np.uint8)
        self._check(self.lib.concord_gguf_write(
            str(path).encode(), json.dumps(spec).encode(), data.ctypes.data_as(_U8P), data.size,
            alignment))


@pytest.fixture(scope="session")
def capi(capi_path):
    return GgufCapi(capi_path)


# --- content shared by the tests ---

# (key, GGUF type name as concord prints it, GGUFValueType, value[, element type]) — every type,
# and arrays of every element type.
METADATA = [
    ("general.architecture", "string", V.STRING, "llama"),
    ("t.u8", "uint8", V.UINT8, 255),
    ("t.i8", "int8", V.INT8, -128),
    ("t.u16", "uint16", V.UINT16, 65535),
    ("t.i16", "int16", V.INT16, -32768),
    ("t.u32", "uint32", V.UINT32, 4294967295),
    ("t.i32", "int32", V.INT32, -2147483648),
    ("t.u64", "uint64", V.UINT64, 18446744073709551615),
    ("t.i64", "int64", V.INT64, -9223372036854775808),
    ("t.f32", "float32", V.FLOAT32, float(np.float32(0.1))),
    ("t.f64", "float64", V.FLOAT64, -1.0000000000000002e-300),
    ("t.bool", "bool", V.BOOL, True),
    ("t.str", "string", V.STRING, "caf\u00e9 \"quoted\"\nline \u20ac"),
    ("t.a_u8", "array", V.ARRAY, [0, 1, 255], "uint8"),
    ("t.a_i8", "array", V.ARRAY, [-128, 127], "int8"),
    ("t.a_u16", "array", V.ARRAY, [65535, 0], "uint16"),
    ("t.a_i16", "array", V.ARRAY, [-32768], "int16"),
    ("t.a_u32", "array", V.ARRAY, [4294967295, 3], "uint32"),
    ("t.a_i32", "array", V.ARRAY, [-5, 5, 6], "int32"),
    ("t.a_u64", "array", V.ARRAY, [18446744073709551615, 0], "uint64"),
    ("t.a_i64", "array", V.ARRAY, [-9223372036854775808, 9223372036854775807], "int64"),
    ("t.a_f32", "array", V.ARRAY, [1.5, float(np.float32(-3.3e-5)), 0.0], "float32"),
    ("t.a_f64", "array", V.ARRAY, [1e300, -0.0, 2.5], "float64"),
    ("t.a_bool", "array", V.ARRAY, [True, False, True], "bool"),
    ("t.a_str", "array", V.ARRAY, ["a", "", "\u00e9\u20ac", "tab\there"], "string"),
    ("t.long", "array", V.ARRAY, list(range(1000, 1100)), "int32"),
]
ELEMENT_TYPES = {"uint8": V.UINT8, "int8": V.INT8, "uint16": V.UINT16, "int16": V.INT16,
                 "uint32": V.UINT32, "int32": V.INT32, "uint64": V.UINT64, "int64": V.INT64,
                 "float32": V.FLOAT32, "float64": V.FLOAT64, "bool": V.BOOL, "string": V.STRING}


def tensors_for_test():
    """name -> (qtype, numpy shape, raw bytes as GGUFWriter takes them)."""
    rng = np.random.default_rng(2026)
    x = rng.standard_normal
    out = {}
    for qtype, shape in [(T.F32, (3, 5)), (T.F16, (7,)), (T.BF16, (2, 3, 4)),
                         (T.Q8_0, (4, 64)), (T.MXFP4, (3, 96)), (T.Q8_0, (2, 1, 2, 32))]:
        values = x(shape).astype(np.float32) * np.float32(3.0)
        name = f"blk.{len(out)}.{qtype.name.lower()}"
        out[name] = (qtype, shape, gguf.quants.quantize(values, qtype))
    return out


def write_with_gguf_writer(path, tensors, alignment=None):
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, _, vtype, value, *element in METADATA[1:]:
        w.add_key_value(key, value, vtype, sub_type=ELEMENT_TYPES[element[0]] if element else None)
    for name, (qtype, shape, raw) in tensors.items():
        if qtype in (T.F32, T.F16):
            w.add_tensor(name, raw)
        else:
            w.add_tensor(name, raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def parse_inspect(text):
    """(header line, {key: (type text, value text)}, {name: (type, dims, bytes, offset)})."""
    lines = text.splitlines()
    metadata, tensors = {}, {}
    i = 2
    while lines[i].startswith("  "):
        key, rest = lines[i][2:].split(": ", 1)
        type_text, value_text = rest.split(" = ", 1)
        metadata[key] = (type_text, value_text)
        i += 1
    assert lines[i].split()[:3] == ["tensor", "type", "dims"]
    for line in lines[i + 1:]:
        name, qtype, rest = line.split(None, 2)
        dims_text, numbers = rest.rsplit("]", 1)
        nbytes, offset = numbers.split()
        tensors[name] = (qtype, json.loads(dims_text + "]"), int(nbytes), int(offset))
    return lines[0], metadata, tensors


def printed_element(value, type_name):
    if type_name == "string":
        return json.dumps(value, ensure_ascii=False)
    if type_name == "bool":
        return "true" if value else "false"
    if type_name in ("float32", "float64"):
        # Shortest round-trip decimal in the value's own width; concord (fmt) writes whole
        # numbers without ".0".
        text = str(np.float32(value)) if type_name == "float32" else repr(float(value))
        return text.removesuffix(".0")
    return str(value)


def expected_metadata_text(type_name, value, element=None):
    if type_name != "array":
        return type_name, printed_element(value, type_name)
    shown = ", ".join(printed_element(v, element) for v in value[:8])
    if len(value) > 8:
        shown += ", ..."
    return f"array<{element}>[{len(value)}]", f"[{shown}]"


def dumped(concord, path, name):
    return np.array([np.float32(v) for v in concord("inspect", path, "--dump", name).split()],
                    dtype=np.float32)


def same_bits(a, b):
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


# --- (1) GGUFWriter -> concord ---

@pytest.mark.parametrize("alignment", [None, 64])
def test_gguf_writer_files_load_in_concord(concord, tmp_path, alignment):
    tensors = tensors_for_test()
    path = tmp_path / "ref.gguf"
    write_with_gguf_writer(path, tensors, alignment)
    header, metadata, table = parse_inspect(concord("inspect", path))
    assert f"GGUF v3, alignment {alignment or 32}," in header

    entries = [(key, expected_metadata_text(t, v, *e)) for key, t, _, v, *e in METADATA]
    if alignment is not None:  # GGUFWriter adds it right after general.architecture
        entries.insert(1, ("general.alignment", ("uint32", str(alignment))))
    expected = dict(entries)
    assert metadata == expected
    assert list(metadata) == list(expected)  # file order kept

    reader = gguf.GGUFReader(path)
    for rt in reader.tensors:
        qtype, shape, raw = tensors[rt.name]
        assert table[rt.name] == (qtype.name, list(shape)[::-1], raw.nbytes,
                                  int(rt.data_offset) - reader.data_offset)
        reference = gguf.quants.dequantize(raw, qtype).ravel()
        assert same_bits(dumped(concord, path, rt.name), reference), rt.name


def test_concord_rejects_corrupt_gguf_from_the_writer(concord, tmp_path):
    path = tmp_path / "ref.gguf"
    write_with_gguf_writer(path, tensors_for_test())
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    message = concord("inspect", cut, expect_rc=2)
    assert message.startswith(f"concord: [gguf] {cut}: ") and message.count("\n") == 1


# --- (2) concord -> GGUFReader ---

def spec_metadata():
    return [(key, t, value, *e) for key, t, _, value, *e in METADATA]


@pytest.mark.parametrize("alignment", [32, 64])
def test_concord_files_load_in_gguf_reader_and_match_the_writer(capi, tmp_path, alignment):
    tensors = tensors_for_test()
    ours = tmp_path / "concord.gguf"
    metadata = spec_metadata()
    if alignment != 32:  # where GGUFWriter puts it: right after general.architecture
        metadata.insert(1, ("general.alignment", "uint32", alignment))
    capi.write(ours, metadata,
               [(name, qtype, shape, raw) for name, (qtype, shape, raw) in tensors.items()],
               alignment)

    reader = gguf.GGUFReader(ours)
    assert reader.alignment == alignment
    fields = {f.name: f for f in reader.fields.values()}
    for key, _, vtype, value, *element in METADATA:
        field = fields[key]
        assert field.types[0] == vtype, key
        got = field.contents()
        if vtype == V.FLOAT32:
            assert np.float32(got) == np.float32(value), key
        elif element and element[0] == "float32":
            assert np.array_equal(np.float32(got), np.float32(value)), key
        elif element and element[0] == "float64":
            assert [np.float64(v).tobytes() for v in got] == [np.float64(v).tobytes() for v in value]
        else:
            assert got == value, key
        if element:
            assert field.types[1] == ELEMENT_TYPES[element[0]], key
    for rt in reader.tensors:
        qtype, shape, raw = tensors[rt.name]
        assert rt.tensor_type == qtype
        assert list(rt.shape) == list(shape)[::-1]
        assert bytes(rt.data.tobytes()) == raw.tobytes(), rt.name
    assert [t.name for t in reader.tensors] == list(tensors)

    theirs = tmp_path / "writer.gguf"
    write_with_gguf_writer(theirs, tensors, None if alignment == 32 else alignment)
    assert ours.read_bytes() == theirs.read_bytes()


# --- (3) codecs ---

def test_size_table_matches_gguf_package(capi):
    for qtype in T:
        assert capi.type_traits(qtype) == (qtype.name, *GGML_QUANT_SIZES[qtype]), qtype.name
    for unknown in (4, 5, 31, 32, 33, 36, 37, 38, max(T) + 1, 1000):
        assert capi.type_traits(unknown) is None


def edge_blocks():
    """32-element blocks that stress the scale and rounding rules."""
    blocks = []

    def block(*values):
        b = np.zeros(32, np.float32)
        b[: len(values)] = values
        blocks.append(b)

    block()                                              # zeros
    block(-0.0, -0.0, 0.0)                               # negative zero
    block(1e-40, -3e-39, 1e-45)                          # subnormal amax (Q8_0: 1/d overflows)
    block(3.6e-37, 1e-38)                                # Q8_0: 1/d just finite
    block(2.0 ** -125, -(2.0 ** -126))                   # smallest MXFP4 scale the reference reaches
    block(3.4e38, -3.0e38, 1.0)                          # huge
    block(65504.0 * 127, 1.0)                            # Q8_0 d at the f16 limit
    block(65520.0 * 127, -1.0)                           # Q8_0 d overflows f16 to Inf
    block(1.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -5.0, 7.0, 7.9999995)
    block(127.0, 0.5, -0.5, 1.5, -1.5, 2.5, 63.5, -63.5)  # Q8_0 ties
    for k in range(-120, 128, 7):                        # amax just below powers of two
        for n in (1, 2, 3, 5, 11, 22, 44, 45):
            block(np.float32(2.0 ** k * (1 - n * 2.0 ** -24)), 0.3 * 2.0 ** k)
    return np.stack(blocks)


def random_blocks(seed, n_blocks=512):
    rng = np.random.default_rng(seed)
    scales = np.float32(2.0) ** rng.integers(-60, 60, size=(n_blocks, 1)).astype(np.float32)
    return (rng.standard_normal((n_blocks, 32)).astype(np.float32) * scales).astype(np.float32)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.MXFP4, T.F16, T.BF16, T.F32])
def test_encoders_match_gguf_quantize(capi, qtype):
    edges = edge_blocks()
    if qtype == T.MXFP4:  # below 2^-125 the reference's scale wraps; see the clamp test below
        edges = edges[np.abs(edges).max(axis=1) >= 2.0 ** -125]
    for data in (random_blocks(1), random_blocks(2), edges):
        ours = capi.encode(qtype, data)
        theirs = np.ascontiguousarray(gguf.quants.quantize(data, qtype)).view(np.uint8).ravel()
        assert ours.tobytes() == theirs.tobytes(), qtype.name


def test_half_formats_keep_nan_and_inf_as_the_reference_does(capi):
    specials = np.array([np.inf, -np.inf, 1e6, -1e39, 3.39e38, 3.4e38], np.float32)
    nans = np.array([0x7FC00000, 0x7F800001, 0xFFC12345, 0x7FA00000, 0x7F802000],
                    np.uint32).view(np.float32)
    data = np.concatenate([specials, nans])
    for qtype in (T.F16, T.BF16):
        theirs = np.ascontiguousarray(gguf.quants.quantize(data, qtype)).view(np.uint8).ravel()
        assert capi.encode(qtype, data).tobytes() == theirs.tobytes(), qtype.name


@pytest.mark.parametrize("qtype", [T.Q8_0, T.MXFP4])
def test_block_encoders_reject_non_finite(capi, qtype):
    for bad in (np.nan, np.inf, -np.inf):
        data = np.ones(32, np.float32)
        data[5] = bad
        with pytest.raises(RuntimeError, match="element 5 is"):
            capi.encode(qtype, data)


def test_mxfp4_below_the_reference_range_clamps_the_scale(capi):
    # amax < 2^-125: the reference's exponent goes negative and its uint8 cast wraps (a huge
    # scale, every element 0); concord clamps the scale byte to 0 (2^-127) instead.
    data = np.zeros(32, np.float32)
    data[:3] = [2.0 ** -127, -(2.0 ** -128), 2.0 ** -130]
    ours = capi.encode(T.MXFP4, data)
    assert ours[0] == 0
    decoded = capi.decode(T.MXFP4, ours, 32)
    # 2^-127 is 1.0 at scale 2^-127; 2^-128 is 0.5; 2^-130 rounds to 0.
    assert same_bits(decoded[:3], np.array([2.0 ** -127, -(2.0 ** -128), 0.0], np.float32))
    theirs = np.ascontiguousarray(gguf.quants.quantize(data, T.MXFP4)).view(np.uint8).ravel()
    assert theirs[0] > 127  # wrapped


@pytest.mark.parametrize("qtype", [T.Q8_0, T.MXFP4, T.F16, T.BF16])
def test_decoders_match_gguf_dequantize(capi, qtype):
    block, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=(16384 // block) * size, dtype=np.uint8)
    if qtype == T.MXFP4:  # every scale byte at least once
        raw.reshape(-1, size)[:256, 0] = np.arange(256, dtype=np.uint8)
    n = raw.size // size * block
    reference = gguf.quants.dequantize(raw, qtype).ravel()
    assert same_bits(capi.decode(qtype, raw, n), reference), qtype.name
