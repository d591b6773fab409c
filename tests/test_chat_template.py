"""Chat templates: the built-in Gemma one, templates from the model file, and the sandbox around them."""

import pytest
from gguf import TokenType
from reference_helpers import load_reference

from ridgeline.errors import RidgelineError
from ridgeline.model.tokenizer.spm import SpmTokenizer

REFERENCE = load_reference()


def _gemma_like(chat_template: str | None = None) -> SpmTokenizer:
    """Gemma's special tokens in a tiny vocabulary: the template logic does not need the 262k real ones."""
    control = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"]
    normal = ["▁", *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n.,!?"]
    return SpmTokenizer(
        control + normal,
        [0.0] * (len(control) + len(normal)),
        [TokenType.CONTROL] * len(control) + [TokenType.NORMAL] * len(normal),
        unknown_id=None,
        add_space_prefix=False,
        bos_id=2,
        eos_id=1,
        eos_ids=frozenset({1, 4}),
        add_bos=True,
        chat_template=chat_template,
    )


def test_builtin_gemma_template_renders_what_llama_cpp_was_given():
    reference_prompt = next(
        case["text"] for case in REFERENCE["tokenize"] if case["special"] and "Hi<end_of_turn>" in case["text"]
    )
    assert _gemma_like().apply_chat_template([{"role": "user", "content": "Hi"}]) == reference_prompt


def test_builtin_gemma_template_folds_the_system_prompt_into_the_first_user_turn():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": " Hello! "},
        {"role": "user", "content": "Why?"},
    ]
    tokenizer = _gemma_like()
    prompt = tokenizer.apply_chat_template(messages)
    assert prompt == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nWhy?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=False) == prompt.removesuffix(
        "<start_of_turn>model\n"
    )
    ids = tokenizer.encode(prompt, special=True)
    assert ids[:3] == [2, 3, tokenizer.piece_to_id["u"]]  # one BOS, then <start_of_turn> as a single token
    assert ids.count(2) == 1


def test_builtin_gemma_template_joins_text_parts():
    parts = [{"type": "text", "text": "Hello "}, {"type": "image_url", "image_url": "x"}, {"type": "text", "text": "you"}]
    assert _gemma_like().apply_chat_template([{"role": "user", "content": parts}], add_generation_prompt=False) == (
        "<start_of_turn>user\nHello you<end_of_turn>\n"
    )


def test_builtin_gemma_template_rejects_roles_out_of_turn():
    with pytest.raises(RidgelineError, match="alternate"):
        _gemma_like().apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_the_model_files_template_is_used_with_its_variables():
    template = (
        "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    tokenizer = _gemma_like(template)
    messages = [{"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(messages) == "<user>Hi<eos><assistant>"
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=False) == "<user>Hi<eos>"


def test_tojson_keeps_the_text_as_written():
    tokenizer = _gemma_like("{{ messages[0] | tojson }}")
    assert tokenizer.apply_chat_template([{"role": "user", "content": "<b>&é"}]) == (
        '{"role": "user", "content": "<b>&é"}'
    )


@pytest.mark.parametrize(
    "template, message",
    [
        ("{{ raise_exception('tools are not supported') }}", "tools are not supported"),
        ("{% for m in messages %}", "chat template failed"),  # syntax error
        ("{{ messages[0]['content'] + 1 }}", "chat template failed"),  # type error on the user's data
    ],
)
def test_template_errors_are_user_errors(template, message):
    with pytest.raises(RidgelineError, match=message):
        _gemma_like(template).apply_chat_template([{"role": "user", "content": "Hi"}])


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",  # the classic escape from a template
        "{{ messages.append({'role': 'system', 'content': 'pwned'}) }}",  # the caller's data is read-only
    ],
)
def test_sandbox_blocks_internals_and_mutation(template):
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(RidgelineError, match="unsafe"):
        _gemma_like(template).apply_chat_template(messages)
    assert messages == [{"role": "user", "content": "Hi"}]
