"""Weight-sync checks on a pair of state dicts: the learner's (what it exported) and the
sampler's (what it serves), with the RL loop's own comparisons and messages (rl/sync.h).

A state dict maps tensor names to NumPy arrays, CPU torch tensors (anything with ``__dlpack__``
or the buffer protocol) or :class:`concord.numerics.QuantizedArray` (a quantized copy: codes,
block scales, tensor scale). The checks, named and numbered as ``concord rl`` names them:

* ``manifest`` (2): every learner tensor maps to exactly one sampler tensor — name, shape,
  dtype (safetensors names: F32, BF16, F16, ...; a QuantizedArray is listed as F32, the values
  concord quantizes from, its format being the precision plan's business); nothing missing or
  extra.
* ``precision_plan`` (3): the learner's plan (``concord.sync.plan``: the forward formats of every
  GEMM weight, the norms, the embedding lookup, the high-precision last layers; see
  :func:`precision_plan`) against the sampler's — given, or derived from what the sampler holds
  (a weight held quantized is read in its descriptor's format, a norm in its dtype).
* ``scale_sanity`` (6): every quantized sampler tensor has no NaN/Inf block scale, no zero or
  placeholder scale on a block with nonzero elements, a positive finite tensor scale, and, where
  the learner holds the values, the NVFP4 / per-tensor FP8 tensor scale their amax gives.
* ``content`` (4): the XXH3-64 of what a consumer reads of each tensor — codes, then block
  scales, then the tensor scale's bits for a quantized tensor (a float tensor is quantized with
  the plan's format for it first, as concord's kernels would), the fp32 values otherwise — equals
  on both sides: the same hash function and byte order as the C++ check.

They run in the RL loop's order (2, 3, 6, 4) and stop at the first failure. The RL loop's other
checks need a payload or a model, not a state dict: version (1), derived copies (5) and the
behaviour probe (7) run in ``concord rl`` and in ``concord serve``.

Pushing weights into a running ``concord serve`` (its POST /v1/weights, docs/serve.md): a
:class:`Pusher` exports each new state dict with a Fair Cast rule, makes the sync payload
(:class:`Publisher`: manifest, plan, content hashes, probe log-probs) and hands it to the server
through POSIX shared memory (or the request body); the server runs all seven checks and swaps
the version in, or refuses it with :class:`PushError` naming the check::

    pusher = concord.sync.Pusher("http://127.0.0.1:8000")   # config and policy from the server
    for step in range(steps):
        ...                                                  # the optimizer step
        pusher.push(model.state_dict(), version=step + 1)

Float tensors other than float32 (bf16, fp16) are widened to float32 for hashing and amax, as a
concord sampler installs them; that widening is the one copy made.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import numpy as np

from . import _concord
from ._concord import InputError
from .numerics import QuantizedArray

_c = _concord.sync

__all__ = [
    "CheckResult",
    "SyncError",
    "manifest",
    "precision_plan",
    "sampler_plan",
    "content_hash",
    "content_hashes",
    "check_manifest",
    "check_precision_plan",
    "check_scales",
    "check_content",
    "check",
    "verify",
    "Publisher",
    "PushError",
    "Pusher",
    "push",
    "served_weights",
]


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: its name and number (as ``concord rl`` reports them), whether it
    passed, and on failure the RL loop's message ("[sync] check N NAME: ...")."""

    check: str
    id: int
    ok: bool
    message: str = ""

    def __bool__(self) -> bool:
        return self.ok


class SyncError(InputError):
    """A failed sync check (a ValueError): ``str(e)`` is the RL loop's message, ``e.result`` the
    :class:`CheckResult` and ``e.results`` every check run."""

    def __init__(self, result: CheckResult, results: list[CheckResult]):
        super().__init__(result.message)
        self.result = result
        self.results = results


def _result(check: str, problem: str) -> CheckResult:
    if problem:
        return CheckResult(check, _c.check_id(check), False, _c.check_message(check, problem))
    return CheckResult(check, _c.check_id(check), True)


# ---- tensors ------------------------------------------------------------------------------------

