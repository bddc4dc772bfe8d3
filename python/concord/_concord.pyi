"""
concord's C++ engine (numerics, Fair Cast export, sync checks, contracts, models)
"""

from concord._concord import (
    contract as contract,
    export as export,
    model as model,
    numerics as numerics,
    sync as sync
)


class InputError(ValueError):
    pass
