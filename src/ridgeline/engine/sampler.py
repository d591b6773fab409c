"""Batched sampling: each row of logits with its own SamplingParams.

Order per row (vLLM's): repetition, frequency and presence penalties, then greedy argmax, or
temperature -> top-k -> top-p -> min-p -> one inverse-CDF draw. Log-probabilities are of the raw
model distribution (vLLM's default), not of the processed one.

Costs on a 262k vocabulary drive the design: drawing one noise value per vocabulary entry
(Gumbel/exponential race) or fully sorting a row each costs milliseconds per row, so a sampled
row draws a single uniform and searches its cumulative distribution, and top-p looks at the top
candidates only, widening the search only for rows whose candidates hold less than top_p of the mass.
"""

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ridgeline.engine.sampling_params import SamplingParams

# Top-p first looks at this many candidates, then 8x more for rows they do not cover.
TOP_P_CANDIDATES = 1024
# Rows of log-softmax computed at once for prompt logprobs ([L, vocab] float32 can be gigabytes).
PROMPT_LOGPROBS_CHUNK = 256


@dataclass
class TokenLogprobs:
    """Log-probability of one chosen (sampled or prompt) token and the top-n alternatives."""

    token_id: int
    logprob: float
    rank: int  # 1 = the most likely token
    top_token_ids: list[int]
    top_logprobs: list[float]


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]  # per row; None where the row did not ask for logprobs


class Sampler:
    """Samples one token per row. Seeded rows draw from a stream that depends only on (seed, step),
    step being the number of tokens the sequence has generated, so batch composition never matters."""

    def __init__(self, seed: int | None = None):
        # Shared by unseeded rows; None seeds it from OS entropy.
        self._rng = random.Random(seed)

    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        prompt_token_ids: Sequence[Sequence[int]],
        output_token_ids: Sequence[Sequence[int]],
    ) -> SamplerOutput:
        """logits: [B, vocab] on any device; row i belongs to a sequence with params[i], whose
        prompt and generated-so-far tokens (for penalties and the seeded step) are given."""
        if not logits.shape[0] == len(params) == len(prompt_token_ids) == len(output_token_ids):
            raise ValueError(f"{logits.shape[0]} rows of logits for {len(params)} params, "
                             f"{len(prompt_token_ids)} prompts and {len(output_token_ids)} outputs")
        raw = logits.float()
        logits = raw
        if any(p.has_penalties for p in params):
            logits = apply_penalties(raw.clone(), params, prompt_token_ids, output_token_ids)

        sampled_rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if not sampled_rows:
            token_ids = logits.argmax(dim=-1)
        else:
            token_ids = self._sample_rows(logits, params, output_token_ids, sampled_rows)
        ids = token_ids.tolist()

        logprob_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        logprobs: list[TokenLogprobs | None] = [None] * len(params)
        if logprob_rows:
            found = token_logprobs(
                raw[_index(logprob_rows, raw.device)],
                [ids[i] for i in logprob_rows],
                [params[i].logprobs for i in logprob_rows],
            )
            for i, entry in zip(logprob_rows, found):
                logprobs[i] = entry
        return SamplerOutput(token_ids=ids, logprobs=logprobs)

    def _sample_rows(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        output_token_ids: Sequence[Sequence[int]],
        sampled_rows: list[int],
    ) -> torch.Tensor:
        device = logits.device
        token_ids = torch.empty(logits.shape[0], dtype=torch.long, device=device)
        greedy_rows = [i for i, p in enumerate(params) if p.is_greedy]
        if greedy_rows:
            greedy_index = _index(greedy_rows, device)
            token_ids[greedy_index] = logits[greedy_index].argmax(dim=-1)
        rows = [params[i] for i in sampled_rows]
        uniforms = [self._uniform(params[i], len(output_token_ids[i])) for i in sampled_rows]
        sampled_index = _index(sampled_rows, device)
        token_ids[sampled_index] = sample_from_logits(logits[sampled_index], rows, uniforms)
        return token_ids

    def _uniform(self, params: SamplingParams, step: int) -> float:
        if params.seed is None:
            return self._rng.random()
        return seeded_uniform(params.seed, step)


