#!/usr/bin/env python3
"""llama.cpp's reference outputs on SmolLM2-135M-Instruct (Q4_1 GGUF), for concord's tests and
for the cross-engine kernel contract (issue 15).

Run with the venv tools/llamacpp_env.sh builds:

  tools/.llamacpp-venv/bin/python tools/make_llamacpp_golden.py            # the goldens
  tools/.llamacpp-venv/bin/python tools/make_llamacpp_golden.py \
      --traffic /tmp/llamacpp-traffic.safetensors                           # + real traffic

Writes under --out-dir (default tests/golden/smollm2/, committed, small):
  tokens.json         token ids of a few texts (English, code, Unicode, a rendered ChatML prompt),
                      as llama_tokenize(add_special=false, parse_special=true), and whether
                      add_special=true adds a BOS (the file says tokenizer.ggml.add_bos_token
                      false, so it must not).
  logits.safetensors  full-vocabulary logits at every position of two short chat prompts, in
                      concord's logit-dump format (src/concord/audit/dump.h: tensor "logits"
                      (P, V) F32, per-row I32 "sequence", "position", "prompt_length", "token",
                      "next", "label"; metadata "concord.format" = "logit-dump/1"). Each sequence
                      is the prompt plus llama.cpp's greedy first token, so the prompt's last row
                      has next = that token. Read it with `concord contract measure --ref FILE`.
  greedy.json         greedy (argmax) continuations of four chat prompts, up to --greedy-max
                      tokens, stopping at an end-of-generation token, with each step's top-2 logit
                      gap (a divergence of another engine is explained when it falls on a tie).
With --traffic PATH (not committed; large): "real traffic" — chat prompts of six task kinds
(factual QA, arithmetic, code, summarization, translation, creative), each greedily continued for
up to --traffic-max-new tokens; the logits of every position of every sequence as llama.cpp
served them (the prompt in one prefill batch, then one decode per generated token) with rows
labelled by task ("task" field), plus PATH.json (the exact token sequences, prompt + continuation,
for the other engine to score) and PATH.prompts.jsonl (the rendered prompts, one JSON object
{"prompt", "label", "task"} a line, for `concord contract dump --prompts`).

Chat prompts are rendered with the GGUF's own chat template exactly as transformers'
apply_chat_template renders it (jinja2 sandbox, trim_blocks, lstrip_blocks; add_generation_prompt).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_lib import DEFAULT_MODEL, ROOT, Engine, chat_template, cpu_name, render_chatml, versions  # noqa: E402

TOKEN_TEXTS = {
    "english": "The quick brown fox jumps over the lazy dog. It wasn't the first time, and "
               "it won't be the last: 3.14159 is roughly pi, 1,000,000 is a million.",
    "code": "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
            "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
            "if __name__ == '__main__':\n\tprint([fib(i) for i in range(10)])  # 0 1 1 2 3\n",
    "unicode": "naïve café — «Ελληνικά» Привет, мир! 日本語のテキスト 한국어 🤖👍🏽 "
               "e\u0301 \u200bzero\u200dwidth ﬁ ½ x² ∑∫ \U0001F600\r\n\t  trailing   ",
    "whitespace": "  leading\n\n\nthree newlines\t\ttabs    four spaces\n \n",
}
TOKEN_CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Translate 'good morning' into French."},
    {"role": "assistant", "content": "Bonjour."},
    {"role": "user", "content": "And into Spanish?"},
]

# (b): short system messages keep the two prompts at ~40 rows (~8 MB of F32 logits).
LOGIT_PROMPTS = {
    "hi": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}],
    "capital": [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Capital of Italy?"}],
}

# (c): prompts that draw long answers (>= 96 tokens before <|im_end|>); the default system
# message (the template's) unless one is given, as `concord generate --chat` renders them.
GREEDY_PROMPTS = {
    "story": [{"role": "user", "content": "Write a short story about a robot who learns to paint."}],
    "photosynthesis": [{"role": "user",
                        "content": "Explain how photosynthesis works, step by step."}],
    "prime": [{"role": "user", "content": "Write a Python function that checks whether a number "
                                          "is prime, and explain how it works."}],
    "tips": [{"role": "system", "content": "You are a friendly productivity coach."},
             {"role": "user", "content": "Give me five tips for staying focused when working "
                                         "from home."}],
}

# (d): real traffic, ten prompts of each task kind.
TRAFFIC = {
    "qa": ["What is the capital of France?", "Who wrote Romeo and Juliet?",
           "How many planets are in the solar system?", "What is the boiling point of water?",
           "What gas do plants absorb from the air?", "Who painted the Mona Lisa?",
           "What is the largest ocean on Earth?", "In which year did World War II end?",
           "What is the chemical symbol for gold?", "What language is spoken in Brazil?"],
    "arithmetic": ["What is 12 + 29?", "Compute 7 times 8.", "What is 144 divided by 12?",
                   "What is 15% of 200?", "Subtract 38 from 100.", "What is 9 squared?",
                   "If I have 3 apples and buy 5 more, how many do I have?",
                   "What is 1000 minus 357?", "What is the sum of 1, 2, 3, 4 and 5?",
                   "Multiply 23 by 4."],
    "code": ["Write a Python function that reverses a string.",
             "How do I read a file line by line in Python?",
             "Write a SQL query that counts the rows of a table named users.",
             "What does the JavaScript map function do?",
             "Write a bash command that lists files by size.",
             "Write a C function that returns the maximum of two integers.",
             "How do I sort a list of dictionaries by a key in Python?",
             "Explain what a Python list comprehension is.",
             "Write a regular expression that matches an email address.",
             "How do I make an HTTP GET request in Python?"],
    "summarization": [
        "Summarize in one sentence: The city council met on Monday to discuss the new park. "
        "Residents asked for more trees and benches, and the council agreed to fund both.",
        "Summarize: Photosynthesis lets plants turn sunlight, water and carbon dioxide into "
        "sugar and oxygen. It happens mostly in the leaves.",
        "Give a short summary: The company reported higher sales this quarter thanks to strong "
        "demand for its new phone, but profits fell because of rising costs.",
        "Summarize this: Regular exercise improves heart health, lifts mood and helps sleep. "
        "Experts suggest 150 minutes of moderate activity a week.",
        "Summarize: The museum will close for renovation in June and reopen next spring with "
        "a larger gallery for modern art.",
        "TL;DR: Our team moved the weekly meeting from Tuesday to Thursday because two members "
        "have classes on Tuesdays.",
        "Summarize briefly: Bees pollinate many crops. Their numbers have fallen because of "
        "pesticides, disease and loss of habitat.",
        "Summarize: The train was delayed by two hours after a tree fell on the tracks during "
        "the storm; no one was hurt.",
        "In one sentence, summarize: Learning a second language can improve memory and make "
        "travel easier, and it opens new job opportunities.",
        "Summarize: The library now lends laptops and Wi-Fi hotspots to students who need "
        "them for homework."],
    "translation": ["Translate into French: Good morning, how are you?",
                    "Translate into Spanish: Where is the train station?",
                    "Translate into German: Thank you very much.",
                    "Translate into Italian: I would like a cup of coffee.",
                    "Translate to English: Je m'appelle Marie.",
                    "Translate to English: ¿Dónde está la biblioteca?",
                    "Translate into French: The cat is sleeping on the sofa.",
                    "Translate into Spanish: I love reading books.",
                    "Translate into Portuguese: See you tomorrow.",
                    "Translate to English: Ich habe Hunger."],
    "creative": ["Write a haiku about the sea.", "Write a limerick about a cat.",
                 "Describe a sunset in two sentences.",
                 "Invent a name for a new ice cream flavor and describe it.",
                 "Write the opening line of a mystery novel.",
                 "Write a short poem about autumn leaves.",
                 "Give me a creative name for a coffee shop.",
                 "Write a two-sentence horror story.",
                 "Describe a dragon in three sentences.",
                 "Write a birthday message for a friend who loves hiking."],
}


def top2(logits: np.ndarray) -> tuple[int, float, int, float]:
    i1 = int(np.argmax(logits))  # argmax: the lowest id among equal maxima, as llama.cpp's greedy
    masked = logits.copy()
    masked[i1] = -np.inf
    i2 = int(np.argmax(masked))
    return i1, float(logits[i1]), i2, float(logits[i2])


def greedy(engine: Engine, prompt: list[int], max_new: int, keep_rows: bool):
    """llama.cpp's greedy decode: the prompt in one prefill, then one token per llama_decode.
    Returns the generated ids, each step's (top1, l1, top2, l2) and, with keep_rows, the logits
    row after every fed token (prompt positions, then each generated token but the last)."""
    engine.clear()
    engine.decode(prompt, logits="all" if keep_rows else "last")
    rows = [engine.logits(i) for i in range(len(prompt))] if keep_rows else []
    last = rows[-1] if keep_rows else engine.logits()
    out, steps = [], []
    for step in range(max_new):
        t = top2(last)
        steps.append(t)
        out.append(t[0])
        if engine.is_eog(t[0]) or step + 1 == max_new:
            break
        engine.decode([t[0]])
        last = engine.logits()
        if keep_rows:
            rows.append(last)
    return out, steps, rows


def text_end(engine: Engine, tokens: list[int]) -> int:
    """Characters of the longest whole-UTF-8 prefix of the tokens' bytes (a token may end inside
    a character): where the text of these tokens ends in the full detokenized text."""
    data = b"".join(engine.piece(t) for t in tokens)
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return len(data[:cut].decode("utf-8"))
        except UnicodeDecodeError:
            continue
    return len(data.decode("utf-8", errors="replace"))


def dump_tensors(seqs: list[dict], vocab: int, tasks: list[str] | None, labels: list[str]):
    """logit-dump/1 tensors for sequences {"tokens", "prompt_length", "rows", "task", "label"}:
    row p of a sequence is the distribution after tokens 0..p, token = tokens[p],
    next = tokens[p + 1]."""
    logits, cols = [], {k: [] for k in ("sequence", "position", "prompt_length", "token", "next",
                                         "task", "label")}
    for si, s in enumerate(seqs):
        toks = s["tokens"]
        assert len(s["rows"]) == len(toks) - 1, (len(s["rows"]), len(toks))
        for p, row in enumerate(s["rows"]):
            assert row.shape == (vocab,)
            logits.append(row)
            cols["sequence"].append(si)
            cols["position"].append(p)
            cols["prompt_length"].append(s["prompt_length"])
            cols["token"].append(toks[p])
            cols["next"].append(toks[p + 1])
            cols["task"].append(tasks.index(s["task"]) if tasks else -1)
            cols["label"].append(labels.index(s["label"]))
    tensors = {"logits": np.ascontiguousarray(np.stack(logits).astype(np.float32))}
    for k, v in cols.items():
        if k == "task" and not tasks:
            continue
        tensors[k] = np.asarray(v, dtype=np.int32)
    return tensors


def provenance(args, engine: Engine) -> dict:
    return {
        "engine": "llama.cpp",
        **versions(),
        "model": Path(args.model).name,
        "model_bytes": Path(args.model).stat().st_size,
        "n_threads": args.threads,
        "n_batch": engine.n_batch,
        "cpu": cpu_name(),
        "made_by": "tools/make_llamacpp_golden.py",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--out-dir", default=str(ROOT / "tests/golden/smollm2"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--greedy-max", type=int, default=128)
    ap.add_argument("--traffic", help="also write the real-traffic dump here (.safetensors)")
    ap.add_argument("--traffic-per-task", type=int, default=10)
    ap.add_argument("--traffic-max-new", type=int, default=30)
    ap.add_argument("--skip-goldens", action="store_true", help="only the --traffic dump")
    args = ap.parse_args()

    template = chat_template(args.model)
    engine = Engine(args.model, n_threads=args.threads)
    V = engine.n_vocab
    prov = provenance(args, engine)
    out = Path(args.out_dir)
    t0 = time.time()

    def chat(messages):
        text = render_chatml(template, messages)
        return text, engine.tokenize(text, add_special=False, parse_special=True)

    if not args.skip_goldens:
        out.mkdir(parents=True, exist_ok=True)
        # (a) token ids
        special = engine.bos_eos()
        texts = dict(TOKEN_TEXTS)
        texts["chatml"] = render_chatml(template, TOKEN_CHAT)
        entries = []
        for name, text in texts.items():
            ids = engine.tokenize(text, add_special=False, parse_special=True)
            with_special = engine.tokenize(text, add_special=True, parse_special=True)
            entries.append({
                "name": name, "text": text, "ids": ids,
                "ids_add_special": with_special,
                "ids_no_parse_special": engine.tokenize(text, add_special=False,
                                                        parse_special=False),
                "roundtrip": engine.detokenize(ids) == text,
            })
        adds_bos = any(e["ids_add_special"][:1] == [special["bos"]] and
                       e["ids"][:1] != [special["bos"]] for e in entries)
        (out / "tokens.json").write_text(json.dumps({
            **prov, "special": special, "adds_bos_with_add_special": adds_bos,
            "chat_messages": TOKEN_CHAT,
            "note": "ids = llama_tokenize(add_special=false, parse_special=true); "
                    "ids_add_special = add_special=true (adds BOS only when the GGUF says "
                    "add_bos_token true); ids_no_parse_special = special tokens as text",
            "texts": entries}, ensure_ascii=False, indent=1) + "\n")

        # (b) full-vocabulary logits of every position of two short chat prompts
        seqs, labels = [], list(LOGIT_PROMPTS)
        for name, messages in LOGIT_PROMPTS.items():
            text, ids = chat(messages)
            gen, _, rows = greedy(engine, ids, 1, keep_rows=True)
            seqs.append({"tokens": ids + gen, "prompt_length": len(ids), "rows": rows,
                         "task": None, "label": name})
        tensors = dump_tensors(seqs, V, None, labels)
        meta = {"concord.format": "logit-dump/1", "concord.labels": json.dumps(labels),
                "concord.source": json.dumps(prov), "concord.messages":
                json.dumps(LOGIT_PROMPTS, ensure_ascii=False)}
        save_file(tensors, str(out / "logits.safetensors"), metadata=meta)
        print(f"logits.safetensors: {tensors['logits'].shape[0]} rows x {V}", file=sys.stderr)

        # (c) greedy continuations with top-2 gaps
        greedy_entries = []
        for name, messages in GREEDY_PROMPTS.items():
            text, ids = chat(messages)
            gen, steps, _ = greedy(engine, ids, args.greedy_max, keep_rows=False)
            greedy_entries.append({
                "name": name, "messages": messages, "prompt_text": text, "prompt_ids": ids,
                "generated_ids": gen, "generated_text": engine.detokenize(gen),
                "stopped": "eog" if engine.is_eog(gen[-1]) else "max_tokens",
                "steps": [{"token": a, "logit": round(la, 5), "second": b,
                           "second_logit": round(lb, 5), "gap": round(la - lb, 5),
                           "text_end": text_end(engine, gen[: k + 1])}
                          for k, (a, la, b, lb) in enumerate(steps)],
                "min_gap": round(min(la - lb for _, la, _, lb in steps), 5),
            })
            print(f"greedy {name}: {len(gen)} tokens, min gap "
                  f"{greedy_entries[-1]['min_gap']}", file=sys.stderr)
        (out / "greedy.json").write_text(json.dumps({
            **prov, "max_new_tokens": args.greedy_max,
            "note": "greedy = argmax of llama.cpp's logits (lowest id on a tie); the prompt in "
                    "one prefill batch, then one llama_decode per token; stops after an "
                    "end-of-generation token (included)",
            "prompts": greedy_entries}, ensure_ascii=False, indent=1) + "\n")

    if args.traffic:
        path = Path(args.traffic)
        tasks = list(TRAFFIC)
        seqs, labels, jseq = [], [], []
        for task in tasks:
            for k, q in enumerate(TRAFFIC[task][: args.traffic_per_task]):
                label = f"{task}-{k:02d}"
                messages = [{"role": "user", "content": q}]
                text, ids = chat(messages)
                gen, steps, rows = greedy(engine, ids, args.traffic_max_new, keep_rows=True)
                toks = ids + gen
                seqs.append({"tokens": toks, "prompt_length": len(ids), "rows": rows,
                             "task": task, "label": label})
                labels.append(label)
                jseq.append({"sequence": len(jseq), "task": task, "label": label,
                             "messages": messages, "prompt_text": text,
                             "prompt_length": len(ids), "tokens": toks,
                             "generated_text": engine.detokenize(gen),
                             "min_gap": round(min(la - lb for _, la, _, lb in steps), 5)})
        tensors = dump_tensors(seqs, V, tasks, labels)
        meta = {"concord.format": "logit-dump/1", "concord.tasks": json.dumps(tasks),
                "concord.labels": json.dumps(labels), "concord.source": json.dumps(prov)}
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path), metadata=meta)
        Path(str(path) + ".json").write_text(json.dumps({
            **prov, "max_new_tokens": args.traffic_max_new,
            "note": "each sequence: prompt ids + llama.cpp's greedy continuation (ending with an "
                    "end-of-generation token when one came); the dump has one row per token but "
                    "the last, in this order",
            "sequences": jseq}, ensure_ascii=False, indent=1) + "\n")
        with open(str(path) + ".prompts.jsonl", "w") as f:
            for s in jseq:
                f.write(json.dumps({"prompt": s["prompt_text"], "label": s["label"],
                                    "task": s["task"]}, ensure_ascii=False) + "\n")
        print(f"{path}: {tensors['logits'].shape[0]} rows x {V}, {len(jseq)} sequences",
              file=sys.stderr)
    print(f"done in {time.time() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
