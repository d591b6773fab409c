"""Structured outputs in the engine, on the tiny random-weight model (its answers are noise, so only the grammar
makes them valid): every kind of constraint (JSON schema, json_object, regex, choice, Lark grammar) gives output
its constraint accepts, greedy and sampled; a constrained request gets the same tokens alone and batched with
others; unsupported schemas, malformed grammars and schemas nested too deep are refused naming the field; compiled
grammars are cached; the default bounds and the closing near max_tokens end answers that would otherwise be cut.
The default model's answers on the schema corpus are tests/test_structured_validity.py's.
"""

import copy
import json
import re

import jsonschema
import pytest
from server_helpers import KV_BYTES_PER_TOKEN, tiny_model_path
from structured_schemas import SCHEMAS, UNSUPPORTED, case

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm import LLM
from ridgeline.engine.llm_engine import EngineConfig
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.engine.structured import StructuredOutputsParams as Structured
from ridgeline.json_schemas import DEFAULT_BOUNDS, bound_schema
from ridgeline.errors import InvalidParameterError

PROMPT = "The quick brown fox"
LARK = r'''
start: "(" num ("," num)* ")"
num: /[0-9]{1,3}/
'''
LARK_LANGUAGE = r"\([0-9]{1,3}(,[0-9]{1,3})*\)"
REGEX = r"[a-z]{2,8}@[a-z]{3,6}\.(com|org)"
CHOICES = ("red", "green", "blue", "dark purple")


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(config=EngineConfig(
        model=str(tiny_model_path()), seed=0,
        kv_cache=KVCacheConfig(dtype="fp32", memory_bytes=256 * 16 * KV_BYTES_PER_TOKEN),
        scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=1024)))


def generate(llm: LLM, constraints: list[Structured], temperature: float, max_tokens: int = 48, seed: int = 1):
    params = [SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens, structured_outputs=c)
              for c in constraints]
    return llm.generate([PROMPT] * len(params), params, use_tqdm=False)


def schema_valid(schema: dict, text: str) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return [error.message for error in validator.iter_errors(json.loads(text))]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_kind_of_constraint_gives_valid_output(llm, temperature):
    # Shapes whose required structure closes in a few tokens: the random model fills every string to its maxLength,
    # one to three tokens a character in the tiny vocabulary, so most of max_tokens goes to the first string.
    schemas = [case(name).schema for name in ("get_weather", "payment_oneof", "scores", "linked_list", "matrix",
                                              "hex_colour", "top_level_array", "shape_anyof")]
    constraints = [Structured(json=s) for s in schemas] + [
        Structured(json=json.dumps(schemas[0])),  # a schema as text
        Structured(json_object=True), Structured(regex=REGEX), Structured(choice=CHOICES), Structured(grammar=LARK)]
    outputs = generate(llm, constraints, temperature, max_tokens=128)
    for constraint, out in zip(constraints, outputs):
        assert out.finish_reason == "stop", (constraint.kind, out.text)  # bounded, and closed before max_tokens
        if constraint.json is not None:
            schema = constraint.json if isinstance(constraint.json, dict) else json.loads(constraint.json)
            assert schema_valid(schema, out.text) == [], out.text
        elif constraint.json_object:
            assert isinstance(json.loads(out.text), dict)
        elif constraint.regex is not None:
            assert re.fullmatch(REGEX, out.text), out.text
        elif constraint.choice is not None:
            assert out.text in CHOICES
        else:
            assert re.fullmatch(LARK_LANGUAGE, out.text), out.text


