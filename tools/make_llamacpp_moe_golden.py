#!/usr/bin/env python3
"""llama.cpp's logits on a tiny Qwen3-MoE GGUF that concord wrote: the independent check that
concord's qwen3moe layout (3-D ffn_*_exps tensors, ffn_gate_inp, the expert keys) is the one
llama.cpp reads, and that both compute the same model (issue 37).

Run once with the venv tools/llamacpp_env.sh builds, after `make build`:

  tools/.llamacpp-venv/bin/python tools/make_llamacpp_moe_golden.py [build/bin/concord]

Writes (committed, small) under tests/golden/moe/:
  tiny_qwen3moe/        an HF folder (config.json, model.safetensors) of seeded random weights:
                        2 layers of width 32, 4 experts of width 32, top-2, renormalised, the
                        byte vocabulary (259); routers N(0, 1) so that no top-k is a near-tie
  tiny_qwen3moe.gguf    `concord export --to gguf` of that folder (f32)
  llamacpp_logits.safetensors
                        tokens I32 (S, T) and llama.cpp's logits F32 (S*T, V) of every position
                        of S = 2 sequences of T = 12 byte tokens, each decoded in one batch, with
                        an f32 KV cache (llama.cpp's default f16 one alone moves logits ~3e-4);
                        metadata: llama-cpp-python / llama.cpp versions, the CPU
tests/model/moe_test.cpp (Moe.LlamaCppRunsConcordsGgufToTheSameLogits) loads the GGUF into
concord and compares.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_lib import ROOT, save_sequence_logits  # noqa: E402

OUT = ROOT / "tests" / "golden" / "moe"
C, F, FM, L, E, K, HQ, HKV, D, V = 32, 64, 32, 2, 4, 2, 2, 1, 16, 259
S, T = 2, 12


def make_folder(folder: Path) -> None:
    rng = np.random.default_rng(37)
    w = {}

    def mat(name, rows, cols, std=0.1):
        w[name] = (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    def norm(name, n):
        w[name] = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    mat("model.embed_tokens.weight", V, C, 0.5)
    for i in range(L):
        p = f"model.layers.{i}."
        norm(p + "input_layernorm.weight", C)
        mat(p + "self_attn.q_proj.weight", HQ * D, C)
        mat(p + "self_attn.k_proj.weight", HKV * D, C)
        mat(p + "self_attn.v_proj.weight", HKV * D, C)
        mat(p + "self_attn.o_proj.weight", C, HQ * D)
        norm(p + "self_attn.q_norm.weight", D)
        norm(p + "self_attn.k_norm.weight", D)
        norm(p + "post_attention_layernorm.weight", C)
        mat(p + "mlp.gate.weight", E, C, 1.0)
        for e in range(E):
            x = f"{p}mlp.experts.{e}."
            mat(x + "gate_proj.weight", FM, C)
            mat(x + "up_proj.weight", FM, C)
            mat(x + "down_proj.weight", C, FM)
    norm("model.norm.weight", C)
    mat("lm_head.weight", V, C)
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": V,
              "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": HQ,
              "num_key_value_heads": HKV, "head_dim": D, "max_position_embeddings": 64,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "num_experts": E, "num_experts_per_tok": K, "moe_intermediate_size": FM,
              "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "bos_token_id": 256, "eos_token_id": 257}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    save_file(w, str(folder / "model.safetensors"), metadata={"format": "pt"})


def main() -> None:
    concord = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "build" / "bin" / "concord")
    folder, gguf = OUT / "tiny_qwen3moe", OUT / "tiny_qwen3moe.gguf"
    make_folder(folder)
    gguf.unlink(missing_ok=True)
    subprocess.run([concord, "export", "--model", str(folder), "--to", "gguf", "--out", str(gguf)], check=True)
    save_sequence_logits(gguf, OUT / "llamacpp_logits.safetensors", S, T, V)

if __name__ == "__main__":
    main()