_SAFETENSORS_DTYPES = {
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
    "int8": "I8", "uint8": "U8", "int16": "I16", "uint16": "U16", "int32": "I32", "uint32": "U32",
    "int64": "I64", "uint64": "U64", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}
_FLOATS = {"float32", "float16", "bfloat16", "float64"}


def _is_quantized(t: Any) -> bool:
    return isinstance(t, QuantizedArray)


def _dtype_of(t: Any) -> str:
    """NumPy-style dtype name of an array or tensor ("float32", "bfloat16", ...)."""
    name = str(t.dtype)
    return name[len("torch."):] if name.startswith("torch.") else name


def _shape_of(t: Any) -> list[int]:
    return [int(d) for d in t.shape]


def _manifest_dtype(name: str, t: Any) -> str:
    if _is_quantized(t):
        return "F32"  # quantized from float32 values; the format is check 3's
    dtype = _dtype_of(t)
    if dtype not in _SAFETENSORS_DTYPES:
        raise TypeError(f"[sync] tensor '{name}': dtype {dtype} has no safetensors name "
                        f"(supported: {', '.join(sorted(_SAFETENSORS_DTYPES))})")
    return _SAFETENSORS_DTYPES[dtype]


def _as_numpy(t: Any) -> np.ndarray:
    """A NumPy view of an array or CPU tensor (no copy)."""
    if isinstance(t, np.ndarray):
        return t
    if hasattr(t, "__dlpack__"):
        try:
            return np.from_dlpack(t)
        except (TypeError, BufferError, RuntimeError):
            if hasattr(t, "float") and hasattr(t, "numpy"):  # a torch bf16 tensor: NumPy lacks bf16
                return t.detach().float().numpy()
            raise
    return np.asarray(t)


def _float32_values(name: str, t: Any) -> np.ndarray:
    """float32 values of a float tensor: the caller's memory for float32, widened otherwise."""
    dtype = _dtype_of(t)
    if dtype not in _FLOATS:
        raise TypeError(f"[sync] tensor '{name}': expected a float tensor, got {dtype}")
    if dtype == "float32":
        return t  # viewed in place by the C++
    a = _as_numpy(t)
    return a if a.dtype == np.float32 else a.astype(np.float32)


def manifest(state_dict: Mapping[str, Any]) -> list[dict]:
    """The manifest of a state dict, in its order: ``[{"name", "shape", "dtype"}]`` as
    ``concord.sync.manifest`` lists tensors (safetensors dtype names; a QuantizedArray is
    listed as F32, the values it was quantized from)."""
    return [{"name": n, "shape": _shape_of(t), "dtype": _manifest_dtype(n, t)} for n, t in state_dict.items()]


def _plan_formats(plan: Optional[Mapping]) -> dict[str, str]:
    """The b (weight) operand format of every weight a plan lists."""
    if plan is None:
        return {}
    return {w["name"]: w["b"] for w in plan["weights"]}


def content_hash(tensor: Any, desc: Optional[str] = None) -> str:
    """The content hash ("0x<16 hex>") of what a consumer reads of one tensor (check 4):

    * a QuantizedArray: XXH3-64 of its packed codes, continued over its block scales, then over
      its tensor scale's 4 bytes;
    * a float tensor with ``desc`` (a QuantDesc or its name/text, not "f32"): the same, of the
      tensor quantized as concord's forward GEMMs quantize a weight (operand b of Y = X Wᵀ);
    * a float tensor otherwise: XXH3-64 of its float32 values (bf16/fp16 widened exactly);
    * any other tensor: XXH3-64 of its raw bytes.
    """
    if _is_quantized(tensor):
        return f"0x{_c.content_hash_quantized(tensor):016x}"
    dtype = _dtype_of(tensor)
    if dtype in _FLOATS:
        d = None if desc is None else str(desc)
        return f"0x{_c.content_hash_values(_float32_values('tensor', tensor), d):016x}"
    raw = _as_numpy(tensor)
    return f"0x{_c.content_hash_bytes(np.ascontiguousarray(raw).reshape(-1).view(np.uint8)):016x}"


