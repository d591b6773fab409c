"""Batched sampler: greedy is argmax, filters keep the right tokens, penalties change logits as
specified, seeded rows are reproducible whatever the batch, and draws follow the distribution."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from ridgeline.engine import sampler as sampler_module
from ridgeline.engine.sampler import (Sampler, apply_penalties, apply_top_k_top_p, draws_before_mask, prompt_logprobs,
                                     sample_from_logits)
from ridgeline.engine.sampling_params import SamplingParams


def sample(logits, params, outputs=None, prompts=None, sampler=None):
    rows = logits.shape[0]
    if isinstance(params, SamplingParams):
        params = [params] * rows
    prompts = prompts if prompts is not None else [[] for _ in range(rows)]
    outputs = outputs if outputs is not None else [[] for _ in range(rows)]
    return (sampler or Sampler(seed=0))(logits, params, prompts, outputs)


def random_logits(rows, vocab, seed, scale=3.0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * scale


def test_greedy_is_argmax_and_leaves_the_logits_untouched():
    logits = random_logits(16, 500, seed=1)
    before = logits.clone()
    result = sample(logits, SamplingParams(temperature=0.0, logprobs=None))
    assert result.token_ids == logits.argmax(dim=-1).tolist()
    assert result.logprobs == [None] * 16
    assert torch.equal(logits, before)


def test_greedy_ties_go_to_the_lowest_token_id():
    assert sample(torch.tensor([[1.0, 5.0, 5.0, 2.0]]), SamplingParams(temperature=0.0)).token_ids == [1]


def test_argmax_rows_agrees_with_torch_on_ties_strides_and_other_dtypes():
    """The greedy fast path (numpy's argmax on the CPU) picks what torch's argmax picks, row by row."""
    logits = random_logits(9, 4099, seed=3)
    logits[2, 17] = logits[2, 4000] = logits[2].max() + 1.0  # a tie far apart: the first wins
    logits[5] = 0.0  # a flat row: token 0
    logits[7, 100] = float("inf")
    for view in (logits, logits[::2], logits[:, 1:], logits.bfloat16()):
        assert sampler_module.argmax_rows(view) == view.argmax(dim=-1).tolist()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=1.5, top_p=1e-6),
        SamplingParams(temperature=1e-4),  # the temperature -> 0 limit
    ],
    ids=["top_k=1", "tiny top_p", "tiny temperature"],
)
def test_sampling_that_keeps_only_the_most_likely_token_equals_greedy(params):
    logits = random_logits(32, 300, seed=2)
    for sampler_seed in range(3):
        assert sample(logits, params, sampler=Sampler(seed=sampler_seed)).token_ids == logits.argmax(dim=-1).tolist()


def test_mixed_batch_greedy_rows_are_argmax_of_their_own_penalised_logits_and_input_is_not_modified():
    logits = random_logits(4, 200, seed=3)
    before = logits.clone()
    favourites = logits.argmax(dim=-1).tolist()
    params = [SamplingParams(temperature=0.0, frequency_penalty=2.0), SamplingParams(temperature=1.0, top_k=5, top_p=0.8),
              SamplingParams(temperature=0.0), SamplingParams(temperature=2.0, presence_penalty=1.0, min_p=0.1)]
    # Row 0 has generated its favourite token 5 times, so the penalty must move its greedy choice;
    # row 2 has no penalty, so its own repeated favourite stays its choice.
    outputs = [[favourites[0]] * 5, [favourites[1]], [favourites[2]] * 5, [favourites[3]]]
    result = sample(logits, params, outputs=outputs, prompts=[[5], [6], [7], [8]])
    penalised = logits[0].clone()
    penalised[favourites[0]] -= 2.0 * 5
    assert result.token_ids[0] == penalised.argmax().item() != favourites[0]
    assert result.token_ids[2] == favourites[2]
    assert torch.equal(logits, before)


def test_a_uniform_at_the_top_of_the_range_picks_the_last_token_with_positive_weight():
    logits = torch.tensor([[0.0, 0.0, -math.inf, -math.inf]])
    # 1 - 1e-12 rounds to 1.0 in float32: the search lands past token 1, on zero-weight tokens.
    assert sample_from_logits(logits, [SamplingParams()], [1.0 - 1e-12]).tolist() == [1]


def test_repetition_frequency_and_presence_penalties_by_hand():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    params = [SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)]
    penalised = apply_penalties(logits.clone(), params, prompt_token_ids=[[0]], output_token_ids=[[1, 1, 2]])
    # token 0: in the prompt only -> 2 / 2; no output count, so no frequency or presence penalty
    # token 1: -1 * 2 = -2, then twice in the output: -2 - 0.5 * 2 - 0.25 = -3.25
    # token 2: 0.5 / 2 = 0.25, once in the output: 0.25 - 0.5 - 0.25 = -0.5
    # token 3: never seen, unchanged
    assert penalised.tolist() == [[1.0, -3.25, -0.5, 3.0]]


def test_penalties_only_touch_the_rows_that_ask_for_them():
    logits = torch.tensor([[2.0, 1.0], [2.0, 1.0]])
    params = [SamplingParams(), SamplingParams(presence_penalty=2.0)]
    penalised = apply_penalties(logits.clone(), params, [[0], [0]], [[0], [0]])
    assert penalised.tolist() == [[2.0, 1.0], [0.0, 1.0]]


def test_a_penalty_changes_the_greedy_choice():
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    assert sample(logits, SamplingParams(temperature=0.0), outputs=[[0]]).token_ids == [0]
    assert sample(logits, SamplingParams(temperature=0.0, presence_penalty=0.5), outputs=[[0]]).token_ids == [1]
    assert sample(logits, SamplingParams(temperature=0.0, repetition_penalty=1.1), prompts=[[0]]).token_ids == [1]


def test_min_p_drops_tokens_below_a_fraction_of_the_top_probability():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().expand(2000, -1).contiguous()
    # 0.35 * 0.5 = 0.175: tokens 2 and 3 go, tokens 0 and 1 both stay
    assert set(sample(logits, SamplingParams(min_p=0.35)).token_ids) == {0, 1}
    assert set(sample(logits, SamplingParams(min_p=0.0)).token_ids) == {0, 1, 2, 3}


def reference_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Full-sort reference: a boolean mask of the kept tokens of one row."""
    vocab = logits.shape[0]
    order = logits.argsort(descending=True)
    kept = top_k if 0 < top_k < vocab else vocab
    probs = torch.softmax(logits[order[:kept]].double(), dim=0)
    mass_before = probs.cumsum(0) - probs
    if top_p < 1.0:
        kept = int((mass_before < top_p).sum())
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[order[:kept]] = True
    return mask


def test_top_k_top_p_match_a_full_sort_reference_including_flat_rows_that_need_more_candidates():
    settings = [(-1, 1.0), (5, 1.0), (-1, 0.9), (20, 0.5), (-1, 0.99), (3, 0.3), (0, 0.6), (64, 0.95)]
    for seed in range(5):
        # scale 0.3 makes rows flat: 4 candidates hold far less than top_p, forcing the widening path
        logits = random_logits(len(settings), 64, seed=seed, scale=0.3 if seed % 2 else 3.0)
        weights = (logits - logits.amax(dim=-1, keepdim=True)).exp()
        filtered = weights.clone()
        apply_top_k_top_p(filtered, [k for k, _ in settings], [p for _, p in settings], candidates=4)
        for row, (k, p) in enumerate(settings):
            kept = filtered[row] > 0
            assert torch.equal(kept, reference_top_k_top_p(logits[row], k, p)), (seed, k, p)
            assert torch.equal(filtered[row][kept], weights[row][kept])


def test_top_k_alone_keeps_its_k_tokens_even_when_float_rounding_says_the_mass_is_already_one():
    weights = torch.tensor([[0.0, -30.0, -30.0, -30.0, -40.0]]).exp()
    apply_top_k_top_p(weights, top_k=[3], top_p=[1.0])
    assert (weights[0] > 0).tolist() == [True, True, True, True, False]  # the tie at the cut is kept


def reference_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    scaled = logits / params.temperature
    kept = reference_top_k_top_p(scaled, params.top_k, params.top_p)
    probs = torch.softmax(scaled.double(), dim=0) * kept
    probs = probs * (probs >= params.min_p * probs.max())
    return probs / probs.sum()


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=2.0),
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=1.0, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.7),
        SamplingParams(temperature=1.0, min_p=0.3),
    ],
    ids=["t=1", "t=2", "t=0.5", "top_k=3", "top_p=0.7", "min_p=0.3"],
)
def test_empirical_distribution_matches_the_filtered_softmax(params):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2])
    draws = 20_000
    tokens = sample(logits.expand(draws, -1).contiguous(), params, sampler=Sampler(seed=1234)).token_ids
    observed = torch.bincount(torch.tensor(tokens), minlength=8).double()
    expected = reference_distribution(logits, params) * draws
    assert observed[expected == 0].sum() == 0, "a filtered-out token was sampled"
    support = expected > 0
    chi_square = float(((observed[support] - expected[support]) ** 2 / expected[support]).sum())
    # 24.3 is the 0.1% tail of chi-square with 7 degrees of freedom (the most any case here has).
    assert chi_square < 24.3


