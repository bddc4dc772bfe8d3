"""Fair Cast export (concord/train/export.h): the rules rne, sr and ef applied to a state dict.

The one-line change in a training loop::

    exporter = concord.export.Exporter("sr", "bf16", seed=0)
    ...
    served = exporter.export(model.state_dict())   # {name: served float32 array}

Bits are identical to the C++ trainer's export of the same tensors (parameter numbers in
state-dict order, the same step).
"""

from ._concord.export import *  # noqa: F401,F403
from ._concord.export import Exporter, rules  # noqa: F401