def content_hashes(state_dict: Mapping[str, Any], plan: Optional[Mapping] = None) -> dict[str, str]:
    """``{name: "0x<16 hex>"}`` for every tensor (:func:`content_hash`), each float weight the
    plan lists quantized with the plan's format for it: the learner's side of check 4."""
    formats = _plan_formats(plan)
    return {n: content_hash(t, formats.get(n) if not _is_quantized(t) else None) for n, t in state_dict.items()}


def precision_plan(model: Any, policy: Optional[str] = None) -> dict:
    """The precision plan (``concord.sync.plan``) that ``policy`` (a preset name such as
    "mxfp8", or a policy JSON file; None: the model's own) gives a :class:`concord.Model`'s
    GEMM weights: ``{"norms", "embedding_lookup", "high_precision_last_layers", "weights":
    [{"name", "a", "b", "high"}]}`` — the text the RL loop's learner publishes."""
    return model.precision_plan(policy)


def sampler_plan(plan: Mapping, sampler: Mapping[str, Any]) -> dict:
    """The plan the sampler's state dict actually follows, starting from ``plan``: a weight it
    holds quantized is read in its descriptor's format (b; high when unscaled at 16 bits or
    more); a weight the plan keeps in "f32" but the sampler holds as bf16 / fp16 is read in that
    format (an MoE router cast down, say); any other float weight is read as planned (its
    consumer quantizes it); the norms (tensors whose name contains "norm") in their dtype ("f32"
    when every one is float32)."""
    norm_formats = {"float32": "f32", "float16": "fp16", "bfloat16": "bf16", "float64": "f64"}
    out = {k: v for k, v in plan.items() if k != "weights"}
    weights = []
    for w in plan["weights"]:
        w = dict(w)
        t = sampler.get(w["name"])
        held = None
        if t is not None and _is_quantized(t):
            held = t.desc.to_string()
        elif t is not None and w["b"] == "f32" and _dtype_of(t) in ("bfloat16", "float16"):
            held = norm_formats[_dtype_of(t)]
        if held is not None:
            w["b"] = held
            w["high"] = bool(_c.plan_weight_high(w["a"]) and _c.plan_weight_high(held))
        weights.append(w)
    out["weights"] = weights
    for n, t in sampler.items():
        if "norm" in n and not _is_quantized(t) and _dtype_of(t) != "float32":
            out["norms"] = norm_formats.get(_dtype_of(t), _dtype_of(t))
            break
    return out


_derive_plan = sampler_plan  # check()'s parameter of that name hides the function there


# ---- the checks -------------------------------------------------------------------------------


def check_manifest(learner: Mapping[str, Any], sampler: Mapping[str, Any]) -> CheckResult:
    """Check 2 on two state dicts: names, shapes and dtypes (see :func:`manifest`)."""
    def triples(sd):
        return [(e["name"], e["shape"], e["dtype"]) for e in manifest(sd)]
    return _result("manifest", _c.manifest_problem(triples(learner), triples(sampler)))


def check_precision_plan(learner_plan: Mapping, sampler_plan: Mapping) -> CheckResult:
    """Check 3 on two precision plans (dicts as :func:`precision_plan` returns)."""
    return _result("precision_plan", _c.precision_plan_problem(dict(learner_plan), dict(sampler_plan)))


def check_scales(sampler: Mapping[str, Any], learner: Optional[Mapping[str, Any]] = None) -> CheckResult:
    """Check 6 on every QuantizedArray of the sampler's state dict, in order; the learner's float
    tensor of the same name (when given) supplies the amax the tensor scale must match."""
    for name, t in sampler.items():
        if not _is_quantized(t):
            continue
        values = None
        if learner is not None and name in learner and not _is_quantized(learner[name]) \
                and _dtype_of(learner[name]) in _FLOATS:
            values = _float32_values(name, learner[name])
        problem = _c.scale_problem(t, values)
        if problem:
            return _result("scale_sanity", f"{name} {problem}")
    return _result("scale_sanity", "")


