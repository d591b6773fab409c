"""Batched sampling: each row of logits with its own SamplingParams.

Order per row (vLLM's): repetition, frequency and presence penalties, logit bias, the grammar's mask (-inf where
it forbids, engine/structured/), then greedy argmax, or
temperature -> top-k -> top-p -> min-p -> one inverse-CDF draw. Log-probabilities are of the raw
model distribution (vLLM's default), not of the processed one. A constrained row sampled with temperature alone
draws first and masks only if the grammar refuses the draw (_sample_chunk): the same distribution, see there.

Costs on a 262k vocabulary drive the design: drawing one noise value per vocabulary entry
(Gumbel/exponential race) or fully sorting a row each cost milliseconds per row, and so does every
fresh [rows, vocab] tensor (the allocator hands it out as new pages). So a sampled row draws a
single uniform and searches its cumulative weights, top-p looks at the top candidates only
(widening only for rows whose candidates hold less than top_p of the mass), penalties touch only
the tokens in the history, and all per-vocabulary work happens in place in one reused buffer.
"""

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.structured.matcher import apply_grammar_masks

# Top-p first looks at this many candidates, then 8x more for rows they do not cover.
TOP_P_CANDIDATES = 1024
# Unmasked draws a constrained row sampled with temperature alone makes (searchsorted on its cumulative weights)
# before its row is masked and drawn from (Sampler._sample_chunk). Where the grammar allows most of the mass each try
# is likely to be taken; where it allows little, eight refusals are likely too and the masked draw follows.
UNMASKED_TRIES = 8
# Rows processed at once: bounds the reused buffer to ROW_CHUNK x vocab float32.
ROW_CHUNK = 64
# Rows of log-softmax computed at once for prompt logprobs ([L, vocab] float32 can be gigabytes).
PROMPT_LOGPROBS_CHUNK = 256


@dataclass
class TokenLogprobs:
    """Log-probability of one chosen (sampled or prompt) token and the top-n alternatives."""

    token_id: int
    logprob: float
    top_token_ids: list[int]
    top_logprobs: list[float]


