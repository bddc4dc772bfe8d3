#!/usr/bin/env python3
"""The slowest build steps of a Ninja build, from its .ninja_log.

    python3 tools/build_slowest.py [BUILD_DIR] [--top N] [--since-last-build] [--json]

Ninja appends one line per finished step to BUILD_DIR/.ninja_log (format v5+: start ms, end ms,
restat mtime, output, command hash). A rebuild appends again, so each output's newest line is
taken. --since-last-build keeps only the steps of the last `ninja` run (Ninja restarts its clock
at 0 for every run, so the last run is the tail after the final drop of the start time).

Prints the top N steps by wall time (compile steps are named by their source, link steps by their
output), then the sum of all steps' times and the span of the run: on 2 cores the span is the
build's wall time, and sum / span says how well the two cores were kept busy.
"""
import argparse
import json
import os
import re
import sys


def read_log(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        header = f.readline()
        m = re.match(r"# ninja log v(\d+)", header)
        if not m:
            sys.exit(f"{path}: not a .ninja_log (first line {header.strip()!r})")
        if int(m.group(1)) < 5:
            sys.exit(f"{path}: ninja log v{m.group(1)} is too old (v5 or newer needed)")
        rows = []
        for n, line in enumerate(f, start=2):
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 5:
                sys.exit(f"{path}:{n}: malformed line (expected 5 tab-separated fields)")
            rows.append((int(parts[0]), int(parts[1]), parts[3]))
    return rows


def last_run(rows):
    """The rows of the last ninja invocation: its clock starts again at 0."""
    start = 0
    for i in range(1, len(rows)):
        if rows[i][0] < rows[i - 1][0] and rows[i][0] < 1000:
            start = i
    return rows[start:]


def describe(output):
    """`.../CMakeFiles/<target>.dir/<path>.cpp.o` -> `<path>.cpp (<target>)`; links as they are."""
    m = re.match(r"(?:.*/)?CMakeFiles/([^/]+)\.dir/(.+)\.o$", output)
    if m:
        return f"{m.group(2)} ({m.group(1)})", "compile"
    if output.endswith(".gch") or ".pch" in output:
        return output, "pch"
    return output, "link"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", nargs="?", default="build", help="build directory (default build)")
    ap.add_argument("--top", type=int, default=20, help="how many steps to list (default 20)")
    ap.add_argument("--since-last-build", action="store_true",
                    help="only the steps of the last ninja run")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    args = ap.parse_args()

    path = os.path.join(args.build, ".ninja_log")
    if not os.path.exists(path):
        sys.exit(f"{path}: no such file (build with the Ninja generator first)")
    rows = read_log(path)
    if args.since_last_build:
        rows = last_run(rows)
    newest = {}
    for start, end, output in rows:
        newest[output] = (start, end)
    if not newest:
        sys.exit(f"{path}: no build steps recorded")
    steps = []
    for output, (start, end) in newest.items():
        name, kind = describe(output)
        steps.append({"step": name, "kind": kind, "seconds": (end - start) / 1000.0})
    steps.sort(key=lambda s: -s["seconds"])
    total = sum(s["seconds"] for s in steps)
    span = (max(e for _, e in newest.values()) - min(s for s, _ in newest.values())) / 1000.0
    by_kind = {}
    for s in steps:
        by_kind[s["kind"]] = by_kind.get(s["kind"], 0.0) + s["seconds"]

    if args.json:
        json.dump({"top": steps[: args.top], "steps": len(steps), "sum_s": total, "span_s": span,
                   "by_kind_s": by_kind}, sys.stdout, indent=1)
        print()
        return
    width = max(len(s["step"]) for s in steps[: args.top])
    for s in steps[: args.top]:
        print(f"{s['seconds']:8.1f} s  {s['step']:<{width}}  [{s['kind']}]")
    kinds = ", ".join(f"{k} {v:.0f} s" for k, v in sorted(by_kind.items()))
    print(f"{len(steps)} steps, {total:.0f} s of step time ({kinds}); "
          f"span {span:.0f} s, {total / span if span else 0:.2f} steps busy on average")


if __name__ == "__main__":
    main()
