"""Speculative decoding with the n-gram proposer: guesses come from the request's own text; verified in one pass,
they change nothing about greedy output (token for token, with stop strings, EOS and max_tokens inside an accepted
run, batched with plain requests), they are accepted on text that repeats, proposals stop where nothing can be
copied, and pages that held rejected guesses go back to the pool."""

import dataclasses

import pytest

from server_helpers import tiny_model_path

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.engine.sequence import Sequence
from ridgeline.engine.speculative import NgramProposer, SpeculativeConfig

GREEDY = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
REPEATING = [(i % 7) + 20 for i in range(40)]  # a loop to copy from
LOOSE = [(37 * i * i + 11 * i) % 300 + 3 for i in range(30)]


def seq(tokens: list[int], params: SamplingParams = GREEDY) -> Sequence:
    return Sequence("s", tokens, params, arrival_time=0.0)


def test_the_proposer_copies_what_followed_the_latest_earlier_occurrence_of_the_last_ngram():
    proposer = NgramProposer(SpeculativeConfig(num_tokens=3))
    assert proposer.propose(seq([5, 6, 7, 8, 9, 5, 6]), room=3) == [7, 8, 9]
    assert proposer.propose(seq([1, 2, 3]), room=3) == []  # nothing earlier to copy
    assert NgramProposer(SpeculativeConfig(num_tokens=3)).propose(seq([5, 6, 7, 5, 6]), room=1) == [7]
    # The longest matching n-gram wins: "9 5 6" occurred before "4 5 6" ended the text.
    assert NgramProposer(SpeculativeConfig(num_tokens=2)).propose(seq([9, 5, 6, 1, 4, 5, 6, 2, 9, 5, 6]), room=2) == [1, 4]
    penalised = seq([5, 6, 5, 6], SamplingParams(temperature=0, repetition_penalty=1.2))
    assert NgramProposer(SpeculativeConfig(num_tokens=3)).propose(penalised, room=3) == []  # history-dependent rows
    with_logprobs = seq([5, 6, 5, 6], SamplingParams(temperature=0, logprobs=2))
    assert NgramProposer(SpeculativeConfig(num_tokens=3)).propose(with_logprobs, room=3) == []
    sampled = seq([5, 6, 5, 6], SamplingParams(temperature=0.8))
    assert NgramProposer(SpeculativeConfig(num_tokens=3)).propose(sampled, room=3) == [5, 6]


def engine(speculative_tokens: int = 0, max_num_seqs: int = 16) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(tiny_model_path()), kv_cache=KVCacheConfig(16, "fp32", 8 << 20),
                                  scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=256),
                                  speculative=SpeculativeConfig(num_tokens=speculative_tokens)))


def run(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, tuple]:
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    finals, streamed = {}, {}
    while engine.has_unfinished():
        for output in engine.step():
            streamed.setdefault(output.request_id, []).extend(output.new_token_ids)
            if output.finished:
                finals[output.request_id] = (output.output_token_ids, output.text, output.finish_reason)
    for request_id, (tokens, _, _) in finals.items():
        assert streamed[request_id] == tokens, "streamed new_token_ids add up to the output"
    return finals


def workload() -> dict[str, tuple[list[int], SamplingParams]]:
    stop_at = dataclasses.replace(GREEDY, max_tokens=37)
    return {"repeating": (REPEATING, GREEDY), "loose": (LOOSE, GREEDY), "short": (REPEATING[:9], stop_at),
            "eos-allowed": (REPEATING, dataclasses.replace(GREEDY, ignore_eos=False)),
            "sampled": (REPEATING, SamplingParams(temperature=0.9, seed=5, max_tokens=30, ignore_eos=True)),
            "stop-token": (LOOSE, dataclasses.replace(GREEDY, stop_token_ids=[27]))}


@pytest.mark.parametrize("speculative_tokens", [1, 5])
def test_greedy_output_is_the_same_with_and_without_speculation(speculative_tokens):
    plain = run(engine(), workload())
    fast = engine(speculative_tokens)
    speculated = run(fast, workload())
    # The sampled request keeps its distribution, not its tokens (rejection sampling draws differently).
    assert len(speculated.pop("sampled")[0]) == len(plain.pop("sampled")[0]) == 30
    assert speculated == plain
    stats = fast.stats()
    assert stats.num_accepted_tokens > 0 and stats.tokens_per_verification > 1
    assert stats.num_free_pages == stats.num_total_pages, "pages of rejected guesses went back"


def test_stop_strings_inside_an_accepted_run_end_the_text_where_they_would_without_speculation():
    plain_engine = engine()
    text = run(plain_engine, {"a": (REPEATING, GREEDY)})["a"][1]
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop
    params = dataclasses.replace(GREEDY, stop=[stop])
    assert run(engine(4), {"a": (REPEATING, params)}) == run(engine(), {"a": (REPEATING, params)})


def test_text_with_nothing_to_copy_soon_stops_proposing():
    fast = engine(4)
    run(fast, {"loose": ([(97 * i) % 300 + 2 for i in range(20)], dataclasses.replace(GREEDY, max_tokens=200))})
    stats = fast.stats()
    # Whatever it guessed, repeated misses pause proposing: far fewer verifications than decode steps.
    assert stats.num_verifications < 100


def test_rejection_sampling_keeps_the_target_distribution_at_every_position():
    """verify_guesses against the distributions it must reproduce: the first token ~ p0 whatever the guess; given
    the first guess accepted, the second ~ p1; given both accepted, the bonus ~ p2. 6,000 seeded draws, each
    frequency within 4.5 standard errors (the draws are seeded: the outcome is fixed, not flaky)."""
    import numpy as np
    import torch

    from ridgeline.engine.sampler import Sampler

    p = np.array([[0.5, 0.2, 0.1, 0.1, 0.05, 0.05], [0.1, 0.6, 0.1, 0.1, 0.05, 0.05], [0.3, 0.3, 0.2, 0.1, 0.05, 0.05]])
    logits = torch.tensor(np.log(p), dtype=torch.float32) * 2.0  # temperature 2 below undoes the scale
    guesses = [1, 1]
    draws = [Sampler().verify_guesses(logits, SamplingParams(temperature=2.0, seed=seed), guesses, step=0)
             for seed in range(6000)]

    def assert_distributed_as(tokens: list[int], expected: np.ndarray) -> None:
        counts = np.bincount(tokens, minlength=len(expected)) / len(tokens)
        error = np.sqrt(expected * (1 - expected) / len(tokens))
        assert np.all(np.abs(counts - expected) <= 4.5 * error + 1e-9), (counts, expected)

    assert_distributed_as([d[0] for d in draws], p[0])
    assert_distributed_as([d[1] for d in draws if d[0] == guesses[0]], p[1])
    assert_distributed_as([d[2] for d in draws if d[:2] == guesses], p[2])
    assert {len(d) for d in draws} == {1, 2, 3}  # rejections at each position, and runs accepted whole


def test_sampled_requests_speculate_and_finish_cleanly():
    fast = engine(4)
    params = SamplingParams(temperature=0.3, top_k=3, seed=11, max_tokens=50, ignore_eos=True)
    results = run(fast, {f"s{i}": (REPEATING, dataclasses.replace(params, seed=i)) for i in range(4)})
    assert all(len(tokens) == 50 for tokens, _, _ in results.values())
    stats = fast.stats()
    assert stats.num_verifications > 0 and stats.num_free_pages == stats.num_total_pages
