"""Runs the model for one engine step: scheduled chunks in, logits out."""

import torch

from ridgeline.engine.kv_cache import KVCache
from ridgeline.model.attention_batch import AttentionBatch, SeqChunk
from ridgeline.model.transformer import Transformer


class ModelRunner:
    def __init__(self, model: Transformer, kv_cache: KVCache):
        self.model, self.kv_cache = model, kv_cache
        self.cache_layers = kv_cache.layers()

    def run(self, chunks: list[SeqChunk]) -> list[torch.Tensor]:
        """One forward pass; for each chunk its logits ([1, vocab], or [len, vocab] when all_logits)."""
        batch = AttentionBatch.build(chunks, self.kv_cache.block_size, self.model.windows, self.model.options.device)
        logits = self.model(batch, self.cache_layers)
        return list(logits.split(batch.logit_counts))