def test_sampled_answers_differ_by_seed_and_repeat_with_it(llm):
    constraint = [Structured(json=case("person_bounded").schema)]
    first, again = (generate(llm, constraint, 1.0, seed=7)[0].text for _ in range(2))
    others = {generate(llm, constraint, 1.0, seed=s)[0].text for s in range(8, 12)}
    assert first == again
    assert len(others | {first}) > 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_constrained_request_gets_the_same_tokens_alone_and_batched(llm, temperature):
    schema = Structured(json=case("invoice").schema)
    alone = generate(llm, [schema], temperature, seed=3)[0].output_token_ids
    batch = [SamplingParams(temperature=1.0, seed=10 + i, max_tokens=40) for i in range(5)]  # unconstrained
    batch += [SamplingParams(temperature=temperature, seed=3, max_tokens=48, structured_outputs=schema)]
    batch += [SamplingParams(temperature=1.0, seed=20 + i, max_tokens=30, structured_outputs=Structured(regex=REGEX))
              for i in range(3)]
    prompts = [PROMPT if i == 5 else f"Another prompt, number {i}, of other length" * (1 + i % 3)
               for i in range(len(batch))]
    outputs = llm.generate(prompts, batch, use_tqdm=False)
    assert outputs[5].output_token_ids == alone
    assert all(re.fullmatch(REGEX, out.text) for out in outputs[6:])


@pytest.mark.parametrize("unsupported", UNSUPPORTED, ids=[u.name for u in UNSUPPORTED])
def test_unsupported_schemas_are_refused_naming_the_keyword(llm, unsupported):
    params = SamplingParams(max_tokens=8, structured_outputs=Structured(json=unsupported.schema, source="response_format"))
    with pytest.raises(InvalidParameterError) as refused:
        llm.engine.add_request("refused", PROMPT, params)
    assert refused.value.param == "response_format"
    assert unsupported.keyword in str(refused.value)
    assert not llm.engine.has_unfinished()


@pytest.mark.parametrize("constraint, words", [
    (Structured(grammar='start: ("a" "b"'), "grammar"),
    (Structured(grammar="start: undefined_rule"), "undefined_rule"),
    (Structured(regex="(unclosed"), "regex"),
    (Structured(regex=r"[^\s\S]"), "matches nothing"),
    (Structured(json="{not json"), "json"),
    (Structured(json={"type": "object", "properties": {"a": {"type": "strnig"}}}), "strnig"),
])
def test_malformed_constraints_are_refused(llm, constraint, words):
    with pytest.raises(InvalidParameterError) as refused:
        llm.engine.grammars.compile(constraint)
    assert refused.value.param == "structured_outputs"
    assert words in str(refused.value)


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_deeply_nested_schemas_are_refused_not_crashed_on(llm):
    # 5,000 levels as a dict crash the process inside llguidance, and json.dumps raises RecursionError: refused first.
    deep_text = '{"type": "object", "properties": {"a": ' * 5000 + '{"type": "string"}' + "}}" * 5000
    for schema in (nested(5000), deep_text, nested(60)):
        with pytest.raises(InvalidParameterError) as refused:
            llm.engine.grammars.compile(Structured(json=schema))
        assert refused.value.param == "structured_outputs"
    llm.engine.grammars.compile(Structured(json=nested(10)))  # an ordinary depth compiles


def test_compiled_grammars_are_cached_by_what_they_say(llm):
    grammars = llm.engine.grammars
    schema = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "string"}}}
    reordered = {"properties": {"y": {"type": "string"}, "x": {"type": "integer"}}, "type": "object"}
    hits, compiled = grammars.stats.cache_hits, grammars.stats.compiled
    first = grammars.compile(Structured(json=schema))
    assert grammars.compile(Structured(json=reordered, source="response_format")) is first
    assert (grammars.stats.compiled, grammars.stats.cache_hits) == (compiled + 1, hits + 1)
    assert grammars.compile(Structured(json=schema, whitespace_pattern="[ ]?")) is not first
    generate(llm, [Structured(json=schema)] * 3, 0.0, max_tokens=4)
    assert grammars.stats.compiled == compiled + 2 and grammars.stats.cache_hits >= hits + 4


