"""Writes the type stubs python/concord/*.pyi from the built extension (nanobind.stubgen).

Run after changing a binding, with the built package on the path:
    PYTHONPATH=build/python .venv/bin/python python/generate_stubs.py
tests/python/package/test_stubs.py fails while a committed stub differs from what this writes.
Each submodule of the extension (concord._concord.numerics, ...) gets the stub of the thin module
that re-exports it (concord/numerics.pyi, ...); concord/_concord.pyi is the extension's top level.
"""

import os
import subprocess
import sys
import tempfile

PACKAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "concord")
# stub file (in python/concord/) -> the extension module it describes
STUBS = {
    "_concord.pyi": "concord._concord",
    "numerics.pyi": "concord._concord.numerics",
    "export.pyi": "concord._concord.export",
    "contract.pyi": "concord._concord.contract",
    "model.pyi": "concord._concord.model",
}
# Extension submodules whose concord/ module is not a thin re-export but a fully annotated Python
# API of its own (concord/sync.py over concord._concord.sync): a stub there would hide that API
# from type checkers, so they get none.
WRAPPED = {"concord._concord.sync"}


def generate(module, package_path):
    """The stub text nanobind.stubgen writes for `module`, imported from package_path (the
    folder holding the built concord/, e.g. build/python)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "stub.pyi")
        env = dict(os.environ, PYTHONPATH=os.path.abspath(package_path))
        subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", module, "-o", out],
                       check=True, env=env, cwd=tmp, timeout=120)
        with open(out, encoding="utf-8") as f:
            return f.read()


def main():
    package_path = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
    if not package_path:
        sys.exit("set PYTHONPATH to the folder holding the built package (build/python)")
    for name, module in STUBS.items():
        path = os.path.join(PACKAGE_DIR, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(generate(module, package_path))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
