"""pytest setup for the reference tests: loads concord's C API from $CONCORD_CAPI.

A missing or unloadable library is an error, never a skip: these tests are how concord is
checked against the field's own implementations, and a silent skip would hide that.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from concord_capi import Capi  # noqa: E402


@pytest.fixture(scope="session")
def capi():
    path = os.environ.get("CONCORD_CAPI")
    if not path:
        pytest.fail("CONCORD_CAPI is not set: point it at the built libconcord_capi.so "
                    "(ctest sets it; by hand: CONCORD_CAPI=build/lib/libconcord_capi.so)")
    return Capi(path)
