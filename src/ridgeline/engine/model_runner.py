"""Runs the model for one engine step: scheduled chunks in, logits out."""

import torch

from ridgeline.engine.kv_cache import KVCache
from ridgeline.engine.step_batch import StepBatchBuilder
from ridgeline.model.attention_batch import ForwardChunk
from ridgeline.model.transformer import Transformer


class ModelRunner:
    def __init__(self, model: Transformer, kv_cache: KVCache):
        self.model, self.kv_cache = model, kv_cache
        self.cache_layers = kv_cache.layers()
        self.batches = StepBatchBuilder(kv_cache.block_size, model.group_windows, model.options.device)

    def forward(self, chunks: list[ForwardChunk]) -> tuple[torch.Tensor, list[int]]:
        """One forward pass: all logit rows in chunk order ([1 or len(chunk), vocab] each) and their counts."""
        batch = self.batches.build(chunks)
        return self.model(batch, self.cache_layers), batch.logit_counts

    def run(self, chunks: list[ForwardChunk]) -> list[torch.Tensor]:
        """One forward pass; for each chunk its logits ([1, vocab], or [len, vocab] when all_logits)."""
        logits, counts = self.forward(chunks)
        return list(logits.split(counts))
