#!/usr/bin/env python3
"""Writes tests/golden/torchao_mx_nvfp4.npz: torchao's MX and NVFP4 quantizer outputs on seeded
inputs, the golden file tests/python/test_torchao_golden.py compares concord against.

torch is a multi-GB install, so this runs once, by hand, in a throwaway venv outside the repo:

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch torchao numpy
    /tmp/torchvenv/bin/python tools/make_torchao_golden.py tests/golden/torchao_mx_nvfp4.npz

Contents (all arrays; `meta` is a JSON string with versions and a description of each key):
  mx_x                      (rows, 32) fp32 inputs, one MX block per row
  mx_{elem}_{rule}_scales   (rows,) uint8 e8m0 codes from torchao's to_mx()
  mx_{elem}_{rule}_codes    (rows, 32) uint8 element codes (e2m1: unpacked, one per byte)
  mx_{elem}_{rule}_packed   e2m1 only: torchao's packed bytes (pack_uint4)
  mx_{elem}_{rule}_deq      (rows, 32) fp32 from torchao's to_dtype() (dequantize)
  nvfp4_{case}_x            (rows, cols) fp32 input tensor of one NVFP4 case
  nvfp4_{case}_{conv}_pts   fp32 per-tensor scale passed to torchao (conv: "torchao" =
                            per_tensor_amax_to_scale(amax) = amax/2688; "te" = 1/(2688/amax),
                            Transformer Engine's decode scale 1/S_enc)
  nvfp4_{case}_{conv}_scales, _codes, _packed, _deq   as for MX (block 1x16)
"""

import json
import sys

import numpy as np
import torch
import torchao
from torchao.prototype.mx_formats import constants as mx_constants
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.kernels import unpack_uint4
from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
from torchao.prototype.mx_formats.nvfp4_tensor import (NVFP4Tensor, nvfp4_quantize,
                                                       per_tensor_amax_to_scale)

BLOCK = 32
ELEMENTS = {
    "e4m3": (torch.float8_e4m3fn, 448.0, 3),
    "e5m2": (torch.float8_e5m2, 57344.0, 2),
    "e2m3": (mx_constants.DTYPE_FP6_E2M3, 7.5, 3),
    "e3m2": (mx_constants.DTYPE_FP6_E3M2, 28.0, 2),
    "e2m1": (torch.float4_e2m1fn_x2, 6.0, 1),
}
RULES = {"floor": "FLOOR", "ceil": "CEIL", "even": "EVEN", "rceil": "RCEIL"}

FLT_MAX = np.float32(np.finfo(np.float32).max)


def f32(v):
    return np.float32(v)


