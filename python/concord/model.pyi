"""
Models and the inference engine: load (HF folder or GGUF), forward to logits, tokenize, generate, token log-probs.
"""

from collections.abc import Sequence
from typing import Any

import numpy
import numpy.typing


class Model:
    """
    A decoder loaded from a Hugging Face folder (config.json + safetensors + tokenizer.json) or a GGUF file, running a precision policy.
    """

    @staticmethod
    def load(path: str, policy: str = 'native') -> Model:
        """
        Loads a model folder or .gguf file. policy: 'native' (the file's own precision: a GGUF's Q4_0/Q4_1/Q8_0 weights served as stored, every other operand fp32), a precision preset on fp32 values (fp32, bf16, mxfp8, fp8-tensor, nvfp4, mxfp4) or a policy JSON file — the --policy of `concord generate`.
        """

    @property
    def path(self) -> str:
        """The file or folder it was loaded from."""

    @property
    def policy(self) -> str:
        """The precision policy's name."""

    @property
    def vocab_size(self) -> int:
        """Logits per position."""

    @property
    def config(self) -> dict[str, Any]:
        """The model's config.json content as a dict."""

    @property
    def stop_token_ids(self) -> list[int]:
        """
        The eos ids the model's files list (generation stops at them by default).
        """

    @property
    def chat_template(self) -> str:
        """The chat template text ('' when none)."""

    def forward(self, tokens: Sequence[int] | numpy.typing.ArrayLike) -> numpy.typing.NDArray[numpy.float32]:
        """
        Logits of every position, teacher-forced (Model::forward): tokens (T,) -> (T, V) float32, or (B, T) -> (B, T, V); the array owns the C++ buffer (no copy). tokens: a list of int or an int32/int64 array.
        """

    def encode(self, text: str, *, bos: bool = True) -> list[int]:
        """
        Token ids of text; bos=True adds the BOS where the vocabulary does, as `concord generate` encodes a prompt.
        """

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """HF's decode(ids, skip_special_tokens=...)."""

    def state_dict(self) -> dict[str, numpy.typing.NDArray[numpy.float32]]:
        """
        The fp32 values of every parameter by HF name, as writable float32 NumPy views of the model's own memory (no copy; they keep the model alive). Call weights_changed() after writing them. Weights a 'native' GGUF model keeps in its file's blocks have no fp32 values and are left out (load with a preset policy, e.g. 'fp32', to get them).
        """

    def weights_changed(self) -> None:
        """
        Rebuilds the quantized / pre-packed copies from the values on the next forward (after writing into state_dict()'s arrays).
        """

    def precision_plan(self, policy: str | None = None) -> dict[str, Any]:
        """
        The precision plan (concord.sync.plan) `policy` (a preset name or policy JSON; None: the model's own) gives this model's GEMM weights: what the RL loop's check 3 compares.
        """

    def content_hashes(self) -> dict[str, str]:
        """
        The content hash of every GEMM weight as this model's kernels read it ({name: '0x<16 hex>'}): what a learner publishes as concord.sync.content (check 4).
        """

    def __repr__(self) -> str: ...

class Completion:
    """One generated sequence."""

    @property
    def tokens(self) -> list[int]:
        """Generated token ids (a stop token included)."""

    @property
    def text(self) -> str:
        """
        The generated text as `concord generate` prints it (special tokens skipped).
        """

    @property
    def logprobs(self) -> list[float]:
        """
        logp of each generated token (model/logprob.h: log_softmax(logits / T), before top-k/top-p/min-p).
        """

    @property
    def finish_reason(self) -> str:
        """'stop', 'length', 'context' or 'cancelled'."""

    @property
    def prompt(self) -> list[int]:
        """The prompt's token ids."""

    def __repr__(self) -> str: ...

class Engine:
    """
    Generation for many sequences on one Model (serve::Engine): KV cache, chunked prefill, batched decode, seeded sampling.
    """

    def __init__(self, model: Model, *, max_sequences: int = 8, prefill_chunk: int = 512, max_context: int = 0) -> None:
        """
        An engine on `model` (kept alive by the engine): max_sequences decoded together, prefill_chunk prompt tokens per pass, max_context tokens per sequence (0: the model's max_position_embeddings).
        """

    def generate(self, prompts: str | Sequence[int] | numpy.typing.ArrayLike | Sequence[str | Sequence[int] | numpy.typing.ArrayLike], *, max_tokens: int = 256, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, seed: int = 0, stop: Sequence[int] | None = None) -> Completion | list[Completion]:
        """
        Generates from a prompt or a list of prompts (each a str, encoded as `concord generate` encodes it, or token ids) and returns a Completion (a list for a list): tokens, text, logprobs, finish_reason. Sampling as `concord generate`'s --temp, --top-k, --top-p, --min-p, --seed (every request gets `seed`; a request's tokens do not depend on the others in the batch); stop: stop token ids (default: the model's eos ids). The GIL is released while the engine runs.
        """

    def token_logprobs(self, tokens: Sequence[int] | numpy.typing.ArrayLike, *, temperature: float = 1.0) -> numpy.typing.NDArray[numpy.float64]:
        """
        logp(tokens[i] | tokens[:i]) for i >= 1 under the model, float64 (T - 1,): the engine scores the sequence as a prompt (model/logprob.h's one definition, the values the engine reports for sampled tokens; temperature as in sampling, 0 counts as 1).
        """

    @property
    def model(self) -> Model:
        """The Model it runs."""