class GrammarMask(Protocol):
    """A constrained row's mask (engine/structured/matcher.py GrammarMatcher)."""

    def words(self) -> np.ndarray:
        """[ceil(vocab / 32)] int32, llguidance's packed mask: bit t % 32 of word t // 32 set where t is allowed."""

    def masked_argmax(self, logits: torch.Tensor, best: int) -> int:
        """The first largest of `logits` among the allowed tokens; `best` is the unmasked row's argmax."""

    def allows(self, token_id: int) -> bool:
        """Whether the grammar allows `token_id` next (one bit read)."""


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
        self._buffer: torch.Tensor | None = None
        # Constrained rows drawn before masking, and those of them the grammar refused (drawn again, masked): what
        # the deferred mask saves depends on how rarely the second happens.
        self.num_drawn_unmasked = 0
        self.num_redrawn = 0
        self.num_masked_redraws = 0  # refused UNMASKED_TRIES times: drawn from the masked row

    def __call__(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        prompt_token_ids: Sequence[Sequence[int]],
        output_token_ids: Sequence[Sequence[int]],
        grammars: "Sequence[GrammarMask | None] | None" = None,
    ) -> SamplerOutput:
        """logits: [B, vocab] on any device, not modified; row i belongs to a sequence with params[i],
        whose prompt and generated-so-far tokens (for penalties and the seeded step) are given.
        grammars[i]: row i's grammar mask (engine/structured/matcher.py), or None."""
        if not logits.shape[0] == len(params) == len(prompt_token_ids) == len(output_token_ids):
            raise ValueError(f"{logits.shape[0]} rows of logits for {len(params)} params, "
                             f"{len(prompt_token_ids)} prompts and {len(output_token_ids)} outputs")
        raw = logits.float()
        grammars = grammars if grammars is not None and any(g is not None for g in grammars) else None
        plain = [p.is_greedy and not p.changes_logits for p in params]
        if all(plain):
            ids = argmax_rows(raw)  # the hot path: nothing to copy
        else:
            # A plain greedy row's grammar is applied below, from its bits; the others' masks in the chunk's buffer.
            masked = None if grammars is None else [None if plain[row] else g for row, g in enumerate(grammars)]
            ids = [0] * len(params)
            for start in range(0, len(params), ROW_CHUNK):
                rows = range(start, min(start + ROW_CHUNK, len(params)))
                chosen = self._sample_chunk(raw, params, prompt_token_ids, output_token_ids, rows, masked)
                for row, token_id in zip(rows, chosen):
                    ids[row] = token_id
        if grammars is not None:  # a plain greedy row: the best allowed token, its argmax wherever that is allowed
            for row, grammar in enumerate(grammars):
                if grammar is not None and plain[row]:
                    ids[row] = grammar.masked_argmax(raw[row], ids[row])

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

    def _sample_chunk(
        self,
        raw: torch.Tensor,
        params: Sequence[SamplingParams],
        prompt_token_ids: Sequence[Sequence[int]],
        output_token_ids: Sequence[Sequence[int]],
        rows: range,
        grammars: "Sequence[GrammarMask | None] | None" = None,
    ) -> list[int]:
        """Token ids for `rows`, in that order. Sampled rows are copied to the front of the buffer
        and greedy ones behind them, so each kind is one contiguous slice.

        A constrained row sampled with temperature alone is not masked before its draw. Let p be its distribution
        after penalties, bias and temperature, and A the tokens its grammar allows; the constrained distribution is
        p(x) / p(A) on A. Draw x from p with the row's uniform; if x is in A take it, else mask the row and draw
        again from p restricted to A, with a second uniform from another stream (independent of the first). A token
        x in A then comes with probability p(x) + (1 - p(A)) * p(x) / p(A) = p(x) / p(A): exactly the constrained
        distribution, so nothing is biased, and a model that follows its grammar (nearly always, inside a JSON
        string) never pays for masking its 262k-wide row. A refused row first tries again unmasked, up to
        UNMASKED_TRIES draws in all, each with its own stream (the same sum, below), as the row's cumulative
        weights are already there. It needs the mask to act on p alone: top-k, top-p and
        min-p choose their tokens from the masked row (vLLM's order), so rows with any of them are masked first,
        as are greedy rows with penalties or a bias. (In float32 a token whose weight underflows to 0 in the
        unmasked row, below about e^-100 of the most likely one, can only come from the second draw: off by a factor
        1 - p(A), where its probability is negligible unless p(A) is too.)"""
        sampled = [i for i in rows if not params[i].is_greedy]
        order = sampled + [i for i in rows if params[i].is_greedy]
        work = self._workspace(len(order), raw.shape[-1], raw.device)
        self._edited_rows(work, raw, order, params, prompt_token_ids, output_token_ids)
        ordered_params = [params[i] for i in order]
        deferred: list[int] = []  # positions in `order` of the constrained rows that draw before masking
        if grammars is not None:
            constrained = [position for position, row in enumerate(order) if grammars[row] is not None]
            deferred = [position for position in constrained
                        if position < len(sampled) and draws_before_mask(ordered_params[position], raw.shape[-1])]
            masked_now = sorted(set(constrained) - set(deferred))
            if masked_now:
                apply_grammar_masks(work, masked_now, [grammars[order[position]].words() for position in masked_now])

        token_ids = torch.empty(len(order), dtype=torch.long, device=raw.device)
        if len(sampled) < len(order):
            token_ids[len(sampled):] = torch.tensor(argmax_rows(work[len(sampled):]), dtype=torch.long)
        if sampled:
            uniforms = [self._uniform(params[i], len(output_token_ids[i])) for i in sampled]
            token_ids[: len(sampled)] = sample_from_logits(work[: len(sampled)], ordered_params[: len(sampled)], uniforms)
        chosen = token_ids.tolist()
        refused = [position for position in deferred if not grammars[order[position]].allows(chosen[position])]
        self.num_drawn_unmasked += len(deferred)
        self.num_redrawn += len(refused)
        if refused:
            # More unmasked tries first, from the cumulative weights the first draw left in the buffer: a searchsorted
            # each, not a 262k-wide pass. After k refusals and a masked draw, x in A still comes with probability
            # p(x) * (1 + (1 - p(A)) + ... + (1 - p(A))^(k-1)) + (1 - p(A))^k * p(x) / p(A) = p(x) / p(A).
            tries = torch.tensor([[self._uniform(params[order[position]], len(output_token_ids[order[position]]),
                                                 f"grammar try {k}") for k in range(1, UNMASKED_TRIES)]
                                  for position in refused], device=raw.device)
            still = []
            for i, position in enumerate(refused):
                candidates = _search_cdf(work[position:position + 1], tries[i:i + 1])[0].tolist()
                grammar = grammars[order[position]]
                taken = next((token_id for token_id in candidates if grammar.allows(token_id)), None)
                if taken is None:
                    still.append(position)
                else:
                    chosen[position] = taken
            refused = still
        if refused:
            # Refused every time: the buffer takes these rows again (it held their unmasked cumulative weights), masked.
            self.num_masked_redraws += len(refused)
            again = [order[position] for position in refused]
            work = self._workspace(len(again), raw.shape[-1], raw.device)
            self._edited_rows(work, raw, again, params, prompt_token_ids, output_token_ids)
            apply_grammar_masks(work, list(range(len(again))), [grammars[row].words() for row in again])
            uniforms = [self._uniform(params[i], len(output_token_ids[i]), "grammar") for i in again]
            redrawn = sample_from_logits(work, [params[i] for i in again], uniforms).tolist()
            for position, token_id in zip(refused, redrawn):
                chosen[position] = token_id
        by_row = dict(zip(order, chosen))
        return [by_row[i] for i in rows]

    def _edited_rows(
        self,
        work: torch.Tensor,
        raw: torch.Tensor,
        order: list[int],
        params: Sequence[SamplingParams],
        prompt_token_ids: Sequence[Sequence[int]],
        output_token_ids: Sequence[Sequence[int]],
    ) -> None:
        """work[j] = raw[order[j]] with its row's penalties and logit bias."""
        torch.index_select(raw, 0, _index(order, raw.device), out=work)
        ordered_params = [params[i] for i in order]
        if any(p.has_penalties for p in ordered_params):
            apply_penalties(work, ordered_params, [prompt_token_ids[i] for i in order], [output_token_ids[i] for i in order])
        if any(p.logit_bias for p in ordered_params):
            apply_logit_bias(work, ordered_params)

    def _workspace(self, rows: int, vocab: int, device: torch.device) -> torch.Tensor:
        if self._buffer is None or self._buffer.device != device or self._buffer.shape[1] != vocab:
            self._buffer = torch.empty(ROW_CHUNK, vocab, device=device)
        return self._buffer[:rows]

    def _uniform(self, params: SamplingParams, step: int, stream: str = "") -> float:
        if params.seed is None:
            return self._rng.random()
        return seeded_uniform(params.seed, step, stream)

    def verify_guesses(self, logits: torch.Tensor, params: SamplingParams, guesses: Sequence[int], step: int) -> list[int]:
        """Speculative decoding for a sampled request: logits [len(guesses) + 1, vocab] at the guesses' positions,
        `step` = tokens generated before the first. An n-gram guess is a point mass, so standard rejection sampling
        reduces to: accept guess i with probability p_i(guess), where p_i is the row's sampling distribution; on
        the first rejection draw from p_i without the guess, renormalised; if every guess is accepted, draw one more
        from the last row. Each returned token is distributed exactly as sampling one token a step would give."""
        work = logits.float().clone()
        rows = [params] * work.shape[0]
        if params.logit_bias:
            apply_logit_bias(work, rows)
        weights = processed_weights(work, rows)
        tokens: list[int] = []
        for i, guess in enumerate(guesses):
            row = weights[i]
            if self._uniform(params, step + i, "accept") * float(row.sum()) < float(row[guess]):
                tokens.append(int(guess))
                continue
            row[guess] = 0.0
            tokens.append(int(_inverse_cdf_draw(row[None], [self._uniform(params, step + i)])[0]))
            return tokens
        last = len(guesses)
        tokens.append(int(_inverse_cdf_draw(weights[last:last + 1], [self._uniform(params, step + last)])[0]))
        return tokens


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's index of its largest value, the first of equals (torch's and numpy's rule alike). On the CPU
    numpy's vectorised argmax: torch's takes ~160 us for one 262k-entry row and ~2.4 ms for 8 rows on 2 threads,
    numpy's ~14 us and ~110 us, which at batch 1 is ~1 % of a decode step."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return logits.numpy().argmax(axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def checks_before_mask(params: SamplingParams, vocab: int) -> bool:
    """A constrained row that needs its grammar mask only if the grammar refuses the token it chose unmasked: a
    plain greedy row (its argmax, one token checked: GrammarMatcher.masked_argmax) or a row that draws first
    (draws_before_mask). The engine computes no mask ahead for these (llm_engine.py)."""
    return (params.is_greedy and not params.changes_logits) or draws_before_mask(params, vocab)


