"""Chat templates: Jinja2 text from the model file, rendered in a sandboxed worker because the file is untrusted input."""

from jinja2 import TemplateError

from ridgeline.model.tokenizer.template_sandbox import ChatTemplateError, render_untrusted
from ridgeline.model.tokenizer.template_worker import render_in_sandbox

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


def render_chat_template(
    source: str, messages: list[dict], *, bos_token: str, eos_token: str, add_generation_prompt: bool,
    tools: list[dict] | None = None,
) -> str:
    context = dict(messages=messages, bos_token=bos_token, eos_token=eos_token, add_generation_prompt=add_generation_prompt)
    if tools is not None:  # as Hugging Face passes them: OpenAI function definitions
        context["tools"] = tools
    if source != GEMMA_TEMPLATE:
        return render_untrusted(source, context)  # the model file's own: a worker bounds its time and memory
    try:
        return render_in_sandbox(source, context)
    except (TemplateError, TypeError, ValueError, KeyError) as error:
        detail = " ".join(str(error).split()) or type(error).__name__
        raise ChatTemplateError(f"chat template failed: {detail}") from None
