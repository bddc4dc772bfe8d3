"""Python overhead of a quantizer: concord.numerics.quantize on a 64 MiB fp32 tensor from Python
against the C++ Google Benchmark of the same function (numerics_bench BM_quantize), in the same
run, at the same OpenMP thread counts.

The two sides quantize a 4096 x 4096 fp32 tensor of N(0, 1) values with the same descriptor and
the same fast (dispatching) path; each call builds a new QuantizedTensor (the C++ benchmark's
loop does the same), so what differs is the Python side: argument parsing, the zero-copy view
of the NumPy input, the QuantizedArray result. Each result is freed before the next call, as
in the C++ loop (keeping the previous result alive while the next is made, `q = quantize(x)` in
a loop, touches two 16 MiB code buffers in turn instead of one, which costs the same in C++ or
Python; bench/README.md has the figure). The Python process also times the same number of
quantize() calls looped in C++ on the same array (numerics._quantize_seconds): Python / that
loop is the binding's own cost, free of what differs between the two processes (input values,
allocator and page state). Rounds alternate C++ and Python so that a change
in machine load hits both. Reported per thread count: the ratio of the fastest repetitions
(min(Python) / min(C++): the least disturbed by other load on a shared machine, the figure to
quote) and of the medians.

  .venv/bin/python bench/python_quant_bench.py [--build build] [--desc mxfp8-e4m3]
      [--threads 1,2] [--rounds 5] [--json out.json]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

# The C++ benchmark's case name for each descriptor it has.
CPP_CASES = {"mxfp8-e4m3": "mxfp8_e4m3", "mxfp4": "mxfp4", "nvfp4": "nvfp4"}
ROWS, COLS = 4096, 4096  # 64 MiB of fp32, as numerics_bench


def cpp_times(build, case, threads):
    """Seconds per quantize from numerics_bench (JSON), one value per repetition (each of the
    benchmark's own MinTime, 0.5 s)."""
    out = os.path.join(build, f"python_quant_bench_{case}_{threads}.json")
    cmd = [os.path.join(build, "bin", "numerics_bench"),
           f"--benchmark_filter=^BM_quantize/{case}/{threads}/",
           "--benchmark_repetitions=3",
           "--benchmark_report_aggregates_only=false",
           "--benchmark_format=json", f"--benchmark_out={out}"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    with open(out) as f:
        runs = json.load(f)["benchmarks"]
    unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    return [r["real_time"] * unit[r["time_unit"]] for r in runs
            if r.get("run_type") == "iteration"]


PYTHON_SIDE = r"""
import json, sys, time
import numpy as np
import concord.numerics as cn
desc, min_time = sys.argv[1], float(sys.argv[2])
x = np.random.default_rng(1).standard_normal((%d, %d), dtype=np.float32)
cn.quantize(x, desc)  # warm-up: kernels chosen, pages touched
times, loop = [], []
for _ in range(3):  # 3 repetitions of >= min_time each, as the C++ side
    n, t0 = 0, time.perf_counter()
    while True:
        q = cn.quantize(x, desc)
        del q  # freed before the next call, as the C++ loop's q goes out of scope
        n += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time:
            break
    times.append(elapsed / n)
    loop.append(cn._quantize_seconds(x, desc, n))  # the same calls, looped in C++
# The binding's fixed cost per call: a one-block tensor, where the quantizer itself is cheap.
small = np.ones((1, 32), np.float32)
n = 20000
t0 = time.perf_counter()
for _ in range(n):
    q = cn.quantize(small, desc)
    del q
small_python = (time.perf_counter() - t0) / n
small_loop = cn._quantize_seconds(small, desc, n)
print(json.dumps({"times": times, "loop": loop, "isa": cn.active_isa(),
                  "call_overhead_s": small_python - small_loop}))
""" % (ROWS, COLS)


def python_times(package_path, desc, threads, min_time):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=package_path)
    result = subprocess.run([sys.executable, "-c", PYTHON_SIDE, desc, str(min_time)], env=env,
                            check=True, capture_output=True, text=True, timeout=600)
    return json.loads(result.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--desc", default="mxfp8-e4m3", choices=sorted(CPP_CASES))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-time", type=float, default=0.5,
                   help="seconds per Python repetition (numerics_bench's MinTime is 0.5)")
    p.add_argument("--json", help="write the results here too")
    a = p.parse_args()
    build = os.path.abspath(a.build)
    package_path = os.path.join(build, "python")
    case = CPP_CASES[a.desc]
    results = []
    print(f"quantize {a.desc} of a {ROWS}x{COLS} fp32 tensor (64 MiB); {a.rounds} rounds of "
          f"(C++ 3 x 0.5s, Python 3 x {a.min_time}s)")
    print(f"{'threads':>7} {'C++ min ms':>11} {'Python min ms':>14} {'min ratio':>10} "
          f"{'C++ med ms':>11} {'Python med ms':>14} {'med ratio':>10} {'loop med ms':>12} "
          f"{'Py/loop':>10}  isa")
    for threads in [int(t) for t in a.threads.split(",")]:
        cpp, py, loop, overhead, isa = [], [], [], [], "?"
        for _ in range(a.rounds):
            cpp += cpp_times(build, case, threads)
            r = python_times(package_path, a.desc, threads, a.min_time)
            py += r["times"]
            loop += r["loop"]
            overhead.append(r["call_overhead_s"])
            isa = r["isa"]
        c, q = statistics.median(cpp), statistics.median(py)
        cm, qm = min(cpp), min(py)
        lm = statistics.median(loop)
        results.append({"threads": threads, "cpp_min_s": cm, "python_min_s": qm,
                         "min_ratio": qm / cm, "cpp_median_s": c, "python_median_s": q,
                         "median_ratio": q / c, "loop_median_s": lm,
                         "python_vs_loop": q / lm, "cpp_all_s": cpp, "python_all_s": py,
                         "loop_all_s": loop, "call_overhead_s": statistics.median(overhead),
                         "isa": isa})
        print(f"{threads:>7} {cm * 1e3:>11.2f} {qm * 1e3:>14.2f} {qm / cm:>10.3f} "
              f"{c * 1e3:>11.2f} {q * 1e3:>14.2f} {q / c:>10.3f} {lm * 1e3:>12.2f} "
              f"{q / lm:>10.3f}  {isa}")
        print(f"{'':>7} fixed cost of one call from Python (1x32 tensor): "
              f"{statistics.median(overhead) * 1e6:.2f} us")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"desc": a.desc, "rows": ROWS, "cols": COLS, "results": results}, f,
                      indent=1)


if __name__ == "__main__":
    main()
