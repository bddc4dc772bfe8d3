"""pytest setup for the reference tests: concord's C API ($CONCORD_CAPI) and binary ($CONCORD_BIN).

A missing or unloadable library is an error, never a skip: these tests are how concord is
checked against the field's own implementations, and a silent skip would hide that.
"""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from concord_capi import Capi  # noqa: E402


@pytest.fixture(scope="session")
def capi_path():
    """The path of the built libconcord_capi.so ($CONCORD_CAPI)."""
    path = os.environ.get("CONCORD_CAPI")
    if not path:
        pytest.fail("CONCORD_CAPI is not set: point it at the built libconcord_capi.so "
                    "(ctest sets it; by hand: CONCORD_CAPI=build/lib/libconcord_capi.so)")
    return path


@pytest.fixture(scope="session")
def capi(capi_path):
    return Capi(capi_path)


@pytest.fixture(scope="session")
def concord_bin():
    path = os.environ.get("CONCORD_BIN")
    if not path:
        pytest.fail("CONCORD_BIN is not set: point it at the built concord binary "
                    "(ctest sets it; by hand: CONCORD_BIN=build/bin/concord)")
    return path


@pytest.fixture(scope="session")
def concord(concord_bin):
    """Runs the concord binary; returns stdout (or stderr when a failure is expected)."""

    def run(*args, expect_rc=0):
        result = subprocess.run([concord_bin, *map(str, args)], capture_output=True, text=True)
        assert result.returncode == expect_rc, result.stderr
        return result.stdout if expect_rc == 0 else result.stderr

    return run
