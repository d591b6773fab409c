"""`ridgeline roofline`: the napkin model for one model on one machine."""

import json

import typer
from rich.console import Console
from rich.table import Table

from ridgeline.model.model_source import load_model_shape
from ridgeline.cli.app import app
from ridgeline.napkin.hardware import THIS_MACHINE, catalogued
from ridgeline.napkin.kv_dtypes import parse_kv_bytes
from ridgeline.napkin.measured import load_measured
from ridgeline.napkin.roofline import REALISTIC_BAND, Roofline, Workload


def gigabytes(nbytes: float) -> str:
    return f"{nbytes / 1e9:,.2f} GB"


@app.command("roofline", help="Which side of the ridge: decode/prefill ceilings, KV cache and memory fit for a model on a machine.")
def roofline_command(
    model: str = typer.Option(None, "--model", help="GGUF file, HF directory or built-in spec name (default: the bundled model)."),
    weights: str = typer.Option(None, "--weights", help="Weight format for a built-in spec: FP16, BF16, Q8_0, Q6_K, Q4_0, Q4_K_M, MXFP4."),
    hardware: str = typer.Option(THIS_MACHINE, "--hardware", help="Catalogue machine name, or this-machine (measured, cached)."),
    batch: int = typer.Option(1, "--batch", min=1, help="Concurrent sequences decoding together."),
    context: int = typer.Option(0, "--context", min=0, help="Tokens already in each sequence's KV cache while decoding."),
    prompt_tokens: int = typer.Option(2048, "--prompt-tokens", min=1, help="Prompt length for prefill and TTFT."),
    precision: str = typer.Option(None, "--precision", help="Matmul precision (fp32, bf16, fp16, fp8, fp4, int8); default: the machine's for the weights (int8 for quantised weights where it was measured)."),
    kv_bytes: str = typer.Option("2", "--kv-bytes", help="Bytes per KV-cache element, or a KV dtype: bf16 = 2, q8_0 = 1.0625 (int8 + an fp16 scale per 32)."),
    measured: str = typer.Option(None, "--measured", help="JSON file of measured points to put on the --plot."),
    remeasure: bool = typer.Option(False, "--remeasure", help="Measure this-machine again instead of using the cache (a worse reading keeps the cached entry: `ridgeline measure --force` replaces it)."),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
    plot: str = typer.Option(None, "--plot", help="Write a roofline chart with decode and prefill operating points: PNG, or self-contained HTML (the dashboard's drawing) for a .html name."),
) -> None:
    from ridgeline.dashboard.export import render_roofline
    from ridgeline.napkin.plot import modelled_figure

    kv_element_bytes = parse_kv_bytes(kv_bytes)  # a bad value fails before the machine is measured
    console = Console(stderr=as_json, width=max(Console().width, 110))  # long figures read better unwrapped
    if hardware == THIS_MACHINE:
        from ridgeline.machine.this_machine import this_machine  # measures with torch; catalogued machines need none

        # The int8 figure runs the compiled kernels, which are built on first use (the engine's first start, or this)
        with console.status("reading this machine's measurement (measured now where none is cached for this thread "
                            "count: ~7 s, ~2 min more where the compiled kernels were never built)"):
            machine = this_machine(remeasure=remeasure)
    else:
        machine = catalogued(hardware)
    roofline = Roofline(load_model_shape(model, weights), machine, precision, kv_element_bytes)
    workload = Workload(batch, context, prompt_tokens, kv_element_bytes, precision)
    summary = roofline.summary(workload)
    summary["hardware_title"] = machine.title  # this machine's provenance: when it was measured, threads, spread
    points = load_measured(measured) if measured else []
    if points:
        summary["measured"] = [
            {"label": p.label, "phase": p.phase, "tokens_per_s": p.tokens_per_s, "fraction_of_ceiling": p.fraction_of_ceiling(roofline)}
            for p in points
        ]
    if plot:
        summary["plot"] = str(render_roofline(modelled_figure(roofline, context, measured=points), plot))
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    print_summary(console, summary)


def print_summary(console: Console, s: dict) -> None:
    decode, prefill, kv, memory = s["decode"], s["prefill"], s["kv"], s["memory"]
    low, high = decode["realistic_tokens_per_s"]
    band = f"{REALISTIC_BAND[0]:.0%}-{REALISTIC_BAND[1]:.0%}"
    crossover = decode["compute_bound_from_batch"]
    rows = [
        ("model", f"{s['model']} ({s['weights']}), {s['params'] / 1e9:,.2f} B params, {gigabytes(s['weight_bytes'])} of weights"),
        ("hardware", f"{s.get('hardware_title', s['hardware'])}: {s['bandwidth_bytes_per_s'] / 1e9:,.1f} GB/s, {s['peak_flops'] / 1e12:,.2f} TFLOP/s {s['precision']}"),
        ("ridge point", f"{s['ridge_flop_per_byte']:,.1f} FLOP/byte"),
        ("bytes read per decode token", f"{gigabytes(decode['bytes_per_token'])} (weights {gigabytes(decode['weight_bytes_per_token'])} + KV at {kv['context']:,} tokens {gigabytes(decode['kv_bytes_per_token_at_context'])})"),
        ("decode ceiling, batch 1", f"{decode['ceiling_tokens_per_s']:,.1f} tok/s; realistic ({band}): {low:,.1f}-{high:,.1f} tok/s"),
        (f"decode at batch {decode['batch']}", f"intensity {decode['intensity_at_batch']:,.1f} FLOP/B, {decode['bound_at_batch']}-bound, {decode['tokens_per_s_at_batch']:,.1f} tok/s total, ITL >= {decode['inter_token_latency_s_at_batch'] * 1e3:,.2f} ms"),
        ("decode turns compute-bound", f"at batch {crossover:,}" if crossover else "never at this context (KV reads grow with the batch)"),
        (f"prefill of {prefill['prompt_tokens']:,} tokens", f"intensity {prefill['intensity']:,.1f} FLOP/B, {prefill['bound']}-bound, {prefill['tokens_per_s']:,.0f} tok/s, TTFT >= {prefill['ttft_s'] * 1e3:,.1f} ms"),
        ("KV per token (GQA vs full MHA)", f"{kv['bytes_per_token']:,.0f} B vs {kv['bytes_per_token_full_mha']:,.0f} B ({kv['gqa_reduction']:.0f}x)"),
        (f"KV for {decode['batch']} x {kv['context']:,} tokens (GQA vs MHA)", f"{gigabytes(kv['bytes_for_context_and_batch'])} vs {gigabytes(kv['bytes_for_context_and_batch_full_mha'])}"),
        ("memory after weights", f"{gigabytes(memory['free_after_weights_bytes'])} of {gigabytes(memory['capacity_bytes'])}" + ("" if memory["fits"] else " [red](weights do not fit)[/]")),
        ("fits", f"{memory['kv_token_capacity']:,.0f} KV tokens in all; batch <= {memory['max_batch_at_context']:,} at {kv['context']:,} tokens; context <= {memory['max_context_at_batch']:,} at batch {decode['batch']}"),
    ]
    for point in s.get("measured", []):
        rows.append((f"measured: {point['label']}", f"{point['tokens_per_s']:,.1f} tok/s = {point['fraction_of_ceiling']:.0%} of the modelled ceiling"))
    if "plot" in s:
        rows.append(("plot", s["plot"]))
    table = Table(show_header=False, box=None)
    for name, value in rows:
        table.add_row(f"[bold]{name}[/]", value)
    console.print(table)
