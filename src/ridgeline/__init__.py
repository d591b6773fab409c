"""ridgeline: an LLM inference and serving engine that knows which side of the roofline ridge it is on."""

__version__ = "0.1.0"

__all__ = ["LLM", "EngineConfig", "SamplingParams", "StructuredOutputsParams"]


def __getattr__(name: str):
    # Lazy, so `ridgeline --help` and the roofline tools do not pay for importing torch (tests/test_cli_imports.py).
    if name == "LLM":
        from ridgeline.engine.llm import LLM

        return LLM
    if name == "EngineConfig":
        from ridgeline.engine.llm_engine import EngineConfig

        return EngineConfig
    if name == "SamplingParams":
        from ridgeline.engine.sampling_params import SamplingParams

        return SamplingParams
    if name == "StructuredOutputsParams":
        from ridgeline.engine.structured import StructuredOutputsParams

        return StructuredOutputsParams
    raise AttributeError(name)
