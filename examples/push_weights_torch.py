#!/usr/bin/env python3
"""A PyTorch training loop that uses `concord serve` as its sampler: after every optimizer step the
new weights are pushed into the running server (concord.sync.Pusher -> POST /v1/weights), which
checks them with the seven sync checks and swaps them in between engine steps; a completion now
and then shows which version answered.

    .venv/bin/pip install torch            # not installed by scripts/setup (large)
    PYTHONPATH=build/python .venv/bin/python examples/push_weights_torch.py --steps 50

The model is a small Llama (transformers' LlamaForCausalLM) on bytes (the 259-token byte-level
vocabulary concord gives a model folder without tokenizer.json), trained on the King James Bible
(`bible -f Gen1:1-Rev22:21`, Debian bible-kjv). Its initial weights are written as a model folder,
`concord serve` is started on it (--policy bf16), and every step's state_dict() is pushed with the
sr export rule (stochastic rounding to the server's bf16, keyed by the step). A push the server
refuses raises concord.sync.PushError naming the failed check; the old version keeps serving.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import concord

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READY = re.compile(r"\[serve\] listening on http://([^:\s]+):(\d+)")


def kjv_bytes():
    text = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], stdin=subprocess.DEVNULL, capture_output=True,
                          check=True).stdout
    return torch.tensor(list(text), dtype=torch.long)


def start_server(binary, folder):
    proc = subprocess.Popen([binary, "serve", "--model", folder, "--policy", "bf16", "--port", "0"],
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        sys.stderr.write(line)
        m = READY.search(line)
        if m:
            threading.Thread(target=lambda: [sys.stderr.write(x) for x in proc.stderr], daemon=True).start()
            return proc, f"http://{m.group(1)}:{m.group(2)}"
    raise RuntimeError(f"concord serve exited with {proc.wait()}")


def complete(url, prompt, max_tokens=40):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    return out["weights_version"], out["choices"][0]["text"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--concord", default=os.path.join(ROOT, "build/bin/concord"))
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    config = LlamaConfig(vocab_size=259, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    data = kjv_bytes()
    folder = tempfile.mkdtemp(prefix="concord-push-")
    model.save_pretrained(folder, safe_serialization=True)
    server, url = start_server(args.concord, folder)
    try:
        pusher = concord.sync.Pusher(url, rule="sr", seed=args.seed)  # config and policy: the server's
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        g = torch.Generator().manual_seed(args.seed)
        for step in range(args.steps):
            starts = torch.randint(0, len(data) - args.context - 1, (args.batch,), generator=g)
            batch = torch.stack([data[s:s + args.context + 1] for s in starts.tolist()])
            loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1].clone()).loss  # HF shifts
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            t0 = time.perf_counter()
            answer = pusher.push(model.state_dict(), version=step + 1)
            line = f"step {step + 1}: loss {loss.item():.3f}, pushed version {answer['version']} in " \
                   f"{time.perf_counter() - t0:.3f} s"
            if (step + 1) % 10 == 0 or step + 1 == args.steps:
                version, text = complete(url, "In the beginning")
                line += f"; served by version {version}: {text!r}"
            print(line, flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
