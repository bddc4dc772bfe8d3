"""The committed type stubs (python/concord/*.pyi) are what nanobind.stubgen writes for the built
extension: a binding changed without regenerating them fails here, with the command to run."""

import difflib
import os
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

import generate_stubs  # noqa: E402


@pytest.mark.parametrize("stub", sorted(generate_stubs.STUBS))
def test_stub_matches_the_built_module(stub):
    with open(os.path.join(generate_stubs.PACKAGE_DIR, stub), encoding="utf-8") as f:
        committed = f.read()
    built = generate_stubs.generate(generate_stubs.STUBS[stub], os.environ["CONCORD_PYTHON_PATH"])
    if committed != built:
        diff = "".join(difflib.unified_diff(committed.splitlines(True), built.splitlines(True),
                                            f"python/concord/{stub} (committed)",
                                            f"{stub} (stubgen of the built module)"))
        pytest.fail(f"python/concord/{stub} is out of date; regenerate with\n"
                    f"  PYTHONPATH=build/python .venv/bin/python python/generate_stubs.py\n{diff}")


def test_every_submodule_has_a_stub():
    import concord._concord as ext
    submodules = {name for name in dir(ext) if type(getattr(ext, name)) is type(ext)}
    assert {f"concord._concord.{m}" for m in submodules} | {"concord._concord"} == \
        set(generate_stubs.STUBS.values()) | generate_stubs.WRAPPED
