#!/usr/bin/env python3
"""llama.cpp's logits on a binary-weight model that concord exported as TQ2_0: the independent check
that `concord export --dtype tq2_0` writes a file llama.cpp reads as the same model (issue 19:
"so it runs outside concord too").

Run once with the venv tools/llamacpp_env.sh builds, after `make build`:

  tools/.llamacpp-venv/bin/python tools/make_llamacpp_binary_golden.py [build/bin/concord]

Writes (committed, small) under tests/golden/binary/:
  tiny_binary.gguf      `concord export --to gguf --dtype tq2_0` of an HF folder of seeded random
                        binary weights (made here in a temporary folder, not kept): a 2-layer Qwen3
                        of width 256 (TQ2_0 rows are 256-element blocks), 4 query / 2 KV heads of
                        64, MLP 256, the byte vocabulary (259), config.json's
                        concord_binary_weights "attention,mlp": every q k v o gate up down row is
                        +-alpha with an fp16-exact alpha, so TQ2_0 (codes -1/+1, d = alpha) holds it
                        exactly; embedding and head Q8_0, norms f32.
  llamacpp_logits.safetensors
                        tokens I32 (S, T) and llama.cpp's logits F32 (S*T, V) for every position of
                        S = 2 sequences of T = 12 byte tokens, each decoded in one batch with an f32
                        KV cache; metadata: llama-cpp-python / llama.cpp versions, the CPU.
tests/model/files_test.cpp (ModelFiles.LlamaCppRunsConcordsTq2_0ExportToTheSameLogits) loads the GGUF
into concord and compares. llama.cpp multiplies TQ2_0 weights with activations rounded to Q8_K
(8 bits per 256-block) and the Q8_0 head with Q8_0 activations, so the agreement is up to that
rounding, not bit for bit.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file  # the model folder

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_lib import ROOT, save_sequence_logits  # noqa: E402

OUT = ROOT / "tests" / "golden" / "binary"
C, F, L, HQ, HKV, D, V = 256, 256, 2, 4, 2, 64, 259
S, T = 2, 12


def make_folder(folder: Path) -> None:
    rng = np.random.default_rng(19)
    w = {}

    def binary(name, rows, cols):
        # +-alpha per row, alpha fp16-exact and about 1/sqrt(cols) so activations keep their scale
        alpha = rng.uniform(0.8, 1.2, size=(rows, 1)) / np.sqrt(cols)
        alpha = alpha.astype(np.float16).astype(np.float32)
        signs = np.where(rng.random((rows, cols)) < 0.5, -1.0, 1.0).astype(np.float32)
        w[name] = (signs * alpha).astype(np.float32)

    def norm(name, n):
        w[name] = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w["model.embed_tokens.weight"] = (rng.standard_normal((V, C)) * 0.5).astype(np.float32)
    for i in range(L):
        p = f"model.layers.{i}."
        norm(p + "input_layernorm.weight", C)
        binary(p + "self_attn.q_proj.weight", HQ * D, C)
        binary(p + "self_attn.k_proj.weight", HKV * D, C)
        binary(p + "self_attn.v_proj.weight", HKV * D, C)
        binary(p + "self_attn.o_proj.weight", C, HQ * D)
        norm(p + "self_attn.q_norm.weight", D)
        norm(p + "self_attn.k_norm.weight", D)
        norm(p + "post_attention_layernorm.weight", C)
        binary(p + "mlp.gate_proj.weight", F, C)
        binary(p + "mlp.up_proj.weight", F, C)
        binary(p + "mlp.down_proj.weight", C, F)
    norm("model.norm.weight", C)
    w["lm_head.weight"] = (rng.standard_normal((V, C)) * 0.2).astype(np.float32)
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": V,
              "hidden_size": C, "intermediate_size": F, "num_hidden_layers": L,
              "num_attention_heads": HQ, "num_key_value_heads": HKV, "head_dim": D,
              "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "bos_token_id": 256, "eos_token_id": 257,
              "concord_binary_weights": "attention,mlp"}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    save_file(w, str(folder / "model.safetensors"), metadata={"format": "pt"})


def main() -> None:
    concord = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "build" / "bin" / "concord")
    OUT.mkdir(parents=True, exist_ok=True)
    gguf = OUT / "tiny_binary.gguf"
    gguf.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "tiny_binary"
        make_folder(folder)
        subprocess.run([concord, "export", "--model", str(folder), "--to", "gguf", "--dtype", "tq2_0",
                        "--out", str(gguf)], check=True)
    from gguf import GGUFReader  # the field's own reader: the file holds TQ2_0 where it should

    kinds = {t.name: t.tensor_type.name for t in GGUFReader(str(gguf)).tensors}
    assert kinds["blk.0.attn_q.weight"] == "TQ2_0" and kinds["blk.1.ffn_down.weight"] == "TQ2_0", kinds
    assert kinds["token_embd.weight"] == "Q8_0" and kinds["output.weight"] == "Q8_0", kinds
    save_sequence_logits(gguf, OUT / "llamacpp_logits.safetensors", S, T, V)
    print(f"tensor types {sorted(set(kinds.values()))}")

if __name__ == "__main__":
    main()