def seeded_uniform(seed: int, step: int) -> float:
    """A uniform in [0, 1) that depends only on (seed, step): a counter-based draw, so no generator
    state has to follow the request around, and the value is the same on every device."""
    digest = hashlib.blake2b(f"{seed}:{step}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 11) * 2.0**-53


def apply_penalties(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
) -> torch.Tensor:
    """In place on float32 logits [B, vocab]. Repetition penalty (HF/vLLM) over prompt + output tokens:
    a seen token's logit is divided by the penalty if positive, multiplied if negative. Frequency and
    presence penalties (OpenAI) over output tokens: logit -= frequency * count + presence * (count > 0)."""
    device, vocab = logits.device, logits.shape[-1]
    repeat_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
    if repeat_rows:
        seen = _token_counts([[*prompt_token_ids[i], *output_token_ids[i]] for i in repeat_rows], vocab, device) > 0
        penalty = torch.tensor([params[i].repetition_penalty for i in repeat_rows], device=device)[:, None]
        index = _index(repeat_rows, device)
        rows = logits[index]
        penalised = torch.where(rows > 0, rows / penalty, rows * penalty)
        logits[index] = torch.where(seen, penalised, rows)

    additive_rows = [i for i, p in enumerate(params) if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0]
    if additive_rows:
        counts = _token_counts([output_token_ids[i] for i in additive_rows], vocab, device)
        frequency = torch.tensor([params[i].frequency_penalty for i in additive_rows], device=device)[:, None]
        presence = torch.tensor([params[i].presence_penalty for i in additive_rows], device=device)[:, None]
        index = _index(additive_rows, device)
        logits[index] -= frequency * counts + presence * (counts > 0)
    return logits


def sample_from_logits(logits: torch.Tensor, params: Sequence[SamplingParams], uniforms: Sequence[float]) -> torch.Tensor:
    """Sample one token per row of float32 logits [R, vocab] (modified in place) with row i's
    temperature, top-k, top-p and min-p, using uniforms[i] in [0, 1) as the row's only randomness."""
    device, vocab = logits.device, logits.shape[-1]
    logits /= torch.tensor([p.temperature for p in params], device=device)[:, None]
    if any(0 < p.top_k < vocab or p.top_p < 1.0 for p in params):
        apply_top_k_top_p(logits, [p.top_k for p in params], [p.top_p for p in params])
    if any(p.min_p > 0.0 for p in params):
        apply_min_p(logits, [p.min_p for p in params])
    return _inverse_cdf_draw(logits, uniforms)


def apply_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float], candidates: int = TOP_P_CANDIDATES) -> None:
    """In place: keep each row's top_k logits (top_k <= 0 or >= vocab: all), then the smallest set of
    the most likely remaining tokens whose probability reaches top_p. Tokens tied with the last
    kept one are kept too (the cut is a logit threshold)."""
    rows, vocab = logits.shape
    device = logits.device
    k_per_row = [k if 0 < k < vocab else vocab for k in top_k]
    looked_at = max(k if k < vocab else (min(candidates, vocab) if p < 1.0 else 1) for k, p in zip(k_per_row, top_p))
    best, _ = logits.topk(looked_at, dim=-1)  # descending

    k = torch.tensor(k_per_row, device=device)[:, None]
    p = torch.tensor(top_p, device=device)[:, None]
    keep = torch.arange(looked_at, device=device)[None, :] < k
    best = best.masked_fill(~keep, -math.inf)
    # top-p renormalises over what top-k left; rows without top-k normalise over the whole vocabulary.
    log_norm = torch.where(k < vocab, best.logsumexp(dim=-1, keepdim=True), logits.logsumexp(dim=-1, keepdim=True))
    probs = (best - log_norm).exp()
    mass_before = probs.cumsum(dim=-1) - probs
    keep &= (mass_before < p) | (p >= 1.0)

    threshold = best.gather(1, keep.sum(dim=-1, keepdim=True) - 1)
    untouched = (k >= vocab) & (p >= 1.0)
    # Candidates holding less than top_p of the mass (flat distributions) cannot place the cut.
    widen = (k >= vocab) & (p < 1.0) & (mass_before[:, -1:] + probs[:, -1:] < p) & (looked_at < vocab)
    threshold = threshold.masked_fill(untouched | widen, -math.inf)
    logits.masked_fill_(logits < threshold, -math.inf)

    widen_rows = widen.squeeze(1).nonzero().squeeze(1).tolist()
    if widen_rows:
        index = _index(widen_rows, device)
        wide = logits[index]
        apply_top_k_top_p(wide, [top_k[i] for i in widen_rows], [top_p[i] for i in widen_rows], candidates * 8)
        logits[index] = wide


