"""Measuring one OpenAI-compatible server after another with `ridgeline bench serve`'s library: what
serve_vs_llamacpp.py and serve_vs_vllm.py share (start a server, wait until it answers, warm it up, load it, stop
it, and lay the figures side by side)."""

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from ridgeline.bench.bench_serve import BenchServeConfig, LoadLevel, bench_serve
from ridgeline.workload.serve_metrics import RequestResult

# (label, key of figures(), format): the rows print_table shows by default.
DEFAULT_ROWS = (
    ("output tok/s", "output_tokens_per_s", "{:.1f}"),
    ("TTFT mean (ms)", "ttft_mean_ms", "{:.0f}"),
    ("TTFT p99 (ms)", "ttft_p99_ms", "{:.0f}"),
    ("ITL mean (ms)", "itl_mean_ms", "{:.1f}"),
    ("ITL p99 (ms)", "itl_p99_ms", "{:.1f}"),
)


def measure(name: str, command: list[str], ready_path: str, args: argparse.Namespace,
            env: dict[str, str] | None = None, ready_timeout_s: float = 300,
            on_done: Callable[[RequestResult], None] = lambda result: None,
            inspect: Callable[[str, float], object] | None = None, quiet_host_wait_s: float | None = None) -> dict:
    """Start a server, wait until it answers, warm it up, load it, stop it; the load level's summary.

    `args` carries the load: concurrency, num_prompts, input_len, output_len, max_seconds, and log_dir for the
    server's log. `env` is the server's whole environment (None: this process's). `inspect(url, load_started_at)`,
    if given, asks the server about the measured load before it is stopped; its answer is the summary's
    "inspected". With `quiet_host_wait_s`, the measured burst waits (up to that long) for the host to stop taking
    CPU time from this machine (wait_for_quiet_host), and the summary's "quiet_host" says how that went."""
    port = int(command[command.index("--port") + 1])
    url = f"http://127.0.0.1:{port}"
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    log = open(Path(args.log_dir) / f"{name}.log", "w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until_ready(server, url + ready_path, f"{name} did not start; see {log.name}", ready_timeout_s)
        level = LoadLevel(concurrency=args.concurrency)
        # Other prompts than the measured ones, so that no server answers the measured requests from its prompt cache.
        warm_up = BenchServeConfig(url, num_prompts=args.concurrency, input_len=args.input_len, output_len=8, seed=1)
        bench_serve(warm_up, [level])
        config = BenchServeConfig(url, num_prompts=args.num_prompts, input_len=args.input_len,
                                  output_len=args.output_len, max_seconds=args.max_seconds)
        quiet = None if quiet_host_wait_s is None else wait_for_quiet_host(quiet_host_wait_s)
        cpus = usable_cpus()  # the server's too: it inherits this process's affinity
        ticks = cpu_ticks(cpus=cpus)
        result = bench_serve(config, [level], on_done)
        summary = result["levels"][0]
        summary["host_steal_percent"] = steal_percent(ticks, cpu_ticks(cpus=cpus))
        if quiet is not None:
            summary["quiet_host"] = quiet
        if inspect is not None:
            summary["inspected"] = inspect(url, result["started_at"])
        return summary
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity, which its children inherit), or all of the machine's where
    the OS does not say."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # (no sched_getaffinity off Linux)
        return list(range(os.cpu_count() or 1))


def cpu_ticks(stat: str | None = None, cpus: list[int] | None = None) -> tuple[int, int] | None:
    """(stolen, all) CPU time so far in clock ticks, from /proc/stat (or `stat`, its text): summed over `cpus`
    (their cpuN lines), or over the whole machine (the first line) without them; None where a line or its steal
    column is missing. "Stolen" is time a virtual machine's CPUs were ready to run while its host ran something
    else. On the 2-core VM these benchmarks run on, the rounds that ran after a vLLM server saw 2-6 % of it, and
    the slowest steps of a burst came in those seconds. Only the CPUs a benchmark may use count: on a machine
    where it is pinned to some, the others' idle time would water the share down."""
    if stat is None:
        try:
            stat = Path("/proc/stat").read_text()
        except OSError:
            return None
    lines = {fields[0]: fields[1:] for fields in map(str.split, stat.splitlines()) if fields}
    names = ["cpu"] if cpus is None else [f"cpu{cpu}" for cpu in cpus]
    stolen = total = 0
    for name in names:
        if len(lines.get(name, ())) < 8:  # steal is the 8th number (Linux 2.6.11 on)
            return None
        ticks = [int(field) for field in lines[name]]
        # guest and guest_nice (9th and 10th) are already counted in user and nice
        stolen, total = stolen + ticks[7], total + sum(ticks[:8])
    return stolen, total