def draws_before_mask(params: SamplingParams, vocab: int) -> bool:
    """A sampled constrained row whose grammar mask can wait until its draw is refused (Sampler._sample_chunk):
    temperature alone, no top-k, top-p or min-p, which would pick their tokens from the masked row."""
    return not params.is_greedy and not 0 < params.top_k < vocab and params.top_p >= 1.0 and params.min_p <= 0.0


def seeded_uniform(seed: int, step: int, stream: str = "") -> float:
    """A uniform in [0, 1) that depends only on (seed, step) and the stream it is for: a counter-based draw, so no
    generator state has to follow the request around, and the value is the same on every device."""
    key = f"{seed}:{step}" if not stream else f"{seed}:{step}:{stream}"
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 11) * 2.0**-53


def apply_penalties(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    prompt_token_ids: Sequence[Sequence[int]],
    output_token_ids: Sequence[Sequence[int]],
) -> torch.Tensor:
    """In place on contiguous float32 logits [B, vocab], touching only tokens in each row's history.
    Repetition penalty (HF/vLLM) over prompt + output tokens: a seen token's logit is divided by the
    penalty if positive, multiplied if negative. Frequency and presence penalties (OpenAI) over
    output tokens: logit -= frequency * count + presence * (count > 0)."""
    flat, vocab, device = logits.view(-1), logits.shape[-1], logits.device
    repeat_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
    if repeat_rows:
        keys, owners = _history_keys([[*prompt_token_ids[i], *output_token_ids[i]] for i in repeat_rows], repeat_rows, vocab, device)
        penalty = torch.tensor([params[i].repetition_penalty for i in repeat_rows], device=device)[owners]
        seen = flat[keys]
        # A token seen twice is written twice with the same value: no need to deduplicate.
        flat[keys] = torch.where(seen > 0, seen / penalty, seen * penalty)

    additive_rows = [i for i, p in enumerate(params) if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0]
    if additive_rows:
        keys, owners = _history_keys([output_token_ids[i] for i in additive_rows], additive_rows, vocab, device)
        frequency = torch.tensor([params[i].frequency_penalty for i in additive_rows], device=device)[owners]
        presence = torch.tensor([params[i].presence_penalty for i in additive_rows], device=device)[owners]
        flat.index_put_((keys,), -frequency, accumulate=True)  # once per occurrence
        flat[keys] = flat[keys] - presence  # once per distinct token: duplicates write the same value
    return logits