def check_content(learner: Mapping[str, Any], sampler: Mapping[str, Any],
                  plan: Optional[Mapping] = None) -> CheckResult:
    """Check 4: every sampler tensor's content hash against the learner's (both as
    :func:`content_hashes` makes them with ``plan``), then their counts."""
    theirs = content_hashes(learner, plan)
    formats = _plan_formats(plan)
    mine = []
    for name, t in sampler.items():
        h = content_hash(t, formats.get(name) if not _is_quantized(t) else None)
        quantized = _is_quantized(t) or formats.get(name, "f32") != "f32"
        mine.append((name, int(h, 16), quantized))
    return _result("content", _c.content_problem(mine, theirs))


def check(learner: Mapping[str, Any], sampler: Mapping[str, Any], plan: Optional[Mapping] = None,
          sampler_plan: Optional[Mapping] = None) -> list[CheckResult]:
    """Runs manifest, precision_plan (when ``plan`` is given; against ``sampler_plan``, or the
    plan derived from the sampler's tensors), scale_sanity and content, in the RL loop's order,
    stopping at the first failure. Returns the results of the checks run."""
    results = [check_manifest(learner, sampler)]
    if results[-1].ok and plan is not None:
        other = sampler_plan if sampler_plan is not None else _derive_plan(plan, sampler)
        results.append(check_precision_plan(plan, other))
    if results[-1].ok:
        results.append(check_scales(sampler, learner))
    if results[-1].ok:
        results.append(check_content(learner, sampler, plan))
    return results


def verify(learner: Mapping[str, Any], sampler: Mapping[str, Any], plan: Optional[Mapping] = None,
           sampler_plan: Optional[Mapping] = None) -> list[CheckResult]:
    """:func:`check`, raising :class:`SyncError` with the RL loop's message at the first failed
    check; returns the (passed) results otherwise."""
    results = check(learner, sampler, plan, sampler_plan)
    for r in results:
        if not r.ok:
            raise SyncError(r, results)
    return results


# ---- pushing weights into `concord serve` ----------------------------------------------------------

Publisher = _c.Publisher


class PushError(InputError):
    """A weight update the server refused (a ValueError): ``str(e)`` is its message ("[sync]
    check N NAME: ..." when a check failed), ``e.status`` the HTTP status, ``e.check`` the check's
    number (None when no check failed: a bad request, another update in progress) and ``e.body``
    the server's JSON answer."""

    def __init__(self, status: int, body: dict):
        error = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(error.get("message") or f"HTTP {status}: {body}")
        self.status = status
        self.check = error.get("check")
        self.body = body


def _request(url: str, method: str, body: Optional[bytes], content_type: Optional[str],
             api_key: Optional[str], timeout: float) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    headers = {}
    if content_type:
        headers["Content-Type"] = content_type
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"error": {"message": raw.decode("utf-8", "replace")}}


def served_weights(url: str, *, api_key: Optional[str] = None, timeout: float = 60.0) -> dict:
    """GET /v1/weights of the server at ``url`` (e.g. "http://127.0.0.1:8000"): the version
    serving, its config, policy, manifest, plan and the content hashes of what its kernels read."""
    status, body = _request(url.rstrip("/") + "/v1/weights", "GET", None, None, api_key, timeout)
    if status != 200:
        raise PushError(status, body)
    return body


