"""`ridgeline profile --through-server`: fit the calibrated step model on what `ridgeline serve` itself spends per
step, read from its own step records (GET /v1/steps, engine/step_record.py) under a calibration load.

`ridgeline profile` alone times LLMEngine.step in a process that does nothing else. Inside the server the same
step costs more: the engine thread also applies arrivals, hands every output to the streams, and shares the cores
(and the GIL) with the HTTP threads, the output thread and the benchmark client. The simulator needs that real
cost, so this fit's target is the *cycle time* of a step: from its forward pass's start to the next step's
forward pass's start, taken only where the engine went straight from one to the other (the later record is not
`after_idle`, and no record is missing between them). The cycle covers the step's own forward pass, its
sampling, detokenising and output hand-off, and the next plan's scheduling; it is attributed to the step whose
rows it samples (the simulator emits a step's tokens at the end of its duration, as the server does after the
output processing). The terms of a cycle are the step's own, rebuilt from its record by the simulator's TermsOf
(of_record), so fit and simulation count the work one way.

The calibration load (CalibrationLoad) is never the validation's: its own seed, prompt and output lengths and
shared prefix, replayed with `bench serve`'s library at a few concurrencies and a Poisson rate, from single
requests to batches past the validation's largest, and through a server in each scheduling mode: with the ITL
target (`auto`: small prefill chunks beside decodes) and with the fixed token budget (`--itl-target-ms 0`: whole
prompts beside decodes). One step shape costs the same whichever policy scheduled it, so the two runs' steps are
fitted together, one model for both modes: a fit per mode would only hide a term the model lacks, and would leave
an ITL target of N ms (neither mode's shapes exactly) without a fit of its own. Two of its levels run decode
batches of one size at short and at long contexts, so the KV read (per cached position) is told apart from the
per-row costs, which the mixed levels move together with it.

While it runs, machine/busy.py counts the CPU time other processes took; a profile taken under load is flagged
(and `ridgeline profile` refuses it without --force).
"""

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from ridgeline.engine.step_record import StepRecord
from ridgeline.errors import RidgelineError
from ridgeline.machine.busy import LoadMeter, LoadReading, listening_pid
from ridgeline.sim.calibrated import FIXED, TARGET, Profile
from ridgeline.sim.stamp import Stamp
from ridgeline.sim.step_time import TermsOf


def cycles(records: list[StepRecord]) -> list[tuple[StepRecord, float]]:
    """(step, seconds from its forward pass's start to the next one's) for every step the engine followed back to
    back: not where it waited for work in between, not across missing records or speculative steps."""
    ordered = sorted(records, key=lambda record: record.index)
    kept = []
    for step, following in zip(ordered, ordered[1:]):
        if following.index != step.index + 1 or following.after_idle:
            continue
        if step.verified_guesses:  # its chunks are not known
            continue
        seconds = (following.timestamp - following.seconds) - (step.timestamp - step.seconds)
        if seconds > 0:
            kept.append((step, seconds))
    return kept


def mode_of(records: list[StepRecord]) -> str:
    """The scheduling mode a server ran its steps in: with an ITL target a step beside decodes records its prefill
    limit (under a calibration load some always do); with the fixed token budget none does."""
    return TARGET if any(record.prefill_limit is not None for record in records) else FIXED


def fit_cycles(runs: list[list[StepRecord]], terms_of: TermsOf, stamp: Stamp, settings: dict,
               load: LoadReading | None = None, flags: tuple[str, ...] = ()) -> Profile:
    """The calibrated profile of the cycle times of these servers' steps (one list of records per server run: their
    indices are each server's own), source "server"."""
    records = [record for run in runs for record in run]
    if not records:
        raise RidgelineError("the server recorded no steps: nothing to fit (did the calibration load reach it?)")
    kept = [cycle for run in runs for cycle in cycles(run)]
    if not kept:
        raise RidgelineError(f"none of the server's {len(records)} steps followed another back to back: "
                             f"no cycle time to fit (the load kept the engine idle between steps)")
    rows = [(terms_of.of_record(step), seconds) for step, seconds in kept]
    audit = tuple((step.chunks, seconds) for step, seconds in kept)
    modes = tuple(sorted({mode_of(run) for run in runs if run}))
    return Profile.fit(stamp, rows, settings | {"measured": "server step cycles"}, audit, source="server",
                       load=load, itl_modes=modes, flags=flags)