def run_seeded_request(rows_before: int, rows_after: int, seed: int, sampler_seed: int, steps: int = 8) -> list[int]:
    """Decode `steps` tokens of one seeded request whose logits at step s are fixed, placed in a batch
    among other rows (seeded, unseeded, greedy) that are at other positions of their own sequences."""
    target = SamplingParams(temperature=1.0, top_p=0.95, seed=seed)
    others = [SamplingParams(temperature=0.8, seed=99), SamplingParams(temperature=1.0), SamplingParams(temperature=0.0)]
    sampler = Sampler(seed=sampler_seed)
    generated: list[int] = []
    for step in range(steps):
        mine = random_logits(1, 64, seed=1000 + step, scale=1.0)
        before = random_logits(rows_before, 64, seed=step) if rows_before else torch.empty(0, 64)
        after = random_logits(rows_after, 64, seed=500 + step) if rows_after else torch.empty(0, 64)
        logits = torch.cat([before, mine, after])
        params = [others[i % 3] for i in range(rows_before)] + [target] + [others[i % 3] for i in range(rows_after)]
        outputs = [[0] * (step * 3 + i) for i in range(rows_before)] + [generated] + [[1] * i for i in range(rows_after)]
        result = sampler(logits, params, [[2]] * len(params), outputs)
        generated = generated + [result.token_ids[rows_before]]
    return generated


