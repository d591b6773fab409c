"""Grammar masks computed while the forward pass runs, so a constrained step costs no extra step time.

A request's next mask depends only on the tokens it already has, known when the step is scheduled; the forward
pass that produces the step's logits takes milliseconds, a mask ~0.03 ms. So the engine hands the step's
constrained requests to one worker thread before the pass and waits for it only when sampling; the worker fills
all their masks in one llguidance call (its batched executor, which drops the GIL). On a machine whose cores the
forward pass's threads already fill, the worker's time is taken from them, so it does nothing but the packed
masks: no unpacked bits, no float rows (the sampler masks a batch's sampled rows in one op, matcher.py).
"""

import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance

from ridgeline.engine.structured.matcher import GrammarMatcher, fill_masks

# Threads of llguidance's executor: one. Its masks are ~0.03 ms a row, and more threads would only take cores from
# the forward pass the worker overlaps (a batch of 16 is ~0.5 ms on one thread against a step of tens of ms).
EXECUTOR_THREADS = 1


class MaskPrefetcher:
    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None  # started on the first constrained step
        self._pending: Future | None = None
        self._executor: llguidance.LLExecutor | None = None
        self.num_masks = 0
        self.mask_seconds = 0.0  # on the worker thread: the time masks cost, hidden behind the forward pass
        self.wait_seconds = 0.0  # what the step actually waited for them

    def ahead(self, matchers: Iterable[GrammarMatcher]) -> None:
        matchers = list(matchers)
        if not matchers:
            return
        self.wait()  # one batch in flight: a matcher is never computed by two threads at once
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-masks")
            self._executor = llguidance.LLExecutor(num_threads=EXECUTOR_THREADS)
        self._pending = self._pool.submit(self._compute, matchers)

    def wait(self) -> None:
        """Block until the masks asked for are ready (re-raises the worker's error, if any)."""
        if self._pending is None:
            return
        started = time.perf_counter()
        pending, self._pending = self._pending, None
        pending.result()
        self.wait_seconds += time.perf_counter() - started

    def _compute(self, matchers: list[GrammarMatcher]) -> None:
        started = time.perf_counter()
        fill_masks(self._executor, matchers)
        self.mask_seconds += time.perf_counter() - started
        self.num_masks += len(matchers)
