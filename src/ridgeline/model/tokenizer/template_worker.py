"""The process that renders chat templates read from model files (run by path: `python template_worker.py`).

A template is a program written by whoever made the file. Jinja's ImmutableSandboxedEnvironment stops it
reaching Python internals (`__globals__`, `__subclasses__`, `_TemplateReference__context`, mutating calls) and
caps `range` at 100k items, but does not stop it spending time or memory: nested loops, `'x' * 10**10`,
`'{:999999999}'.format(1)`, a string doubled sixty times, recursion through macros. Rather than guard every
operator and filter, the render runs here, in a small interpreter of its own under an address-space limit;
the server bounds the time (template_sandbox.py) and replaces the process when it overruns or dies.

This file imports nothing from ridgeline (so the worker starts in ~0.1 s without numpy or torch); the
sandboxed environment is defined here once and chat_template.py uses the same one for our own template.

Protocol: one JSON object per line each way. In: {"source", "context"}. Out: {"text"} or {"error"}.
"""

import json
import sys
from functools import lru_cache

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# A prompt longer than this is no chat: the server's body limit is 4 MiB, and no context is this long.
MAX_RENDERED_CHARS = 4 * 1024 * 1024
# What the interpreter, jinja2 and a rendered prompt of MAX_RENDERED_CHARS need, with room to spare.
ADDRESS_SPACE_BYTES = 512 << 20
TOO_MUCH_MEMORY = f"rendering needed more than {ADDRESS_SPACE_BYTES >> 20} MiB"


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value, indent: int | None = None) -> str:
    # Jinja's own tojson escapes <, > and & for HTML, which would change the prompt text.
    return json.dumps(value, ensure_ascii=False, indent=indent)


@lru_cache(maxsize=8)
def compile_template(source: str) -> Template:
    # trim_blocks/lstrip_blocks: the whitespace rules chat templates are written for (as transformers renders them).
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.filters["tojson"] = _tojson
    return env.from_string(source)


def render_in_sandbox(source: str, context: dict) -> str:
    """The template's text; raises what the template raised. Output is cut off (as an error) past the cap."""
    parts, size = [], 0
    for part in compile_template(source).generate(**context):
        size += len(part)
        if size > MAX_RENDERED_CHARS:
            raise TemplateError(f"the rendered prompt is longer than {MAX_RENDERED_CHARS} characters")
        parts.append(part)
    return "".join(parts)


def _answer(job: dict) -> dict:
    try:
        return {"text": render_in_sandbox(job["source"], job["context"])}
    except MemoryError:
        return {"error": TOO_MUCH_MEMORY}
    except RecursionError:
        return {"error": "recursion too deep"}
    except Exception as error:  # noqa: BLE001 - whatever the template raised is the client's answer
        return {"error": " ".join(str(error).split())[:500] or type(error).__name__}


def main() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        reply = _answer(json.loads(line))
        try:
            encoded = json.dumps(reply)  # ASCII: lone surrogates in a template's output travel as escapes
        except MemoryError:
            encoded = json.dumps({"error": TOO_MUCH_MEMORY})
        print(encoded, flush=True)


if __name__ == "__main__":
    main()
