"""Calibrated step time: this machine's measured steps fitted on the roofline's own terms, counted as the engine's
path does the work (sim/engine_path.py).

A step's time is modelled as c0 + c1*chunks + c2*decode tiles + c3*prompt tiles + c4*LM-head tiles
+ c5*attention FLOPs + c6*KV bytes read, every c >= 0 (non-negative least squares): c0 is the fixed cost of a
step (Python, dispatch, sampling setup), c1 per sequence (its attention call per layer, its sampler row), c2-c4
the cost of one matmul tile of each kind (a tile streams the weights once: memory-bound for 8 decode rows,
compute-bound for 64 prompt rows), c5 the inverse of the FLOP/s attention attains, c6 the inverse of the KV
gather's bandwidth. Where the compiled kernels run, tiles are single rows and c2-c4 become per-row costs, the
roofline's FLOP terms again. `ridgeline profile` measures the samples and records the path: either
LLMEngine.step timed alone over a grid (sim/profile.py, source "engine") or, with --through-server, the cycle
time of back-to-back steps inside `ridgeline serve` under a calibration load (bench/server_profile.py, source
"server": what the server really spends per step, its other threads included).
"""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ridgeline.engine.step_cost import nonnegative_least_squares  # one fit for the profile and the engine's own estimate
from ridgeline.errors import RidgelineError
from ridgeline.sim.engine_path import EnginePath
from ridgeline.sim.stamp import Stamp
from ridgeline.sim.step_time import StepTerms

TERMS = ("step", "chunks", "decode_tiles", "prompt_tiles", "logit_tiles", "attention_flops", "kv_read_bytes")
FORMAT = 3  # 1 fitted per-row FLOPs, which a tiled engine path does not follow; 2 had no source
SOURCES = ("engine", "server")
REWEIGHTINGS = 5


def features(terms: StepTerms) -> list[float]:
    return [1.0, terms.chunks, terms.decode_tiles, terms.prompt_tiles, terms.logit_tiles, terms.span_attention_flops,
            terms.kv_read_bytes]


@dataclass(frozen=True)
class Profile:
    stamp: Stamp
    coefficients: tuple[float, ...]  # one per TERMS entry, in seconds per unit
    samples: int
    median_abs_error: float  # of the fit over its own samples, as a fraction of the measured time
    settings: dict  # the engine settings it was measured with (KV dtype, block size, engine path, ...)
    # What was measured, kept so a fit can be audited: per step, (start, tokens, samples) per chunk and its seconds.
    steps: tuple = ()
    source: str = "engine"  # what was timed: one of SOURCES

    @classmethod
    def fit(cls, stamp: Stamp, rows: list[tuple[StepTerms, float]], settings: dict, steps: tuple = (),
            source: str = "engine") -> "Profile":
        if len(rows) < 2 * len(TERMS):
            raise RidgelineError(f"a profile needs at least {2 * len(TERMS)} measured steps, got {len(rows)}")
        x = np.array([features(terms) for terms, _ in rows])
        y = np.array([seconds for _, seconds in rows])
        # Relative error matters (a 1 ms decode step as much as a 1 s prefill), but weighting each row by its own
        # measured 1/y favours the fast draws: on a shared machine a step's time is skewed right (a slow draw
        # weighs less than a fast one), so the fit ran ~10 % below the mean. Weight by the model's prediction
        # instead (iteratively reweighted): relative in scale, unbiased for the mean of steps that look alike.
        coef = nonnegative_least_squares(x / y[:, None], np.ones_like(y))
        for _ in range(REWEIGHTINGS):
            predicted = np.maximum(x @ coef, 1e-9)
            coef = nonnegative_least_squares(x / predicted[:, None], y / predicted)
        error = float(np.median(np.abs(x @ coef - y) / y))
        return cls(stamp, tuple(float(c) for c in coef), len(rows), error, settings, steps, source)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        row = {"format": FORMAT, "terms": list(TERMS)} | asdict(self)
        path.write_text(json.dumps(row, indent=2))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        try:
            row = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise RidgelineError(f"no profile at {path}: measure one with `ridgeline profile`") from None
        except (OSError, json.JSONDecodeError) as error:
            raise RidgelineError(f"cannot read profile {path}: {error}") from None
        if (not isinstance(row, dict) or row.get("format") != FORMAT or row.get("terms") != list(TERMS)
                or row.get("source") not in SOURCES):
            raise RidgelineError(f"profile {path} is not a ridgeline profile of format {FORMAT}: measure it again")
        steps = tuple((tuple(tuple(chunk) for chunk in chunks), seconds) for chunks, seconds in row.get("steps", ()))
        return cls(Stamp(**row["stamp"]), tuple(row["coefficients"]), row["samples"], row["median_abs_error"],
                   row["settings"], steps, row["source"])


class CalibratedStepTime:
    def __init__(self, profile: Profile):
        self.profile = profile
        self.coefficients = profile.coefficients
        self.path = EnginePath.from_settings(profile.settings)  # the simulator counts tiles as the profiled engine did
        timed = "server step cycles" if profile.source == "server" else "engine steps"
        self.name = (f"calibrated on {profile.stamp.cpu}, {profile.stamp.threads} threads ({profile.samples} "
                     f"{timed}, median fit error {profile.median_abs_error:.1%})")

    def seconds(self, terms: StepTerms) -> float:
        return sum(c * f for c, f in zip(self.coefficients, features(terms)))
