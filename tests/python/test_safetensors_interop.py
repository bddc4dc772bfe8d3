"""concord's safetensors reader and writer against the format's own library (safetensors, PyPI).

Files written by safetensors.numpy load in concord with identical tensors (checked through
`concord inspect` and `concord inspect --dump`), and files concord writes load in safetensors
with the expected bytes — byte-identical to what the library itself writes for the same tensors.
The concord binary comes from $CONCORD_BIN (ctest sets it).
"""

import json
import os
import struct
import subprocess

import ml_dtypes
import numpy as np
import pytest
import safetensors
from safetensors import safe_open
from safetensors.numpy import load_file, save, save_file


def header_of(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, json.loads(f.read(n))


def python_tensors():
    rng = np.random.default_rng(2026)
    normal = rng.standard_normal
    return {
        "f32": normal((3, 5)).astype(np.float32),
        "f16": normal((4,)).astype(np.float16),
        "bf16": normal((2, 3)).astype(ml_dtypes.bfloat16),
        "f64": normal((2, 2)),
        "i64": rng.integers(-2**62, 2**62, size=(3,), dtype=np.int64),
        "u64": np.array([0, 2**64 - 1], dtype=np.uint64),
        "i32": rng.integers(-2**31, 2**31, size=(2, 2), dtype=np.int32),
        "u32": np.array([0, 2**32 - 1], dtype=np.uint32),
        "i16": np.array([-32768, 32767, 0], dtype=np.int16),
        "u16": np.array([65535, 1], dtype=np.uint16),
        "i8": np.array([-128, 127], dtype=np.int8),
        "u8": np.arange(6, dtype=np.uint8).reshape(2, 3),
        "bool": np.array([True, False, True]),
        "scalar": np.array(1.25, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "subnormal": np.array([1e-45, -0.0, np.inf, -np.inf], dtype=np.float32),
    }


def parse_inspect_table(text):
    """name -> (dtype, shape, bytes, file offset) from `concord inspect` output."""
    rows = {}
    for line in text.splitlines()[2:]:
        if line.startswith("metadata:"):
            break
        name, dtype, rest = line.split(None, 2)
        shape_text, numbers = rest.rsplit("]", 1)
        nbytes, offset = numbers.split()
        shape = json.loads(shape_text + "]")
        rows[name] = (dtype, shape, int(nbytes), int(offset))
    return rows


def dumped_values(text, dtype):
    lines = text.split()
    if dtype in ("F32", "F16", "BF16"):
        return np.array([np.float32(float(v)) for v in lines], dtype=np.float32)
    if dtype == "F64":
        return np.array([float(v) for v in lines], dtype=np.float64)
    return [int(v) for v in lines]


def test_python_file_loads_in_concord_with_identical_tensors(tmp_path, concord):
    tensors = python_tensors()
    path = tmp_path / "py.safetensors"
    save_file(tensors, str(path), metadata={"format": "np", "note": "written by safetensors"})
    n, header = header_of(path)

    out = concord("inspect", path)
    assert out.splitlines()[0].endswith(f"header {n} bytes, {len(tensors)} tensors, 2 metadata entries")
    assert "  format = np" in out and "  note = written by safetensors" in out
    rows = parse_inspect_table(out)
    assert set(rows) == set(tensors)
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        assert rows[name] == (info["dtype"], info["shape"], end - begin, 8 + n + begin), name

    for name, array in tensors.items():
        dtype = header[name]["dtype"]
        got = dumped_values(concord("inspect", path, "--dump", name), dtype)
        flat = array.reshape(-1)
        if dtype in ("F32", "F16", "BF16"):
            # fp32 is exact for all three; compare bit patterns (-0.0, inf, subnormals included).
            want = flat.astype(np.float32)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name
        elif dtype == "F64":
            assert np.array_equal(got.view(np.uint64), flat.view(np.uint64)), name
        else:
            assert got == [int(v) for v in flat], name


def test_concord_validation_agrees_with_the_library_on_coverage(tmp_path, concord):
    # Both reject a buffer with bytes that belong to no tensor.
    raw = bytearray(save({"a": np.zeros(2, dtype=np.uint8)}))
    raw += b"\0"
    path = tmp_path / "gap.safetensors"
    path.write_bytes(bytes(raw))
    with pytest.raises(Exception):
        safetensors.deserialize(bytes(raw))
    result = subprocess.run([os.environ["CONCORD_BIN"], "inspect", str(path)], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "belong to no tensor" in result.stderr


def make_checkpoint(path):
    rng = np.random.default_rng(7)
    tensors = {
        "model.layers.0.mlp.up_proj.weight": (rng.standard_normal((64, 96)) * 0.02).astype(np.float32),
        "model.layers.0.input_layernorm.weight": (1 + 0.02 * rng.standard_normal(96)).astype(np.float32),
        "model.embed_tokens.weight": rng.standard_normal((2, 16, 32)).astype(ml_dtypes.bfloat16),
        "step": np.array([3], dtype=np.int64),
    }
    save_file(tensors, str(path), metadata={"format": "pt"})
    return tensors


def test_concord_bf16_file_loads_in_safetensors(tmp_path, concord):
    src = tmp_path / "model.safetensors"
    tensors = make_checkpoint(src)
    dst = tmp_path / "bf16.safetensors"
    concord("quant", src, dst, "--format", "bf16", "--skip", "norm")

    loaded = load_file(str(dst))
    assert set(loaded) == set(tensors)
    w = "model.layers.0.mlp.up_proj.weight"
    assert loaded[w].dtype == ml_dtypes.bfloat16 and loaded[w].shape == (64, 96)
    # concord's RNE fp32 -> bf16 equals ml_dtypes' cast, bit for bit.
    assert np.array_equal(loaded[w].view(np.uint16), tensors[w].astype(ml_dtypes.bfloat16).view(np.uint16))
    emb = "model.embed_tokens.weight"
    assert np.array_equal(loaded[emb].view(np.uint16), tensors[emb].view(np.uint16))
    norm = "model.layers.0.input_layernorm.weight"
    assert loaded[norm].dtype == np.float32 and np.array_equal(loaded[norm], tensors[norm])
    assert np.array_equal(loaded["step"], tensors["step"])

    with safe_open(str(dst), framework="np") as f:
        metadata = f.metadata()
    assert metadata["format"] == "pt"
    entry = json.loads(metadata["concord.quant." + w])
    assert entry == {"format": "element=bf16;rounding=rne;overflow=saturate", "dtype": "F32", "shape": [64, 96]}
    assert "concord.quant." + norm not in metadata


def test_concord_mxfp8_layout_decodes_with_ml_dtypes(tmp_path, concord):
    src = tmp_path / "model.safetensors"
    tensors = make_checkpoint(src)
    q = tmp_path / "q.safetensors"
    concord("quant", src, q, "--format", "mxfp8-e4m3", "--skip", "norm")
    d = tmp_path / "d.safetensors"
    concord("dequant", q, d)

    # The library reads concord's F8 tensors as raw bytes (its numpy loader lacks F8 dtypes).
    raw = {name: view for name, view in safetensors.deserialize(q.read_bytes())}
    w = "model.layers.0.mlp.up_proj.weight"
    assert raw[w]["dtype"] == "F8_E4M3" and raw[w]["shape"] == [64, 96]
    assert raw[w + ".scales"]["dtype"] == "F8_E8M0" and raw[w + ".scales"]["shape"] == [64, 3]
    codes = np.frombuffer(bytes(raw[w]["data"]), dtype=ml_dtypes.float8_e4m3fn).reshape(64, 96)
    scales = np.frombuffer(bytes(raw[w + ".scales"]["data"]), dtype=ml_dtypes.float8_e8m0fnu).reshape(64, 3)
    expected = codes.astype(np.float32) * np.repeat(scales.astype(np.float32), 32, axis=1)
    dequantized = load_file(str(d))
    assert np.array_equal(dequantized[w], expected)
    # MXFP8 E4M3 on Gaussian data: relative error ~3%.
    rel = np.linalg.norm(dequantized[w] - tensors[w]) / np.linalg.norm(tensors[w])
    assert 0.01 < rel < 0.05


def test_concord_writes_the_same_bytes_as_the_library(tmp_path, concord):
    src = tmp_path / "model.safetensors"
    make_checkpoint(src)
    q = tmp_path / "q.safetensors"
    concord("quant", src, q, "--format", "mxfp4", "--skip", "norm")
    d = tmp_path / "d.safetensors"
    concord("dequant", q, d)  # written by concord's writer, metadata {"format": "pt"}
    loaded = load_file(str(d))
    with safe_open(str(d), framework="np") as f:
        metadata = f.metadata()
    assert save(loaded, metadata=metadata) == d.read_bytes()
