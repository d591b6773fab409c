#!/usr/bin/env python
"""Coverage-guided fuzzing (atheris) of structured-output constraints: JSON schemas, regexes, choices and Lark
grammars of any shape -> StructuredOutputsParams.validate -> GrammarCompiler.compile (the default model's
262,144-token vocabulary) -> the first token mask.

    python tests/fuzz/fuzz_constraints.py [-runs=N | -max_total_time=S] [-seed=N]

Structure-aware: each input picks a seed constraint and rewrites a few of its parts with values of any JSON type,
JSON Schema keywords (supported or not), regex and grammar fragments. Every input must compile or end in an
InvalidParameterError with a one-line message (the server's 400); anything else — another exception, a hang past
-timeout, RSS past -rss_limit_mb — is a crash, written under the printed work directory.
"""

import copy
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["ridgeline"]):
    from ridgeline.engine.structured.compiler import GrammarCompiler
    from ridgeline.engine.structured.params import StructuredOutputsParams
    from ridgeline.errors import InvalidParameterError
    from ridgeline.model.checkpoint import read_checkpoint

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
     "required": ["name"]},
    {"type": "array", "items": {"enum": ["a", "b", 3, None]}, "minItems": 1, "maxItems": 4},
    {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"},
    {"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"type": "number", "exclusiveMaximum": 10}]},
    {"type": "string", "format": "date-time"},
]
KEYWORDS = ["type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "allOf", "not", "$ref",
            "$defs", "pattern", "format", "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems",
            "additionalProperties", "patternProperties", "prefixItems", "if", "then", "else", "uniqueItems",
            "contains", "propertyNames", "multipleOf", "x-guidance", "default", "title"]
TYPES = ["object", "array", "string", "integer", "number", "boolean", "null", "objekt"]
FRAGMENTS = ["a", "[", "]", "(", ")", "*", "+", "?", "{", "}", "|", "\\", "\\d", "\\w", ".", "^", "$", "(?=x)", "{2,1}",
             "[^\\s\\S]", "\"", "start:", " ", "\n", ":", "%json", "%ignore", "/", "x{999999}", "é", "\x00"]
REGEXES = ["[a-z]+", "\\d{3}-\\d{4}", "(yes|no)", "a*"]
GRAMMARS = ['start: "yes" | "no"\n', 'start: item+\nitem: /[0-9]/ ","\n', 'start: %json {"type": "integer"}\n']


def any_value(data: atheris.FuzzedDataProvider, depth: int = 0):
    kind = data.ConsumeIntInRange(0, 8)
    if kind == 0:
        return data.ConsumeInt(9)
    if kind == 1:
        return data.ConsumeRegularFloat()
    if kind == 2:
        return data.PickValueInList(TYPES)
    if kind == 3:
        return data.ConsumeUnicodeNoSurrogates(8)
    if kind == 4:
        return data.ConsumeBool()
    if kind == 5:
        return None
    if kind == 6 and depth < 3:
        return [any_value(data, depth + 1) for _ in range(data.ConsumeIntInRange(0, 3))]
    if kind == 7 and depth < 3:
        return {data.PickValueInList(KEYWORDS): any_value(data, depth + 1) for _ in range(data.ConsumeIntInRange(0, 3))}
    return copy.deepcopy(data.PickValueInList(SCHEMAS))


def mutated_text(data: atheris.FuzzedDataProvider, seeds: list[str]) -> str:
    text = data.PickValueInList(seeds)
    for _ in range(data.ConsumeIntInRange(0, 4)):
        at = data.ConsumeIntInRange(0, len(text))
        text = text[:at] + data.PickValueInList(FRAGMENTS) + text[at + data.ConsumeIntInRange(0, 2):]
    return text


def constraint(data: atheris.FuzzedDataProvider) -> StructuredOutputsParams:
    kind = data.ConsumeIntInRange(0, 4)
    if kind == 0:
        return StructuredOutputsParams(regex=mutated_text(data, REGEXES))
    if kind == 1:
        return StructuredOutputsParams(grammar=mutated_text(data, GRAMMARS))
    if kind == 2:
        return StructuredOutputsParams(choice=[data.ConsumeUnicodeNoSurrogates(6) for _ in range(data.ConsumeIntInRange(0, 3))])
    schema = copy.deepcopy(data.PickValueInList(SCHEMAS))
    for _ in range(data.ConsumeIntInRange(0, 5)):
        target = schema
        while isinstance(target, dict) and target and data.ConsumeBool():
            child = target.get(data.PickValueInList(sorted(target)))
            if not isinstance(child, dict):
                break
            target = child
        if isinstance(target, dict):
            target[data.PickValueInList(KEYWORDS)] = any_value(data)
    return StructuredOutputsParams(json=schema if kind == 3 else str(schema).replace("'", '"'))


def main(argv: list[str]) -> None:
    compiler = GrammarCompiler(read_checkpoint().load_tokenizer(), 262_144)
    compiler.ll_tokenizer  # built once, before the runs are timed

    def test_one_input(data: bytes) -> None:
        spec = constraint(atheris.FuzzedDataProvider(data))
        try:
            spec.validate()
            compiler.compile(spec).matcher().bias()
        except InvalidParameterError as error:
            if "\n" in str(error) or error.param != spec.source:
                raise AssertionError(f"a refusal must be one line naming its field: {error!r}") from None

    work = Path(tempfile.mkdtemp(prefix="ridgeline-fuzz-constraints-"))
    (work / "corpus").mkdir()
    defaults = ["-timeout=20", "-rss_limit_mb=4096", f"-artifact_prefix={work}/", "-print_final_stats=1"]
    print(f"fuzz_constraints: work directory {work}", file=sys.stderr)
    atheris.Setup([argv[0], *defaults, *[a for a in argv[1:] if a.startswith("-")], str(work / "corpus")], test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