def apply_min_p(logits: torch.Tensor, min_p: list[float]) -> None:
    """In place: drop tokens whose probability is below min_p times the row's most likely token's,
    compared as logits (log of min_p = -inf for rows without min-p, which drops nothing)."""
    floor = torch.tensor(min_p, device=logits.device).log()[:, None] + logits.amax(dim=-1, keepdim=True)
    logits.masked_fill_(logits < floor, -math.inf)


def _inverse_cdf_draw(logits: torch.Tensor, uniforms: Sequence[float]) -> torch.Tensor:
    """The first token whose cumulative (unnormalised) probability exceeds u times the total."""
    cdf = (logits - logits.amax(dim=-1, keepdim=True)).exp_().cumsum_(dim=-1)
    # Largest float32 below 1: a u that rounds up to 1 would land past the last token.
    u = torch.tensor(uniforms, device=logits.device).clamp_(max=1.0 - 2.0**-24)
    target = u[:, None] * cdf[:, -1:]
    chosen = torch.searchsorted(cdf, target, right=True).clamp_(max=logits.shape[-1] - 1)
    # A zero-probability pick needs float rounding at the very top of the CDF (or a scan that is
    # not monotone on some device); fall back to the row's most likely token then.
    below = torch.where(chosen > 0, cdf.gather(1, (chosen - 1).clamp_(min=0)), torch.zeros_like(target))
    invalid = cdf.gather(1, chosen) <= below
    return torch.where(invalid, logits.argmax(dim=-1, keepdim=True), chosen).squeeze(1)


def token_logprobs(logits: torch.Tensor, token_ids: Sequence[int], num_top: Sequence[int]) -> list[TokenLogprobs]:
    """For each row of raw logits [R, vocab]: log-probability and rank of token_ids[i] and the
    num_top[i] most likely tokens."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = torch.tensor(list(token_ids), device=logits.device)[:, None]
    chosen_logprobs = logprobs.gather(1, chosen)
    ranks = (logprobs > chosen_logprobs).sum(dim=-1) + 1
    most = max(num_top, default=0)
    top_values, top_ids = logprobs.topk(most, dim=-1) if most > 0 else (logprobs[:, :0], chosen[:, :0])
    top_values, top_ids = top_values.tolist(), top_ids.tolist()
    return [
        TokenLogprobs(
            token_id=token_id,
            logprob=logprob,
            rank=rank,
            top_token_ids=top_ids[row][:n],
            top_logprobs=top_values[row][:n],
        )
        for row, (token_id, logprob, rank, n) in enumerate(
            zip(token_ids, chosen_logprobs.squeeze(1).tolist(), ranks.tolist(), num_top)
        )
    ]


def prompt_logprobs(logits: torch.Tensor, next_token_ids: Sequence[int], num_top: int) -> list[TokenLogprobs]:
    """Prompt scoring (OpenAI echo + logprobs): logits[j] is the model's prediction after prompt
    position j and next_token_ids[j] the prompt token that actually follows it. The first prompt
    token has no prediction; the caller reports None for it."""
    if logits.shape[0] != len(next_token_ids):
        raise ValueError(f"{logits.shape[0]} rows of logits for {len(next_token_ids)} prompt tokens")
    result: list[TokenLogprobs] = []
    for start in range(0, len(next_token_ids), PROMPT_LOGPROBS_CHUNK):
        chunk = next_token_ids[start : start + PROMPT_LOGPROBS_CHUNK]
        result += token_logprobs(logits[start : start + len(chunk)], chunk, [num_top] * len(chunk))
    return result


def _token_counts(histories: list[Sequence[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[len(histories), vocab] float32 count of each token id in each history."""
    counts = torch.zeros(len(histories), vocab, device=device)
    rows = torch.repeat_interleave(torch.arange(len(histories)), torch.tensor([len(h) for h in histories]))
    ids = torch.tensor([t for h in histories for t in h], dtype=torch.long)
    counts.index_put_((rows.to(device), ids.to(device)), torch.ones(len(ids), device=device), accumulate=True)
    return counts


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=device)
