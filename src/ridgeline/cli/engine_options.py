"""The engine settings' command-line options, declared once for every command that runs a model (their values
become an EngineConfig in engine/options.py)."""

import typer

# The KV-cache type options, declared once for every command that runs an engine. K and V can differ, as with
# llama.cpp's -ctk / -ctv (keys are the more sensitive side: a q8_0 V with a bf16 K is the cautious trade).
KV_CACHE_DTYPE = typer.Option("bf16", "--kv-cache-dtype", help="KV-cache element type of K and V: bf16, fp16, fp32 "
                              "or q8_0 (int8 with an fp16 scale per 32 values: 1.88x the tokens of bf16).")
KV_CACHE_DTYPE_K = typer.Option(None, "--kv-cache-dtype-k", help="K's type alone (default: --kv-cache-dtype).")
KV_CACHE_DTYPE_V = typer.Option(None, "--kv-cache-dtype-v", help="V's type alone (default: --kv-cache-dtype).")

ITL_TARGET_MS = typer.Option("auto", "--itl-target-ms", help="Longest a step that carries decodes may take, in ms "
                             "(a stream's inter-token latency): prefill chunks beside decodes are cut to fit, using "
                             "step times measured as the engine runs. auto: 1.75x the predicted time of a decode-only "
                             "step of the running and waiting requests; 0 or off: prefill fills --max-num-batched-tokens whatever decodes run.")
