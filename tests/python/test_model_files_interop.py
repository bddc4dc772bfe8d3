"""Model files against the formats' own packages (safetensors, gguf, tokenizers; PyPI).

(1) A Hugging Face folder written here with numpy (Llama with GQA, Qwen3 with QK-norm, Qwen2
    with biases) goes through `concord export`: the safetensors folder holds the same tensors
    (safetensors.numpy), and the GGUF file loads in gguf.GGUFReader with every key llama.cpp
    reads for the architecture, llama.cpp's tensor names and shapes, and llama's q/k rows in
    the order of convert_hf_to_gguf.py's LlamaModel.permute (written out here in numpy).
(2) A GGUF written by gguf.GGUFWriter in llama.cpp's layout (the llama permutation done here,
    in numpy, from llama.cpp's formula; a byte-level BPE vocabulary with merges) loads in
    concord: `concord export` back to safetensors gives the original HF tensors bit for bit,
    and its tokenizer.json encodes as the vocabulary says in HF tokenizers. This is the
    independent check of the name map and the permutation.
$CONCORD_BIN comes from ctest.
"""

import json
import os

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

C, F, L, HQ, HKV, D = 64, 96, 2, 4, 2, 16


def llama_cpp_permute(w, n_head, n_head_kv=None):
    """convert_hf_to_gguf.py, LlamaModel.permute (numpy instead of torch)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def hf_weights(arch, vocab, seed):
    """HF parameter name -> float32 array, for Qwen3ForCausalLM (tied), Qwen2ForCausalLM
    (q/k/v biases, untied) or LlamaForCausalLM (untied)."""
    rng = np.random.default_rng(seed)
    w = {"model.embed_tokens.weight": rng.normal(0, 0.05, (vocab, C))}
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.normal(size=C)
        w[p + "self_attn.q_proj.weight"] = rng.normal(0, 0.05, (HQ * D, C))
        w[p + "self_attn.k_proj.weight"] = rng.normal(0, 0.05, (HKV * D, C))
        w[p + "self_attn.v_proj.weight"] = rng.normal(0, 0.05, (HKV * D, C))
        w[p + "self_attn.o_proj.weight"] = rng.normal(0, 0.05, (C, HQ * D))
        if arch == "Qwen2ForCausalLM":
            w[p + "self_attn.q_proj.bias"] = 0.1 * rng.normal(size=HQ * D)
            w[p + "self_attn.k_proj.bias"] = 0.1 * rng.normal(size=HKV * D)
            w[p + "self_attn.v_proj.bias"] = 0.1 * rng.normal(size=HKV * D)
        if arch == "Qwen3ForCausalLM":
            w[p + "self_attn.q_norm.weight"] = 1 + 0.1 * rng.normal(size=D)
            w[p + "self_attn.k_norm.weight"] = 1 + 0.1 * rng.normal(size=D)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.normal(size=C)
        w[p + "mlp.gate_proj.weight"] = rng.normal(0, 0.05, (F, C))
        w[p + "mlp.up_proj.weight"] = rng.normal(0, 0.05, (F, C))
        w[p + "mlp.down_proj.weight"] = rng.normal(0, 0.05, (C, F))
    w["model.norm.weight"] = 1 + 0.1 * rng.normal(size=C)
    if arch != "Qwen3ForCausalLM":
        w["lm_head.weight"] = rng.normal(0, 0.05, (vocab, C))
    return {k: v.astype(np.float32) for k, v in w.items()}


# HF name (without "model.layers.{i}.") -> llama.cpp's (gguf-py's TensorNameMap) name.
GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GGUF_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
                     "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def gguf_name(hf):
    if hf in GGUF_GLOBAL_NAMES:
        return GGUF_GLOBAL_NAMES[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{GGUF_LAYER_NAMES[rest]}"


def gguf_layout(arch, hf_name, w):
    """The tensor as llama.cpp stores it: llama's q/k rows permuted, everything else as is."""
    if arch == "LlamaForCausalLM" and (".q_proj." in hf_name or ".k_proj." in hf_name):
        return llama_cpp_permute(w, HQ, HQ if ".q_proj." in hf_name else HKV)
    return w


def write_hf_folder(path, arch, weights, vocab):
    os.makedirs(path)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": [arch], "vocab_size": vocab, "hidden_size": C,
              "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": HQ,
              "num_key_value_heads": HKV, "head_dim": D, "max_position_embeddings": 128,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
              "tie_word_embeddings": arch == "Qwen3ForCausalLM", "bos_token_id": 256,
              "eos_token_id": 257, "torch_dtype": "float32"}
    (path / "config.json").write_text(json.dumps(config))


