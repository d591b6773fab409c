"""The engine hands the sampler the logits rows it samples: one run of rows as a view, never a gathered copy."""

import torch

from ridgeline.engine.llm_engine import sampled_rows


def test_one_run_of_rows_is_a_view_of_the_logits():
    logits = torch.randn(9, 262)
    for rows in ([0, 1, 2, 3, 4, 5, 6, 7, 8], [0, 1, 2, 3], [3, 4, 5], [8]):
        picked = sampled_rows(logits, rows)
        assert torch.equal(picked, logits[rows])
        assert picked.data_ptr() == logits[rows[0]].data_ptr() and picked.is_contiguous()


def test_scattered_rows_are_gathered():
    # A step whose finished prompt chunk sits between decode rows and an unfinished chunk's row.
    logits = torch.randn(6, 262)
    picked = sampled_rows(logits, [0, 1, 3, 5])
    assert torch.equal(picked, logits[[0, 1, 3, 5]])
    assert picked.data_ptr() != logits.data_ptr()
