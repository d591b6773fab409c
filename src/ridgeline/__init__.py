"""ridgeline: an LLM inference and serving engine that knows which side of the roofline ridge it is on."""

__version__ = "0.1.0"
