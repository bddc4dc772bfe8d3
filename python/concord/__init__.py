"""concord from Python: element formats, block quantization, Fair Cast export, weight-sync
checks, divergence contracts and models, on NumPy arrays and CPU PyTorch tensors without copies.

Submodules: :mod:`concord.numerics`, :mod:`concord.export`, :mod:`concord.sync`,
:mod:`concord.contract`, :mod:`concord.model` (its :class:`Model`, :class:`Engine` and
:class:`Completion` are also ``concord.Model`` etc.). Errors concord itself reports are
:class:`concord.InputError` (a ``ValueError``) with the same message as the CLI.
"""

import os as _os

# As the CLI does (src/concord/cli/runtime.cpp): OpenMP threads that wait passively instead of
# spinning, unless the user chose (OMP_WAIT_POLICY / GOMP_SPINCOUNT). libgomp reads the variable
# once, when it is loaded — by the extension below, unless something (torch) loaded it earlier,
# in which case that choice stands (docs/python.md).
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["OMP_WAIT_POLICY"] = "passive"

from . import _concord  # noqa: E402
from ._concord import InputError  # noqa: E402

from . import numerics, export, sync, contract, model  # noqa: E402
from .model import Completion, Engine, Model  # noqa: E402

__all__ = ["InputError", "numerics", "export", "sync", "contract", "model", "Completion",
           "Engine", "Model"]