def read_steps(url: str, after: int = -1, api_key: str | None = None) -> tuple[list[StepRecord], int]:
    """The server's kept step records with index > after, and how many it has recorded in all."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    target = f"{url.rstrip('/')}/v1/steps"
    try:
        response = httpx.get(target, params={"after": after}, headers=headers, timeout=60)
    except httpx.HTTPError as error:
        raise RidgelineError(f"cannot read {target}: {error}") from None
    if response.status_code == 404:
        raise RidgelineError(f"{url} has no /v1/steps: profile through a `ridgeline serve` (it records its steps)")
    if response.status_code == 401:
        raise RidgelineError(f"{target} wants an API key: give --api-key")
    if response.status_code != 200:
        raise RidgelineError(f"{target} answered {response.status_code}: {response.text[:200]}")
    try:
        body = response.json()
        return [StepRecord.from_json(row) for row in body["data"]], int(body["recorded"])
    except (ValueError, KeyError, TypeError) as error:
        raise RidgelineError(f"{target} did not answer with step records this version can read "
                             f"(a server of other code?): {error!r}") from None


@dataclass(frozen=True)
class Level:
    """One part of the calibration load: requests replayed at a concurrency (all at once) or a Poisson rate."""
    label: str
    concurrency: int | None
    rate: float | None
    requests: int
    prompt_tokens: tuple[int, ...] = ()  # () the load's own lengths
    output_tokens: tuple[int, ...] = ()


@dataclass(frozen=True)
class CalibrationLoad:
    """What the server is driven with while its steps are read: not the validation traces (benchmarks/
    sim_vs_real.py: seeds 200-207, prompts of 96/320/896/1,408 tokens, a 192-token prefix, 12/24/48 outputs)."""

    seed: int = 1000
    prompt_tokens: tuple[int, ...] = (40, 200, 600, 1100, 1800)
    output_tokens: tuple[int, ...] = (20, 40, 80)
    shared_prefix: int = 128
    # One request at a time, a Poisson stream, a deep batch, then decode batches of one size at short and at long
    # contexts (the KV read per cached position apart from the per-row costs).
    levels: tuple[Level, ...] = (
        Level("warm-up", 2, None, 3), Level("concurrency 1", 1, None, 5), Level("rate 0.45", None, 0.45, 16),
        Level("concurrency 16", 16, None, 20), Level("short contexts", 10, None, 10, (40, 100), (96,)),
        Level("long contexts", 10, None, 10, (1100, 1800), (40,)))
    warm_up: str = "warm-up"  # its steps are not fitted (first-use costs)
    # --itl-target-ms of each server the load runs through: both modes' step shapes (small chunks, whole prompts).
    modes: tuple[str, ...] = ("auto", "0")

    def trace(self, path: Path, level: int, vocab: int, run: int = 0) -> Path:
        """The level's requests for the `run`-th server (each run its own prompts)."""
        from ridgeline.workload.trace import TraceRequest, write_trace
        from ridgeline.sim.workload import poisson_arrivals, random_ids

        spec = self.levels[level]
        seed = self.seed + 100 * run + level
        rng = random.Random(seed)
        prefix = random_ids(rng, self.shared_prefix, vocab)
        arrivals = poisson_arrivals(spec.rate, spec.requests, seed) if spec.rate else [0.0] * spec.requests
        rows = []
        for arrival in arrivals:
            length = rng.choice(spec.prompt_tokens or self.prompt_tokens)
            head = prefix if length > 2 * self.shared_prefix and rng.random() < 0.5 else ()
            rows.append(TraceRequest(arrival, rng.choice(spec.output_tokens or self.output_tokens),
                                     prompt_ids=head + random_ids(rng, length - len(head), vocab)))
        return write_trace(path, rows)


