"""The tied embedding reads its rows from the LM head's packed weight: one copy of the matrix in memory, the same
values as dequantising the stored rows, and no reference left into the GGUF file's memory map."""

import torch
from compiled_kernels import needs_compiled


@needs_compiled
def test_tied_embedding_shares_the_packed_head_and_matches_the_stored_rows(default_checkpoint, default_runner):
    model = default_runner.model
    assert model.embedding.source is model.lm_head.quantized
    ids = torch.tensor([0, 2, 106, 262143, 2])
    stored = default_checkpoint.tensors["token_embd.weight"].select_rows(ids).dequantize()
    assert torch.equal(model.embedding(ids), stored * model.embedding.scale)


def test_dense_weights_are_copied_out_of_the_file(default_checkpoint):
    norm = default_checkpoint.tensors["output_norm.weight"]
    assert norm.dequantize().data_ptr() != norm.data.data_ptr()
