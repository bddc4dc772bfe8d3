"""Kernel contracts on logits from any engine (docs/contracts.md), as ``concord contract`` runs
them: how far a candidate's logits may deviate from a reference's per slice of traffic, and what
that bound guarantees.

* :func:`measure` compares two (rows, V) float32 (or float64) logit arrays row by row — read in
  place, from NumPy, torch or anything with ``__dlpack__`` — and returns a :class:`Measurement`
  (per slice: osc quantiles and max, max |Δ log p|, TV, KL, greedy flips and their predictor);
  :func:`measure_dumps` does the same on two logit dumps, exactly as ``concord contract measure
  --ref A --cand B``.
* :func:`fit` turns a measurement into a :class:`Contract`; :func:`check` checks a measurement
  against a contract (a Contract, a ``contract.json`` path or its dict).
* :func:`load_dump` / :func:`save_dump` read and write logit dumps (.npy + .rows.json sidecar,
  or .safetensors).
* The bounds a contract's osc budget eps implies: :func:`logp_bound`, :func:`ratio_bounds`,
  :func:`tv_bound`, :func:`kl_bound`, :func:`greedy_stable`, :func:`sequence_tv_bound`,
  :func:`reward_drift_bound`, :func:`policy_gradient_bias_bound`, :func:`tis_safe_truncation`,
  and one row's divergence, :func:`row_divergence`.
"""

from ._concord.contract import (  # noqa: F401
    CheckResult,
    Contract,
    Measurement,
    check,
    fit,
    greedy_stable,
    kl_bound,
    load_dump,
    logp_bound,
    measure,
    measure_dumps,
    policy_gradient_bias_bound,
    ratio_bounds,
    reward_drift_bound,
    row_divergence,
    save_dump,
    sequence_tv_bound,
    tis_safe_truncation,
    tv_bound,
)

__all__ = [
    "CheckResult", "Contract", "Measurement", "check", "fit", "greedy_stable", "kl_bound",
    "load_dump", "logp_bound", "measure", "measure_dumps", "policy_gradient_bias_bound",
    "ratio_bounds", "reward_drift_bound", "row_divergence", "save_dump", "sequence_tv_bound",
    "tis_safe_truncation", "tv_bound",
]
