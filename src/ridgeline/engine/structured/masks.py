"""Grammar masks computed while the forward pass runs, so a constrained step costs no extra step time.

A request's next mask depends only on the tokens it already has, known when the step is scheduled; the forward
pass that produces the step's logits takes milliseconds, the mask ~0.03 ms and its bits ~0.01 ms (plus ~0.25 ms
for the additive row a sampled request needs). So the engine hands the step's constrained requests to one worker
thread before the pass and waits for it only when sampling. llguidance releases the GIL for the mask. On a machine
whose cores the forward pass's threads already fill, the worker's time is taken from them: hence the bits only,
not a float row, for greedy requests (matcher.py).
"""

import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from ridgeline.engine.structured.matcher import GrammarMatcher


class MaskPrefetcher:
    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None  # started on the first constrained step
        self._pending: Future | None = None
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
        for matcher in matchers:
            matcher.compute()
        self.mask_seconds += time.perf_counter() - started
        self.num_masks += len(matchers)