class Pusher:
    """Pushes versions of a model's weights into the ``concord serve`` at ``url``.

    config / policy: the model's config.json dict and the server's precision policy; None: asked
    of the server (GET /v1/weights). rule / seed: the Fair Cast export of each state dict to the
    served format (rne, sr, ef; :class:`concord.export.Exporter`, whose ef residual persists
    across pushes); rule=None: the values are sent as given (already exported). via: "shm" (a POSIX
    shared-memory segment the server maps: no copy through HTTP) or "body" (the payload as the
    request body; a remote server). api_key: the server's --api-key.
    """

    def __init__(self, url: str, *, config: Optional[Mapping] = None, policy: Optional[str] = None,
                 rule: Optional[str] = "rne", seed: int = 0, via: str = "shm", api_key: Optional[str] = None,
                 probe_sequences: int = 4, probe_length: int = 32, probe_seed: int = 7, timeout: float = 600.0):
        if via not in ("shm", "body"):
            raise InputError(f"[sync.Pusher] via must be 'shm' or 'body', not {via!r}")
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.via = via
        self.timeout = timeout
        if config is None or policy is None:
            info = served_weights(self.url, api_key=api_key, timeout=timeout)
            config = info["config"] if config is None else config
            policy = info["policy"] if policy is None else policy
        self.config = dict(config)
        self.policy = policy
        self.publisher = Publisher(self.config, policy, probe_sequences, probe_length, probe_seed)
        from .export import Exporter

        fmt = self.publisher.served_format
        self.exporter = Exporter(rule, fmt, seed) if rule is not None and fmt != "f32" else None

    def payload(self, state_dict: Mapping[str, Any], version: int, *, fault: Optional[str] = None) -> bytes:
        """The sync payload of ``version`` (exported with the rule first); fault: a learner-side
        sync fault put into it (testing)."""
        shapes = dict(self.publisher.shapes)
        for name, t in state_dict.items():
            if name not in shapes and not (self.publisher.tied and name == "lm_head.weight"):
                raise InputError(f"[sync.Pusher] '{name}' is not a tensor of this model")
            if name in shapes and _shape_of(t) != list(shapes[name]):
                raise InputError(f"[sync.Pusher] '{name}': shape {tuple(_shape_of(t))} where the model has "
                                 f"{tuple(shapes[name])}")
        for name in shapes:
            if name not in state_dict:
                raise InputError(f"[sync.Pusher] the state dict has no '{name}'")
        tensors = {name: _float32_values(name, state_dict[name]) for name in shapes}
        if self.exporter is not None:
            tensors = self.exporter.export(tensors, step=version)
        return self.publisher.payload(tensors, version, fault)

    def push(self, state_dict: Mapping[str, Any], version: int, *, abort_running: bool = False,
             fault: Optional[str] = None) -> dict:
        """Sends ``state_dict`` (float32 master values by HF name: NumPy or CPU torch) as
        ``version`` (newer than the one serving). Returns the server's answer (``version``,
        ``applied``, ``report`` with every check's time) once the new version serves; raises
        :class:`PushError` when refused (the old version keeps serving). abort_running: end the
        requests running on the old version instead of letting them finish. fault: a sync fault
        of ``concord rl --fault``, for testing: a learner-side one is put into the payload, a
        sampler-side one is sent to the server (which needs --weights-faults)."""
        learner_faults = {name for name, learner in _c.faults() if learner}
        data = self.payload(state_dict, version, fault=fault if fault in learner_faults else None)
        if fault in learner_faults:
            fault = None  # in the payload
        options = {"abort_running": abort_running}
        if fault is not None:
            options["fault"] = fault
        if self.via == "body":
            query = f"version={int(version)}&abort_running={'true' if abort_running else 'false'}"
            if fault is not None:
                query += f"&fault={fault}"
            status, body = _request(f"{self.url}/v1/weights?{query}", "POST", data, "application/octet-stream",
                                    self.api_key, self.timeout)
        else:
            from multiprocessing import shared_memory

            segment = shared_memory.SharedMemory(create=True, size=len(data))
            try:
                segment.buf[: len(data)] = data
                request = {"version": int(version), "shm": "/" + segment.name.lstrip("/"), **options}
                status, body = _request(f"{self.url}/v1/weights", "POST", json.dumps(request).encode(),
                                        "application/json", self.api_key, self.timeout)
            finally:
                segment.close()
                segment.unlink()
        if status != 200:
            raise PushError(status, body)
        return body


def push(url: str, state_dict: Mapping[str, Any], version: int, *, plan: Optional[str] = None,
         **options: Any) -> dict:
    """One push (a :class:`Pusher` made for it): ``state_dict`` as ``version`` into the server at
    ``url``, exported with rne (``rule=``), the server's policy unless ``plan`` names one. For a
    training loop, keep a Pusher: it builds the publisher once and keeps sr/ef state."""
    abort_running = options.pop("abort_running", False)
    fault = options.pop("fault", None)
    return Pusher(url, policy=plan, **options).push(state_dict, version, abort_running=abort_running, fault=fault)