def apply_logit_bias(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """In place on contiguous float32 logits [B, vocab]: add each row's bias to the tokens it names (OpenAI's
    logit_bias; the logprobs reported stay those of the raw model, as for penalties)."""
    vocab = logits.shape[-1]
    keys = [row * vocab + token for row, p in enumerate(params) for token in p.logit_bias]
    if keys:
        biases = [bias for p in params for bias in p.logit_bias.values()]
        logits.view(-1).index_add_(0, _index(keys, logits.device), torch.tensor(biases, device=logits.device))
    return logits


def sample_from_logits(logits: torch.Tensor, params: Sequence[SamplingParams], uniforms: Sequence[float]) -> torch.Tensor:
    """Sample one token per row of contiguous float32 logits [R, vocab] (overwritten) with row i's
    temperature, top-k, top-p and min-p, using uniforms[i] in [0, 1) as the row's only randomness."""
    return _inverse_cdf_draw(processed_weights(logits, params), uniforms)


def processed_weights(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Each row's unnormalised sampling distribution (temperature, then top-k, top-p and min-p), in place of the
    contiguous float32 logits [R, vocab]."""
    device, vocab = logits.device, logits.shape[-1]
    temperature = torch.tensor([p.temperature for p in params], device=device)[:, None]
    # Unnormalised weights exp((logit - max) / T): the most likely token weighs exactly 1.
    weights = logits.sub_(logits.amax(dim=-1, keepdim=True)).div_(temperature).exp_()
    if any(0 < p.top_k < vocab or p.top_p < 1.0 for p in params):
        apply_top_k_top_p(weights, [p.top_k for p in params], [p.top_p for p in params])
    if any(p.min_p > 0.0 for p in params):
        # Relative to the most likely token, whose weight is 1 (top-k/top-p always keep it).
        weights.masked_fill_(weights < torch.tensor([p.min_p for p in params], device=device)[:, None], 0.0)
    return weights


def apply_top_k_top_p(weights: torch.Tensor, top_k: list[int], top_p: list[float], candidates: int = TOP_P_CANDIDATES) -> None:
    """In place on unnormalised probabilities [R, vocab]: keep each row's top_k tokens (top_k <= 0 or
    >= vocab: all), then the smallest set of the most likely remaining tokens whose probability
    reaches top_p; zero the rest. Tokens tied with the last kept one are kept too (the cut is a
    weight threshold)."""
    rows, vocab = weights.shape
    device = weights.device
    k_per_row = [k if 0 < k < vocab else vocab for k in top_k]
    looked_at = max(k if k < vocab else (min(candidates, vocab) if p < 1.0 else 1) for k, p in zip(k_per_row, top_p))
    best, _ = weights.topk(looked_at, dim=-1)  # descending

    k = torch.tensor(k_per_row, device=device)[:, None]
    p = torch.tensor(top_p, device=device)[:, None]
    keep = torch.arange(looked_at, device=device)[None, :] < k
    best = best * keep
    # top-p renormalises over what top-k left; rows without top-k over the whole vocabulary.
    total = torch.where(k < vocab, best.sum(dim=-1, keepdim=True), weights.sum(dim=-1, keepdim=True))
    probs = best / total
    mass_before = probs.cumsum(dim=-1) - probs
    keep &= (mass_before < p) | (p >= 1.0)

    threshold = best.gather(1, keep.sum(dim=-1, keepdim=True) - 1)
    untouched = (k >= vocab) & (p >= 1.0)
    # Candidates holding less than top_p of the mass (flat distributions) cannot place the cut.
    widen = (k >= vocab) & (p < 1.0) & (mass_before[:, -1:] + probs[:, -1:] < p) & (looked_at < vocab)
    threshold = threshold.masked_fill(untouched | widen, 0.0)
    weights.masked_fill_(weights < threshold, 0.0)

    widen_rows = widen.squeeze(1).nonzero().squeeze(1).tolist()
    if widen_rows:
        index = _index(widen_rows, device)
        wide = weights[index]
        apply_top_k_top_p(wide, [top_k[i] for i in widen_rows], [top_p[i] for i in widen_rows], candidates * 8)
        weights[index] = wide


def _inverse_cdf_draw(weights: torch.Tensor, uniforms: Sequence[float]) -> torch.Tensor:
    """The first token whose cumulative weight exceeds u times the row's total (weights overwritten by their
    cumulative sums, which _search_cdf can draw from again)."""
    cdf = weights.cumsum_(dim=-1)
    return _search_cdf(cdf, torch.tensor(uniforms, device=weights.device)[:, None]).squeeze(1)


def _search_cdf(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[R, K] tokens: for each of row r's K uniforms u[r, k], the first token whose cumulative weight in cdf[r]
    exceeds u[r, k] times the row's total."""
    total = cdf[:, -1:]
    chosen = torch.searchsorted(cdf, u * total, right=True).clamp_(max=cdf.shape[-1] - 1)
    below = torch.where(chosen > 0, cdf.gather(1, (chosen - 1).clamp_(min=0)), torch.zeros_like(total))
    zero_weight = cdf.gather(1, chosen) <= below
    if zero_weight.any():
        # Only float rounding at the very top of the CDF gets here (u rounded up to 1 in float32, or
        # u * total rounded up to the total): the target is the last token with positive weight,
        # the first whose cumulative weight reaches the total.
        last_positive = (cdf < total).sum(dim=-1, keepdim=True)
        chosen = torch.where(zero_weight, last_positive, chosen)
    return chosen


