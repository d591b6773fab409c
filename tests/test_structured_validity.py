"""Constrained answers of the default model (Gemma 3 270M) on a subset of the schema corpus (tests/structured_schemas.py,
CI_SUBSET: one of each shape, the loop-prone ones included), greedy and sampled at temperature 1, all in one batched
call: every answer that finished validates against its schema (jsonschema, formats checked), and nearly all finish
within a small max_tokens, thanks to the default bounds and the closing near max_tokens (json_schemas/bounds.py,
matcher.py). The whole corpus, before and after those defaults, is benchmarks/structured_outputs.py's.
"""

import pytest
from structured_schemas import CI_SUBSET, case, run_corpus

from ridgeline.engine.llm import LLM

pytestmark = pytest.mark.slow

MAX_TOKENS = 96
FINISHED_AT_LEAST = 0.85  # measured: 25/28 (the whole corpus: 129/134; without the defaults 97/134)


@pytest.fixture(scope="module")
def answers():
    return run_corpus(LLM(), [case(name) for name in CI_SUBSET], temperatures=(0.0, 1.0), max_tokens=MAX_TOKENS)


def test_every_finished_answer_is_valid(answers):
    invalid = [(a.case, a.temperature, a.problem, a.text) for a in answers if a.valid is False]
    assert invalid == []


def test_constrained_answers_finish(answers):
    finished = [a for a in answers if a.finish_reason == "stop"]
    assert len(finished) >= FINISHED_AT_LEAST * len(answers), [(a.case, a.temperature, a.text[-80:])
                                                                for a in answers if a.finish_reason != "stop"]
    assert all(a.num_tokens <= MAX_TOKENS for a in answers)
