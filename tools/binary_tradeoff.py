#!/usr/bin/env python3
"""The binary-weight trade-off (issue 19): one `concord train` run per optimizer on the same
config, seed, data and steps — fp32 AdamW (the full-precision reference), the latent-weight
baseline, Bop, and ED(b) for each b — and a table of held-out bits per character (the validation
loss in nats per byte over ln 2; the corpus is ASCII, so a byte is a character), the state bits
per binary weight (from the optimizer's allocations, as metrics.jsonl reports them), sign flips
and peak RSS.

  tools/binary_tradeoff.py --concord build/bin/concord --config configs/tiny.json --steps 600 \
      --out runs/binary-tiny [--bits 2,3,4,6,8] [--ed-range 0.125] [--arms ed2,ed3] \
      [--extra "ed --ed-rounding diffused"]

--ed-range R gives the ED(b) arms `--latent-range R` (the residual's grid spans [-R, R]; their runs
are named edB-rR); --arms runs and tabulates only the named arms (fp32-adamw, latent-adamw, bop,
edB or edB-rR, and the --extra names).

Runs already finished in --out are reused (concord train resumes or says it is done), so the
script can be killed and rerun. Prints the table as Markdown and writes it to OUT/tradeoff.md.
"""
import argparse
import json
import math
import os
import shlex
import subprocess
import sys


def run(concord, config, steps, out, name, flags):
    run_dir = os.path.join(out, name)
    cmd = [concord, "train", "--config", config, "--steps", str(steps), "--out", run_dir, "--quiet"] + flags
    print("$ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    val, bits, flips, rss = None, None, 0, 0
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "val_loss" in j:
                val = j["val_loss"]
            if "state_bits_per_binary_weight" in j:
                bits = j["state_bits_per_binary_weight"]
                flips += j.get("sign_flips", 0)
                rss = max(rss, j.get("peak_rss_bytes", 0))
    return {"name": name, "flags": " ".join(flags), "bpc": val / math.log(2), "bits": bits, "flips": flips,
            "rss": rss}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concord", default="build/bin/concord")
    ap.add_argument("--config", default="configs/tiny.json")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--out", default="runs/binary-tradeoff")
    ap.add_argument("--bits", default="2,3,4,6,8")
    ap.add_argument("--ed-range", type=float, default=None, help="--latent-range for the ED(b) arms")
    ap.add_argument("--arms", default=None, help="only these arms, comma-separated (default: all)")
    ap.add_argument("--extra", action="append", default=[], help="another optimizer's flags, e.g. 'ed --ed-bits 4 "
                    "--ed-rounding diffused'")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    runs = [("fp32-adamw", ["--optimizer", "adamw"]), ("latent-adamw", ["--optimizer", "latent-adamw"]),
            ("bop", ["--optimizer", "bop"])]
    if a.ed_range is None:
        runs += [(f"ed{b}", ["--optimizer", "ed", "--ed-bits", str(b)]) for b in a.bits.split(",")]
    else:
        r = f"{a.ed_range:g}"
        runs += [(f"ed{b}-r{r}", ["--optimizer", "ed", "--ed-bits", str(b), "--latent-range", r])
                 for b in a.bits.split(",")]
    for e in a.extra:
        words = e.split()
        runs.append(("-".join(w.lstrip("-") for w in words), ["--optimizer"] + words))
    if a.arms is not None:
        wanted = a.arms.split(",")
        unknown = [w for w in wanted if w not in [name for name, _ in runs]]
        if unknown:
            sys.exit(f"binary_tradeoff.py: no arm named {', '.join(unknown)} (arms: {', '.join(n for n, _ in runs)})")
        runs = [(name, flags) for name, flags in runs if name in wanted]
    rows = [run(a.concord, a.config, a.steps, a.out, name, flags) for name, flags in runs]
    latent = next((r for r in rows if r["name"] == "latent-adamw"), None)

    def vs_latent(r):
        return "" if latent is None else f"{100 * (r['bpc'] / latent['bpc'] - 1):+.2f}%"
    lines = ["| optimizer | flags | held-out BPC | vs latent | state bits / binary weight | less state than latent | "
             "sign flips | peak RSS |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["bits"] is None:
            lines.append(f"| {r['name']} | `{r['flags']}` | {r['bpc']:.4f} | {vs_latent(r)} "
                         f"| 32 master + 64 AdamW (not binary) | | | |")
            continue
        less = "" if latent is None else f"{latent['bits'] / r['bits']:.1f}x"
        lines.append(f"| {r['name']} | `{r['flags']}` | {r['bpc']:.4f} | {vs_latent(r)} | "
                     f"{r['bits']:.3f} | {less} | {r['flips']} | "
                     f"{r['rss'] / 2**20:.0f} MiB |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(a.out, "tradeoff.md"), "w") as f:
        f.write(f"config {a.config}, {a.steps} steps\n\n{table}\n")


if __name__ == "__main__":
    main()
