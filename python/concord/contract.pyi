"""
Kernel contracts on logits from any engine (docs/contracts.md): divergence bounds, measurement over traffic slices, fitted contracts and their checks — the functions `concord contract` runs.
"""

from collections.abc import Sequence
from typing import Any

import numpy
import numpy.typing
from numpy.typing import NDArray


def tv_bound(eps: float) -> float:
    """
    TV(p_A, p_B) <= tanh(eps/4) for logits whose difference has oscillation osc <= eps.
    """

def kl_bound(eps: float) -> float:
    """KL (either direction) <= min(eps^2/8, eps*tanh(eps/4))."""

def logp_bound(eps: float) -> float:
    """|log p_A(y) - log p_B(y)| <= eps for every token y."""

def ratio_bounds(eps: float) -> tuple[float, float]:
    """p_A(y)/p_B(y) lies in [e^-eps, e^eps]: returns that pair."""

def greedy_stable(margin_ref: float, eps: float) -> bool:
    """
    True when the reference's greedy token provably stays the candidate's (top-1 margin > eps, with a relative slack of 2^-40).
    """

def sequence_tv_bound(eps: object) -> float:
    """
    Sequence TV <= 1 - prod_t (1 - tanh(eps_t/4)) for per-position bounds eps (float64 array).
    """

def reward_drift_bound(r_min: float, r_max: float, sequence_tv: float) -> float:
    """|E_A[R] - E_B[R]| <= (r_max - r_min) * sequence_tv."""

def policy_gradient_bias_bound(g_max: float, sequence_tv: float) -> float:
    """
    Bias of the uncorrected policy-gradient estimate <= 2 * g_max * sequence_tv.
    """

def tis_safe_truncation(eps: float) -> float:
    """
    The smallest token-level TIS truncation C (= e^eps) that never truncates under osc <= eps.
    """

def row_divergence(ref: object, cand: object, token: int = -1) -> dict:
    """
    One position's divergence between a reference and a candidate row of logits (float32 or float64, 1-D): osc, linf, max_abs_dlogp, tv, kl, kl_reverse, the greedy tokens and flip, the reference's margin and the flip predictor, and for `token` its dlogp / dp / reference logp.
    """

class Measurement:
    """
    Per-slice statistics of compared rows (the measurement.json of `concord contract measure`).
    """

    @property
    def ref(self) -> str:
        """What the reference side was."""

    @property
    def cand(self) -> str:
        """What the candidate side was."""

    @property
    def vocab(self) -> int:
        """Logits per row."""

    @property
    def rows(self) -> int:
        """Rows compared (the 'all' slice)."""

    @property
    def slices(self) -> list[str]:
        """Slice names, 'all' first, then by dimension."""

    def to_dict(self) -> dict[str, Any]:
        """The concord-measurement/1 JSON as a dict (measurement.json's content)."""

    def __getitem__(self, slice: str) -> object:
        """
        One slice's statistics as in measurement.json (KeyError for a slice with no rows).
        """

    def osc(self, slice: str = 'all') -> NDArray[numpy.float64]:
        """Every row's osc in the slice, ascending (float64)."""

    def __repr__(self) -> str: ...

def measure(ref_logits: numpy.typing.ArrayLike, cand_logits: numpy.typing.ArrayLike, *, slices: dict[str, Any] | None = None, sequence: Sequence[int] | None = None, position: Sequence[int] | None = None, prompt_length: Sequence[int] | None = None, token: Sequence[int] | None = None, next: Sequence[int] | None = None, task: Sequence[str] | None = None, label: Sequence[str] | None = None, ref: str = 'ref', cand: str = 'cand') -> Measurement:
    """
    Compares ref_logits with cand_logits row by row, (rows, V) float32 arrays (float64: compared in fp64) read in place, from any engine, and returns the per-slice Measurement, as `concord contract measure` does on two dumps. slices: None or a dict of prompt_length_edges, position_edges, decided_margin (nats), margin_bins. Row identities (each optional, one entry per row; the logit-dump defaults otherwise): sequence (default: the row index), position (0), prompt_length (0), token (-1: unknown), next (the token that follows, -1: none; it gives the per-token |dlogp|), task and label ("": none).
    """

def measure_dumps(ref_path: str, cand_path: str, *, slices: object | None = None) -> Measurement:
    """
    Measures two logit dumps (.npy or .safetensors, dump.h): exactly `concord contract measure --ref REF --cand CAND` (the sides named by their paths).
    """

class Contract:
    """
    A kernel contract (concord-contract/1): per slice, the allowed osc quantile and maximum, and the guarantees they imply.
    """

    @staticmethod
    def load(path: str) -> Contract:
        """Reads a contract.json (as `concord contract` writes)."""

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Contract:
        """A contract from its JSON as a dict."""

    def save(self, path: str) -> None:
        """Writes the contract JSON (atomic)."""

    def to_dict(self) -> object:
        """The contract JSON (with the derived guarantees per slice) as a dict."""

    @property
    def ref(self) -> str:
        """The reference it was fitted for."""

    @property
    def cand(self) -> str:
        """The candidate it was fitted for."""

    def __repr__(self) -> str: ...

def fit(measurement: Measurement, *, headroom: float = 2.0, quantile: float = 0.99, min_osc: float = 1e-06) -> Contract:
    """
    Fits a contract to a measurement: per slice, osc_quantile = headroom * the measured quantile, osc_max = headroom * the measured max (at least min_osc) — `concord contract measure`'s contract.json.
    """

class CheckResult:
    """The verdict of a contract check (check.json)."""

    @property
    def passed(self) -> bool:
        """Every exercised slice is within the contract."""

    @property
    def violations(self) -> object:
        """
        Broken slices: dicts of slice, what ('osc p99' / 'osc max'), measured, allowed, rows_over.
        """

    @property
    def not_exercised(self) -> list[str]:
        """Contract slices with no rows measured."""

    def to_dict(self) -> object:
        """The concord-check/1 JSON (check.json's content) as a dict."""

    def __bool__(self) -> bool: ...

    def __repr__(self) -> str: ...

def check(contract: object, measurement: Measurement) -> CheckResult:
    """
    Checks a measurement against a contract (a Contract, a contract.json path or its dict), as `concord contract check` does: a slice passes when its osc quantile and max are within the contract's.
    """

def load_dump(path: str) -> tuple[numpy.typing.NDArray[numpy.float32] | numpy.typing.NDArray[numpy.float64], dict[str, Any]]:
    """
    Reads a logit dump (.npy [+ .rows.json] or .safetensors, dump.h): returns (logits, rows) — the (P, V) logits as float32 (float64 for an F64 dump; BF16/F16 widened exactly) and a dict of the row fields (sequence, position, prompt_length, token, next as int64 arrays; task, label as lists of str), ready for measure(..., **rows).
    """

def save_dump(path: str, logits: object, *, sequence: Sequence[int] | None = None, position: Sequence[int] | None = None, prompt_length: Sequence[int] | None = None, token: Sequence[int] | None = None, next: Sequence[int] | None = None, task: Sequence[str] | None = None, label: Sequence[str] | None = None) -> None:
    """
    Writes (P, V) float32 logits as a logit dump: .safetensors, or .npy with its <path>.rows.json sidecar (atomic), readable by `concord contract --ref/--cand`. Row identities (each optional, one entry per row; the logit-dump defaults otherwise): sequence (default: the row index), position (0), prompt_length (0), token (-1: unknown), next (the token that follows, -1: none; it gives the per-token |dlogp|), task and label ("": none).
    """