def test_bounds_leave_the_schema_sent_alone_and_defer_to_its_own():
    for c in SCHEMAS:
        before = copy.deepcopy(c.schema)
        bound_schema(c.schema, DEFAULT_BOUNDS)
        assert c.schema == before
    bounded = bound_schema({"type": "object", "properties": {
        "n": {"type": "integer"}, "m": {"type": "integer", "minimum": 0}, "x": {"type": "number", "multipleOf": 0.5},
        "s": {"type": "string"}, "t": {"type": "string", "maxLength": 1000}, "a": {"type": "array"},
        "e": {"enum": ["a", "b"]}}}, DEFAULT_BOUNDS)
    properties = bounded["properties"]
    limit = 10 ** DEFAULT_BOUNDS.integer_digits - 1
    assert (properties["n"]["minimum"], properties["n"]["maximum"]) == (-limit, limit)
    assert (properties["m"]["minimum"], properties["m"]["maximum"]) == (0, limit)
    assert properties["x"]["multipleOf"] == 0.5
    assert properties["s"]["maxLength"] == DEFAULT_BOUNDS.max_string_length and properties["t"]["maxLength"] == 1000
    assert properties["a"]["maxItems"] == DEFAULT_BOUNDS.max_items and properties["e"] == {"enum": ["a", "b"]}
    assert bounded["additionalProperties"] is False


def test_bounds_unroll_recursion():
    bounded = bound_schema(case("linked_list").schema, DEFAULT_BOUNDS)
    assert len(bounded["$defs"]) == DEFAULT_BOUNDS.recursion_depth
    deepest = bounded["$defs"][f"$defs__item__level{DEFAULT_BOUNDS.recursion_depth}"]
    assert deepest["properties"]["next"]["anyOf"][0] is False
    # six levels is the most a value can nest, and a value that deep is still valid against the schema as sent
    value = None
    for i in range(DEFAULT_BOUNDS.recursion_depth):
        value = {"value": i, "next": value}
    jsonschema.validate(value, bounded)
    jsonschema.validate(value, case("linked_list").schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"value": 0, "next": value}, bounded)


def test_a_schema_that_must_recurse_compiles_as_sent(llm):
    # No finite instance stops at 6 levels if every level must go one deeper: the bounds step aside.
    endless = {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}},
               "$ref": "#/$defs/n"}
    llm.engine.grammars.compile(Structured(json=endless))


def test_unbounded_answers_end_with_the_defaults_and_are_cut_without_them(llm):
    grammars = llm.engine.grammars
    schema = Structured(json={"type": "object", "properties": {"note": {"type": "string"}, "n": {"type": "number"}},
                              "required": ["note", "n"]})
    bounded = generate(llm, [schema] * 4, 1.0, max_tokens=48, seed=5)
    assert all(out.finish_reason == "stop" for out in bounded)
    assert all(schema_valid(schema.json, out.text) == [] for out in bounded)
    grammars.json_bounds, grammars.close_json = None, False
    try:
        unbounded = generate(llm, [schema] * 4, 1.0, max_tokens=48, seed=5)
    finally:
        grammars.json_bounds, grammars.close_json = DEFAULT_BOUNDS, True
    assert any(out.finish_reason == "length" for out in unbounded)  # the random model writes on: cut, honestly
    for out in unbounded:
        if out.finish_reason == "length":
            with pytest.raises(json.JSONDecodeError):
                json.loads(out.text)


