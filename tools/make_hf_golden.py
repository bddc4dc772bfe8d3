#!/usr/bin/env python3
"""Writes tests/golden/hf_{qwen3,llama,qwen2,qwen3_moe}_tiny.safetensors (+ .config.json): Hugging Face
transformers' own Qwen3ForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM (q/k/v biases) and
Qwen3MoeForCausalLM (router, top-k experts, load-balancing loss), in float64, on seeded tiny models — the
goldens that tests/model/reference_golden_test.cpp (fp64 reference) and
tests/model/model_vs_reference_test.cpp (concord's Model) are checked against.

torch is a multi-GB install, so this runs once, by hand, in a throwaway venv outside the repo
(the outputs are committed; CI never needs torch):

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch transformers safetensors numpy
    /tmp/torchvenv/bin/python tools/make_hf_golden.py tests/golden [qwen3 llama qwen2]

Made with torch 2.15.0, transformers 5.24.0, safetensors 0.8.0 (also recorded in each file's
__metadata__).

float64 everywhere. HF's modeling code hard-codes float32 in four places even when the model is
float64: RMSNorm (`hidden_states.to(torch.float32)`), the RoPE tables (`torch.arange(...,
dtype=torch.float)` and `position_ids[..., None].float()`), the attention softmax
(`softmax(..., dtype=torch.float32)`), and the loss (`logits.float()` in ForCausalLMLoss). A
golden with those float32 round trips would only agree with an fp64 reference to ~1e-7. So this
script loads HF's own modeling module source with exactly those float32 casts rewritten to
float64 (the replacements and their counts are asserted below; nothing else changes), and
computes the loss with torch's cross_entropy in float64 on the same shift HF uses. As a check it
also runs the unmodified HF model and prints how far its float32-cast logits and loss are from
the float64 ones.

Each file holds, all little-endian:
  <HF parameter name>   F32, every entry of model.named_parameters() (tied Qwen3: no
                        lm_head.weight, as in model.h). The weights are drawn in float64 and
                        rounded to float32 *before* the float64 forward, so F32 stores them
                        exactly and an fp32 model loads the very weights HF ran on.
  input_ids             I32 (B, T), B=2, T=12, seeded uniform in [0, vocab)
  logits                F64 (B*T, V)
  loss                  F64 (1,)  mean cross-entropy of tokens[t+1] given tokens[..t], over the
                        B*(T-1) positions (HF labels = input_ids; concord: targets[t] =
                        tokens[t+1], targets[T-1] = -1 — the same mean)
  ce_loss, aux_loss     F64 (1,)  Qwen3-MoE only: the cross-entropy and HF's load-balancing loss;
                        loss = ce_loss + router_aux_loss_coef * aux_loss, as HF's with labels
  selected.<layer>      I32 (B*T, k)  Qwen3-MoE only: each MoE layer's top-k experts per token,
                        ascending (the script asserts no near-tie: margin > 1e-6)
  <expert names>        Qwen3-MoE: transformers 5 holds a layer's experts fused
                        (mlp.experts.gate_up_proj, down_proj); the file names them per expert,
                        mlp.experts.{e}.{gate,up,down}_proj.weight, as checkpoints and concord do
  grad.<param name>     F32, d loss / d parameter from loss.backward() in float64, rounded to
                        float32 on storage (relative error <= 2^-24, far below the 1e-4 the
                        fp32 model is held to; F64 would make the files ~1.3-1.5 MB)
Weights: torch.manual_seed(seed), then in named_parameters() order: matrices N(0, 0.02^2),
norm weights and biases 1 + 0.1 N(0, 1) (so that the norms are not the identity and the biases
matter); then rounded to float32.
"""

import importlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import safetensors
import torch
import transformers
from safetensors.numpy import save_file

B, T = 2, 12
SHAPE = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=10000.0)

# HF's float32 casts, rewritten to float64; each must occur exactly this many times.
FP64_REWRITES = [
    ("hidden_states.to(torch.float32)", "hidden_states.to(torch.float64)", 1),  # RMSNorm
    ("dtype=torch.float)", "dtype=torch.float64)", 2),                           # RoPE tables
    ("position_ids[..., None].float()", "position_ids[..., None].double()", 1),  # RoPE angles
    ("softmax(attn_weights, dim=-1, dtype=torch.float32)",
     "softmax(attn_weights, dim=-1, dtype=torch.float64)", 1),                  # attention
]


