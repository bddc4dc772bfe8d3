#!/usr/bin/env python3
"""Prepares the GPU contract's inputs (docs/cuda.md) from a CPU logit dump of SmolLM2-135M.

Reads the dump `concord contract dump --kernel fp32 ... --hidden` wrote (logits .npy with its
.rows.json, and the hidden .npy) and the model's GGUF, and writes into OUT (default gpu-inputs/,
git-ignored, carried to the GPU machine; under the device tool's 64 MiB with the repository):
  hidden.npy              (R, 576) float32: the lm_head inputs of R rows spread over the dump
  token_embd.q8_0.npy     (49152, 612) uint8: the GGUF's token_embd blocks as stored (Q8_0: per
                          32 values an fp16 scale and 32 int8 codes; the tied lm_head), decoded
                          on the GPU machine to exactly the fp32 values concord's fp32 kernel uses
                          (an fp16 times an int8 is exact in fp32)
  cpu-fp32.sums.json      (below)
and into REF (default gpu-ref/, git-ignored, kept here: the contract's reference)
  cpu-fp32.npy            (R, 49152) float32: those rows' CPU logits, with cpu-fp32.npy.rows.json
  cpu-fp32.sums.json:     per row, a checksum of the CPU logits' bits: sum_i bits_i * (2i + 1)
                          mod 2^64 (one changed value always changes it), which cuda_gemm compares
                          with the GPU's exact fp32 product

    .venv/bin/python tools/gpu_inputs.py --dump D.npy --hidden H.npy --model M.gguf [--rows 48] [--out gpu-inputs] [--ref gpu-ref]
"""
import argparse
import json
import os
import sys

import numpy as np


def checksum(row: np.ndarray) -> int:
    bits = row.astype(np.float32).view(np.uint32).astype(np.uint64)
    weights = (2 * np.arange(bits.size, dtype=np.uint64) + 1)
    with np.errstate(over="ignore"):
        return int(np.sum(bits * weights, dtype=np.uint64))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", required=True)
    ap.add_argument("--hidden", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--out", default="gpu-inputs")
    ap.add_argument("--ref", default="gpu-ref")
    a = ap.parse_args()
    import gguf

    logits = np.load(a.dump, mmap_mode="r")
    hidden = np.load(a.hidden)
    rows = json.load(open(a.dump + ".rows.json"))
    if logits.shape[0] != hidden.shape[0]:
        sys.exit(f"gpu_inputs: {a.dump} has {logits.shape[0]} rows but {a.hidden} has {hidden.shape[0]}")
    pick = np.unique(np.linspace(0, logits.shape[0] - 1, min(a.rows, logits.shape[0])).round().astype(int))
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.ref, exist_ok=True)
    np.save(os.path.join(a.out, "hidden.npy"), np.ascontiguousarray(hidden[pick], dtype=np.float32))
    ref = np.ascontiguousarray(logits[pick], dtype=np.float32)
    np.save(os.path.join(a.ref, "cpu-fp32.npy"), ref)
    sub = {k: [v[i] for i in pick] for k, v in rows.items() if isinstance(v, list) and len(v) == logits.shape[0]}
    json.dump(sub, open(os.path.join(a.ref, "cpu-fp32.npy.rows.json"), "w"))
    json.dump({"rows": [int(i) for i in pick], "sums": [str(checksum(r)) for r in ref]},
              open(os.path.join(a.out, "cpu-fp32.sums.json"), "w"))

    reader = gguf.GGUFReader(a.model)
    (embd,) = [t for t in reader.tensors if t.name == "token_embd.weight"]
    if embd.tensor_type.name != "Q8_0":
        sys.exit(f"gpu_inputs: token_embd is {embd.tensor_type.name}; cuda_gemm decodes Q8_0")
    vocab, width = int(embd.shape[1]), int(embd.shape[0])
    blocks = np.asarray(embd.data, dtype=np.uint8).reshape(vocab, width // 32 * 34)
    np.save(os.path.join(a.out, "token_embd.q8_0.npy"), blocks)
    # A sanity check in fp64 (the bit-exact one is cuda_gemm's): the hidden rows times the
    # dequantized table reproduce the CPU logits to fp32 accuracy.
    d = blocks.reshape(vocab, width // 32, 34)
    scale = d[:, :, :2].copy().view(np.float16).astype(np.float64)
    q = d[:, :, 2:].view(np.int8).astype(np.float64)
    w = (q * scale).reshape(vocab, width)
    z = hidden[pick].astype(np.float64) @ w.T
    err = np.max(np.abs(z - ref)) / np.max(np.abs(ref))
    print(f"gpu_inputs: {len(pick)} rows of {logits.shape[0]}, vocab {vocab}, hidden {width}; "
          f"fp64 hidden . W^T vs the CPU logits: max |d| / max |z| = {err:.2e}")
    if not err < 1e-4:
        sys.exit("gpu_inputs: the hidden states do not reproduce the dump's logits")
    total = sum(os.path.getsize(os.path.join(a.out, f)) for f in ("hidden.npy", "token_embd.q8_0.npy", "cpu-fp32.sums.json"))
    print(f"gpu_inputs: wrote {a.out}/ (carried to the GPU: {total / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
