"""A tiny Llama-architecture model folder written here (config.json + model.safetensors with seeded
random weights; no tokenizer.json, so concord gives its 259-entry vocabulary the byte-level
tokenizer): small enough that loading, forward passes and generation take milliseconds. Also
the code blocks of docs/python.md's examples, which the tests run."""

import json
import os

import numpy as np
from safetensors.numpy import save_file

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": 259, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
}


def tensors(seed=0, std=0.05):
    """The model's weights by HF name: matrices normal(0, std), norms around 1."""
    rng = np.random.default_rng(seed)
    c = CONFIG
    C, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    D, H, KV = c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"]

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(C)).astype(np.float32)

    out = {"model.embed_tokens.weight": mat(V, C)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = norm()
        out[p + "self_attn.q_proj.weight"] = mat(H * D, C)
        out[p + "self_attn.k_proj.weight"] = mat(KV * D, C)
        out[p + "self_attn.v_proj.weight"] = mat(KV * D, C)
        out[p + "self_attn.o_proj.weight"] = mat(C, H * D)
        out[p + "post_attention_layernorm.weight"] = norm()
        out[p + "mlp.gate_proj.weight"] = mat(I, C)
        out[p + "mlp.up_proj.weight"] = mat(I, C)
        out[p + "mlp.down_proj.weight"] = mat(C, I)
    out["model.norm.weight"] = norm()
    out["lm_head.weight"] = mat(V, C)
    return out


def write(folder, seed=0):
    """Writes the model folder; returns its path."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    save_file(tensors(seed), os.path.join(folder, "model.safetensors"))
    return folder


def docs_example(name):
    """The Python code block that follows `<!-- example: NAME` in docs/python.md (so the tests run
    the documentation's own examples)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    with open(os.path.join(root, "docs", "python.md"), encoding="utf-8") as f:
        text = f.read()
    at = text.index(f"<!-- example: {name}")
    start = text.index("```python\n", at) + len("```python\n")
    return text[start:text.index("```\n", start)]