def test_masked_argmax_is_the_argmax_of_the_masked_row(llm):
    import numpy as np
    import torch

    vocab = llm.engine.model_config.vocab_size
    rng = np.random.default_rng(0)
    for constraint in (Structured(json=case("invoice").schema), Structured(regex=REGEX), Structured(choice=CHOICES)):
        matcher = llm.engine.grammars.compile(constraint).matcher()
        for _ in range(12):
            logits = torch.from_numpy(rng.normal(size=vocab).astype(np.float32))
            logits[rng.integers(vocab, size=4)] = logits.max()  # ties: the first of equals wins on both paths
            expected = int(np.argmax((logits + matcher.bias()).numpy()))
            assert matcher.masked_argmax(logits, int(np.argmax(logits.numpy()))) == expected
            if matcher.is_terminated or not matcher.consume([expected]):
                break


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_check_their_token_first_and_get_the_masked_answer(llm, monkeypatch, temperature):
    # A plain greedy or temperature-only constrained row computes no mask ahead on the worker (its time is taken
    # from the forward pass's cores): it asks the grammar about its argmax or draw and computes the mask only where
    # that is refused, in the closing window too. Its tokens must be those of the row masked ahead, at every kind
    # of constraint, batched with an unconstrained row.
    import ridgeline.engine.llm_engine as llm_engine

    constraints = [Structured(json=case("invoice").schema), Structured(regex=REGEX), Structured(choice=CHOICES),
                   Structured(grammar=LARK)]
    params = [SamplingParams(temperature=temperature, seed=11, max_tokens=64, structured_outputs=c)
              for c in constraints]
    params += [SamplingParams(temperature=1.0, seed=5, max_tokens=24)]  # unconstrained, beside them
    prompts = [f"{PROMPT} {i}" for i in range(len(params))]
    worker, sampling = llm.engine.masks, llm.engine.grammars.sampling_masks
    before = worker.num_masks, sampling.count
    checked = [out.output_token_ids for out in llm.generate(prompts, params, use_tqdm=False)]
    on_worker, at_sampling = worker.num_masks - before[0], sampling.count - before[1]
    tokens = sum(len(ids) for ids in checked[:4])
    # None masked ahead, rows in their closing window (the last 16 of 64 tokens, JSON) included; refusals after.
    assert on_worker == 0 and 0 < at_sampling < tokens
    monkeypatch.setattr(llm_engine, "checks_before_mask", lambda params, vocab: False)  # every row masked ahead
    before = worker.num_masks
    ahead = [out.output_token_ids for out in llm.generate(prompts, params, use_tqdm=False)]
    assert worker.num_masks - before >= tokens - len(constraints)
    assert checked[:4] == ahead[:4]


