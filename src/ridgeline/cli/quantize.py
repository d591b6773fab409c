"""`ridgeline quantize IN.gguf OUT.gguf --type T`: one model as another tier, with its size and decode ceiling."""

from pathlib import Path

import typer

from ridgeline.cli.app import app


@app.command("quantize", help="Requantise a GGUF model (q4_0, q4_1, q5_0, q8_0, q4_k, q6_k); norms and 1-D tensors stay as stored.")
def quantize_command(
    source: Path = typer.Argument(..., help="Input GGUF file."),
    destination: Path = typer.Argument(..., help="Output GGUF file."),
    qtype: str = typer.Option(..., "--type", help="q4_0, q4_1, q5_0, q8_0, q4_k or q6_k."),
    hardware: str = typer.Option("this-machine", "--hardware", help="Machine for the decode ceiling (napkin)."),
) -> None:
    from ridgeline.model.quant.quantize_file import quantize_gguf
    from ridgeline.machine.this_machine import machine_named as get_hardware
    from ridgeline.model.model_source import load_model_shape
    from ridgeline.napkin.roofline import Roofline

    report = quantize_gguf(source, destination, qtype.lower())
    print(f"{destination}: {report.qtype}, {report.bytes_after / 1e6:,.1f} MB (was {report.bytes_before / 1e6:,.1f} MB); "
          f"{report.tensors_requantized} tensors requantised, {len(report.tensors_kept)} kept as stored")
    machine = get_hardware(hardware)
    for path in (source, destination):
        roofline = Roofline(load_model_shape(str(path)), machine)
        print(f"  {path.name}: decode ceiling {1 / roofline.decode(1, 0).seconds:,.0f} tok/s at batch 1 on {machine.title} "
              f"({roofline.decode_bytes_per_token() / 1e6:,.1f} MB read per token)")
