"""Element formats and block quantization"""

from collections.abc import Sequence
from typing import Annotated

import numpy
import numpy.typing
from numpy.typing import NDArray


def formats() -> list[str]:
    """The element format names: f32, bf16, fp16, e4m3, ..."""

def block_formats() -> list[str]:
    """
    The block-format preset names (mxfp8-e4m3, ..., nvfp4, nvfp4-2d, fp8-tensor).
    """

def rounding_modes() -> list[str]:
    """
    Rounding mode names ("stochastic" is accepted as another name of "sr").
    """

def overflow_modes() -> list[str]:
    """Overflow policy names."""

def scale_rules() -> list[str]:
    """MX scale rule names (torchao's)."""

def format_info(format: str) -> dict:
    """
    The traits of an element format: bits, exponent/mantissa bits, bias, max_finite, min_normal, min_subnormal, specials, and code_dtype (the NumPy dtype of its codes).
    """

def active_isa() -> str:
    """The SIMD kernels the fast paths dispatch to (avx512, avx2 or generic)."""

def encode(x: numpy.typing.ArrayLike, format: str, *, rounding: str = 'rne', overflow: str = 'saturate', seed: int = 0, stream: int = 0, first_index: int = 0, reference: bool = False, out: numpy.typing.ArrayLike | None = None) -> numpy.typing.NDArray:
    """
    Encodes a float32 array into element codes of `format`.

    x: C-contiguous float32 CPU array of any shape (viewed, not copied).
    Returns one code per element, same shape, dtype uint8 (8/6/4-bit formats), uint16
    (bf16, fp16) or uint32 (f32), right-aligned as concord's encode_ref returns them; or
    writes them into `out` (that dtype and shape) and returns `out`.
    rounding: rne | rtz | sr. sr draws element i's random word from Philox4x32-10 keyed
    by (seed, stream) at index first_index + i. overflow: saturate | ieee (the library's
    default is saturate; the CLI `concord codec encode` uses ieee unless --saturate).
    reference=True runs the scalar reference instead of the SIMD fast path (bit-identical).
    """

def decode(codes: numpy.typing.ArrayLike, format: str, *, reference: bool = False, out: numpy.typing.ArrayLike | None = None) -> numpy.typing.NDArray:
    """
    Decodes element codes (dtype as encode returns them) to float32, same shape; into
    `out` when given. Bits above the format's width are ignored.
    """

class QuantDesc:
    """
    A quantized-tensor descriptor: element format x block shape x scale format x scale rule x rounding x overflow x axis.
    """

    def __init__(self, name: str, *, scale_rule: str | None = None, rounding: str | None = None, overflow: str | None = None, axis: int | None = None) -> None:
        """
        From a preset name (mxfp8-e4m3, mxfp8-e5m2, mxfp6-e2m3, mxfp6-e3m2, mxfp4, nvfp4,
        nvfp4-2d, fp8-tensor), an element format name (a plain cast) or the canonical text
        (element=e4m3;block=1x32;scale=e8m0;rule=floor;axis=1;rounding=rne;overflow=saturate),
        with optional overrides.
        """

    @property
    def element(self) -> str:
        """Element format name."""

    @element.setter
    def element(self, arg: str, /) -> None: ...

    @property
    def block(self) -> tuple[int, int]:
        """Block shape (rows, cols); (0, 0) for per-tensor and plain casts."""

    @block.setter
    def block(self, arg: tuple[int, int], /) -> None: ...

    @property
    def scale(self) -> str | None:
        """
        Scale format: e8m0 (MX), ue4m3 (NVFP4), f32 (per-tensor), or None (plain cast).
        """

    @scale.setter
    def scale(self, arg: str | None, /) -> None: ...

    @property
    def scale_rule(self) -> str:
        """MX scale rule: floor | ceil | even | rceil."""

    @scale_rule.setter
    def scale_rule(self, arg: str, /) -> None: ...

    @property
    def rounding(self) -> str:
        """Rounding: rne | rtz | sr."""

    @rounding.setter
    def rounding(self, arg: str, /) -> None: ...

    @property
    def overflow(self) -> str:
        """Overflow: saturate | ieee."""

    @overflow.setter
    def overflow(self, arg: str, /) -> None: ...

    @property
    def axis(self) -> int:
        """Axis a 1-D block runs along (1: along a row)."""

    @axis.setter
    def axis(self, arg: int, /) -> None: ...

    def to_string(self) -> str:
        """The canonical text (stored in file metadata)."""

    def __str__(self) -> str: ...

    def __repr__(self) -> str: ...

    def __eq__(self, arg: QuantDesc, /) -> bool: ...

    def __hash__(self) -> int: ...

