"""Calibrated step time: this machine's measured steps fitted on the roofline's own terms, counted as the engine's
path does the work (sim/engine_path.py).

A step's time is modelled as c0 + c1*chunks + c2*decode tiles + c3*prompt tiles + c4*LM-head tiles
+ c5*prompt chunks' attention FLOPs + c6*KV bytes read, every c >= 0 (non-negative least squares): c0 is the
fixed cost of a step (Python, dispatch, sampling setup), c1 per sequence (its attention call per layer, its
sampler row), c2-c4 the cost of one matmul tile of each kind (a tile streams the weights once: memory-bound for 8
decode rows, compute-bound for 64 prompt rows), c5 the inverse of the FLOP/s a prompt chunk's attention attains
(rows x keys), c6 the inverse of the bandwidth at which cached KV is read (a decode row's whole attention: it
reads each cached position once and does ~4 FLOP per byte of it). Format 3 priced a decode row's attention on both
c5 and c6, but a decode row's FLOPs and KV bytes are one context times two fixed factors, so decode steps cannot
tell the two apart: four quiet calibrations of one commit put c6 anywhere in a 2.4x range (issue 32), and c5 (with
it every prompt's price) moved with it. Now each cost has steps that pin it: c5 the prompt chunks, c6 the decode
rows, at contexts the calibration load varies apart from the row count. Where the compiled kernels run, tiles are
single rows and c2-c4 become per-row costs, the roofline's FLOP terms again. `ridgeline profile` measures the
samples and records the path: either LLMEngine.step timed alone over a grid (sim/profile.py, source "engine") or,
with --through-server, the cycle time of back-to-back steps inside `ridgeline serve` under a calibration load in
each scheduling mode (bench/server_profile.py, source "server": what the server really spends per step, its other
threads included). It also records whether other processes shared the cores meanwhile (machine/busy.py), and
flags a fit taken under load or above MAX_FIT_ERROR.
"""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ridgeline.engine.step_cost import nonnegative_least_squares  # one fit for the profile and the engine's own estimate
from ridgeline.errors import RidgelineError
from ridgeline.machine.busy import LoadReading
from ridgeline.sim.engine_path import EnginePath
from ridgeline.sim.stamp import Stamp
from ridgeline.sim.step_time import StepTerms, TermsOf

TERMS = ("step", "chunks", "decode_tiles", "prompt_tiles", "logit_tiles", "prompt_attention_flops", "kv_read_bytes")
# 1 fitted per-row FLOPs, which a tiled engine path does not follow; 2 had no source; 3 priced decode attention on
# two collinear terms and kept no record of the load it was measured under
FORMAT = 4
SOURCES = ("engine", "server")
REWEIGHTINGS = 5
# A fit whose median error over its own steps is above this is refused (`ridgeline profile` without --force):
# the terms do not explain the steps, so the simulator's prices would not either. A quiet fit through the server
# ran at 9.2 % (Zen 4 VM, 2026-12-02); the one fitted beside another job at 84 % (issue 32).
MAX_FIT_ERROR = 0.15
# The scheduling modes a server calibration can run in: a fixed token budget (--itl-target-ms 0) prefills whole
# prompts beside decodes; an ITL target (auto or milliseconds) cuts them into small chunks. A fit that saw only one
# mode's step shapes extrapolates to the other's (whole prompts priced 1.14-1.26x too long, issue 32).
FIXED, TARGET = "fixed", "target"


def itl_mode(target_set: bool) -> str:
    return TARGET if target_set else FIXED


def identifiable(x: np.ndarray) -> list[int]:
    """The columns of `x` to fit, in TERMS order: one that is a linear combination of those before it in every
    measured step (on the compiled path every chunk computes one LM-head row, so LM-head tiles equal chunks) is
    left out at 0 rather than split against them at random from one calibration to the next."""
    scaled = x / np.maximum(np.abs(x).max(axis=0), 1e-300)
    keep: list[int] = []
    for column in range(x.shape[1]):
        if np.linalg.matrix_rank(scaled[:, keep + [column]]) == len(keep) + 1:
            keep.append(column)
    return keep