def steal_percent(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the CPUs' time stolen by the host between two cpu_ticks() readings, in percent."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return 100.0 * (after[0] - before[0]) / (after[1] - before[1])


# Keeps one CPU busy for argv[1] seconds.
_SPIN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass"


def steal_under_load(seconds: float = 2.0) -> float | None:
    """The share of `seconds` (percent) the host took from this machine's CPUs while every one of them was busy.

    An idle virtual CPU is never kept waiting, so an idle machine reads no steal whatever its host is doing: the
    probe keeps every CPU busy (one spinning process each) while it reads /proc/stat. Every CPU this process may
    use, that is: spinners for every CPU of a machine it is pinned to part of would crowd onto that part."""
    cpus = usable_cpus()
    before = cpu_ticks(cpus=cpus)
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN, str(seconds)]) for _ in cpus]
    for spinner in spinners:
        spinner.wait()
    return steal_percent(before, cpu_ticks(cpus=cpus))


QUIET_STEAL_PERCENT = 0.5  # a quiet host: at most this share stolen while every CPU is busy


def wait_for_quiet_host(limit_s: float, probe: Callable[[], float | None] = steal_under_load,
                        pause: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                        pause_s: float = 3.0) -> dict:
    """Probe the host's steal until a probe reads at most QUIET_STEAL_PERCENT, for at most `limit_s` seconds
    (0: one probe, no waiting), so that a burst is not measured while the host is still busy on another engine's
    behalf. On the 2-core VM of issue 16, the burst that followed a vLLM server saw 2.5-3.9 % of its time stolen
    and no other burst more than 0.2 %. Returns the seconds waited, each probe's reading and whether the last
    one was quiet (None where /proc/stat has no steal column: nothing to wait for)."""
    started, readings = clock(), []
    while True:
        share = probe()
        readings.append(share)
        if share is None or share <= QUIET_STEAL_PERCENT or clock() - started >= limit_s:
            return {"waited_s": clock() - started, "steal_percent": readings,
                    "quiet": None if share is None else share <= QUIET_STEAL_PERCENT}
        pause(pause_s)  # between probes the machine idles, as it would between a user's requests


def wait_until_ready(server: subprocess.Popen, url: str, failure: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while server.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass  # not listening yet
        time.sleep(0.5)
    raise RuntimeError(failure)


def figures(level: dict) -> dict:
    return {
        "output_tokens_per_s": level["output_tokens_per_s"],
        "ttft_mean_ms": level["ttft_ms"]["mean"],
        "ttft_p50_ms": level["ttft_ms"]["p50"],
        "ttft_p99_ms": level["ttft_ms"]["p99"],
        "itl_mean_ms": level["itl_ms"]["mean"],
        "itl_p50_ms": level["itl_ms"]["p50"],
        "itl_p99_ms": level["itl_ms"]["p99"],
        "completed": level["completed"],
        "failed": level["failed"],
        "output_tokens": level["output_tokens"],
        "prompt_tokens": level["prompt_tokens"],
        "duration_s": level["duration_s"],
        "host_steal_percent": level.get("host_steal_percent"),
    }


def print_table(results: dict[str, dict], rows=DEFAULT_ROWS) -> None:
    print(f"{'':20}" + "".join(f"{name:>18}" for name in results))
    for label, key, fmt in rows:
        cells = ("-" if column.get(key) is None else fmt.format(column[key]) for column in results.values())
        print(f"{label:20}" + "".join(f"{cell:>18}" for cell in cells))
    completion = (f"{column['completed']} / {column['failed']}" for column in results.values())
    print(f"{'completed / failed':20}" + "".join(f"{text:>18}" for text in completion))
