"""Train the small byte-level BPE tokenizers in tests/data/tokenizer/ with HF tokenizers.

Each is trained on the King James Bible (the corpus concord trains on) and saved as a
tokenizer.json that concord must load and encode exactly as HF does:

  qwen3_kjv_4096.json   Qwen3's pipeline: NFC, the Qwen2 split regex, ByteLevel, 4096-token BPE,
                        then Qwen3's special tokens (<|endoftext|>, <|im_start|>, ...) and its
                        non-special added tokens (<think>, </think>, <tool_call>, ...).
  llama3_kjv_1024.json  Llama 3's: no normalizer, the Llama-3 regex (\\p{N}{1,3}),
                        ignore_merges, and added tokens with lstrip/rstrip/single_word/normalized.
  gpt2_kjv_1024.json    GPT-2's: ByteLevel with its own regex, merges written as "a b" strings.

Usage: .venv/bin/python tools/make_test_tokenizer.py [out_dir] (default tests/data/tokenizer).
The corpus is ~/.cache/concord/kjv.txt, or `/usr/bin/bible -f Gen1:1-Rev22:21` when missing.
"""

import json
import os
import subprocess
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, trainers

QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
               r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = QWEN2_REGEX.replace(r"\p{N}|", r"\p{N}{1,3}|")

QWEN3_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                 "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                 "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                 "<|image_pad|>", "<|video_pad|>"]
QWEN3_ADDED = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
               "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
               "<tool_response>", "</tool_response>", "<think>", "</think>"]
# Qwen3 marks the fim/repo/file tokens special; the tool and think tokens are not.
QWEN3_ADDED_SPECIAL = {"<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                       "<|repo_name|>", "<|file_sep|>"}


def kjv_text():
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                         "concord", "kjv.txt")
    if os.path.exists(cache):
        with open(cache, encoding="utf-8") as f:
            return f.read()
    return subprocess.run(["/usr/bin/bible", "-f", "Gen1:1-Rev22:21"], stdin=subprocess.DEVNULL,
                          capture_output=True, check=True, text=True).stdout


def train(tokenizer, vocab_size, lines):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(lines, trainer=trainer)


def qwen3(lines):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train(tok, 4096, lines)
    for content in QWEN3_SPECIAL + QWEN3_ADDED:
        special = content in QWEN3_SPECIAL or content in QWEN3_ADDED_SPECIAL
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
    return tok


def llama3(lines):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    train(tok, 1024, lines)
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    tok.add_tokens([
        AddedToken("<mask>", lstrip=True, rstrip=True, single_word=True, normalized=False),
        AddedToken("[L]", lstrip=True, normalized=False),
        AddedToken("[R]", rstrip=True, normalized=False),
        AddedToken("word", single_word=True, normalized=False),
        AddedToken("Lord God", normalized=True),
        AddedToken("<|end|>", normalized=False),  # a prefix of <|end_of_text|>: longest wins
    ])
    return tok


def gpt2(lines):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    train(tok, 1024, lines)
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "tests", "data", "tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    lines = kjv_text().splitlines(keepends=True)
    for name, make in [("qwen3_kjv_4096.json", qwen3), ("llama3_kjv_1024.json", llama3),
                       ("gpt2_kjv_1024.json", gpt2)]:
        data = json.loads(make(lines).to_str())
        if name.startswith("gpt2"):  # the other merge form of tokenizer.json
            data["model"]["merges"] = [" ".join(m) for m in data["model"]["merges"]]
        path = os.path.join(out_dir, name)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        print(f"{path}: {os.path.getsize(path)} bytes, {len(data['model']['vocab'])} tokens, "
              f"{len(data['model']['merges'])} merges, {len(data['added_tokens'])} added")


if __name__ == "__main__":
    main()
