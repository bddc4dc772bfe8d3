#!/usr/bin/env python3
"""The RL results on a real model (issue 22): GRPO on SmolLM2-135M-Instruct, every arm with fixed
seeds, resumable, then the tables (OUT/results.md, OUT/results.json) and one HTML report over
every arm (OUT/report.html, `concord rl-report`).

Arms (the same task, batch, steps, learning rate and held-out evaluation in every one):
  Fair Cast   bf16 sampler and learner, the served copy exported from the fp32 master by
              rne, sr and ef, each at seeds 1 and 2 (fc-<rule>-s<seed>)
  precision   mxfp8/mxfp8 (matched), bf16/mxfp8 and fp8-tensor/mxfp8 (mismatched), rne, seed 1
  FP4         nvfp4/nvfp4 and mxfp4/mxfp4, rne, seed 1, against fc-rne-s1 (bf16/bf16)

    python3 scripts/rl_smol_results.py [--out runs/rl-smol] [--steps 200] [--arms fc,prec,fp4]
    python3 scripts/rl_smol_results.py --quick     # every arm, 2 steps, the small built-in model (CI)

A killed run resumes: a finished arm (its summary.json) is kept, an unfinished one continues from
its last checkpoint (`concord rl` on the same --out), and the tables are rebuilt from the run
directories. The model is exported once from the installed GGUF (scripts/smollm2-path) into
OUT/model as fp32 masters, unless --model names a folder. A finished arm's checkpoints (~4 GB each
on SmolLM2) are removed unless --keep-checkpoints. Not part of CI but its --quick.
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAIR_CAST = [(f"fc-{rule}-s{seed}", "bf16", "bf16", rule, seed) for rule in ("rne", "sr", "ef") for seed in (1, 2)]
PRECISION = [("prec-mxfp8-mxfp8", "mxfp8", "mxfp8", "rne", 1),
             ("prec-bf16-mxfp8", "bf16", "mxfp8", "rne", 1),
             ("prec-fp8tensor-mxfp8", "fp8-tensor", "mxfp8", "rne", 1)]
FP4 = [("fp4-nvfp4", "nvfp4", "nvfp4", "rne", 1), ("fp4-mxfp4", "mxfp4", "mxfp4", "rne", 1)]
GROUPS = {"fc": FAIR_CAST, "prec": PRECISION, "fp4": FP4}


def log(msg):
    print(f"[rl_smol_results {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    log(" ".join(cmd))
    r = subprocess.run(cmd, **kw)
    if r.returncode != 0:
        sys.exit(f"rl_smol_results: {cmd[0]} {cmd[1]} exited {r.returncode}")
    return r


def model_folder(args):
    if args.quick and not args.model:
        return None  # the built-in byte-level model, warmed up by concord rl itself
    if args.model:
        return args.model
    folder = os.path.join(args.out, "model")
    if os.path.exists(os.path.join(folder, "model.safetensors")):
        return folder
    gguf = subprocess.run([os.path.join(ROOT, "scripts/smollm2-path")], capture_output=True, text=True)
    if gguf.returncode != 0:
        sys.exit(gguf.stderr.strip() or "rl_smol_results: scripts/smollm2-path failed")
    with open(os.path.join(args.out, "logs", "export.txt"), "w", encoding="utf-8") as out:
        run([args.concord, "export", "--model", gguf.stdout.strip(), "--to", "safetensors", "--out", folder], stdout=out)
    return folder


def expected_config(args, arm):
    """What an arm's config.json must hold for its finished run to count as this arm's."""
    _, sampler, learner, rule, seed = arm
    e = {"sampler": sampler, "learner": learner, "export": rule, "seed": seed,
         "task": {"name": args.task, "difficulty": args.difficulty},
         "grpo/steps": args.steps, "grpo/lr": args.lr, "eval/every": args.eval_every, "eval/prompts": args.eval_prompts}
    if not args.quick:
        e.update({"grpo/prompts_per_step": args.prompts, "grpo/group_size": args.group,
                  "grpo/max_new_tokens": args.max_new})
    return e


def finished(args, arm, d):
    """True when d holds this arm's finished run; exits when it holds another configuration's
    (a rerun would have to discard it: choose another --out)."""
    try:
        with open(os.path.join(d, "summary.json"), encoding="utf-8") as f:
            json.load(f)
        with open(os.path.join(d, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    for key, want in expected_config(args, arm).items():
        have = config
        for part in key.split("/"):
            have = have.get(part) if isinstance(have, dict) else None
        if have != want:
            sys.exit(f"rl_smol_results: {d} is a finished run with {key} = {have!r}, not {want!r}; "
                     f"use another --out (or remove it)")
    return True


def run_arm(args, model, arm):
    name, sampler, learner, rule, seed = arm
    d = os.path.join(args.out, "arms", name)
    if finished(args, arm, d):
        log(f"{name}: finished earlier, kept")
        return d
    cmd = [args.concord, "rl", "--name", name, "--sampler", sampler, "--learner", learner, "--export", rule,
           "--seed", str(seed), "--task", args.task, "--difficulty", str(args.difficulty), "--steps", str(args.steps),
           "--lr", str(args.lr), "--eval-every", str(args.eval_every), "--eval-prompts", str(args.eval_prompts),
           "--checkpoint-every", str(args.checkpoint_every), "--out", d, "--quiet"]
    if args.quick:
        cmd += ["--quick", "--base", os.path.join(args.out, "base")]
    else:
        cmd += ["--prompts", str(args.prompts), "--group", str(args.group), "--max-new", str(args.max_new)]
    if model:
        cmd += ["--init-from", model, "--warmup-steps", "0"]
    t0 = time.time()
    with open(os.path.join(args.out, "logs", name + ".txt"), "a", encoding="utf-8") as out:
        run(cmd, stdout=out)
    log(f"{name}: {time.time() - t0:.0f} s here")
    if not args.keep_checkpoints:  # ~4 GB each on SmolLM2 (master, AdamW moments, Fair Cast meter)
        shutil.rmtree(os.path.join(d, "checkpoints"), ignore_errors=True)
    return d


# ---- tables ------------------------------------------------------------------------------------

def load(d):
    with open(os.path.join(d, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    with open(os.path.join(d, "metrics.jsonl"), encoding="utf-8") as f:
        lines = [json.loads(l) for l in f if l.strip()]
    return summary, lines


def mean(v):
    v = [x for x in v if x is not None and math.isfinite(x)]
    return sum(v) / len(v) if v else float("nan")


def window(lines, key, lo, hi):
    """Mean of `key` over the steps in the fraction [lo, hi) of the run."""
    n = len(lines)
    a, b = int(lo * n), max(int(lo * n) + 1, int(hi * n))
    return mean([l.get(key) for l in lines[a:b]])


def reach(lines, level, width=10):
    """The first step whose trailing mean reward over `width` steps reaches `level` (None: never)."""
    r = [l["reward"] for l in lines]
    for i in range(width - 1, len(r)):
        if sum(r[i + 1 - width:i + 1]) / width >= level:
            return lines[i]["step"]
    return None


def arm_row(d, level):
    s, lines = load(d)
    counts = s.get("lag_counts", [])
    evals = [l["eval"] for l in lines if "eval" in l] + ([s["eval_final"]] if "eval_final" in s else [])
    fin = s.get("eval_final", {})
    return {
        "dir": d, "name": s["name"], "sampler": s["sampler"], "learner": s["learner"], "export": s["export"],
        "steps": s["steps"],
        "reward_first": window(lines, "reward", 0, 0.1), "reward_mid": window(lines, "reward", 0.45, 0.55),
        "reward_last": window(lines, "reward", 0.9, 1.0), "reach_step": reach(lines, level),
        "k3_kl": mean([l.get("rollout_corr/k3_kl") for l in lines]),
        "token_mult_prob_error": mean([l.get("token_mult_prob_error") for l in lines]),
        "entropy": mean([l.get("entropy") for l in lines]),
        "lag_median": s["lag"]["median"], "lag_p90": s["lag"]["p90"], "lag_events": s["lag"]["events"],
        "lag_events_ge_50": sum(counts[50:]), "lag_pending": s["lag"]["pending"],
        "heldout_served": fin.get("reward_served"), "heldout_master": fin.get("reward_master"),
        "greedy_same_final": fin.get("greedy_same"), "greedy_same_mean": mean([e["greedy_same"] for e in evals]),
        "syncs": len(lines), "sync_failures": s["sync_failures"], "seconds": s["seconds"]["total"],
    }


def f3(x):
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3f}"


def g3(x):
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3g}"


def spread(v):
    v = [x for x in v if x is not None and math.isfinite(x)]
    if not v:
        return "-"
    return f"{statistics.mean(v):.3f}" + (f" ({min(v):.3f}-{max(v):.3f})" if len(v) > 1 else "")


def curves(args, fc):
    """The Fair Cast reward curves as tables: the mean reward of each window of steps and the
    held-out reward at each evaluation, per rule, as the mean over seeds (min-max)."""
    rules = [rule for rule in ("rne", "sr", "ef") if any(r["export"] == rule for r in fc)]
    runs = {rule: [load(r["dir"])[1] for r in fc if r["export"] == rule] for rule in rules}
    width = max(1, args.steps // 10)
    out = [f"### Reward curves: sampled reward per {width}-step window", "",
           "| steps | " + " | ".join(rules) + " |", "|---|" + "---|" * len(rules)]
    for lo in range(1, args.steps + 1, width):
        hi = min(args.steps, lo + width - 1)
        cells = []
        for rule in rules:
            means = [mean([l["reward"] for l in lines if lo <= l["step"] <= hi]) for lines in runs[rule]]
            cells.append(spread(means))
        out.append(f"| {lo}-{hi} | " + " | ".join(cells) + " |")
    out += ["", "### Held-out reward (greedy) of the served copy and of its fp32 master at each evaluation", "",
            "| after updates | " + " | ".join(f"{rule} served | {rule} master" for rule in rules) + " |",
            "|---|" + "---|---|" * len(rules)]
    evals = {}
    for rule in rules:
        for lines in runs[rule]:
            for l in lines:
                if "eval" in l:
                    evals.setdefault(l["step"], {}).setdefault(rule, []).append(l["eval"])
    for r in fc:  # the final evaluation, after the last step's update (summary.json)
        s, _ = load(r["dir"])
        if "eval_final" in s:
            evals.setdefault(s["steps"] + 1, {}).setdefault(r["export"], []).append(s["eval_final"])
    for step in sorted(evals):
        cells = []
        for rule in rules:
            e = evals[step].get(rule, [])
            cells += [spread([x["reward_served"] for x in e]), spread([x["reward_master"] for x in e])]
        # an evaluation on step k's metrics line ran on the weights synced before its update
        out.append(f"| {step - 1} | " + " | ".join(cells) + " |")
    return out + ["", "Each cell: the mean over seeds (min-max).", ""]


def tables(args, rows):
    by = {r["name"]: r for r in rows}
    out = [f"# RL on {'the built-in small model (--quick)' if args.quick else 'SmolLM2-135M-Instruct'}",
           "", f"Task {args.task} difficulty {args.difficulty}; {args.steps} GRPO steps of "
           f"{'4 x 4 (--quick)' if args.quick else f'{args.prompts} prompts x {args.group} replies of up to {args.max_new} tokens'}; "
           f"lr {args.lr}; held-out evaluation every {args.eval_every} steps on {args.eval_prompts} prompts (greedy).", ""]
    fc = [r for r in rows if r["name"].startswith("fc-")]
    if fc:
        out += ["## Fair Cast: bf16 served copy from fp32 masters", "",
                f"| export | seeds | reward first 10% | middle 10% | last 10% | steps to {args.reach:g} | held-out reward (served) | held-out (master) "
                "| greedy same, final | greedy same, mean | lag p50 | lag p90 | events | events >= 50 steps | pending | wall s |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for rule in ("rne", "sr", "ef"):
            rs = [r for r in fc if r["export"] == rule]
            if not rs:
                continue
            col = lambda k: [r[k] for r in rs]
            out.append(f"| {rule} | {len(rs)} | {spread(col('reward_first'))} | {spread(col('reward_mid'))} | "
                       f"{spread(col('reward_last'))} | {'/'.join(str(x) if x else '-' for x in col('reach_step'))} | {spread(col('heldout_served'))} | {spread(col('heldout_master'))} | "
                       f"{spread(col('greedy_same_final'))} | {spread(col('greedy_same_mean'))} | "
                       f"{'/'.join(g3(x) for x in col('lag_median'))} | {'/'.join(g3(x) for x in col('lag_p90'))} | "
                       f"{'/'.join(str(x) for x in col('lag_events'))} | {'/'.join(str(x) for x in col('lag_events_ge_50'))} | "
                       f"{'/'.join(str(x) for x in col('lag_pending'))} | {'/'.join(f'{x:.0f}' for x in col('seconds'))} |")
        out += ["", "Spread: the mean over seeds (min-max); a/b: seed 1 / seed 2.", ""]
        out += curves(args, fc)
    prec = [by[a[0]] for a in PRECISION if a[0] in by]
    if prec:
        ref = by.get("prec-fp8tensor-mxfp8")
        out += ["## Matched vs mismatched precision (learner mxfp8)", "",
                "| sampler / learner | mean k3 KL | vs fp8-tensor/mxfp8 | mean token_mult_prob_error | reward last 10% | held-out reward | wall s |",
                "|---|---|---|---|---|---|---|"]
        for r in prec:
            rel = "-"
            if ref and ref["k3_kl"] > 0 and r is not ref:
                rel = f"{100 * (1 - r['k3_kl'] / ref['k3_kl']):.0f}% lower"
            out.append(f"| {r['sampler']} / {r['learner']} | {g3(r['k3_kl'])} | {rel} | {g3(r['token_mult_prob_error'])} | "
                       f"{f3(r['reward_last'])} | {f3(r['heldout_served'])} | {r['seconds']:.0f} |")
        out.append("")
    fp4 = [by[n] for n in ("fc-rne-s1", "fp4-nvfp4", "fp4-mxfp4") if n in by]
    if any(r["name"].startswith("fp4-") for r in fp4):
        out += ["## FP4 end to end", "",
                f"| sampler / learner | reward first 10% | last 10% | steps to {args.reach:g} | held-out reward | mean k3 KL | mean token_mult_prob_error | mean entropy | wall s |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in fp4:
            out.append(f"| {r['sampler']} / {r['learner']} | {f3(r['reward_first'])} | {f3(r['reward_last'])} | "
                       f"{r['reach_step'] or '-'} | {f3(r['heldout_served'])} | {g3(r['k3_kl'])} | {g3(r['token_mult_prob_error'])} | "
                       f"{f3(r['entropy'])} | {r['seconds']:.0f} |")
        out.append("")
    syncs = sum(r["syncs"] for r in rows)
    failures = sum(r["sync_failures"] for r in rows)
    out += ["## Weight syncs", "", f"{syncs} syncs over {len(rows)} arms, each verified by the seven checks: "
            f"{failures} refused (no fault was injected, so every refusal would be a false alarm).", ""]
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concord", default=os.path.join(ROOT, "build/bin/concord"))
    p.add_argument("--out", default=os.path.join(ROOT, "runs/rl-smol"))
    p.add_argument("--model", help="model folder (default: SmolLM2-135M-Instruct exported into OUT/model)")
    p.add_argument("--arms", default="fc,prec,fp4", help="groups (fc, prec, fp4) or arm names, comma-separated")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--max-new", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--task", default="add")
    p.add_argument("--difficulty", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--eval-prompts", type=int, default=32)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--reach", type=float, default=0.8,
                   help="the tables' 'steps to R': first step whose 10-step mean reward reaches R")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep a finished arm's checkpoints (default: removed; its metrics and summary stay)")
    p.add_argument("--quick", action="store_true", help="every arm, 2 steps, the small built-in model (CI smoke)")
    args = p.parse_args()
    if args.quick:
        args.steps, args.eval_every, args.eval_prompts = 2, 1, 4
    for k in ("steps", "prompts", "group", "max_new", "eval_every", "eval_prompts"):
        if getattr(args, k) < 1:
            p.error(f"--{k.replace('_', '-')} must be at least 1")
    arms = []
    for item in args.arms.split(","):
        group = GROUPS.get(item) or [a for g in GROUPS.values() for a in g if a[0] == item]
        if not group:
            p.error(f"--arms: unknown '{item}' (groups fc, prec, fp4, or an arm name)")
        arms += [a for a in group if a not in arms]
    if not os.access(args.concord, os.X_OK):
        sys.exit(f"rl_smol_results: {args.concord} is not an executable (build it: cmake --build build --target concord)")
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    model = model_folder(args)
    dirs = [run_arm(args, model, a) for a in arms]
    rows = [arm_row(d, args.reach) for d in dirs]
    text = tables(args, rows)
    tmp = os.path.join(args.out, "results.md.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    os.replace(tmp, os.path.join(args.out, "results.md"))
    tmp = os.path.join(args.out, "results.json.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
    os.replace(tmp, os.path.join(args.out, "results.json"))
    cmd = [args.concord, "rl-report", "--title", "concord rl: SmolLM2 arms" if not args.quick else "concord rl: arms (--quick)",
           "--out", os.path.join(args.out, "report.html")]
    for d in dirs:
        cmd += ["--run", d]
    run(cmd, stdout=subprocess.DEVNULL)
    print(text)
    print(f"-> {args.out}/results.md, results.json, report.html")


if __name__ == "__main__":
    main()
