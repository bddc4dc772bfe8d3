#!/usr/bin/env python3
"""A weight update of SmolLM2-135M-Instruct pushed into a running `concord serve --policy bf16`
(POST /v1/weights through POSIX shared memory, concord.sync.Pusher), against a memcpy of the same
bytes measured in the same run.

    PYTHONPATH=build/python .venv/bin/python bench/weights_update_bench.py [--pushes 5] [--json F]

The learner's state dict is SmolLM2's own weights in fp32 (the GGUF dequantized), nudged each
push so every version differs. Per push: the client's export (rne to bf16) and payload (the C++
Publisher: encode, quantizer hashes, probe forward, serialize), the shared-memory write, and the
server's side as its answer reports it — decode (parse + install + prepare the bf16 copies), the
seven checks, the swap — and the whole round trip. memcpy: the best of 5 copies of a buffer of the
payload's size (numpy), in this process, just before the pushes. Like the other side-by-side
scripts it waits for a quiet machine first (machine.py; FORCE=1 skips the wait).
"""

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import cpu_name, wait_quiet  # noqa: E402
from serve_fixture import Server, concord_bin, smollm2_path  # noqa: E402

import concord  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pushes", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    wait_quiet("bench/weights_update_bench.py")

    gguf = smollm2_path()
    state = concord.Model.load(gguf, "fp32").state_dict()
    state = {k: np.array(v, copy=True) for k, v in state.items()}
    rows = []
    with Server(concord_bin(), gguf, "--policy", "bf16") as server:
        url = f"http://127.0.0.1:{server.port}"
        pusher = concord.sync.Pusher(url)
        for version in range(1, args.pushes + 1):
            for v in state.values():
                v *= np.float32(1.0 + 1e-3)  # a new version: every bf16 value moves
            t0 = time.perf_counter()
            payload = pusher.payload(state, version)
            t_payload = time.perf_counter() - t0
            if version == 1:
                src = np.frombuffer(payload, np.uint8)
                dst = np.empty_like(src)
                memcpy = min(_timed(lambda: np.copyto(dst, src)) for _ in range(5))
            t0 = time.perf_counter()
            answer = pusher.push(state, version)  # payload again + shm write + POST
            t_total = time.perf_counter() - t0
            report = answer["report"]
            s = report["seconds"]
            rows.append({"version": version, "payload_bytes": report["payload_bytes"],
                         "client_payload_s": t_payload, "round_trip_s": t_total,
                         "server_s": answer["seconds"], "decode_s": s["decode"], "install_s": s["install"],
                         "prepare_s": s["prepare"], "checks_s": s["checks"], "swap_s": s["swap"],
                         "checks": {c["check"]: c["seconds"] for c in report["checks"]}})
            r = rows[-1]
            print(f"version {version}: payload {r['payload_bytes'] / 2**20:.1f} MiB; client payload "
                  f"{t_payload * 1e3:.0f} ms; server {r['server_s'] * 1e3:.0f} ms (decode {s['decode'] * 1e3:.0f} = "
                  f"install {s['install'] * 1e3:.0f} + prepare {s['prepare'] * 1e3:.0f}, checks "
                  f"{s['checks'] * 1e3:.0f} of which probe {r['checks']['probe'] * 1e3:.0f}, swap "
                  f"{s['swap'] * 1e3:.3f}); round trip {t_total * 1e3:.0f} ms; memcpy {memcpy * 1e3:.1f} ms",
                  flush=True)
    median = lambda key: float(np.median([r[key] for r in rows]))  # noqa: E731
    summary = {"cpu": cpu_name(), "model": os.path.basename(gguf), "policy": "bf16", "memcpy_s": memcpy,
               "payload_bytes": rows[0]["payload_bytes"], "rows": rows,
               "median": {k: median(k) for k in ("client_payload_s", "server_s", "decode_s", "checks_s",
                                                 "swap_s", "round_trip_s")}}
    m = summary["median"]
    print(f"median: server {m['server_s'] * 1e3:.0f} ms = {m['server_s'] / memcpy:.0f}x memcpy "
          f"({memcpy * 1e3:.1f} ms); checks {m['checks_s'] * 1e3:.0f} ms; round trip {m['round_trip_s'] * 1e3:.0f} ms "
          f"= {m['round_trip_s'] / memcpy:.0f}x memcpy; lscpu model name: {summary['cpu']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
