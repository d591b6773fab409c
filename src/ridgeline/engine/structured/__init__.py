"""Constrained decoding: a request may carry a grammar (a JSON schema, a regex, a choice, a Lark/GBNF grammar);
at each of its steps the sampler masks the tokens the grammar forbids, and the grammar advances with the token
taken. The grammar engine is llguidance (also llama.cpp's and one of vLLM's); docs/structured_outputs.md says why."""

from ridgeline.engine.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
