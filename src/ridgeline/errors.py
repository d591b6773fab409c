"""User-facing errors: the CLI prints them as one line and exits non-zero; the server maps them to 4xx.

An error that one request field is to blame for carries that field's name (`param`) and, where OpenAI defines
one, a machine-readable `code`, so the server maps errors by attribute and never by reading their text.
"""


class RidgelineError(Exception):
    """A problem with what the user asked for (bad file, bad argument), not a bug in ridgeline."""

    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param  # the engine's name for the field at fault (SamplingParams / request field names)
        if code is not None:
            self.code = code


class ModelLoadError(RidgelineError):
    """The model file is missing, truncated, corrupt or uses something we do not support."""


class UnsupportedError(ModelLoadError):
    """The model uses an architecture or tensor type ridgeline does not implement."""


class InvalidParameterError(RidgelineError):
    """A request field holds a value out of its range or of the wrong type."""


class ContextLengthError(InvalidParameterError):
    """A prompt (plus the tokens asked for) does not fit the model's context."""

    code = "context_length_exceeded"
