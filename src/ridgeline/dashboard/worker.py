"""One dashboard panel per worker: its roofline (this machine, this model), its steps as points, its queue and
KV cache.

`LocalWorker` is the engine in this process. A router's backends or disaggregated prefill/decode workers are
more workers with the same JSON (`describe` once, `update` per tick), fetched from each worker's /v1/steps and
/dashboard/state instead of read in-process; the page already draws one panel per entry of `workers`.
"""

import threading

from ridgeline.dashboard.feed import DashboardFeed
from ridgeline.dashboard.machine import machine_named
from ridgeline.dashboard.step_points import step_point
from ridgeline.napkin.hardware import THIS_MACHINE
from ridgeline.napkin.roofline import Roofline
from ridgeline.napkin.roofline_figure import roofline_figure


class LocalWorker:
    def __init__(self, worker_id: str, role: str, model_name: str, engine, feed: DashboardFeed, hardware: str):
        self.id = worker_id
        self.role = role  # "prefill+decode" here; "prefill" or "decode" for disaggregated workers
        self.model_name = model_name
        self.engine = engine
        self.feed = feed
        self.hardware_name = hardware
        # The engine's thread count, read here on the thread that built the engine: torch's count on the thread that
        # later draws the first roof (a server's worker thread) need not be the engine's.
        self.threads = _torch_threads() if hardware == THIS_MACHINE else None
        self._roofline: Roofline | None = None
        self._lock = threading.Lock()

    def roofline(self) -> Roofline:
        """This model on this worker's machine: a catalogued one, or this one as cached, else its napkin estimate
        titled NOT MEASURED (dashboard/machine.py; nothing is measured here)."""
        with self._lock:
            if self._roofline is None:
                recorder = self.engine.steps
                self._roofline = Roofline(recorder.shape, machine_named(self.hardware_name, self.threads),
                                          kv_dtype_bytes=recorder.kv_dtype_bytes)
            return self._roofline

    def steps(self, after: int = -1, since: float | None = None, limit: int | None = None) -> list[dict]:
        steps = self.engine.steps.recent(after, limit)
        return [step.to_json() for step in steps if since is None or step.timestamp >= since]

    def figure(self, steps: list[dict]) -> dict:
        roofline = self.roofline()
        title = f"{self.model_name} on {roofline.hardware.title}"
        return roofline_figure(roofline, [step_point(step, roofline) for step in steps], title)

    def describe(self, points: int) -> dict:
        """Everything a panel needs to start: the figure with the last `points` steps, and the current view."""
        steps = self.steps(limit=points)
        hardware = self.roofline().hardware
        return {
            "id": self.id,
            "kind": "local",
            "role": self.role,
            "model": self.model_name,
            "hardware": {"name": hardware.name, "title": hardware.title},
            "figure": self.figure(steps),
            "last_step": steps[-1]["index"] if steps else -1,
            "view": self.feed.view.to_json(),
        }

    def update(self, after: int) -> dict:
        """What changed since step `after`: new points and the current view."""
        roofline = self.roofline()
        steps = self.steps(after)
        return {
            "id": self.id,
            "points": [step_point(step, roofline).to_json() for step in steps],
            "last_step": steps[-1]["index"] if steps else after,
            "view": self.feed.view.to_json(),
        }


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()
