#!/usr/bin/env python3
"""Issue 23's figures (docs/moe.md "Simulated scale"): expert-parallel MoE layers measured on real
MPI ranks and simulated at 8, 64 and 256 ranks.

1. Trains the two tiny Qwen3-MoE models if their runs are missing (configs/tiny-moe-64.json: 64
   experts top-4; configs/tiny-moe.json: 8 experts top-2; about a minute each).
2. Records routing traces: 12 Bible passages (380 bytes each) and 120 sampled tokens per passage,
   `concord generate --routing-trace`.
3. Real runs (mpirun -np 2, one OpenMP thread a rank, after waiting for a quiet machine): 400
   bytes of Genesis prefilled 16 tokens a pass (64 routed rows) and 40 greedy tokens, under the
   contiguous placement, a rank 3x slower, and EPLB's placement from another passage's loads, each
   twice; `concord ep-sim --calibrate` fits the cost model to the first run of each and predicts
   the repeats (predicted vs measured layer time, per layer and p50/p99).
4. Simulations from the traces (random batches of 2048 tokens of the 64-expert model), at 8, 64
   and 256 ranks, every placement: with the GPU-like default cost model, and with the calibrated
   one; with and without a rank 2x slower; then a Zipf(1) bursty router of 256 experts top-8; then
   the 8-expert model at 2 and 4 ranks, where the exhaustive optimum is computed.

Writes every output under --out and a summary.md of them.
    python3 bench/ep_sim_study.py [--concord build/bin/concord] [--out runs/ep-sim-study] [--tries 2000]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine  # noqa: E402

PASSAGES = ["Gen1:1-Gen2:5", "Exo3:1-Exo4:2", "Psa23:1-Psa25:5", "Mat5:1-Mat5:30", "Joh1:1-Joh1:20",
            "Isa40:1-Isa40:20", "Rom8:1-Rom8:20", "Pro3:1-Pro3:20", "Job38:1-Job38:20", "Rev21:1-Rev21:20",
            "Luk15:11-Luk15:32", "Deu6:1-Deu6:20"]


def bible(ref, n):
    text = subprocess.run(["bible", "-f", ref], capture_output=True, text=True, check=True).stdout
    return text.encode()[:n].decode(errors="ignore")


def run(cmd, env=None, out=None):
    print("+ " + " ".join(cmd if len(" ".join(cmd)) < 300 else cmd[:6] + ["..."]), file=sys.stderr, flush=True)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ep_sim_study: {' '.join(cmd[:4])} failed ({r.returncode}):\n{r.stderr}")
    if out:
        with open(out, "w") as f:
            f.write(r.stdout)
    return r


def real_table(c, mpirun, model, out, loads, repeats=5):
    """The real runs' layer time and waiting, the median of `repeats` runs per configuration
    (docs/moe.md); the balanced router levels with the calibrated cost model (out/cost.json) when
    there is one."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    prompt = bible("Gen1:1-Gen1:10", 400)
    cost = os.path.join(out, "cost.json")
    balanced = ["--router", "balanced"] + (["--ep-cost", cost] if os.path.exists(cost) else [])
    rows = ["| placement | router | rank 1 | layer p50 µs | layer p99 µs | waiting | imbalance |",
            "|---|---|---|---:|---:|---:|---:|"]
    eplb = ["--placement", "eplb", "--placement-loads", loads]
    speed = ["--placement", "speed", "--placement-loads", loads]
    search = ["--placement", "search", "--placement-trace", os.path.join(out, "plan.trace")] + \
        (["--ep-cost", cost] if os.path.exists(cost) else [])
    slow = ["--slow-rank", "1:3"]
    for name, router, extra in (("contiguous", "-", []), ("EPLB", "even", eplb), ("EPLB", "balanced", eplb + balanced),
                                ("contiguous", "-", slow), ("EPLB", "even", eplb + slow),
                                ("EPLB", "balanced", eplb + slow + balanced), ("speed-aware", "even", speed + slow),
                                ("speed-aware", "balanced", speed + slow + balanced),
                                ("search", "balanced", search + ["--router", "balanced"]),
                                ("search", "balanced", search + slow + ["--router", "balanced"])):
        found = []
        for _ in range(repeats):
            r = run([mpirun, "-np", "2", "--oversubscribe", "--mca", "btl", "self,vader", "-x", "OMP_NUM_THREADS", c,
                     "generate", "--model", model, "--prompt", prompt, "--max-tokens", "40", "--temp", "0",
                     "--prefill-chunk", "16", "--expert-parallel"] + extra, env=env)
            line = next((l for l in r.stderr.splitlines() if l.startswith("expert parallel")), "")
            m = re.search(r"([\d.]+)% of the MoE layers' time spent waiting.*p50 ([\d.]+) us, p99 ([\d.]+) us.*up to ([\d.]+)",
                          line)
            if not m:
                sys.exit(f"ep_sim_study: no expert-parallel summary in: {line}")
            found.append([float(x) for x in m.groups()])
        med = [sorted(col)[len(col) // 2] for col in zip(*found)]
        who = "3x slower" if "--slow-rank" in extra else "1x"
        rows.append(f"| {name} | {router} | {who} | {med[1]:.1f} | {med[2]:.1f} | {med[0]:.1f}% | {med[3]:.2f} |")
    text = "\n".join(rows) + "\n"
    with open(os.path.join(out, "real.md"), "w") as f:
        f.write(text)
    return text


def trained(concord, config, run_dir):
    if not os.path.isdir(os.path.join(run_dir, "final")):
        run([concord, "train", "--config", config, "--out", run_dir])
    return os.path.join(run_dir, "final")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concord", default="build/bin/concord")
    ap.add_argument("--out", default="runs/ep-sim-study")
    ap.add_argument("--tries", default="2000", help="the tail search's moves per layer")
    ap.add_argument("--real-only", action="store_true", help="only the real runs and the calibration")
    ap.add_argument("--table-only", action="store_true", help="only the table of real runs by placement")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    c, out = a.concord, a.out
    m64 = trained(c, "configs/tiny-moe-64.json", "runs/tiny-moe-64")
    m8 = trained(c, "configs/tiny-moe.json", "runs/tiny-moe")

    if a.table_only:
        mpirun = shutil.which("mpirun")
        if not mpirun:
            sys.exit("ep_sim_study: --table-only needs mpirun")
        machine.wait_quiet("ep_sim_study")
        loads = os.path.join(out, "loads.json")
        run([c, "generate", "--model", m64, "--prompt", bible("Exo1:1-Exo1:10", 400), "--max-tokens", "100", "--temp",
             "0", "--router-stats", loads, "--routing-trace", os.path.join(out, "plan.trace")])
        print(real_table(c, mpirun, m64, out, loads))
        return
    traces = {m64: [], m8: []}
    for model, tag in ((m64, "e64"), (m8, "e8")):
        for i, ref in enumerate(PASSAGES):
            path = os.path.join(out, f"trace_{tag}_{i + 1}.jsonl")
            run([c, "generate", "--model", model, "--prompt", bible(ref, 380), "--max-tokens", "120", "--temp", "0.8",
                 "--seed", str(i + 1), "--routing-trace", path])
            traces[model].append(path)
    t64 = [x for p in traces[m64] for x in ("--trace", p)]
    t8 = [x for p in traces[m8] for x in ("--trace", p)]

    summary = [f"# ep-sim study ({machine.cpu_name()}, {os.cpu_count()} CPUs)\n"]
    cost = []
    mpirun = shutil.which("mpirun")
    if mpirun:
        machine.wait_quiet("ep_sim_study")
        env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        loads = os.path.join(out, "loads.json")
        run([c, "generate", "--model", m64, "--prompt", bible("Exo1:1-Exo1:10", 400), "--max-tokens", "100", "--temp",
             "0", "--router-stats", loads, "--routing-trace", os.path.join(out, "plan.trace")])
        prompt = bible("Gen1:1-Gen1:10", 400)
        runs = []
        for rep in (1, 2):
            for name, extra in (("contiguous", []), ("slow1x3", ["--slow-rank", "1:3"]),
                                ("eplb", ["--placement", "eplb", "--placement-loads", loads])):
                ep, tr = os.path.join(out, f"real_{name}_{rep}.ep.jsonl"), os.path.join(out, f"real_{name}_{rep}.trace")
                r = run([mpirun, "-np", "2", "--oversubscribe", "--mca", "btl", "self,vader", "-x", "OMP_NUM_THREADS",
                         c, "generate", "--model", m64, "--prompt", prompt, "--max-tokens", "40", "--temp", "0",
                         "--prefill-chunk", "16",
                         "--expert-parallel", "--ep-stats", ep, "--routing-trace", tr] + extra, env=env)
                line = next((l for l in r.stderr.splitlines() if l.startswith("expert parallel")), "")
                summary.append(f"- real {name} (repeat {rep}): {line}\n")
                runs += ["--run", ep, tr]
        cal = run([c, "ep-sim", "--calibrate", *runs, "--fit-runs", "3", "--cost-out", os.path.join(out, "cost.json"),
                   "--json", os.path.join(out, "calibration.json"), "--html", os.path.join(out, "calibration.html")],
                  out=os.path.join(out, "calibration.md"))
        summary += ["\n## Calibration (fitted on the first run of each configuration, the repeats predicted)\n\n", cal.stdout]
        summary += ["\n## Real runs by placement\n\n", real_table(c, mpirun, m64, out, loads)]
        cost = ["--cost", os.path.join(out, "cost.json"), "--exchange", "alltoall"]
    else:
        summary.append("- no mpirun: real runs and calibration skipped\n")

    if a.real_only:
        print("".join(summary))
        return
    sims = [("trace, GPU-like cost", t64 + ["--tokens", "2048"], []),
            ("trace, GPU-like cost, rank 3 2x slower", t64 + ["--tokens", "2048", "--slow-rank", "3:2"], []),
            ("Zipf(1) router, 256 experts top-8, GPU-like cost", ["--zipf", "1"], []),
            ("Zipf(1) router, rank 3 2x slower", ["--zipf", "1", "--slow-rank", "3:2"], [])]
    if cost:
        sims.insert(2, ("trace, calibrated CPU cost (all-to-all)", t64 + ["--tokens", "2048"], cost))
    for i, (title, args, extra) in enumerate(sims):
        r = run([c, "ep-sim", *args, *extra, "--ranks", "8,64,256", "--batches", "200", "--search-tries", a.tries,
                 "--json", os.path.join(out, f"sim{i + 1}.jsonl"), "--html", os.path.join(out, f"sim{i + 1}.html")],
                out=os.path.join(out, f"sim{i + 1}.md"))
        summary += [f"\n## {title}\n\n", r.stdout]
    r = run([c, "ep-sim", *t8, "--tokens", "256", "--ranks", "2,4", "--batches", "200", "--search-tries", a.tries,
             "--policies", "contiguous,eplb,eplb+balanced,search+balanced,optimal,optimal+balanced",
             "--json", os.path.join(out, "small.jsonl")], out=os.path.join(out, "small.md"))
    summary += ["\n## 8 experts at 2 and 4 ranks (the exhaustive optimum)\n\n", r.stdout]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("".join(summary))
    print("".join(summary))


if __name__ == "__main__":
    main()
