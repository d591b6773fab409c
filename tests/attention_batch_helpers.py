"""Comparing two AttentionBatches field by field (values, dtypes, shapes, contiguity)."""

import torch


def assert_same(batch, expected):
    for name in ("token_ids", "positions", "row_seq", "key_end", "logit_rows"):
        got, want = getattr(batch, name), getattr(expected, name)
        assert got.dtype == want.dtype and torch.equal(got, want) and got.is_contiguous(), name
    assert (batch.block_size, batch.row_starts, batch.logit_counts) == (expected.block_size, expected.row_starts,
                                                                         expected.logit_counts)
    for view, want in zip(batch.groups, expected.groups, strict=True):
        for name in ("block_tables", "slot_mapping", "key_begin"):
            got, wanted = getattr(view, name), getattr(want, name)
            assert got.dtype == wanted.dtype and got.shape == wanted.shape and torch.equal(got, wanted), name
            assert got.is_contiguous(), name  # the compiled kernels take the data pointer and assume it
    got, want = batch.row_paths, expected.row_paths
    assert (got.num_rows, got.all_compute) == (want.num_rows, want.all_compute)
    for rows, wanted in ((got.compute_rows, want.compute_rows), (got.memory_rows, want.memory_rows)):
        assert (rows is None) == (wanted is None) and (rows is None or torch.equal(rows, wanted))
