"""Requests' constraints compiled once per model into llguidance matchers, cached by what they say.

llguidance builds a grammar's lexer and parser when a matcher is made (it drops the GIL meanwhile, bounded by its
parser limits) and each request needs its own matcher state, so the cache holds one pristine matcher per
constraint and every request takes a copy of it: a schema sent a thousand times is compiled once.
"""

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import llguidance
import numpy as np

from ridgeline.engine.structured.matcher import GrammarMatcher, SamplingMasks, closing_window
from ridgeline.json_schemas import DEFAULT_BOUNDS, JsonBounds, bound_schema, schema_too_large
from ridgeline.engine.structured.params import StructuredOutputsParams
from ridgeline.engine.structured.vocabulary import ClosingVocabulary, closing_vocabulary, grammar_tokenizer
from ridgeline.errors import InvalidParameterError
from ridgeline.model.tokenizer.base import Tokenizer

CACHE_SIZE = 256  # compiled constraints kept (a pristine matcher is tens of kB to a few MB)
# llguidance's own limits on what a grammar may cost to build and to step; what a hostile schema (10,000
# properties, nesting 1,000 deep, a regex with a huge automaton) runs into, so compiling stays bounded.
PARSER_LIMITS = dict(max_grammar_size=500_000, initial_lexer_fuel=2_000_000, step_lexer_fuel=400_000,
                     max_lexer_states=250_000)
# Separators of the JSON the grammar writes: OpenAI's own output style, and no free whitespace (params.py says why).
JSON_OPTIONS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


@dataclass
class CompilerStats:
    compiled: int = 0  # constraints compiled (cache misses that succeeded)
    cache_hits: int = 0
    failed: int = 0  # constraints refused (400s)
    compile_seconds: float = 0.0  # total time spent compiling


class CompiledGrammar:
    def __init__(self, pristine: llguidance.LLMatcher, vocab_size: int, compile_seconds: float,
                 closing: ClosingVocabulary | None = None, sampling_masks: SamplingMasks | None = None):
        self._pristine = pristine
        self._sampling_masks = sampling_masks
        self.vocab_size = vocab_size
        self.compile_seconds = compile_seconds
        self._closing = closing  # JSON grammars only: what an answer near max_tokens is steered to

    def matcher(self, max_tokens: int | None = None) -> GrammarMatcher:
        window = closing_window(max_tokens)
        return GrammarMatcher(self._pristine.deep_copy(), self.vocab_size,
                              None if window is None else max_tokens - window, self._closing, self._sampling_masks)