def field(reader, key):
    assert key in reader.fields, f"GGUF lacks '{key}', which llama.cpp reads"
    return reader.fields[key]


ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_concord_export_loads_in_safetensors_and_gguf_reader(tmp_path, concord, arch):
    vocab = 259  # the byte tokenizer's: concord supplies it for a folder without tokenizer.json
    weights = hf_weights(arch, vocab, seed=len(arch))
    write_hf_folder(tmp_path / "hf", arch, weights, vocab)

    out = concord("export", "--model", tmp_path / "hf", "--to", "safetensors", "--out", tmp_path / "st")
    assert "safetensors" in out
    exported = load_file(str(tmp_path / "st" / "model.safetensors"))
    assert sorted(exported) == sorted(weights)
    for name, w in weights.items():
        assert exported[name].dtype == np.float32 and np.array_equal(exported[name], w), name
    bf16 = tmp_path / "bf16"
    concord("export", "--model", tmp_path / "hf", "--to", "safetensors", "--out", bf16, "--dtype", "bf16")
    assert json.loads((bf16 / "config.json").read_text())["torch_dtype"] == "bfloat16"
    hf_tokenizer = Tokenizer.from_file(str(tmp_path / "st" / "tokenizer.json"))
    assert hf_tokenizer.encode("Hi!").ids == [72, 105, 33]

    concord("export", "--model", tmp_path / "hf", "--to", "gguf", "--out", tmp_path / "m.gguf")
    reader = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    a = ARCHS[arch]
    assert field(reader, "general.architecture").contents() == a
    expected_u32 = {
        f"{a}.context_length": 128, f"{a}.embedding_length": C, f"{a}.block_count": L,
        f"{a}.feed_forward_length": F, f"{a}.attention.head_count": HQ,
        f"{a}.attention.head_count_kv": HKV, f"{a}.attention.key_length": D,
        f"{a}.attention.value_length": D, f"{a}.rope.dimension_count": D,
        "general.file_type": 0, "tokenizer.ggml.bos_token_id": 256,
        "tokenizer.ggml.eos_token_id": 257}
    for key, value in expected_u32.items():
        f = field(reader, key)
        assert f.types == [gguf.GGUFValueType.UINT32] and f.contents() == value, key
    for key, value in {f"{a}.attention.layer_norm_rms_epsilon": 1e-6, f"{a}.rope.freq_base": 10000.0}.items():
        f = field(reader, key)
        assert f.types == [gguf.GGUFValueType.FLOAT32] and f.contents() == np.float32(value), key
    assert field(reader, "general.name").contents()
    assert field(reader, "tokenizer.ggml.model").contents() == "gpt2"
    assert field(reader, "tokenizer.ggml.pre").contents()
    tokens = field(reader, "tokenizer.ggml.tokens").contents()
    assert len(tokens) == vocab and tokens[256:] == ["<|bos|>", "<|eos|>", "<|pad|>"]
    assert tokens[ord("A")] == "A" and tokens[ord(" ")] == "Ġ"  # GPT-2's byte-level characters
    assert field(reader, "tokenizer.ggml.token_type").contents() == [1] * 256 + [3] * 3
    assert field(reader, "tokenizer.ggml.merges").contents() == []  # llama.cpp requires the key

    tensors = {t.name: t for t in reader.tensors}
    assert sorted(tensors) == sorted(gguf_name(n) for n in weights)
    for name, w in weights.items():
        t = tensors[gguf_name(name)]
        assert t.tensor_type == gguf.GGMLQuantizationType.F32, name
        assert list(t.shape) == list(reversed(w.shape)), name  # ne0 first
        assert np.array_equal(np.asarray(t.data).reshape(w.shape), gguf_layout(arch, name, w)), name


def byte_level_vocabulary():
    """GPT-2's bytes_to_unicode characters as tokens 0..255, two merged tokens, three specials."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    tokens = [chars[b] for b in range(256)] + ["Ġt", "he", "<|bos|>", "<|eos|>", "<|pad|>"]
    types = [1] * 258 + [3] * 3
    return tokens, types, ["Ġ t", "h e"]


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_gguf_from_gguf_writer_loads_in_concord(tmp_path, concord, arch):
    tokens, types, merges = byte_level_vocabulary()
    vocab = len(tokens)
    weights = hf_weights(arch, vocab, seed=11)
    a = ARCHS[arch]
    path = tmp_path / f"{a}.gguf"
    writer = gguf.GGUFWriter(str(path), a)
    writer.add_name("python reference")
    writer.add_context_length(128)
    writer.add_embedding_length(C)
    writer.add_block_count(L)
    writer.add_feed_forward_length(F)
    writer.add_head_count(HQ)
    writer.add_head_count_kv(HKV)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(500000.0)
    writer.add_rope_dimension_count(D)
    writer.add_file_type(0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(258)
    writer.add_eos_token_id(259)
    writer.add_chat_template("{{ messages }}")
    for name, w in weights.items():
        writer.add_tensor(gguf_name(name), gguf_layout(arch, name, w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    out = tmp_path / "back"
    concord("export", "--model", path, "--to", "safetensors", "--out", out)
    back = load_file(str(out / "model.safetensors"))
    assert sorted(back) == sorted(weights)
    for name, w in weights.items():
        assert np.array_equal(back[name], w), f"{name}: the name map or the permutation is off"
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [arch]
    assert config["head_dim"] == C // HQ and config["num_key_value_heads"] == HKV
    assert config["rms_norm_eps"] == 1e-5 and config["rope_theta"] == 500000.0
    assert config["tie_word_embeddings"] is False and config["vocab_size"] == vocab
    assert config["bos_token_id"] == 258 and config["eos_token_id"] == 259
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == "{{ messages }}"
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 259

    hf_tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    # "the cat": "the" -> t + he (merge "h e"), " cat" -> Ġ c a t (no "Ġ t" pair to merge).
    assert hf_tokenizer.encode("the cat").ids == [ord("t"), 257, tokens.index("Ġ"), ord("c"), ord("a"), ord("t")]
    assert hf_tokenizer.encode(" top").ids == [256, ord("o"), ord("p")]


def test_corrupt_gguf_is_one_line_error(tmp_path, concord):
    tokens, types, merges = byte_level_vocabulary()
    path = tmp_path / "bad.gguf"
    writer = gguf.GGUFWriter(str(path), "gptneox")
    writer.add_context_length(128)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), C), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    err = concord("export", "--model", path, "--to", "safetensors", "--out", tmp_path / "x",
                  expect_rc=2)
    assert err.count("\n") == 1 and str(path) in err and "gptneox" in err, err