class QuantizedArray:
    """
    The result of quantize(): codes, block scales and tensor scale, owned by C++ and seen from NumPy without a copy.
    """

    @staticmethod
    def from_arrays(desc: QuantDesc | str, shape: Sequence[int], packed: numpy.typing.ArrayLike, scales: numpy.typing.ArrayLike, tensor_scale: float = 1.0) -> QuantizedArray:
        """
        Rebuilds a quantized tensor from its stored arrays (copied into C++): packed
        codes (uint8, block.h layout), block scales (uint8) and the tensor scale.
        """

    @property
    def desc(self) -> QuantDesc:
        """The descriptor."""

    @property
    def shape(self) -> list[int]:
        """Shape of the quantized array (as given to quantize)."""

    @property
    def tensor_scale(self) -> float:
        """
        fp32 decode multiplier after the block scale (NVFP4: 1/S_enc; fp8-tensor: 1/S; else 1).
        """

    @property
    def packed(self) -> Annotated[NDArray[numpy.uint8], dict(writable=False)]:
        """
        The codes as stored (block.h): 16-bit formats 2 bytes little-endian, 8/6-bit one
        byte each, 4-bit two per byte (element 2k in the low nibble). Read-only view.
        """

    @property
    def scales(self) -> Annotated[NDArray[numpy.uint8], dict(writable=False)]:
        """
        Block scale codes (e8m0 or ue4m3), shape (block grid rows, block grid cols); empty
        without block scales. Read-only view.
        """

    @property
    def codes(self) -> numpy.typing.NDArray:
        """
        One code per element, shape as the input, dtype as encode() returns them: a view of
        `packed` except for 4-bit formats (unpacked into a new array).
        """

    def dequantize(self, *, reference: bool = False, out: numpy.typing.ArrayLike | None = None) -> numpy.typing.NDArray:
        """Same as numerics.dequantize(self, ...)."""

    def __repr__(self) -> str: ...

def quantize(x: numpy.typing.ArrayLike, desc: QuantDesc | str, *, scale_rule: str | None = None, rounding: str | None = None, overflow: str | None = None, axis: int | None = None, seed: int = 0, stream: int = 0, reference: bool = False) -> QuantizedArray:
    """
    Quantizes a 1-D (one row) or 2-D float32 array with a block descriptor (QuantDesc or
    its text: 'mxfp8-e4m3', 'mxfp4', 'nvfp4', 'nvfp4-2d', 'fp8-tensor', a format name, or
    the canonical text); scale_rule/rounding/overflow/axis override the descriptor's.
    sr: element (r, c) uses Philox word r*cols + c of (seed, stream). reference=True runs
    quantize_ref; the default is the dispatching fast path (bit-identical).
    """

def dequantize(q: QuantizedArray, *, reference: bool = False, out: numpy.typing.ArrayLike | None = None) -> numpy.typing.NDArray:
    """
    x = element * block_scale * tensor_scale in fp32, shape as quantized; into `out` when given.
    """

def fake_quantize(x: numpy.typing.ArrayLike, desc: QuantDesc | str, *, scale_rule: str | None = None, rounding: str | None = None, overflow: str | None = None, axis: int | None = None, seed: int = 0, stream: int = 0, reference: bool = False, out: numpy.typing.ArrayLike | None = None) -> numpy.typing.NDArray:
    """
    dequantize(quantize(x, desc, ...)): the values a quantized GEMM would see.
    """