def test_batched_masks_are_each_rows_own_mask(llm):
    # The engine fills a step's masks in one llguidance call and the sampler masks its sampled rows together: row
    # for row the same as each matcher's own mask added as a 0 / -inf row, whichever rows of the buffer they are,
    # for masks that allow few tokens (between JSON values), nearly all (inside a string) and a mix (random bits).
    import llguidance
    import numpy as np
    import torch

    from ridgeline.engine.structured.matcher import apply_grammar_masks, fill_masks

    vocab = llm.engine.model_config.vocab_size
    constraints = [Structured(json=case("invoice").schema), Structured(regex=REGEX), Structured(choice=CHOICES),
                   Structured(grammar=LARK), Structured(json={"type": "object"})]
    starts = ["{", "ab", "re", "(", '{"a": "b']
    batched = [llm.engine.grammars.compile(c).matcher() for c in constraints]
    alone = [llm.engine.grammars.compile(c).matcher() for c in constraints]
    for m, text in zip(batched + alone, starts * 2):  # different positions in different grammars
        assert m.consume(llm.tokenizer.encode(text, add_bos=False))
    fill_masks(llguidance.LLExecutor(num_threads=1), batched)
    rng = np.random.default_rng(0)
    mixed = rng.integers(-2**31, 2**31, size=(vocab + 31) // 32, dtype=np.int64).astype(np.int32)
    logits = torch.from_numpy(rng.normal(size=(8, vocab)).astype(np.float32))
    for rows in ([0, 1, 2, 3, 4, 5], [7, 1, 3, 0, 5, 2]):
        masked = logits.clone()
        apply_grammar_masks(masked, rows, [m.words() for m in batched] + [mixed])
        expected = logits.clone()
        for row, m in zip(rows, alone):
            expected[row] += m.bias()
        expected[rows[-1]] += torch.from_numpy(np.where(np.unpackbits(mixed.view(np.uint8), bitorder="little")[:vocab],
                                                        np.float32(0), np.float32(-np.inf)))
        assert torch.equal(masked, expected)
        assert all(torch.isinf(masked[row]).any() and torch.isfinite(masked[row]).any() for row in rows)


def test_masking_rows_that_allow_few_most_or_some_tokens_is_adding_their_bias():
    # apply_grammar_masks writes only the forbidden ids where few are, keeps only the allowed ones where few are,
    # and selects whole rows otherwise: each path gives exactly the 0 / -inf row added (a 262k-sized vocabulary,
    # where the paths part; the tiny model's 323 tokens all take the last).
    import numpy as np
    import torch

    from ridgeline.engine.structured.matcher import apply_grammar_masks

    vocab, rng = 32768 + 5, np.random.default_rng(1)  # not a multiple of 32: the last word's spare bits are ignored
    words = (vocab + 31) // 32
    few = np.zeros(words, dtype=np.int32)
    few[rng.integers(words, size=40)] = rng.integers(1, 2**31, size=40)
    most = np.full(words, -1, dtype=np.int32)
    most[rng.integers(words, size=40)] = rng.integers(-2**31, -1, size=40)
    some = rng.integers(-2**31, 2**31, size=words, dtype=np.int64).astype(np.int32)
    logits = torch.from_numpy(rng.normal(size=(5, vocab)).astype(np.float32))
    for rows in ([0, 1, 2], [4, 2, 0], [1, 3, 2]):
        masked = logits.clone()
        apply_grammar_masks(masked, rows, [few, most, some])
        expected = logits.clone()
        for row, packed in zip(rows, [few, most, some]):
            allowed = np.unpackbits(packed.view(np.uint8), bitorder="little")[:vocab]
            expected[row] += torch.from_numpy(np.where(allowed, np.float32(0), np.float32(-np.inf)))
        assert torch.equal(masked, expected)


def test_a_token_checked_before_its_mask_is_computed_gets_the_masks_answer(llm):
    # A row sampled with temperature alone asks the grammar about its draw's one token before any mask exists
    # (llguidance's validate_tokens, matcher.allows); the answer must be the mask's bit, allowed tokens and forbidden
    # ones, end token included, at positions of every kind of constraint.
    import numpy as np

    vocab, rng = llm.engine.model_config.vocab_size, np.random.default_rng(2)
    constraints = [Structured(json=case("invoice").schema), Structured(regex=REGEX), Structured(choice=CHOICES),
                   Structured(grammar=LARK), Structured(json={"type": "object"})]
    checked = allowed = 0
    for constraint, text in zip(constraints, ["{", "ab", "re", "(1", '{"a": "b']):
        unmasked, masked = (llm.engine.grammars.compile(constraint).matcher() for _ in range(2))
        for step in range(12):
            if step == 0:
                assert unmasked.consume(llm.tokenizer.encode(text, add_bos=False))
                assert masked.consume(llm.tokenizer.encode(text, add_bos=False))
            bits = np.unpackbits(masked.words().view(np.uint8), bitorder="little")[:vocab]
            tokens = [*rng.integers(vocab, size=16).tolist(), *np.flatnonzero(bits)[:8].tolist(), *llm.tokenizer.eos_ids]
            for token in tokens:
                assert unmasked.needs_mask and unmasked.allows(token) == bool(bits[token]), (constraint.kind, step, token)
            checked, allowed = checked + len(tokens), allowed + int(bits[tokens].sum())
            taken = int(np.flatnonzero(bits)[rng.integers(bits.sum())])
            if not (unmasked.consume([taken]) and masked.consume([taken])) or masked.is_terminated:
                break
    assert 0 < allowed < checked