# Qwen3-MoE's further float32 casts: the router's softmax and the load-balancing loss.
FP64_REWRITES_MOE = [
    ("softmax(router_logits, dtype=torch.float, dim=-1)",
     "softmax(router_logits, dtype=torch.float64, dim=-1)", 1),                 # router
    ("torch.float32", "torch.float64", 5),                                       # aux loss sums
    ("routing_weights.float()", "routing_weights.double()", 2),                  # aux loss sums
]


def fp64_modeling_module(name):
    """HF's transformers.models.<name>.modeling_<name>, with the float32 casts made float64."""
    original = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    source = Path(original.__file__).read_text()
    for old, new, count in FP64_REWRITES + (FP64_REWRITES_MOE if name == "qwen3_moe" else []):
        found = source.count(old)
        assert found == count, f"{original.__name__}: expected {count} x {old!r}, found {found}"
        source = source.replace(old, new)
    assert "float32" not in source and ".float()" not in source, "an fp32 cast is left"
    module = types.ModuleType(original.__name__ + "_fp64")
    module.__package__ = original.__package__
    module.__file__ = original.__file__
    sys.modules[module.__name__] = module  # HF's docstring decorators look the module up
    exec(compile(source, original.__file__ + " (fp64 casts)", "exec"), module.__dict__)
    return original, module


def build(name, config, seed, use_fp64_module=True):
    original, fp64 = fp64_modeling_module(name)
    cls_name = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM",
                "qwen2": "Qwen2ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[name]
    cls = getattr(fp64 if use_fp64_module else original, cls_name)
    torch.manual_seed(seed)
    if name == "qwen3_moe":
        # The modeling file's own loop over experts (transformers 5 otherwise dispatches to
        # torch's grouped_mm, which has no float64).
        config._experts_implementation = "eager"
    model = cls(config).double().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("mlp.gate.weight"):
                # MoE routers N(0, 1): decisive routing, so that no token's top-k is a near-tie
                # that fp32 and fp64 could break differently.
                p.copy_(torch.randn(p.shape, dtype=torch.float64))
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, dtype=torch.float64) * 0.02)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, dtype=torch.float64))
            p.copy_(p.float().double())  # fp32-representable: stored exactly as F32
    return model


def hf_checkpoint_names(name, value, config):
    """(checkpoint name, tensor) pairs of a parameter: transformers 5 fuses a layer's experts into
    mlp.experts.gate_up_proj (E, 2F, C) and mlp.experts.down_proj (E, C, F); checkpoints (and
    concord) name them per expert, mlp.experts.{e}.{gate,up,down}_proj.weight."""
    if name.endswith("mlp.experts.gate_up_proj"):
        prefix, F = name[: -len("gate_up_proj")], config.moe_intermediate_size
        out = []
        for e in range(value.shape[0]):
            out.append((f"{prefix}{e}.gate_proj.weight", value[e, :F]))
            out.append((f"{prefix}{e}.up_proj.weight", value[e, F:]))
        return out
    if name.endswith("mlp.experts.down_proj"):
        prefix = name[: -len("down_proj")]
        return [(f"{prefix}{e}.down_proj.weight", value[e]) for e in range(value.shape[0])]
    return [(name, value)]


def shifted_loss(logits, input_ids):
    V = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits[:, :-1, :].reshape(-1, V),
                                             input_ids[:, 1:].reshape(-1).long())