def mx_inputs(rng):
    """One 32-element block per row: random blocks, then named corner cases."""
    rows = []

    def block(amax_value=None, fill_scale=1.0, fill=None):
        b = (rng.standard_normal(BLOCK) * fill_scale).astype(np.float32) if fill is None else fill
        b = np.asarray(b, np.float32).copy()
        if amax_value is not None:
            b = np.clip(b, -abs(amax_value), abs(amax_value))
            b[rng.integers(BLOCK)] = amax_value
        rows.append(b)

    # Random blocks over many magnitudes.
    for _ in range(48):
        block(fill_scale=10.0 ** rng.uniform(-6, 6))
    # amax just below, at, and just above powers of two (the floor(log2f) trap).
    for k in (-126, -100, -20, -3, -1, 0, 1, 2, 3, 7, 8, 9, 15, 16, 60, 127):
        p = np.ldexp(np.float32(1), k)
        for a in (np.nextafter(p, f32(0)), p, np.nextafter(p, f32(np.inf))):
            block(amax_value=a, fill_scale=float(p) / 4)
    # amax exactly max_elem * 2^k and one ulp either side (RCEIL: amax/max vs amax*(1/max)).
    for _, max_elem, mbits in ELEMENTS.values():
        for k in (-20, -3, 0, 1, 5):
            a = np.float32(np.ldexp(max_elem, k))
            for v in (np.nextafter(a, f32(0)), a, np.nextafter(a, f32(np.inf))):
                block(amax_value=v, fill_scale=float(a) / 8)
        # EVEN: amax whose mantissa rounds (half up, at mbits) into the next binade, and not.
        for k in (-2, 0, 4):
            top = np.float32(np.ldexp(2.0 - 2.0 ** -(mbits + 1), k))  # the halfway point
            for v in (np.nextafter(top, f32(0)), top, np.nextafter(top, f32(np.inf))):
                block(amax_value=v)
    # Negative amax, mixed signs.
    block(amax_value=f32(-300.0), fill_scale=100.0)
    # All zeros, signed zeros.
    block(fill=np.zeros(BLOCK))
    block(fill=np.where(np.arange(BLOCK) % 2 == 0, 0.0, -0.0))
    # NaN, +Inf, -Inf in a block.
    for special in (np.nan, np.inf, -np.inf):
        b = rng.standard_normal(BLOCK).astype(np.float32)
        b[5] = special
        block(fill=b)
    # fp32 subnormals only; subnormals mixed with tiny normals; tiny normals.
    block(fill=rng.integers(1, 1 << 23, BLOCK, dtype=np.uint32).view(np.float32))
    sub = rng.integers(1, 1 << 23, BLOCK, dtype=np.uint32).view(np.float32)
    sub[0] = np.float32(np.finfo(np.float32).tiny) * 3
    block(fill=sub)
    block(fill_scale=1e-37)
    # Large magnitudes, up to FLT_MAX (EVEN rounds amax into exponent 255 here).
    block(fill_scale=1e37)
    block(amax_value=FLT_MAX, fill_scale=1e38)
    block(amax_value=np.float32(np.ldexp(1.999, 127)), fill_scale=1e38)
    # Element ties: scale 2^0 for every element format and its grid midpoints (and the
    # values themselves), so the element rounding is exercised at ties.
    for name, (_, max_elem, _) in ELEMENTS.items():
        grid = element_grid(name)
        mids = ((grid[:-1] + grid[1:]) / 2).astype(np.float32)
        pool = np.concatenate([grid, mids])
        for i in range(0, pool.size, BLOCK - 1):
            chunk = pool[i:i + BLOCK - 1]
            b = np.zeros(BLOCK, np.float32)
            b[: chunk.size] = chunk * np.where(rng.random(chunk.size) < 0.5, -1, 1)
            b[-1] = max_elem  # amax = max_elem: FLOOR/CEIL/EVEN/RCEIL all give scale 2^0
            block(fill=b)
    return np.stack(rows)


def element_grid(name):
    """Non-negative finite values of an element format (from its definition)."""
    ebits, mbits, bias, max_elem = {"e4m3": (4, 3, 7, 448.0), "e5m2": (5, 2, 15, 57344.0),
                                    "e2m3": (2, 3, 1, 7.5), "e3m2": (3, 2, 3, 28.0),
                                    "e2m1": (2, 1, 1, 6.0)}[name]
    values = set()
    for e in range(1 << ebits):
        for m in range(1 << mbits):
            v = (m / 2 ** mbits) * 2.0 ** (1 - bias) if e == 0 else \
                (1 + m / 2 ** mbits) * 2.0 ** (e - bias)
            if v <= max_elem:
                values.add(v)
    return np.array(sorted(values), np.float32)


def torchao_mx(x, name, rule):
    dtype = ELEMENTS[name][0]
    t = torch.from_numpy(x)
    scale, data = to_mx(t, dtype, BLOCK, getattr(ScaleCalculationMode, RULES[rule]))
    deq = to_dtype(data, scale, dtype, BLOCK, torch.float32)
    scales = scale.view(torch.uint8).reshape(-1).numpy().copy()
    out = {"scales": scales, "deq": deq.numpy().astype(np.float32)}
    if name == "e2m1":
        out["packed"] = data.view(torch.uint8).numpy().reshape(x.shape[0], -1).copy()
        out["codes"] = unpack_uint4(data.view(torch.uint8)).numpy().reshape(x.shape).copy()
    else:
        out["codes"] = data.view(torch.uint8).numpy().reshape(x.shape).copy()
    return out


