"""Prefill and decode rates of a model on its replicas: the roofline's estimate until there are measurements,
then a moving average of what requests actually took (from the timings each output carries)."""

from dataclasses import dataclass

# How much one new measurement moves the average: recent enough to follow load, smooth enough to ignore one outlier.
SMOOTHING = 0.2
PRIOR_PROMPT_TOKENS = 512  # the prompt length the roofline prior is taken at
PRIOR_CONTEXT = 512


@dataclass
class Rates:
    prefill_tokens_per_s: float
    decode_tokens_per_s: float  # per stream
    source: str  # where the figures came from: "roofline", "configured" or "default", then "measured"
    # Whether each figure has been measured yet: the first measurement replaces the prior, later ones blend in.
    prefill_measured: bool = False
    decode_measured: bool = False

    def observe(self, prefill_tokens: int, prefill_s: float | None, decode_tokens: int, decode_s: float | None) -> None:
        if prefill_s and prefill_tokens > 0:
            rate = prefill_tokens / prefill_s
            self.prefill_tokens_per_s = _blend(self.prefill_tokens_per_s, rate) if self.prefill_measured else rate
            self.prefill_measured, self.source = True, "measured"
        if decode_s and decode_tokens > 0:
            rate = decode_tokens / decode_s
            self.decode_tokens_per_s = _blend(self.decode_tokens_per_s, rate) if self.decode_measured else rate
            self.decode_measured, self.source = True, "measured"

    def observe_output(self, output) -> None:
        """From a finished RequestOutput: its uncached prompt over its prefill time, its tokens over its decode time."""
        t = output.timings
        prefill_s = t.first_token - t.first_scheduled if t.first_token and t.first_scheduled else None
        decode_s = t.token_times[-1] - t.token_times[0] if len(t.token_times) > 1 else None
        self.observe(len(output.prompt_token_ids) - output.num_cached_tokens, prefill_s,
                     len(t.token_times) - 1, decode_s)


def _blend(old: float, new: float) -> float:
    return (1 - SMOOTHING) * old + SMOOTHING * new


def roofline_rates(shape, hardware) -> Rates:
    """The napkin's realistic rates: half the roofline's ceiling for prefill (compute) and decode (bandwidth)."""
    from ridgeline.napkin.advise import EFFICIENCY
    from ridgeline.napkin.roofline import Roofline

    roofline = Roofline(shape, hardware)
    prefill = roofline.prefill(PRIOR_PROMPT_TOKENS)
    decode = roofline.decode(1, PRIOR_CONTEXT)
    return Rates(EFFICIENCY * prefill.tokens_per_s, EFFICIENCY * decode.tokens_per_s, "roofline")
