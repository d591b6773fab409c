"""`ridgeline profile`: measure this machine's engine steps and fit the simulator's calibrated step model."""

from pathlib import Path

import typer
from rich.console import Console

from ridgeline.cli.app import app
from ridgeline.cli.bench_serve import parse_list
from ridgeline.cli.engine_options import KV_CACHE_DTYPE, KV_CACHE_DTYPE_K, KV_CACHE_DTYPE_V
from ridgeline.engine.options import engine_config


@app.command("profile", help="Time this machine's real engine steps over a grid (prefill tokens, decode rows, context) and fit the simulator's calibrated step model; with --through-server, fit what `ridgeline serve` itself spends per step under a calibration load.")
def profile_command(
    model: Path = typer.Option(None, "--model", help="GGUF file or HF directory (default: the bundled model)."),
    threads: int = typer.Option(None, "--threads", min=1, help="Torch intra-op threads (the profile is only valid for this count)."),
    decode_rows: str = typer.Option("1,6,15,30", "--decode-rows", help="Decode batch sizes of the grid."),
    contexts: str = typer.Option("32,640", "--contexts", help="Context lengths (tokens already cached) of the grid."),
    prefill_tokens: str = typer.Option("40,320,1200", "--prefill-tokens", help="Prompt sizes added to each decode batch."),
    max_num_batched_tokens: int = typer.Option(2048, "--max-num-batched-tokens", min=1, help="Tokens per step, as serve."),
    kv_cache_memory: str = typer.Option("2GiB", "--kv-cache-memory", help="KV-cache budget, as serve."),
    kv_cache_dtype: str = KV_CACHE_DTYPE,
    kv_cache_dtype_k: str = KV_CACHE_DTYPE_K,
    kv_cache_dtype_v: str = KV_CACHE_DTYPE_V,
    block_size: int = typer.Option(16, "--block-size", min=1, help="Tokens per KV-cache block."),
    dtype: str = typer.Option("float32", "--dtype", help="Activation dtype: float32 or bfloat16."),
    lm_head: str = typer.Option("keep", "--lm-head", help="keep, q8 or q4 (as serve)."),
    out: Path = typer.Option(None, "--out", help="Where to write the profile (default: ~/.cache/ridgeline/profiles/MODEL.json)."),
    seed: int = typer.Option(0, "--seed", help="Seed for the random prompt ids."),
    through_server: bool = typer.Option(False, "--through-server", help="Start `ridgeline serve` with these settings, drive a calibration load through it with bench serve, and fit the cycle time of its back-to-back steps from /v1/steps (scheduling, sampling, output hand-off and the server's other threads included) instead of LLMEngine.step timed alone. The grid options do not apply."),
    server: str = typer.Option(None, "--server", help="As --through-server, against a running `ridgeline serve` at this URL (this machine and code, the same settings and --threads, no API key)."),
    force: bool = typer.Option(False, "--force", help="Write the profile even if its fit's median error is above 15 % or other processes took more than 10 % of the cores' time while it was measured; the profile records why, and `simulate --calibrated` warns."),
) -> None:
    from ridgeline.sim.profile import Grid, measure
    from ridgeline.sim.setup import profile_path

    config = engine_config(model, threads=threads, dtype=dtype, lm_head=lm_head, kv_cache_memory=kv_cache_memory,
                           kv_cache_dtype=kv_cache_dtype, kv_cache_dtype_k=kv_cache_dtype_k,
                           kv_cache_dtype_v=kv_cache_dtype_v, block_size=block_size,
                           max_num_batched_tokens=max_num_batched_tokens)
    console = Console()
    if through_server or server:
        from ridgeline.bench.server_profile import measure_through_server

        serve_args = [*([str(model)] if model else []), *(["--threads", str(threads)] if threads else []),
                      "--dtype", dtype, "--lm-head", lm_head, "--kv-cache-memory", kv_cache_memory,
                      "--kv-cache-dtype", kv_cache_dtype, "--block-size", str(block_size),
                      "--max-num-batched-tokens", str(max_num_batched_tokens),
                      *(["--kv-cache-dtype-k", kv_cache_dtype_k] if kv_cache_dtype_k else []),
                      *(["--kv-cache-dtype-v", kv_cache_dtype_v] if kv_cache_dtype_v else [])]
        with console.status("profiling through the server") as status:
            profile = measure_through_server(config, serve_args, server,
                                             progress=lambda line: status.update(f"profiling through the server: {line}"))
        report(console, profile, keep(profile, out or profile_path(profile.stamp.model), force), "server step cycles")
        return
    grid = Grid(tuple(parse_list(decode_rows, int, "--decode-rows")), tuple(parse_list(contexts, int, "--contexts")),
                tuple(parse_list(prefill_tokens, int, "--prefill-tokens")))
    with console.status("profiling") as status:
        profile = measure(config, grid, seed, progress=lambda line: status.update(f"profiling: {line}"))
    report(console, profile, keep(profile, out or profile_path(profile.stamp.model), force), "engine steps")


def keep(profile, path: Path, force: bool) -> Path:
    """Save the profile, unless it is flagged (a bad fit, taken under load) and not forced: then nothing is written
    and the command fails with one line saying why."""
    from ridgeline.errors import RidgelineError

    if profile.flags and not force:
        raise RidgelineError(f"profile refused, nothing written: {'; '.join(profile.flags)}; measure again on a quiet "
                             f"machine, or keep it flagged with --force")
    return profile.save(path)


def report(console, profile, path, what: str) -> None:
    from ridgeline.sim.calibrated import TERMS

    console.print(f"{profile.samples} {what} measured; fit's median error {profile.median_abs_error:.1%}"
                  + ("" if profile.other_cpu_share is None
                     else f"; other processes took {profile.other_cpu_share:.0%} of the cores meanwhile"),
                  highlight=False)
    for flag in profile.flags:  # kept with --force
        console.print(f"[bold yellow]warning:[/] flagged: {flag}", highlight=False)
    for term, coefficient in zip(TERMS, profile.coefficients):
        console.print(f"  {term:>16}: {coefficient:.4g} s per unit", highlight=False)
    console.print(f"profile for {profile.stamp.model} at {profile.stamp.commit[:12]}, {profile.stamp.cpu}, "
                  f"{profile.stamp.threads} threads: wrote {path}", highlight=False)
