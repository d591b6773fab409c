"""The one admission check: every refusal names its field and code, and what passes comes out resolved."""

import pytest

from ridgeline.engine.admission import Admission, AdmissionLimits
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import Scheduler, SchedulerConfig
from ridgeline.errors import ContextLengthError, InvalidParameterError

VOCAB = 100


def admission(max_seq_len: int = 50, budget: int = 2048, chunked: bool = True) -> Admission:
    return Admission(AdmissionLimits(VOCAB, max_seq_len, budget, chunked))


def test_max_tokens_left_open_resolves_to_the_room_the_context_leaves() -> None:
    admitted = admission(max_seq_len=50).admit([5] * 20, SamplingParams(max_tokens=None))
    assert admitted.prompt_token_ids == (5,) * 20 and admitted.params.max_tokens == 30
    assert admission().admit([5] * 20, SamplingParams(max_tokens=7)).params.max_tokens == 7


@pytest.mark.parametrize("prompt_len, max_tokens, param", [(50, 1, "prompt"), (60, None, "prompt"), (40, 11, "max_tokens")])
def test_what_does_not_fit_the_context_is_refused_with_one_code(prompt_len: int, max_tokens: int | None, param: str) -> None:
    with pytest.raises(ContextLengthError) as refused:
        admission(max_seq_len=50).admit([5] * prompt_len, SamplingParams(max_tokens=max_tokens))
    assert refused.value.param == param and refused.value.code == "context_length_exceeded"


def test_the_limit_is_what_the_kv_pool_can_hold_when_that_is_less_than_the_context() -> None:
    scheduler = Scheduler(SchedulerConfig(), num_pages=8, max_model_len=100, block_size=4)
    check = Admission(AdmissionLimits(VOCAB, scheduler.max_seq_len, 2048, True))
    assert scheduler.max_seq_len == 32
    with pytest.raises(ContextLengthError):
        check.admit(list(range(32)), SamplingParams())


@pytest.mark.parametrize("prompt, message", [([], "empty"), ([3, VOCAB], "outside the vocabulary"), ([3, -1], "outside"),
                                             ([True], "outside")])
def test_bad_prompts_are_refused_naming_the_prompt(prompt: list, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message) as refused:
        admission().admit(prompt, SamplingParams())
    assert refused.value.param == "prompt" and refused.value.code is None


def test_a_text_prompt_needs_a_tokenizer() -> None:
    with pytest.raises(InvalidParameterError, match="token ids only"):
        admission().admit("hello", SamplingParams())


@pytest.mark.parametrize("params, param", [
    (SamplingParams(top_p=0.0), "top_p"),
    (SamplingParams(temperature=-1), "temperature"),
    (SamplingParams(stop_token_ids=[VOCAB]), "stop_token_ids"),
    (SamplingParams(logit_bias={VOCAB: 1.0}), "logit_bias"),
    (SamplingParams(logit_bias={3: 101.0}), "logit_bias"),
    (SamplingParams(max_tokens=-1), "max_tokens"),
])
def test_sampling_fields_out_of_range_are_refused_naming_the_field(params: SamplingParams, param: str) -> None:
    with pytest.raises(InvalidParameterError) as refused:
        admission().admit([3, 4], params)
    assert refused.value.param == param


def test_without_chunked_prefill_a_prompt_must_fit_one_step() -> None:
    admission(budget=32, chunked=False).admit([3] * 32, SamplingParams(max_tokens=1))
    with pytest.raises(InvalidParameterError, match="max_num_batched_tokens") as refused:
        admission(budget=32, chunked=False).admit([3] * 33, SamplingParams(max_tokens=1))
    assert refused.value.param == "prompt"
