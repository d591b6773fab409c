"""What a request asks its output to match, with vLLM's names (`StructuredOutputsParams`): exactly one of a JSON
schema, any JSON object, a regex, a choice of strings, or a grammar (Lark, or GBNF as llama.cpp writes it)."""

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ridgeline.errors import InvalidParameterError
from ridgeline.json_schemas import schema_too_large

# Bounds on what one request may send: the grammar engine has its own limits on what it builds, these keep a
# request's text itself from being the cost.
MAX_GRAMMAR_CHARS = 1_000_000
MAX_CHOICES = 4096


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: str | dict | None = None  # a JSON schema (as text or parsed)
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None  # Lark (llguidance's dialect) or GBNF
    json_object: bool = False  # any JSON object (OpenAI's response_format json_object)
    # By default the JSON has no free whitespace: ", " and ": " between items, nothing else. A small model under a
    # grammar that allows any whitespace can spend its whole max_tokens on newlines (vLLM's any-whitespace
    # default). A regex here (e.g. "[ \n]*") allows that whitespace between tokens instead.
    whitespace_pattern: str | None = None
    # Which request field this came from, so errors name it ("response_format", "tool_choice", ...).
    source: str = field(default="structured_outputs", compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.choice, list):
            object.__setattr__(self, "choice", tuple(self.choice))

    @property
    def kind(self) -> str:
        return next(kind for kind in ("json", "regex", "choice", "grammar") if getattr(self, kind) is not None) \
            if not self.json_object else "json_object"

    def validate(self) -> None:
        """Shape only (exactly one constraint, of the right type and size); whether it compiles is the compiler's."""
        given = [kind for kind in ("json", "regex", "choice", "grammar") if getattr(self, kind) is not None]
        if self.json_object:
            given.append("json_object")
        if len(given) != 1:
            raise InvalidParameterError(
                f"{self.source} must give exactly one of json, regex, choice, grammar or json_object, got "
                f"{', '.join(given) if given else 'none'}", param=self.source)
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise InvalidParameterError(f"{self.source}: a JSON schema must be an object", param=self.source)
        if isinstance(self.json, dict) and (problem := schema_too_large(self.json)) is not None:
            raise InvalidParameterError(f"{self.source}: the JSON schema is too large: {problem}", param=self.source)
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise InvalidParameterError(f"{self.source}: choice must be a non-empty list of non-empty strings",
                                            param=self.source)
            if len(self.choice) > MAX_CHOICES:
                raise InvalidParameterError(f"{self.source}: at most {MAX_CHOICES} choices", param=self.source)
        for name in ("regex", "grammar", "whitespace_pattern"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidParameterError(f"{self.source}: {name} must be a non-empty string", param=self.source)
        try:
            text = self.text()
        except (RecursionError, TypeError, ValueError) as error:  # deep nesting; what JSON cannot hold (a set, NaN)
            raise InvalidParameterError(f"{self.source}: the JSON schema cannot be read: {error}",
                                        param=self.source) from None
        if len(text) > MAX_GRAMMAR_CHARS:
            raise InvalidParameterError(f"{self.source}: the {self.kind} is longer than {MAX_GRAMMAR_CHARS} characters",
                                        param=self.source)

    def text(self) -> str:
        """The constraint as one canonical string (a schema with sorted keys): what the compiled grammar is cached by."""
        if self.json_object:
            return ""
        if self.json is not None:
            return json.dumps(self.json, sort_keys=True, allow_nan=False) if isinstance(self.json, dict) else self.json
        if self.choice is not None:
            return json.dumps(list(self.choice))
        return self.regex if self.regex is not None else self.grammar

    def cache_key(self) -> str:
        return hashlib.sha256(f"{self.kind}\0{self.whitespace_pattern}\0{self.text()}".encode()).hexdigest()

    @classmethod
    def from_dict(cls, value: dict[str, Any], source: str = "structured_outputs") -> "StructuredOutputsParams":
        """vLLM's `structured_outputs` object: its known keys; an unknown one is an error, not a silent no-op."""
        known = {"json", "regex", "choice", "grammar", "json_object", "whitespace_pattern"}
        ignored = {"disable_any_whitespace", "disable_additional_properties", "disable_fallback", "backend"}
        unknown = set(value) - known - ignored
        if unknown:
            raise InvalidParameterError(f"{source}: unsupported key(s) {', '.join(sorted(unknown))} "
                                        f"(supported: {', '.join(sorted(known))})", param=source)
        return cls(**{k: v for k, v in value.items() if k in known and v is not None}, source=source)

