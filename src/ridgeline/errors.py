"""User-facing errors: the CLI prints them as one line and exits non-zero; the server maps them to 4xx."""


class RidgelineError(Exception):
    """A problem with what the user asked for (bad file, bad argument), not a bug in ridgeline."""


class ModelLoadError(RidgelineError):
    """The model file is missing, truncated, corrupt or uses something we do not support."""


class UnsupportedError(ModelLoadError):
    """The model uses an architecture or tensor type ridgeline does not implement."""


class ContextLengthError(RidgelineError):
    """A prompt (plus the tokens asked for) does not fit the model's context."""
