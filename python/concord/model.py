"""Models and the inference engine: :class:`Model` loads a Hugging Face folder or a GGUF file
under a precision policy ("native" or a preset), runs the forward pass to logits (returned as a
NumPy array that owns the C++ buffer) and tokenizes; :class:`Engine` generates (as ``concord
generate``) and scores token log-probs with the engine's one definition (serve/logprob.h).
Long calls release the GIL.
"""

from ._concord.model import Completion, Engine, Model  # noqa: F401

__all__ = ["Completion", "Engine", "Model"]
