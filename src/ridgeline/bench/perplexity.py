"""Perplexity as llama.cpp's `llama-perplexity` computes it: non-overlapping windows of `ctx` tokens, the first
token of each replaced by BOS, each window scored on its second half (tokens that saw at least ctx/2 of context)."""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ridgeline.engine.model_runner import ModelRunner
from ridgeline.errors import RidgelineError
from ridgeline.model.attention_batch import ForwardChunk


@dataclass
class PerplexityResult:
    perplexity: float
    uncertainty: float  # ± one standard error, propagated from the mean negative log-likelihood
    windows: int
    scored_tokens: int


def perplexity(runner: ModelRunner, token_ids: list[int], bos_id: int | None, ctx: int = 512,
               on_window: Callable[[int, int, float], None] | None = None) -> PerplexityResult:
    windows = len(token_ids) // ctx
    if windows == 0:
        raise RidgelineError(f"the text has {len(token_ids)} tokens, fewer than one window of --ctx {ctx}")
    tables = runner.kv_cache.group_tables(list(range(-(-ctx // runner.kv_cache.block_size))))
    first = ctx // 2
    nll_sum = nll_sq_sum = 0.0
    count = 0
    for w in range(windows):
        window = token_ids[w * ctx:(w + 1) * ctx]
        if bos_id is not None:
            window = [bos_id] + window[1:]
        logits = runner.run([ForwardChunk(window, 0, tables, all_logits=True)])[0]
        log_probs = torch.log_softmax(logits[first:ctx - 1], dim=-1)
        targets = torch.tensor(window[first + 1:ctx])
        nll = -log_probs.gather(1, targets[:, None]).squeeze(1).double()
        nll_sum += nll.sum().item()
        nll_sq_sum += (nll**2).sum().item()
        count += len(targets)
        if on_window is not None:
            on_window(w + 1, windows, math.exp(nll_sum / count))
    mean = nll_sum / count
    stderr = math.sqrt(max(nll_sq_sum / count - mean**2, 0.0) / max(count - 1, 1))
    ppl = math.exp(mean)
    return PerplexityResult(ppl, ppl * stderr, windows, count)
