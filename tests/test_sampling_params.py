"""SamplingParams: defaults are valid, every out-of-range value is refused with an error naming the field."""

import pytest

from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.errors import RidgelineError

VOCAB = 1000


def test_defaults_and_typical_requests_are_valid():
    SamplingParams().validate(VOCAB)
    SamplingParams(
        n=4, max_tokens=None, temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.1,
        presence_penalty=-2.0, frequency_penalty=2.0, seed=-1, stop=["\n\n"], stop_token_ids=[0, VOCAB - 1],
        logprobs=20, prompt_logprobs=0, include_stop_str_in_output=True,
    ).validate(VOCAB)
    SamplingParams(max_tokens=0, prompt_logprobs=5).validate(VOCAB)  # scoring a prompt only (echo)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 0),
        ("n", 10_000),
        ("n", 1.5),
        ("max_tokens", -1),
        ("max_tokens", "16"),
        ("temperature", -0.1),
        ("temperature", 1e6),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("top_p", 0.0),
        ("top_p", 1.01),
        ("top_k", -2),
        ("top_k", 3.0),
        ("min_p", -0.01),
        ("min_p", 1.5),
        ("repetition_penalty", 0.0),
        ("repetition_penalty", -1.0),
        ("presence_penalty", 2.5),
        ("frequency_penalty", -2.5),
        ("seed", True),
        ("seed", 2**70),
        ("logprobs", -1),
        ("logprobs", 21),
        ("prompt_logprobs", 100),
        ("stop", [""]),
        ("stop", ["x"] * 17),
        ("stop", ["x" * 1000]),
        ("stop", [3]),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", [VOCAB]),
        ("stop_token_ids", ["3"]),
        ("ignore_eos", "yes"),
        ("include_stop_str_in_output", 1),
    ],
)
def test_bad_value_is_refused_naming_the_field(field, value):
    with pytest.raises(RidgelineError, match=field):
        SamplingParams(**{field: value}).validate(VOCAB)


def test_stop_token_ids_are_only_range_checked_against_a_known_vocabulary():
    SamplingParams(stop_token_ids=[10**6]).validate()


def test_a_single_stop_string_means_one_stop_string():
    assert SamplingParams(stop="END").stop == ["END"]


def test_temperature_zero_is_greedy():
    assert SamplingParams(temperature=0.0).is_greedy
    assert not SamplingParams(temperature=0.5).is_greedy


def test_children_of_a_seeded_request_get_distinct_seeds_and_n_1():
    parent = SamplingParams(n=3, seed=7, stop=["x"])
    children = [parent.child(i) for i in range(3)]
    assert [c.seed for c in children] == [7, 8, 9]
    assert all(c.n == 1 and c.stop == ["x"] for c in children)
    assert parent.child(0).stop is not parent.stop
    assert SamplingParams(n=2).child(1).seed is None
