"""`ridgeline profile`: time this machine's real engine steps over a grid and fit the calibrated step model.

Each grid point (decode rows R, context C) starts R requests of C prompt tokens (their prefill steps are
samples too), lets them decode a few steps, then adds prompts of each prefill size alongside them (mixed
steps), so the samples cover prefill, decode and the two together. What is timed is the whole
LLMEngine.step (schedule, forward pass, sampling, detokenising), the cost the simulator stands in for.
The default grid's sizes are not multiples of the torch path's tiles (8 decode rows, 64 prompt rows:
sim/engine_path.py), so where that path runs the fit sees its staircase rather than one side of it; it takes
about two minutes for the default model with the compiled kernels on 2 cores (and ~4 on the torch path).
"""

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import SchedulerOutput
from ridgeline.machine.busy import LoadMeter
from ridgeline.model.model_source import shape_from_checkpoint
from ridgeline.model.checkpoint import read_checkpoint
from ridgeline.sim.calibrated import Profile
from ridgeline.sim.engine_path import of_this_engine
from ridgeline.sim.stamp import current_stamp
from ridgeline.sim.step_time import StepTerms, TermsOf

WARMUP_STEPS = 4
DECODE_STEPS = 6  # cheap steps, repeated: one decode step varies by ~10 % on a shared machine


@dataclass(frozen=True)
class Grid:
    decode_rows: tuple[int, ...] = (1, 6, 15, 30)
    contexts: tuple[int, ...] = (32, 640)
    prefill_tokens: tuple[int, ...] = (40, 320, 1200)


class StepTimer:
    """Times engine.step() and keeps the SchedulerOutput it ran, as StepTerms."""

    def __init__(self, engine: LLMEngine, terms_of: TermsOf):
        self.engine, self.terms_of = engine, terms_of
        self.rows: list[tuple[StepTerms, float]] = []
        self.steps: list[tuple[tuple[tuple[int, int, bool], ...], float]] = []  # the same steps, as chunks
        self._plan: SchedulerOutput | None = None
        schedule = engine.scheduler.schedule

        def recording_schedule() -> SchedulerOutput:
            self._plan = schedule()
            return self._plan

        engine.scheduler.schedule = recording_schedule

    def step(self, keep: bool = True) -> None:
        start = time.perf_counter()
        self.engine.step()
        elapsed = time.perf_counter() - start
        if keep and self._plan is not None and self._plan.chunks:
            self.rows.append((self.terms_of(self._plan), elapsed))
            self.steps.append((tuple(self._plan.step_chunks), elapsed))


def measure(config: EngineConfig, grid: Grid, seed: int = 0,
            progress: Callable[[str], None] = lambda line: None) -> Profile:
    import torch

    engine = LLMEngine(config)
    meter = LoadMeter()  # whether another job shared the cores while the steps were timed
    meter.start()
    shape = shape_from_checkpoint(read_checkpoint(config.model))
    path = of_this_engine()
    timer = StepTimer(engine, TermsOf(shape, config.kv_cache.bytes_per_value, path))
    rng = random.Random(seed)
    vocab = engine.model_config.vocab_size
    counter = iter(range(10**9))

    def add(prompt_len: int, max_tokens: int) -> str:
        request_id = f"profile-{next(counter)}"
        ids = [rng.randrange(vocab) for _ in range(prompt_len)]  # random: no prefix hits between requests
        engine.add_request(request_id, ids, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
        return request_id

    add(64, WARMUP_STEPS)
    for _ in range(WARMUP_STEPS + 1):
        timer.step(keep=False)
    for rows in grid.decode_rows:
        for context in grid.contexts:
            progress(f"{rows} rows at context {context}")
            ids = [add(context, DECODE_STEPS + 4 * len(grid.prefill_tokens) + 64) for _ in range(rows)]
            while engine.scheduler.num_waiting or any(s.num_uncomputed_tokens > 1 for s in engine.scheduler.running):
                timer.step()
            for _ in range(DECODE_STEPS):
                timer.step()
            for prefill in grid.prefill_tokens:
                add(prefill, 1)
                timer.step()
                while engine.scheduler.num_waiting:
                    timer.step()
            for request_id in ids:
                engine.abort(request_id)
            while engine.has_unfinished():
                timer.step()
    settings = {"model": engine.model_name, "kv_cache_dtype": config.kv_cache.name,
                "block_size": config.kv_cache.block_size, "dtype": config.dtype, "lm_head": config.lm_head,
                "engine_path": dataclasses.asdict(path)}
    stamp = current_stamp(engine.model_name, config.threads or torch.get_num_threads())
    return Profile.fit(stamp, timer.rows, settings, tuple(timer.steps), load=meter.stop())
