"""The engine thread's side of the dashboard: after each step it keeps the finished requests' latencies for a
sliding window and, at most every `view_interval_s` (and whenever the engine falls idle, so the last view is
never stale), an EngineView. Readers on the event loop take copies under a lock.
"""

import threading
import time
from collections import deque
from collections.abc import Callable

from ridgeline.workload.serve_metrics import distribution_ms
from ridgeline.dashboard.engine_view import EngineView, engine_view

MAX_SAMPLES = 50_000  # per window, whatever the traffic: the percentiles stay cheap to compute


class DashboardFeed:
    def __init__(self, engine, window_s: float = 60.0, view_interval_s: float = 0.25,
                 clock: Callable[[], float] = time.monotonic, view: EngineView | None = None):
        # engine None: the engine steps in another process, which sends its views (observe's `view`), starting with
        # `view`; the latencies are still kept here, from the outputs that arrive.
        self.engine = engine
        self.window_s = window_s
        self.view_interval_s = view_interval_s
        self.clock = clock
        self._ttfts: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)  # (finish time, seconds)
        self._itls: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)
        self._lock = threading.Lock()
        self._view = engine_view(engine) if engine is not None else view
        self._view_time = clock()

    # ---- engine thread
    def observe(self, outputs: list, view: EngineView | None = None) -> None:
        """After a step, on the engine thread, with the step's outputs (and, for an engine in another process, the
        view it sent, if any)."""
        now = self.clock()
        finished = [output.timings for output in outputs if output.finished and output.timings.ttft is not None]
        if finished:
            with self._lock:
                for timings in finished:
                    self._ttfts.append((now, timings.ttft))
                    self._itls.extend((now, gap) for gap in timings.itls)
        if self.engine is None:
            if view is not None:
                self._view, self._view_time = view, now
        elif now - self._view_time >= self.view_interval_s or not self.engine.has_work():
            self._view = engine_view(self.engine)  # one reference swap: readers see the old or the new view
            self._view_time = now

    # ---- any thread
    @property
    def view(self) -> EngineView:
        return self._view

    def latency(self) -> dict:
        """TTFT and ITL of the requests that finished in the last window_s seconds (ms: mean, p50, p90, p99)."""
        since = self.clock() - self.window_s
        with self._lock:
            ttfts = [value for finished, value in self._ttfts if finished >= since]
            itls = [value for finished, value in self._itls if finished >= since]
        return {"window_s": self.window_s, "requests": len(ttfts), "ttft_ms": distribution_ms(ttfts),
                "itl_ms": distribution_ms(itls)}