def drive(url: str, load: CalibrationLoad, vocab: int, directory: Path,
          progress: Callable[[str], None] = lambda line: None, run: int = 0) -> list[StepRecord]:
    """Replay the calibration load through `bench serve`'s library against the server at `url`, reading its step
    records after each level (so the server's ring buffer never drops any), warm-up excluded. `bench serve`
    sends no API key: the server must run without one."""
    from ridgeline.bench.bench_serve import BenchServeConfig, LoadLevel, bench_serve

    _, recorded = read_steps(url, after=2**62)  # the count alone: where this load's steps begin
    records: list[StepRecord] = []
    for level, spec in enumerate(load.levels):
        label = spec.label
        progress(label)
        trace = load.trace(directory / f"calibration-{run}-{level}.jsonl", level, vocab, run)
        config = BenchServeConfig(url, trace=trace, max_seconds=900, seed=load.seed + 100 * run + level)
        result = bench_serve(config, [LoadLevel(concurrency=spec.concurrency)])["levels"][0]
        if result["failed"]:
            raise RidgelineError(f"{result['failed']} of the calibration's {label} requests failed: "
                                 f"{result['errors'][0]}")
        steps, total = read_steps(url, after=recorded - 1)
        recorded = total
        if label != load.warm_up:
            records += steps
    if not records:
        raise RidgelineError(f"the server at {url} recorded no steps under the calibration load")
    return records


def measure_through_server(config, serve_args: list[str], url: str | None = None, load: CalibrationLoad = CalibrationLoad(),
                           progress: Callable[[str], None] = lambda line: None) -> Profile:
    """Start `ridgeline serve` with `serve_args` once per scheduling mode of the load (or use the one at `url`, in
    whatever mode it runs: this machine, this code, the same settings as `config`), drive the calibration load and
    fit its steps' cycle times, with what other processes took of the cores meanwhile."""
    import contextlib
    import dataclasses
    import tempfile
    from urllib.parse import urlparse

    import torch

    from ridgeline.model.model_source import load_model_shape
    from ridgeline.bench.served import ridgeline_server
    from ridgeline.sim.engine_path import of_this_engine
    from ridgeline.sim.stamp import current_stamp

    shape = load_model_shape(config.model)
    path = of_this_engine()  # the server runs this code on this machine (the stamp says so): the same path
    terms_of = TermsOf(shape, config.kv_cache.bytes_per_value, path)
    meter, flags = LoadMeter(), []  # our processes: this one and its children (the servers it starts)
    if url is not None:
        server_pid = listening_pid(urlparse(url).port or 80)
        if server_pid is None:  # its CPU time would read as another job's: the load cannot be told
            meter = None
            flags.append(f"load not measured: the process serving {url} is not one this user can see")
        else:
            meter.add_root(server_pid)
    runs: list[list[StepRecord]] = []
    with tempfile.TemporaryDirectory(prefix="ridgeline-profile-") as directory, \
            open(Path(directory) / "serve.log", "w+") as log:
        if meter is not None:
            meter.start()
        try:
            for run, mode in enumerate(load.modes if url is None else (None,)):
                with contextlib.ExitStack() as stack:
                    target = url
                    if target is None:
                        progress(f"starting ridgeline serve --itl-target-ms {mode}")
                        target, _ = stack.enter_context(ridgeline_server(*serve_args, "--itl-target-ms", mode,
                                                                         stderr=log))
                    runs.append(drive(target, load, shape.vocab_size, Path(directory),
                                      lambda line, mode=mode: progress(f"{line} ({mode})" if mode else line), run))
        except RuntimeError as error:  # the server did not start or died
            log.seek(0)
            raise RidgelineError(f"ridgeline serve failed: {error}; its log ends:\n{log.read()[-2000:]}") from None
        reading = meter.stop() if meter is not None else None  # the servers were stopped and waited for: still ours
    settings = {"model": shape.name, "kv_cache_dtype": config.kv_cache.name, "block_size": config.kv_cache.block_size,
                "dtype": config.dtype, "lm_head": config.lm_head, "engine_path": dataclasses.asdict(path)}
    stamp = current_stamp(shape.name, config.threads or torch.get_num_threads())
    return fit_cycles(runs, terms_of, stamp, settings, reading, tuple(flags))
