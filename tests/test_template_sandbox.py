"""Hostile chat templates (the model file's own): escapes refused, runaway time and memory cut off, each as a
clear user error; the worker that renders them comes back for the next request."""

import pytest

from ridgeline.errors import RidgelineError
from ridgeline.model.tokenizer.chat_template import render_chat_template
from ridgeline.model.tokenizer.template_sandbox import ChatTemplateError, TemplateWorker
from ridgeline.model.tokenizer.template_worker import MAX_RENDERED_CHARS

MESSAGES = [{"role": "user", "content": "Hi"}]
CONTEXT = {"messages": MESSAGES, "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": True}


def _render(source: str) -> str:
    return render_chat_template(source, MESSAGES, bos_token="<s>", eos_token="</s>", add_generation_prompt=True)


ESCAPES = {
    "subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "cycler_globals": "{{ cycler.__init__.__globals__.os.system('id') }}",
    "joiner_globals": "{{ joiner.__init__.__globals__ }}",
    "namespace_globals": "{{ namespace.__init__.__globals__ }}",
    "lipsum_globals": "{{ lipsum.__globals__['os'] }}",
    "format_walk": "{{ '{0.__class__.__base__.__subclasses__}'.format('') }}",
    "mutate_messages": "{{ messages.append({'role': 'system', 'content': 'pwned'}) }}",
    "mutate_dict": "{{ messages[0].update({'content': 'pwned'}) }}",
}
# Unsafe attributes looked up with '.' or [] are undefined in the sandbox: they render as nothing, leak nothing.
SILENT = {
    "function_globals": "{{ raise_exception.__globals__ }}",
    "template_context": "{{ self._TemplateReference__context }}",
    "dunder_item": "{{ messages['__class__'] }}",
    "attr_filter": "{{ ''|attr('__class__')|attr('__mro__') }}",
}


@pytest.mark.parametrize("name", ESCAPES)
def test_escape_attempts_are_refused_as_user_errors(name):
    with pytest.raises(RidgelineError, match="chat template failed: .*unsafe"):
        _render(ESCAPES[name])
    assert MESSAGES == [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("name", SILENT)
def test_private_and_dunder_lookups_render_as_nothing(name):
    assert _render(SILENT[name] + "ok") == "ok"


RUNAWAY = {
    "huge_range": ("{{ range(10**9) | length }}", "Range too big"),
    "recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion too deep"),
    "string_repeat": ("{{ 'x' * 10**10 }}", "needed more than"),
    "center_width": ("{{ 'a' | center(10**10) }}", "needed more than"),
    "doubling": (
        "{% set ns = namespace(s='xx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        "needed more than|longer than",
    ),
    "long_output": ("{% for i in range(100000) %}{{ 'y' * 100 }}{% endfor %}", f"longer than {MAX_RENDERED_CHARS}"),
    "big_int_text": ("{{ 10 ** 100000 }}", "chat template failed"),
}


@pytest.mark.parametrize("name", RUNAWAY)
def test_runaway_templates_end_in_a_clear_error(name):
    template, message = RUNAWAY[name]
    with pytest.raises(ChatTemplateError, match=message):
        _render(template)
    assert _render("{{ messages[0].content }}") == "Hi"  # the worker still serves (or was replaced)


def test_a_render_over_its_time_is_cut_off_and_the_worker_replaced():
    worker = TemplateWorker(render_seconds=0.3)
    try:
        busy = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
        with pytest.raises(ChatTemplateError, match="took longer than 0.3 s"):
            worker.render(busy, CONTEXT)
        assert worker._process is None  # killed, not left spinning
        assert worker.render("{{ messages[0].content }}!", CONTEXT) == "Hi!"
    finally:
        worker.close()


def test_a_dead_worker_is_replaced_on_the_next_render():
    worker = TemplateWorker()
    try:
        assert worker.render("{{ bos_token }}", CONTEXT) == "<s>"
        worker._process.kill()
        worker._process.wait()
        assert worker.render("{{ eos_token }}", CONTEXT) == "</s>"
    finally:
        worker.close()


def test_text_that_is_not_valid_unicode_travels_through_the_worker_unchanged():
    # The tokenizer refuses it afterwards by name; the worker's JSON pipe must not be what breaks.
    context = {**CONTEXT, "messages": [{"role": "user", "content": "a\ud800b"}]}
    worker = TemplateWorker()
    try:
        assert worker.render("{{ messages[0].content }}", context) == "a\ud800b"
    finally:
        worker.close()