def make(name, config, seed, out_dir):
    model = build(name, config, seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    input_ids = torch.randint(0, config.vocab_size, (B, T), generator=gen)
    moe = name == "qwen3_moe"
    out = model(input_ids=input_ids, output_router_logits=moe)
    logits = out.logits
    assert logits.dtype == torch.float64
    loss = shifted_loss(logits, input_ids)
    extra = {}
    if moe:
        # CE + coef * HF's load-balancing loss (what HF's loss is with labels and
        # output_router_logits), and each MoE layer's selected experts (ascending per token).
        aux = out.aux_loss
        assert aux.dtype == torch.float64
        ce = loss
        loss = ce + config.router_aux_loss_coef * aux
        extra["ce_loss"] = np.array([ce.item()], dtype=np.float64)
        extra["aux_loss"] = np.array([aux.item()], dtype=np.float64)
        moe_layers = [i for i in range(config.num_hidden_layers) if i not in config.mlp_only_layers
                      and (i + 1) % config.decoder_sparse_step == 0]
        assert len(moe_layers) == len(out.router_logits)
        for layer, rl in zip(moe_layers, out.router_logits):
            probs = torch.softmax(rl, dim=-1)
            top2 = torch.topk(probs, config.num_experts_per_tok + 1, dim=-1).values
            gap = (top2[:, -2] - top2[:, -1]).min().item()
            assert gap > 1e-6, f"layer {layer}: a near-tie in the top-k (gap {gap})"
            picks = torch.topk(probs, config.num_experts_per_tok, dim=-1).indices
            extra[f"selected.{layer}"] = picks.sort(dim=-1).values.numpy().astype(np.int32)
            print(f"  layer {layer}: smallest top-k margin {gap:.3g}")
    model.zero_grad()
    loss.backward()

    # HF's own loss (labels = input_ids) must be the same, up to its float32 upcast.
    with torch.no_grad():
        hf_loss = model(input_ids=input_ids, labels=input_ids, output_router_logits=moe).loss.item()
    assert abs(hf_loss - loss.item()) < 1e-5 * abs(loss.item()), (hf_loss, loss.item())

    # The unmodified HF model (float32 casts inside) on the same weights, for the record.
    stock = build(name, config, seed, use_fp64_module=False)
    stock.load_state_dict(model.state_dict())
    with torch.no_grad():
        stock_logits = stock(input_ids=input_ids).logits
        stock_loss = stock(input_ids=input_ids, labels=input_ids).loss.item()
    stock_rel = ((stock_logits - logits).abs().max() / logits.abs().max()).item()

    tensors = {}
    names = []
    for pname, p in model.named_parameters():
        grads = dict(hf_checkpoint_names(pname, p.grad.detach(), config))
        for cname, value in hf_checkpoint_names(pname, p.detach(), config):
            names.append(cname)
            tensors[cname] = value.numpy().astype(np.float32)
            assert np.array_equal(tensors[cname].astype(np.float64), value.numpy())
            tensors["grad." + cname] = grads[cname].numpy().astype(np.float32)
    tensors.update(extra)
    tensors["input_ids"] = input_ids.numpy().astype(np.int32)
    tensors["logits"] = logits.detach().reshape(B * T, -1).numpy().copy()
    tensors["loss"] = np.array([loss.item()], dtype=np.float64)
    meta = {
        "architecture": config.architectures[0],
        "seed": str(seed),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "note": "float64; HF modeling code with its float32 casts rewritten to float64 "
                "(tools/make_hf_golden.py)",
        "parameters": json.dumps(names),
    }
    stem = f"hf_{name}_tiny"
    path = Path(out_dir) / f"{stem}.safetensors"
    save_file(tensors, str(path), metadata=meta)
    path.chmod(0o644)
    (Path(out_dir) / f"{stem}.config.json").write_text(model.config.to_json_string())
    print(f"{path}: {path.stat().st_size} bytes, {len(names)} parameters "
          f"({sum(p.numel() for p in model.parameters())} values), loss {loss.item():.17g}")
    print(f"  max |logit| {logits.abs().max().item():.4g}; unmodified HF (fp32 casts): "
          f"logits rel diff {stock_rel:.3g}, loss {stock_loss:.17g} "
          f"(diff {abs(stock_loss - loss.item()):.3g})")
    print(f"  tied: {'lm_head.weight' not in names}; params: {names[:3]} ... {names[-2:]}")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/golden"
    qwen3 = transformers.Qwen3Config(**SHAPE, head_dim=16, tie_word_embeddings=True,
                                     architectures=["Qwen3ForCausalLM"])
    llama = transformers.LlamaConfig(**SHAPE, tie_word_embeddings=False,
                                     architectures=["LlamaForCausalLM"])
    qwen2 = transformers.Qwen2Config(**SHAPE, tie_word_embeddings=True,
                                     architectures=["Qwen2ForCausalLM"])
    # Qwen3-MoE: 8 experts, top-2, renormalised (as Qwen3-30B-A3B), layer 0 dense through
    # mlp_only_layers and layer 1 MoE, the load-balancing loss on at coef 0.1 (visible in the
    # gradients), untied head.
    qwen3_moe = transformers.Qwen3MoeConfig(**SHAPE, head_dim=16, tie_word_embeddings=False,
                                            num_experts=8, num_experts_per_tok=2,
                                            moe_intermediate_size=48, norm_topk_prob=True,
                                            decoder_sparse_step=1, mlp_only_layers=[0],
                                            router_aux_loss_coef=0.1, output_router_logits=True,
                                            architectures=["Qwen3MoeForCausalLM"])
    assert llama.hidden_size // llama.num_attention_heads == 16
    models = {"qwen3": (qwen3, 1234), "llama": (llama, 5678), "qwen2": (qwen2, 9012),
              "qwen3_moe": (qwen3_moe, 3456)}
    for name in sys.argv[2:] or models:
        make(name, *models[name], out_dir)


if __name__ == "__main__":
    main()
