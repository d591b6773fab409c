"""Chat templates: Jinja2 text from the model file, rendered in a sandbox because the file is untrusted input."""

import json
from functools import lru_cache

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ridgeline.errors import RidgelineError

# Used when the model file has no template (the default Gemma 3 file has none). Gemma has no system role:
# a system message is folded into the first user turn, and the assistant's turns are called "model".
# Content may be a string or OpenAI-style parts ([{"type": "text", "text": ...}]); text parts are joined.
GEMMA_TEMPLATE = """\
{{- bos_token -}}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set system_prefix = messages[0]['content'] ~ '\n\n' -%}
    {%- set turns = messages[1:] -%}
{%- else -%}
    {%- set system_prefix = '' -%}
    {%- set turns = messages -%}
{%- endif -%}
{%- for message in turns -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{- raise_exception('Gemma chat roles must alternate user, assistant, user, ... (got ' ~ message['role'] ~ ')') -}}
    {%- endif -%}
    {%- set content = message['content'] -%}
    {%- if content is not string -%}
        {%- set content = content | selectattr('type', 'equalto', 'text') | map(attribute='text') | join -%}
    {%- endif -%}
    {{- '<start_of_turn>' ~ ('model' if message['role'] == 'assistant' else message['role']) ~ '\n' -}}
    {{- (system_prefix if loop.first else '') ~ content | trim -}}
    {{- '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<start_of_turn>model\n' -}}
{%- endif -%}
"""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value, indent: int | None = None) -> str:
    # Jinja's own tojson escapes <, > and & for HTML, which would change the prompt text.
    return json.dumps(value, ensure_ascii=False, indent=indent)


@lru_cache(maxsize=8)
def _compile(source: str) -> Template:
    # trim_blocks/lstrip_blocks: the whitespace rules chat templates are written for (as transformers renders them).
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.filters["tojson"] = _tojson
    return env.from_string(source)


def render_chat_template(
    source: str, messages: list[dict], *, bos_token: str, eos_token: str, add_generation_prompt: bool
) -> str:
    try:
        return _compile(source).render(
            messages=messages,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        )
    except (TemplateError, TypeError, ValueError, KeyError) as error:
        detail = " ".join(str(error).split()) or type(error).__name__
        raise RidgelineError(f"chat template failed: {detail}") from None