def token_logprobs(logits: torch.Tensor, token_ids: Sequence[int], num_top: Sequence[int]) -> list[TokenLogprobs]:
    """For each row of raw logits [R, vocab]: log-probability of token_ids[i] and of the num_top[i]
    most likely tokens."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = torch.tensor(list(token_ids), device=logits.device)[:, None]
    chosen_logprobs = logprobs.gather(1, chosen).squeeze(1).tolist()
    most = max(num_top, default=0)
    top_values, top_ids = logprobs.topk(most, dim=-1) if most > 0 else (logprobs[:, :0], chosen[:, :0])
    top_values, top_ids = top_values.tolist(), top_ids.tolist()
    return [
        TokenLogprobs(
            token_id=token_id,
            logprob=logprob,
            top_token_ids=top_ids[row][:n],
            top_logprobs=top_values[row][:n],
        )
        for row, (token_id, logprob, n) in enumerate(zip(token_ids, chosen_logprobs, num_top))
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


def _history_keys(
    histories: list[Sequence[int]], rows: list[int], vocab: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices row * vocab + token of every history token, and which entry of `rows` owns each."""
    lengths = torch.tensor([len(h) for h in histories])
    owners = torch.repeat_interleave(torch.arange(len(histories)), lengths)
    tokens = torch.tensor([t for h in histories for t in h], dtype=torch.long)
    keys = torch.tensor(rows, dtype=torch.long)[owners] * vocab + tokens
    return keys.to(device), owners.to(device)


def _index(rows: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=device)