def test_seeded_request_is_reproducible_whatever_the_batch_around_it(monkeypatch):
    alone = run_seeded_request(rows_before=0, rows_after=0, seed=1234, sampler_seed=0)
    assert run_seeded_request(rows_before=3, rows_after=2, seed=1234, sampler_seed=1) == alone
    monkeypatch.setattr(sampler_module, "ROW_CHUNK", 2)  # the batch is processed in chunks of 2 rows
    assert run_seeded_request(rows_before=3, rows_after=2, seed=1234, sampler_seed=1) == alone
    assert run_seeded_request(rows_before=0, rows_after=7, seed=1234, sampler_seed=2) == alone
    assert run_seeded_request(rows_before=5, rows_after=0, seed=1234, sampler_seed=3) == alone
    # ...and the seed matters: another seed draws another sequence
    assert run_seeded_request(rows_before=0, rows_after=0, seed=1235, sampler_seed=0) != alone
    assert len(set(alone)) > 1


def test_logprobs_are_of_the_raw_distribution_for_the_sampled_and_top_tokens():
    logits = random_logits(3, 100, seed=5)
    top_two = logits[0].topk(2).indices.tolist()
    params = [
        SamplingParams(temperature=0.5, repetition_penalty=1.5, frequency_penalty=2.0, logprobs=3),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, logprobs=0),
    ]
    # Row 0 penalises its two most likely tokens hard: its processed distribution is far from the raw one.
    result = sample(logits, params, prompts=[top_two, [3], [4]], outputs=[top_two * 3, [6], [7]])
    raw = torch.log_softmax(logits, dim=-1)
    entry = result.logprobs[0]
    token = result.token_ids[0]
    assert entry.token_id == token
    assert entry.logprob == pytest.approx(raw[0, token].item(), abs=1e-5)
    top = raw[0].topk(3)
    assert entry.top_token_ids == top.indices.tolist()
    assert entry.top_logprobs == pytest.approx(top.values.tolist(), abs=1e-5)
    assert result.logprobs[1] is None
    greedy = result.logprobs[2]
    assert greedy.top_token_ids == [] and greedy.logprob == pytest.approx(raw[2].max().item(), abs=1e-5)


def test_prompt_logprobs_score_each_next_prompt_token(monkeypatch):
    monkeypatch.setattr(sampler_module, "PROMPT_LOGPROBS_CHUNK", 3)  # exercise the chunking
    logits = random_logits(10, 30, seed=6)
    next_tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]
    scored = prompt_logprobs(logits, next_tokens, num_top=2)
    raw = torch.log_softmax(logits, dim=-1)
    assert [s.token_id for s in scored] == next_tokens
    assert [s.logprob for s in scored] == pytest.approx([raw[i, t].item() for i, t in enumerate(next_tokens)], abs=1e-5)
    assert [s.top_token_ids for s in scored] == raw.topk(2).indices.tolist()
    with pytest.raises(ValueError):
        prompt_logprobs(logits, next_tokens[:-1], num_top=2)