def nvfp4_cases(rng):
    cases = {}
    cases["normal"] = rng.standard_normal((32, 64)).astype(np.float32)
    # Block amax spread over 2^-30..2^10 against one tensor amax: small blocks hit the
    # subnormal e4m3 scales (and torchao's clamp to 2^-6).
    spread = rng.standard_normal((64, 32)).astype(np.float32)
    spread *= np.exp2(rng.uniform(-30, 10, (64, 2))).repeat(16, axis=1).astype(np.float32)
    cases["spread"] = spread
    cases["large"] = (rng.standard_normal((8, 32)) * 1e30).astype(np.float32)
    cases["tiny"] = (rng.standard_normal((8, 32)) * 1e-30).astype(np.float32)
    sub = rng.integers(1, 1 << 23, (8, 32), dtype=np.uint32).view(np.float32)
    cases["fp32_subnormal"] = sub
    zeros_and_one = np.zeros((4, 32), np.float32)
    zeros_and_one[2, 17] = 3.0
    cases["zero_blocks"] = zeros_and_one
    # e2m1 ties: tensor amax 448*6 makes S_enc 1; block amax 6 gives block scale 1.
    grid = element_grid("e2m1")
    pool = np.concatenate([grid, (grid[:-1] + grid[1:]) / 2]).astype(np.float32)
    ties = np.zeros((4, 32), np.float32)
    for r in range(4):
        ties[r, :] = rng.choice(pool, 32) * np.where(rng.random(32) < 0.5, -1, 1)
        ties[r, 0] = 6.0
        ties[r, 16] = 6.0
    ties[0, 1] = 448.0 * 6.0
    cases["ties"] = ties
    return cases


def torchao_nvfp4(x, pts):
    t = torch.from_numpy(x)
    pts_t = torch.tensor(pts, dtype=torch.float32)
    scales, packed = nvfp4_quantize(t, 16, pts_t)
    nv = NVFP4Tensor.to_nvfp4(t, 16, per_tensor_scale=pts_t)
    assert torch.equal(nv.qdata.view(torch.uint8), packed.view(torch.uint8))
    deq = nv.dequantize(torch.float32)
    return {
        "scales": scales.view(torch.uint8).numpy().reshape(x.shape[0], -1).copy(),
        "packed": packed.view(torch.uint8).numpy().copy(),
        "codes": unpack_uint4(packed.view(torch.uint8)).numpy().reshape(x.shape).copy(),
        "deq": deq.numpy().astype(np.float32),
    }


def main(path):
    rng = np.random.default_rng(20240617)
    out = {}
    meta = {
        "torch": torch.__version__,
        "torchao": torchao.__version__,
        "numpy": np.__version__,
        "generator": "tools/make_torchao_golden.py",
        "mx_block": BLOCK,
        "mx_elements": list(ELEMENTS),
        "mx_rules": list(RULES),
        "nvfp4_conventions": {
            "torchao": "per_tensor_scale = per_tensor_amax_to_scale(amax) = amax / (448*6)",
            "te": "per_tensor_scale = 1 / min(448*6 / amax, FLT_MAX) in fp32 (Transformer "
                  "Engine's 1/S_enc)",
        },
    }
    x = mx_inputs(rng)
    out["mx_x"] = x
    for name in ELEMENTS:
        for rule in RULES:
            for key, value in torchao_mx(x, name, rule).items():
                out[f"mx_{name}_{rule}_{key}"] = value
    cases = nvfp4_cases(rng)
    meta["nvfp4_cases"] = list(cases)
    for case, cx in cases.items():
        out[f"nvfp4_{case}_x"] = cx
        amax = torch.from_numpy(cx).abs().max()
        # Transformer Engine: S_enc = min(448*6 / amax, FLT_MAX) (1 when amax is 0).
        s_enc = torch.clamp(torch.tensor(448.0 * 6.0, dtype=torch.float32) / amax,
                            max=float(FLT_MAX))
        conventions = {"te": torch.tensor(1.0, dtype=torch.float32) / s_enc}
        if amax > 0:
            conventions["torchao"] = per_tensor_amax_to_scale(amax)
        for conv, pts in conventions.items():
            pts = np.float32(pts.item())
            out[f"nvfp4_{case}_{conv}_pts"] = np.array([pts], np.float32)
            for key, value in torchao_nvfp4(cx, pts).items():
                out[f"nvfp4_{case}_{conv}_{key}"] = value
    out["meta"] = np.array(json.dumps(meta, indent=1))
    np.savez_compressed(path, **out)
    print(f"wrote {path}: {len(out)} arrays, torch {torch.__version__}, "
          f"torchao {torchao.__version__}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/golden/torchao_mx_nvfp4.npz")
