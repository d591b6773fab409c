"""`--lm-head q4|q8|keep`: the LM head requantised on request, never silently."""

import pytest
import torch
from gguf import GGMLQuantizationType as T

from ridgeline.errors import RidgelineError
from ridgeline.model.quant.random_blocks import random_stored
from ridgeline.model.quant.requantize import requantize
from ridgeline.model.transformer import ModelOptions


@pytest.mark.parametrize("qtype,bits", [(T.Q4_0, 4.5), (T.Q8_0, 8.5)])
def test_requantised_weight_keeps_its_values_within_the_format_error(qtype, bits):
    stored = random_stored(T.Q8_0, (64, 256), seed=0)
    dense = stored.dequantize()
    again = requantize(stored, qtype)
    assert again.qtype == qtype and again.shape == stored.shape and again.bits_per_weight == bits
    # one fp16 scale per 32 weights: off by at most about one step of max|w| / 8 (Q4_0) or max|w| / 127 (Q8_0)
    step = dense.view(64, -1, 32).abs().amax(-1, keepdim=True) / (8 if qtype == T.Q4_0 else 127)
    error = (again.dequantize() - dense).view(64, -1, 32).abs()
    assert (error <= step * 1.01).all()


def test_keep_changes_nothing_and_unknown_choices_are_refused():
    stored = random_stored(T.Q8_0, (16, 64), seed=1)
    assert requantize(stored, T.Q8_0) is stored
    with pytest.raises(RidgelineError, match="unknown --lm-head 'q3'"):
        ModelOptions(lm_head="q3")


def test_the_default_models_head_becomes_q4_and_logits_stay_close(default_checkpoint, default_runner):
    from ridgeline.model.transformer import Transformer

    model = Transformer(default_checkpoint, ModelOptions(lm_head="q4"))
    head = model.lm_head.quantized
    assert head.qtype == T.Q4_0 and head.nbytes < default_runner.model.lm_head.quantized.nbytes * 0.55
    hidden = torch.randn(3, default_checkpoint.config.hidden_size, generator=torch.Generator().manual_seed(2))
    kept, requantised = default_runner.model.lm_head.quantized(hidden), head(hidden)
    assert torch.corrcoef(torch.stack((kept.flatten(), requantised.flatten())))[0, 1] > 0.98
