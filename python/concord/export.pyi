"""Fair Cast export of fp32 weights"""

import numpy.typing


def rules() -> list[str]:
    """The export rule names: rne, sr, ef."""

class Exporter:
    """
    Fair Cast export of fp32 master weights to the served copy, as the trainer and the RL loop do it (train/export.h), on named tensors.
    """

    def __init__(self, rule: str = 'rne', format: str = 'bf16', seed: int = 0) -> None:
        """
        rule: rne | sr | ef. format: the served element format (bf16, fp16, e4m3, ...; f32
        makes every rule a copy). seed keys sr's random bits: tensor number p at step s
        uses Philox stream p of seed ^ (0x9E3779B97F4A7C15 * (s + 1)).
        """

    @property
    def rule(self) -> str:
        """The rule's name."""

    @property
    def format(self) -> str:
        """The served format."""

    @property
    def seed(self) -> int:
        """sr's seed."""

    @property
    def next_step(self) -> int:
        """The step export() uses when none is given (one after the last export)."""

    @property
    def names(self) -> list[str]:
        """Tensor names in the order they were first seen: the parameter numbers."""

    @property
    def keeps_state(self) -> bool:
        """
        Whether the rule carries state between steps (ef into a format below f32).
        """

    def export(self, state_dict: dict[str, numpy.typing.ArrayLike], *, step: int | None = None, output: str = 'float32', out: dict[str, numpy.typing.ArrayLike] | None = None) -> dict[str, numpy.typing.NDArray]:
        """
        Exports every tensor of a state dict {name: float32 array} (NumPy, CPU torch;
        viewed, not copied) and returns {name: served}. 1-D tensors (norms) are served in
        fp32, as the precision policy keeps them. output='float32': the served values in
        fp32 (what the forward pass reads); output='codes': matrices as codes of the served
        format (bf16/fp16: uint16, 8-bit and narrower: uint8 one per element), viewable as
        ml_dtypes / torch dtypes. out={name: float32 array}: written in place and returned.
        step: the training step (sr's random draw); default next_step.
        """

    def apply(self, name: str, master: numpy.typing.ArrayLike, *, step: int | None = None, out: numpy.typing.ArrayLike | None = None) -> numpy.typing.NDArray:
        """
        Exports one tensor; returns its served float32 copy (into `out` when given). Does
        not advance next_step.
        """

    def state(self) -> dict[str, numpy.typing.NDArray]:
        """
        ef's carried error {name: float32 array} (copies; empty for rne and sr): what a checkpoint saves.
        """

    def error(self, name: str) -> numpy.typing.NDArray | None:
        """
        ef's carried error of one tensor (a copy), or None where the rule carries none.
        """

    def load_state(self, state: dict[str, numpy.typing.ArrayLike]) -> None:
        """
        Restores state() from a checkpoint, so that the next export continues bit-identically.
        """
