"""StepBatchBuilder gives, step after step, exactly what AttentionBatch.build gives for the same chunks, although it
writes small steps into buffers it reuses: through steady decoding (tables growing a block at a time, sliding-window
entries released), sequences joining and leaving, all-logits chunks, prompt chunks, and steps it hands to build."""

import random

import torch
from attention_batch_helpers import assert_same

from ridgeline.engine.step_batch import MAX_ROWS, StepBatchBuilder
from ridgeline.model.attention_batch import AttentionBatch, ForwardChunk

BLOCK = 4
WINDOWS = [None, 6, 6]
CPU = torch.device("cpu")


class FakeSequence:
    """Tokens and block tables as the block manager keeps them: one page per block per group, sliding groups'
    blocks below the window RELEASED (-1)."""

    def __init__(self, rng, prompt_len):
        self.rng, self.tokens, self.tables = rng, [rng.randrange(1000) for _ in range(prompt_len)], [[], [], []]
        self.num_prompt = prompt_len

    def chunk(self, start, end, all_logits=False):
        for group, window in enumerate(WINDOWS):
            table = self.tables[group]
            while len(table) * BLOCK < end:
                table.append(self.rng.randrange(10_000))
            if window is not None:
                for block in range(max(0, start - window + 1) // BLOCK):
                    table[block] = -1
        return ForwardChunk(self.tokens[start:end], start, [list(t) for t in self.tables], all_logits=all_logits,
                            num_prompt_tokens=self.num_prompt)


def test_steady_decoding_with_sequences_joining_and_leaving_matches_build():
    rng = random.Random(0)
    builder = StepBatchBuilder(BLOCK, WINDOWS, CPU)
    running = [FakeSequence(rng, rng.randrange(1, 9)) for _ in range(3)]
    for seq in running:
        seq.tokens.append(rng.randrange(1000))  # the token sampled from its prefill
    for step in range(60):
        if step % 17 == 5:  # one leaves, another joins (already prefilled)
            running.pop(rng.randrange(len(running)))
            joining = FakeSequence(rng, rng.randrange(1, 13))
            joining.tokens.append(rng.randrange(1000))
            running.append(joining)
        chunks = [seq.chunk(len(seq.tokens) - 1, len(seq.tokens)) for seq in running]
        assert_same(builder.build(chunks), AttentionBatch.build(chunks, BLOCK, WINDOWS, CPU))
        for seq in running:
            seq.tokens.append(rng.randrange(1000))


def test_random_small_and_large_steps_match_build():
    rng = random.Random(1)
    builder = StepBatchBuilder(BLOCK, WINDOWS, CPU)
    for trial in range(200):
        chunks = []
        for _ in range(rng.randrange(1, 6)):
            seq = FakeSequence(rng, rng.randrange(1, 30))
            seq.tokens += [rng.randrange(1000) for _ in range(rng.randrange(0, 5))]  # generated tokens
            start = rng.randrange(0, len(seq.tokens))
            end = rng.choice([start + 1, rng.randrange(start + 1, len(seq.tokens) + 1)])
            chunks.append(seq.chunk(start, end, all_logits=rng.random() < 0.2))
        assert_same(builder.build(chunks), AttentionBatch.build(chunks, BLOCK, WINDOWS, CPU))


def test_a_step_of_the_last_ones_shape_reuses_its_buffers_and_a_large_one_is_built_fresh():
    rng = random.Random(2)
    builder = StepBatchBuilder(BLOCK, WINDOWS, CPU)
    seq = FakeSequence(rng, 9)
    seq.tokens.append(1)
    first = builder.build([seq.chunk(9, 10)])
    seq.tokens.append(2)
    second = builder.build([seq.chunk(10, 11)])
    assert second is first and second.positions.tolist() == [10]  # overwritten in place
    long = FakeSequence(rng, MAX_ROWS + 1)
    assert builder.build([long.chunk(0, MAX_ROWS + 1)]) is not first


def test_tables_changed_in_place_between_steps_are_seen():
    """A caller may hand the same table lists every step and change them in place (a page appended, one released):
    the rows the builder kept from the last step must not be taken for the new ones."""
    builder = StepBatchBuilder(BLOCK, WINDOWS, CPU)
    tables = [[10, 11, 12], [20, 21, 22], [30, 31, 32]]
    for position in range(9, 40):
        if position % BLOCK == 0 and position // BLOCK >= len(tables[0]):
            for group, table in enumerate(tables):
                table.append(100 * group + position)
        for group, window in enumerate(WINDOWS):
            if window is not None:
                for block in range(max(0, position - window + 1) // BLOCK):
                    tables[group][block] = -1
        chunks = [ForwardChunk([position], position, tables, num_prompt_tokens=5)]
        assert_same(builder.build(chunks), AttentionBatch.build(chunks, BLOCK, WINDOWS, CPU))
