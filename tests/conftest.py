"""Fixtures shared across the suite: the real default model (loaded once) and tiny random models."""

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def default_checkpoint():
    from ridgeline.model.checkpoint import read_checkpoint

    return read_checkpoint()


@pytest.fixture(scope="session")
def default_model(default_checkpoint):
    from ridgeline.model.transformer import ModelOptions, Transformer

    return Transformer(default_checkpoint, ModelOptions())


@pytest.fixture(scope="session")
def default_runner(default_model):
    from ridgeline.engine.kv_cache import KVCache, KVCacheConfig
    from ridgeline.engine.model_runner import ModelRunner

    cache = KVCache(default_model.config, KVCacheConfig(dtype="fp32"), num_blocks=64, device=torch.device("cpu"))
    return ModelRunner(default_model, cache)