class GrammarCompiler:
    """One per engine: the model's vocabulary as llguidance sees it (built on first use, ~1 s for a 262k
    vocabulary) and the cache. Thread-safe: the server compiles on a worker thread, the engine copies matchers."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._closing: ClosingVocabulary | None = None
        # JSON answers within closing_window(max_tokens) of their max_tokens are steered to close (matcher.py);
        # False leaves them to be cut at max_tokens (finish_reason "length"), as vLLM does.
        self.close_json = True
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self.stats = CompilerStats()
        self.sampling_masks = SamplingMasks()  # what every matcher made here computed when sampled (matcher.py)
        self.limits = llguidance.LLParserLimits(**PARSER_LIMITS)
        # Bounds a JSON schema gets where it sets none, so answers end (bounds.py); None compiles schemas as sent.
        self.json_bounds: JsonBounds | None = DEFAULT_BOUNDS

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = grammar_tokenizer(self._tokenizer, self.vocab_size)
                self._closing = closing_vocabulary(self._tokenizer, self.vocab_size)
            return self._ll_tokenizer

    def compile(self, spec: StructuredOutputsParams) -> CompiledGrammar:
        """The constraint compiled (from the cache when seen before); an InvalidParameterError naming
        `spec.source` when it is malformed, uses a feature the grammar engine does not support, or is too large."""
        spec.validate()
        key = spec.cache_key()
        if spec.json is not None or spec.json_object:
            key += f"/{self.json_bounds.key() if self.json_bounds else 'unbounded'}"
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
                self.stats.cache_hits += 1
                return found
        tokenizer = self.ll_tokenizer
        started = time.perf_counter()
        # The constraint as sent decides what is refused (bounds could make a refused schema pass: a oneOf whose
        # branches overlap, say); the matcher is built from the bounded one (bounds.py), or from the one sent where
        # the bounds alone break it (a recursion that must go deeper than the levels unrolled).
        grammar = self._grammar_text(spec)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer, limits=self.limits)
        if is_error:
            self._refuse(spec, messages[0] if messages else "invalid grammar")
        pristine = None
        if self._bounds_apply(spec):
            pristine = llguidance.LLMatcher(tokenizer, self._grammar_text(spec, bounded=True), log_level=0,
                                            limits=self.limits)
            if pristine.is_error():
                pristine = None
        if pristine is None:
            pristine = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=self.limits)
        if pristine.is_error():
            self._refuse(spec, pristine.get_error())
        probe = pristine.deep_copy()  # llguidance finds a grammar that matches nothing when asked for a first mask
        probe.compute_bitmask()
        if probe.is_stopped() and not probe.is_accepting():
            self._refuse(spec, "it matches nothing (no text can satisfy it)")
        compiled = CompiledGrammar(pristine, self.vocab_size, time.perf_counter() - started,
                                   self._closing if spec.json is not None or spec.json_object else None,
                                   self.sampling_masks)
        with self._lock:
            self.stats.compiled += 1
            self.stats.compile_seconds += compiled.compile_seconds
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _bounds_apply(self, spec: StructuredOutputsParams) -> bool:
        return self.json_bounds is not None and (spec.json is not None or spec.json_object)

    def _grammar_text(self, spec: StructuredOutputsParams, bounded: bool = False) -> str:
        try:
            if spec.json_object or spec.json is not None:
                schema = {"type": "object"} if spec.json_object else _schema_object(spec.json)
                if bounded and self._bounds_apply(spec):
                    schema = bound_schema(schema, self.json_bounds)
                options = dict(JSON_OPTIONS)
                if spec.whitespace_pattern is not None:
                    options.update(whitespace_flexible=True, whitespace_pattern=spec.whitespace_pattern)
                # As text: llguidance reads a dict through Python recursion that a deep one crashes (params.py).
                return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema, allow_nan=False),
                                                                     overrides=options)
            if spec.regex is not None:
                return llguidance.LLMatcher.grammar_from_regex(spec.regex)
            if spec.choice is not None:
                return llguidance.grammar_from("choice", list(spec.choice))
            return llguidance.grammar_from("grammar", spec.grammar)  # Lark, or GBNF converted to Lark
        except (ValueError, TypeError, RecursionError) as error:
            self._refuse(spec, str(error))

    def _refuse(self, spec: StructuredOutputsParams, problem: str) -> None:
        with self._lock:
            self.stats.failed += 1
        problem = " ".join(problem.split())
        if "is not present in a registry" in problem:  # llguidance's words for a $ref it would have to fetch
            problem = f"a $ref outside the schema is not supported (only refs into it, such as #/$defs/...): {problem}"
        if len(problem) > 500:
            problem = problem[:500] + " ..."
        raise InvalidParameterError(f"{spec.source}: the {spec.kind.replace('_', ' ')} cannot be used: {problem}",
                                    param=spec.source)


def _schema_object(schema: str | dict) -> dict:
    """A schema sent as JSON text (vLLM's guided_json allows it), as the object it encodes."""
    if isinstance(schema, dict):
        return schema
    try:
        parsed = json.loads(schema)
    except json.JSONDecodeError as error:
        raise ValueError(f"the schema is not valid JSON: {error}") from None
    except RecursionError:
        raise ValueError("the schema nests too deep to read") from None
    if not isinstance(parsed, dict):
        raise ValueError("a JSON schema must be an object")
    if (problem := schema_too_large(parsed)) is not None:
        raise ValueError(f"the JSON schema is too large: {problem}")
    return parsed

