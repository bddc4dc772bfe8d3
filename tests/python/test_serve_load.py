"""The bounded load test of `concord serve` (bench/serve_load.py, issue 17 "Load"): 8 concurrent
streaming clients x 2 requests x 16 tokens on SmolLM2-135M-Instruct with --max-sequences 4, after
the same 16 requests sent one at a time. serve_load.py fails (exit 1) unless every request is
answered exactly once (one completion id, no error, [DONE]), every output (tokens, text,
finish_reason; greedy and seeded) equals the one-at-a-time output, and the server exits 0 on
SIGTERM. The full sweep (1, 8, 32, 128 clients) is bench/serve_run.sh.
"""

import json
import subprocess
import sys
from pathlib import Path

from serve_fixture import ROOT, concord_bin, smollm2_path


def test_bounded_load(tmp_path):
    out = tmp_path / "load.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench/serve_load.py"), "--server-bin",
                        concord_bin(), "--model", smollm2_path(), "--max-sequences", "4",
                        "--levels", "8x2", "--max-tokens", "16", "--wall-cap", "120",
                        "--out", str(out)], capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, f"serve_load.py: rc {r.returncode}\n{r.stdout}\n{r.stderr[-4000:]}"
    report = json.loads(Path(out).read_text())
    (level,) = report["levels"]
    assert level["answered"] == level["requests"] == 16 and not level["problems"]
    assert level["generated_tokens"] == report["reference"]["generated_tokens"] > 0
    assert report["server_exit_status"] == 0
