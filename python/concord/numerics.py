"""Element formats and block quantization (concord/numerics), results identical to the C++ and the CLI.

Arrays are viewed, not copied: inputs must be C-contiguous float32 (codes: uint8/uint16/uint32)
CPU arrays — NumPy, CPU torch tensors, anything with ``__dlpack__`` or the buffer protocol.
Anything else raises TypeError (dtype) or ValueError (strides, device, dimensions) naming the
argument; nothing is converted silently. Results are new NumPy arrays that own the C++ buffers,
or the caller's ``out=`` array.
"""

from ._concord.numerics import *  # noqa: F401,F403
from ._concord.numerics import (  # noqa: F401
    QuantDesc,
    QuantizedArray,
    _data_pointer,
    _quantize_seconds,
    active_isa,
    block_formats,
    decode,
    dequantize,
    encode,
    fake_quantize,
    format_info,
    formats,
    overflow_modes,
    quantize,
    rounding_modes,
    scale_rules,
)