def test_a_row_count_mismatch_is_a_caller_bug_not_garbage():
    with pytest.raises(ValueError):
        sample(random_logits(3, 10, seed=7), [SamplingParams()], prompts=[[]], outputs=[[]])


class PackedMask:
    """A grammar's mask over a small vocabulary as the sampler reads it (engine/structured/matcher.py's
    GrammarMatcher): llguidance's packed words, one bit read, and how often the whole mask was asked for."""

    def __init__(self, allowed: list[int], vocab: int):
        self.allowed, self.words_read = set(allowed), 0
        bits = np.zeros((vocab + 31) // 32 * 32, dtype=np.uint8)
        bits[allowed] = 1
        self._words = np.packbits(bits, bitorder="little").view(np.int32)

    def words(self) -> np.ndarray:
        self.words_read += 1
        return self._words

    def allows(self, token_id: int) -> bool:
        return token_id in self.allowed

    def masked_argmax(self, logits: torch.Tensor, best: int) -> int:
        return max(sorted(self.allowed), key=lambda t: float(logits[t]))


GRAMMAR_LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.2])
ALLOWED = [1, 3, 4, 7]  # a third of the mass at temperature 1: both the first draw and the masked one are common


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=2.0),
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=1.0, logit_bias={3: 2.0, 0: 1.0}),
        SamplingParams(temperature=1.0, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.7),
        SamplingParams(temperature=1.0, min_p=0.3),
    ],
    ids=["t=1", "t=2", "t=0.5", "logit_bias", "top_k=3", "top_p=0.7", "min_p=0.3"],
)
def test_constrained_draws_follow_the_masked_distribution(params, monkeypatch):
    # Temperature-only rows draw unmasked, again unmasked on a refusal, and mask only after UNMASKED_TRIES refusals
    # (Sampler._sample_chunk); the others mask first. Either way each token comes with the probability of the masked
    # row's distribution: a chi-square over 20,000 seeded rows, one seed each, so each try's stream is exercised
    # independently of the others'.
    draws = 20_000
    monkeypatch.setattr(sampler_module, "ROW_CHUNK", draws)  # one chunk: the rows are 8 tokens wide
    logits = GRAMMAR_LOGITS.expand(draws, -1).contiguous()
    rows = [dataclasses.replace(params, seed=i) for i in range(draws)]
    masks = [PackedMask(ALLOWED, 8)] * draws
    sampler = Sampler(seed=0)
    tokens = sampler(logits, rows, [[]] * draws, [[]] * draws, masks).token_ids
    if draws_before_mask(params, 8):  # every path taken: the first draw, the further tries, the masked one
        assert 0 < sampler.num_masked_redraws < sampler.num_redrawn < sampler.num_drawn_unmasked == draws
    else:
        assert sampler.num_drawn_unmasked == 0
    observed = torch.bincount(torch.tensor(tokens), minlength=8).double()
    biased = GRAMMAR_LOGITS.clone()
    for token, bias in params.logit_bias.items():
        biased[token] += bias
    forbidden = torch.full((8,), float("-inf"))
    forbidden[ALLOWED] = 0.0
    expected = reference_distribution(biased + forbidden, params) * draws
    assert observed[expected == 0].sum() == 0, "a token the grammar or a filter forbids was sampled"
    support = expected > 0
    chi_square = float(((observed[support] - expected[support]) ** 2 / expected[support]).sum())
    assert chi_square < 16.3  # the 0.1% tail of chi-square with 3 degrees of freedom (4 allowed tokens)


def test_a_sampled_row_reads_its_whole_mask_only_when_the_grammar_refuses_its_draw():
    vocab = 64
    logits = random_logits(3, vocab, seed=11)
    likely = logits[0].argsort(descending=True)[:60].tolist()  # nearly all the mass: the first draw is taken
    unlikely = logits[1].argsort()[:2].tolist()  # nearly none: the draw is refused, the masked row drawn from
    masks = [PackedMask(likely, vocab), PackedMask(unlikely, vocab), PackedMask(likely, vocab)]
    params = [SamplingParams(temperature=1.0, seed=5), SamplingParams(temperature=1.0, seed=5),
              SamplingParams(temperature=1.0, top_p=0.9, seed=5)]  # top-p picks from the masked row: masked first
    tokens = Sampler(seed=0)(logits, params, [[]] * 3, [[]] * 3, masks).token_ids
    assert [mask.words_read for mask in masks] == [0, 1, 1]
    assert tokens[0] in likely and tokens[1] in unlikely and tokens[2] in likely
    # The token taken at once is the one an unconstrained row with the same seed draws.
    assert tokens[0] == Sampler(seed=0)(logits[:1], params[:1], [[]], [[]]).token_ids[0]
