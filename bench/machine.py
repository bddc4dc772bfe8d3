"""What the side-by-side bench scripts share about the machine: waiting until it is quiet (no
compiler running, load average under 1) before measuring, and lscpu's model name for the report."""

import os
import subprocess
import sys
import time


def quiet():
    if subprocess.run(["pgrep", "-x", "cc1plus"], capture_output=True).returncode == 0:
        return False
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0]) < 1.0


def wait_quiet(script, limit=1800):
    """Blocks until the machine is quiet; exits naming `script` after `limit` s. FORCE=1 skips it."""
    if os.environ.get("FORCE"):
        return
    waited = 0
    while not quiet():
        if waited >= limit:
            sys.exit(f"{script}: the machine stayed busy for {waited} s; rerun later or FORCE=1")
        if waited % 60 == 0:
            print(f"waiting for a quiet machine (load {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)
        time.sleep(5)
        waited += 5


def cpu_name():
    """lscpu's model name ("?" when lscpu says none)."""
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")
