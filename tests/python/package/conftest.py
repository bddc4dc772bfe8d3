"""pytest setup for the `concord` package tests: the built package ($CONCORD_PYTHON_PATH, the
folder holding concord/, set by ctest to <build>/python), and the C++ it is compared with — the
C ABI ($CONCORD_CAPI, through ../concord_capi.py) and the CLI ($CONCORD_BIN).

A missing variable or an import of some other `concord` is an error, never a skip: a silent skip
would hide that the package was not tested.
"""

import os
import subprocess
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # concord_capi.py

_PACKAGE_PATH = os.environ.get("CONCORD_PYTHON_PATH")
if not _PACKAGE_PATH:
    raise pytest.UsageError(
        "CONCORD_PYTHON_PATH is not set: point it at the folder holding the built package "
        "(ctest sets it; by hand: CONCORD_PYTHON_PATH=build/python)")
sys.path.insert(0, os.path.abspath(_PACKAGE_PATH))

import concord  # noqa: E402

if not os.path.abspath(concord.__file__).startswith(os.path.abspath(_PACKAGE_PATH)):
    raise pytest.UsageError(f"imported concord from {concord.__file__}, not from "
                            f"CONCORD_PYTHON_PATH={_PACKAGE_PATH}")

from concord_capi import Capi  # noqa: E402


def _required_env(name, hint):
    path = os.environ.get(name)
    if not path:
        pytest.fail(f"{name} is not set: {hint}")
    return path


@pytest.fixture(scope="session")
def capi():
    return Capi(_required_env("CONCORD_CAPI", "ctest sets it; by hand: "
                              "CONCORD_CAPI=build/lib/libconcord_capi.so"))


@pytest.fixture(scope="session")
def concord_cli():
    """Runs the concord binary with stdin text; returns stdout."""
    binary = _required_env("CONCORD_BIN", "ctest sets it; by hand: CONCORD_BIN=build/bin/concord")

    def run(*args, stdin=""):
        result = subprocess.run([binary, *map(str, args)], input=stdin, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return result.stdout

    return run