def fit_coefficients(full: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative coefficients of the columns of `full` (one row of features per step) for the step times `y`,
    and the fit's median relative error."""
    keep = identifiable(full)
    x = full[:, keep]
    # Relative error matters (a 1 ms decode step as much as a 1 s prefill), but weighting each row by its own
    # measured 1/y favours the fast draws: on a shared machine a step's time is skewed right (a slow draw
    # weighs less than a fast one), so the fit ran ~10 % below the mean. Weight by the model's prediction
    # instead (iteratively reweighted): relative in scale, unbiased for the mean of steps that look alike.
    coef = nonnegative_least_squares(x / y[:, None], np.ones_like(y))
    for _ in range(REWEIGHTINGS):
        predicted = np.maximum(x @ coef, 1e-9)
        coef = nonnegative_least_squares(x / predicted[:, None], y / predicted)
    error = float(np.median(np.abs(x @ coef - y) / y))
    expanded = np.zeros(full.shape[1])
    expanded[keep] = coef
    return expanded, error


def features(terms: StepTerms) -> list[float]:
    return [1.0, terms.chunks, terms.decode_tiles, terms.prompt_tiles, terms.logit_tiles, terms.prompt_attention_flops,
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
    other_cpu_share: float | None = None  # share of the cores' time other processes took meanwhile (machine/busy.py)
    itl_modes: tuple[str, ...] = ()  # scheduling modes (FIXED, TARGET) whose steps were fitted; () an engine grid
    # Why this profile should not be trusted (fit error above MAX_FIT_ERROR, measured under load): `ridgeline
    # profile` refuses to write a profile with flags unless --force, and `simulate --calibrated` warns of each.
    flags: tuple[str, ...] = ()

    @classmethod
    def fit(cls, stamp: Stamp, rows: list[tuple[StepTerms, float]], settings: dict, steps: tuple = (),
            source: str = "engine", load: LoadReading | None = None, itl_modes: tuple[str, ...] = (),
            flags: tuple[str, ...] = ()) -> "Profile":
        """Fit `rows`; `load` is what the cores did meanwhile (None: not measured), `flags` what the caller found
        wrong besides what the fit itself checks."""
        if len(rows) < 2 * len(TERMS):
            raise RidgelineError(f"a profile needs at least {2 * len(TERMS)} measured steps, got {len(rows)}")
        coef, error = fit_coefficients(np.array([features(terms) for terms, _ in rows]),
                                       np.array([seconds for _, seconds in rows]))
        flags = list(flags)
        if error > MAX_FIT_ERROR:
            flags.append(f"fit error {error:.1%} is above the {MAX_FIT_ERROR:.0%} limit")
        if load is not None and load.busy:
            flags.append(f"taken under load: {load.describe()}")
        return cls(stamp, tuple(float(c) for c in coef), len(rows), error, settings, steps, source,
                   None if load is None else load.other_share, tuple(itl_modes), tuple(flags))

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
                   row["settings"], steps, row["source"], row.get("other_cpu_share"), tuple(row.get("itl_modes", ())),
                   tuple(row.get("flags", ())))


class CalibratedStepTime:
    def __init__(self, profile: Profile, location: str | None = None, terms_of: TermsOf | None = None):
        self.profile, self.location = profile, location  # location: the file it was read from, for warnings
        self.coefficients = profile.coefficients
        self.path = EnginePath.from_settings(profile.settings)  # the simulator counts tiles as the profiled engine did
        # The measured steps' jitter: measured / predicted for every step the profile kept (with `terms_of`, the
        # counting of the profiled engine). The fit prices the mean of steps that look alike, but a shared
        # machine's step times are skewed right: without jitter a simulated stream's ITL p50 is that mean (above
        # the measured median) and its p99 is its p50 at light load (24 % below measured, 2026-12-02). A simulated
        # replica multiplies each step by one of these ratios, drawn with its own seeded generator (sim/replica.py);
        # the ITL target's step-cost estimate uses the prediction alone, as the engine's own estimate is a mean.
        self.spread: tuple[float, ...] = ()
        if terms_of is not None and profile.steps:
            ratios = [seconds / self.seconds(terms_of.of_chunks([tuple(chunk) for chunk in chunks]))
                      for chunks, seconds in profile.steps]
            self.spread = tuple(sorted(r for r in ratios if np.isfinite(r) and r > 0))
        timed = "server step cycles" if profile.source == "server" else "engine steps"
        self.name = (f"calibrated on {profile.stamp.cpu}, {profile.stamp.threads} threads ({profile.samples} "
                     f"{timed}, median fit error {profile.median_abs_error:.1%})")

    def seconds(self, terms: StepTerms) -> float:
        return sum(c * f for c, f in zip(self.coefficients, features(terms)))

    def warnings(self, target_set: bool) -> list[str]:
        """What a simulation with this profile, scheduling with an ITL target or not, should be told: the profile's
        flags (kept with --force), and a scheduling mode whose step shapes its calibration never ran."""
        where = f"profile {self.location}" if self.location else "the profile"
        found = [f"{where} is flagged: {flag}" for flag in self.profile.flags]
        mode = itl_mode(target_set)
        if self.profile.itl_modes and mode not in self.profile.itl_modes:
            found.append(f"{where} was calibrated on {', '.join(self.profile.itl_modes)}-mode steps only, not the "
                         f"{mode} mode simulated here: measure it again with `ridgeline profile --through-server`")
        return found
