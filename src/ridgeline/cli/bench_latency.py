"""`ridgeline bench latency`: llama-bench-style pp/tg tok/s beside the measured roofline ceilings."""

import json

import typer
from rich.console import Console
from rich.table import Table

from ridgeline.cli.app import bench_app
from ridgeline.errors import RidgelineError


def _synthesised(shape: str, model: str | None, weights: tuple[str, ...], layers: int | None,
                 console: Console) -> tuple[str, tuple[str, ...]]:
    """The synthetic file for --shape (written into the cache on first use) and the weight modes to run it in:
    a --weights value naming a file type picks the file; the others are modes (default: quantized)."""
    from ridgeline.model.synth.plan import WEIGHTS
    from ridgeline.model.synth.writer import SynthOptions, cache_dir, synth_file

    if model is not None:
        raise RidgelineError("--shape and --model name two models: give one")
    types = [w for w in weights if w.lower() in WEIGHTS]
    if len(types) > 1:
        raise RidgelineError(f"--shape takes one file type, not {', '.join(types)}")
    options = SynthOptions(shape, types[0] if types else "q4_k_m", layers)
    directory = cache_dir()
    if not (directory / options.file_name).exists():
        console.print(f"writing {options.file_name} into {directory} (random weights, once)", highlight=False)
    with console.status(f"writing {options.file_name}", spinner="dots") as status:
        path = synth_file(directory, options, lambda done, total: status.update(
            f"writing {options.file_name}: {done / 1e9:.2f} of {total / 1e9:.2f} GB"))
    return str(path), tuple(w for w in weights if w.lower() not in WEIGHTS) or ("quantized",)


@bench_app.command("latency", help="Prompt processing (pp) and generation (tg) tok/s, bytes per decode token and % of the bandwidth ceiling.")
def latency_command(
    model: str = typer.Option(None, "--model", help="GGUF file, HF directory or smollm2 (default: the bundled model)."),
    prompt_tokens: int = typer.Option(512, "-p", "--prompt-tokens", min=0, help="Prompt length for the pp test (0 skips it)."),
    gen_tokens: int = typer.Option(128, "-n", "--gen-tokens", min=0, help="Tokens generated in the tg test (0 skips it)."),
    threads: int = typer.Option(None, "--threads", min=1, help="torch threads (default: torch's)."),
    repetitions: int = typer.Option(3, "--repetitions", "-r", min=1, help="Runs of each test (mean ± sd)."),
    weights: list[str] = typer.Option(None, "--weights", help="quantized (kept quantised in memory), bf16 or f32 (dequantised at load); repeat to run several (default: all three). With --shape, also the synthetic file's type (q4_k_m, q8_0, q4_0, ...; default q4_k_m), run quantized."),
    shape: str = typer.Option(None, "--shape", help="Measure a catalogued model shape (llama-3.1-8b, qwen2.5-1.5b, ...) without downloading it: a random-weight GGUF, written on first use into ~/.cache/ridgeline/synth (see `ridgeline synth`)."),
    layers: int = typer.Option(None, "--layers", min=1, help="With --shape: only the first N layers."),
    lm_head: str = typer.Option("keep", "--lm-head", help="keep the LM head as stored, or requantise it to q8 (Q8_0) or q4 (Q4_0): fewer bytes per token, some accuracy (measure it with `ridgeline perplexity --lm-head`)."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    # Imported here, not at the top: every command module is imported for `ridgeline --help`, which needs no torch.
    from ridgeline.bench.bench_latency import WEIGHT_MODES, LatencyConfig, run_latency

    console = Console(stderr=True)
    modes = tuple(weights or ())
    if shape is not None:
        model, modes = _synthesised(shape, model, modes, layers, console)
    elif layers is not None:
        raise RidgelineError("--layers applies to --shape only")
    config = LatencyConfig(model, prompt_tokens, gen_tokens, threads, repetitions, modes or WEIGHT_MODES, lm_head)
    with console.status("starting", spinner="dots") as status:
        results = run_latency(config, progress=lambda text: status.update(text))
    if as_json:
        print(json.dumps([r.summary() for r in results], indent=2))
        return
    first = results[0]
    head = "" if lm_head == "keep" else f", LM head requantised to {lm_head}"
    table = Table(title=f"ridgeline bench latency ({first.threads} threads{head})")
    for column in ("weights", f"pp{config.prompt_tokens} tok/s", f"tg{config.gen_tokens} tok/s", "bytes/token",
                   "weights read: engine / napkin", "ceiling tok/s", "tg % ceiling", "pp % peak", "tg step: linear / other ms"):
        table.add_column(column, justify="right")
    for r in results:
        s = r.summary()
        table.add_row(
            r.weights,
            f"{s['pp_tok_s']['mean']:.1f} ± {s['pp_tok_s']['sd']:.1f}",
            f"{s['tg_tok_s']['mean']:.1f} ± {s['tg_tok_s']['sd']:.1f}",
            f"{r.bytes_per_token / 1e6:,.1f} MB",
            f"{r.decode_weight_bytes / 1e6:,.1f} / {r.napkin_weight_bytes / 1e6:,.1f} MB",
            f"{r.ceiling_tok_s:.1f}",
            f"{r.tg_fraction_of_ceiling:.0%}",
            f"{r.pp_fraction_of_peak:.0%}",
            f"{r.tg_linear_ms:.1f} / {r.tg_step_ms - r.tg_linear_ms:.1f}",
        )
    out = Console()
    out.print(table)
    peaks = ", ".join(dict.fromkeys(f"{r.matmul_precision} matmul {r.matmul_flops / 1e9:.0f} GFLOP/s" for r in results))
    out.print(f"{first.machine}: read bandwidth {first.read_bandwidth / 1e9:.1f} GB/s, {peaks}; "
              "ceiling = bandwidth / bytes per decode token (weights the step read + average KV cache); weights read: "
              "what the engine counted a decode step reading (shared weights + routed experts) beside the roofline's "
              "figure for the same weights (matrices only, k/E of the experts); "
              "pp % peak counts linear-layer FLOPs only, against the matmul rate of the precision they ran in; "
              "'other' = everything outside the linear layers "
              "(attention, norms, RoPE, Python).")
