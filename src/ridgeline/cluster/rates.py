"""Prefill and decode rates of a model on its replicas: the roofline's estimate until there are measurements,
then what requests actually took (from the timings each output carries).

Prefill is learnt per uncached token. A request's prefill time (first scheduled to first token) is whole engine
steps: a cache hit with 16 uncached tokens still waits out a step of everything else in the batch, so dividing its
tokens by its time makes prefill look ten times slower than it is, and a router that believes it overprices every
queue. The rate is the slope of a line fitted through (uncached tokens, seconds) of recent requests, the
intercept a fixed cost per request (the step it waits out whatever its size); while the recent requests are all
about one size, the slope cannot be told from the intercept, and the rate is their tokens over their seconds.
"""

from dataclasses import dataclass, field

# How much one new measurement moves the average: recent enough to follow load, smooth enough to ignore one outlier.
SMOOTHING = 0.2
# The prefill fit's memory: each request's weight decays by this much per new one (~20 requests' worth).
FIT_SMOOTHING = 0.05
# The fit's slope is trusted once the recent uncached lengths spread at least this much (coefficient of variation).
MIN_SPREAD = 0.25
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
    prefill_fixed_s: float = 0.0  # a prefill's cost whatever its size (the fit's intercept)
    _fit: list[float] = field(default_factory=lambda: [0.0] * 6, repr=False)  # decayed n, x, y, xx, xy, yy sums

    def observe(self, prefill_tokens: int, prefill_s: float | None, decode_tokens: int, decode_s: float | None) -> None:
        if prefill_s and prefill_tokens > 0:
            self._observe_prefill(prefill_tokens, prefill_s)
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


    def _observe_prefill(self, tokens: int, seconds: float) -> None:
        keep = 1 - FIT_SMOOTHING
        fit = self._fit
        for i, value in enumerate((1.0, tokens, seconds, tokens * tokens, tokens * seconds, seconds * seconds)):
            fit[i] = keep * fit[i] + value
        n, sx, sy, sxx, sxy, _ = fit
        mean_x, mean_y = sx / n, sy / n
        var_x = sxx / n - mean_x * mean_x
        slope = (sxy / n - mean_x * mean_y) / var_x if var_x > (MIN_SPREAD * mean_x) ** 2 else 0.0
        if slope > 0 and mean_y - slope * mean_x >= 0:
            self.prefill_tokens_per_s, self.prefill_fixed_s = 1 / slope, mean_y - slope * mean_x
        else:  # one size of prompt (or a fit that says nothing): tokens over seconds, all of it per token
            self.prefill_tokens_per_s, self.prefill_fixed_s = sx / sy, 0.0
        self.prefill_measured, self.source = True, "measured"


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
