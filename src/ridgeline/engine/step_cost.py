"""What an engine step costs, measured as the engine runs: the estimate an ITL target budgets prefill with.

The scheduler asks one question of a step-cost model: how long would a step of these chunks take? A chunk is
(start, num_tokens, samples), the same triple sim/step_time.TermsOf.of_chunks prices, so the simulator hands the
scheduler its calibrated or roofline model (sim/replica.py) and the engine hands it this one, fitted to its own
recent steps; it needs no profile and follows the machine as it is now (a shared core, a warm cache).

The estimate is the calibrated model's fit (non-negative least squares, relative error) on three terms:

    seconds ~ c_step + c_decode * decode_rows + c_prompt * prompt_tokens

c_step is what every step pays (Python, dispatch, reading the weights), c_decode a decode row (its LM-head row
included), c_prompt a prompt token. Attention's growth with context is left out: below a few thousand tokens the
matmuls dominate a row, and the fit, over a window of recent steps, follows a drift in the mix anyway. Steps
with prompt tokens and steps without are kept in windows of their own, so a long run of decode-only steps never
pushes the last prefill measurements out (c_prompt would then be unknown, and read as free). Within a window
newer steps weigh more (the first steps of a process pay one-time costs; a shared machine's speed drifts).

Early on, decode steps of one or two rows cannot tell c_step from c_decode, and a fit that put it all on the
rows would predict a 32-row step 16x a 2-row one. So until decode-only steps of batch sizes SLOPE_SPAN rows
apart have run, a decode row is priced at what the model's arithmetic says it costs against a prompt token
(`decode_row_ratio`: a decode row computes all a prompt token does plus its row of the LM head, 2.7x the FLOPs
on Gemma 3 270M, whose LM head is 168M of its 268M parameters): c_decode = ratio x c_prompt exactly, and the fit
has two unknowns. Until then the fit has only the steps of a burst's start to go on: a server's warm-up (decode
steps of one or two rows) and prefill chunks with a few decodes beside them, where a decode row's share is small
and noisy. Left free there, c_decode went to 0: a 32-row decode step was predicted at 12-16 ms against the
50-65 ms it takes, and the ITL target (a multiple of that step) held every mixed step to the floor of prefill.
A pull toward the ratio instead of the equality (as a penalty weighing one step) did not hold either: the
warm-up's 1-row steps ran slower than its 2-row ones, and for the first ~30 steps of a burst the fit read
c_decode ~0 and a 32-row step at 16 ms (2026-12-03, logged live). Once the slope is measured, and always without
a ratio (0), c_decode is free but for a slight pull toward zero that only breaks ties: a step-cost model that is
not told the model's shape under-predicts a larger batch, whose first step then teaches the fit.
"""

from collections import deque
from collections.abc import Iterable

import numpy as np

from ridgeline.engine.scheduler import StepChunk  # (start, num_tokens, samples): one sequence's share of a step

WINDOW = 32  # steps kept of each kind (with prompt tokens, without)
RECENCY = 0.9  # a step's weight against the next newer one of its kind (half-weight ~7 steps back)
DECODE_PULL = 0.3  # how hard c_decode is pulled toward zero without a ratio (against the heaviest step, weighing
# 1): enough to settle two batch sizes a few percent apart in time, too little to bend a fit over steps of 1 to 32
# rows
SLOPE_SPAN = 8  # decode-only steps this many rows apart in batch size tell c_decode from c_step by themselves: the
# ratio then gives way to the weak pull, so the engine's own decode steps overrule the model's arithmetic


def nonnegative_least_squares(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0 (Lawson-Hanson active set), on unit-scaled columns."""
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    a = x / scale
    n = a.shape[1]
    passive = np.zeros(n, dtype=bool)
    coef = np.zeros(n)
    for _ in range(3 * n):
        gradient = a.T @ (y - a @ coef)
        candidates = ~passive & (gradient > 1e-12)
        if not candidates.any():
            break
        passive[np.argmax(np.where(candidates, gradient, -np.inf))] = True
        while True:
            trial = np.zeros(n)
            trial[passive] = np.linalg.lstsq(a[:, passive], y, rcond=None)[0]
            if (trial[passive] > 0).all():
                coef = trial
                break
            # Step back toward the last feasible point until a coefficient reaches zero, and drop it.
            blocked = passive & (trial <= 0)
            alpha = np.min(coef[blocked] / (coef[blocked] - trial[blocked] + 1e-300))
            coef = coef + alpha * (trial - coef)
            passive &= coef > 1e-15
    return coef / scale


def step_features(chunks: Iterable[StepChunk]) -> tuple[int, int]:
    """(decode rows, prompt tokens) of a step. A one-token chunk is a decode row (as TermsOf counts it); a
    decode verifying speculative guesses computes its guesses like prompt tokens, so they count as such."""
    decode_rows = prompt_tokens = 0
    for _, num_tokens, _ in chunks:
        if num_tokens == 1:
            decode_rows += 1
        else:
            prompt_tokens += num_tokens
    return decode_rows, prompt_tokens


class OnlineStepCost:
    """Step time fitted to the engine's recent steps; predict() is None until it has seen enough to answer."""

    def __init__(self, window: int = WINDOW, decode_row_ratio: float = 0.0):
        if decode_row_ratio < 0:
            raise ValueError(f"decode_row_ratio must be >= 0, got {decode_row_ratio}")
        self.decode_row_ratio = decode_row_ratio
        self._with_prompt: deque[tuple[int, int, float]] = deque(maxlen=window)
        self._without_prompt: deque[tuple[int, int, float]] = deque(maxlen=window)
        self._coefficients: tuple[float, float, float] | None = None
        self._stale = False

    def observe(self, chunks: Iterable[StepChunk], seconds: float) -> None:
        """One step that ran these chunks in `seconds`."""
        decode_rows, prompt_tokens = step_features(chunks)
        if seconds <= 0 or not (decode_rows or prompt_tokens):
            return
        (self._with_prompt if prompt_tokens else self._without_prompt).append((decode_rows, prompt_tokens, seconds))
        self._stale = True

    @property
    def coefficients(self) -> tuple[float, float, float] | None:
        """(c_step, c_decode, c_prompt) in seconds, or None before a step with prompt tokens and one with decode
        rows were seen (the share of each is unknown until then)."""
        if self._stale:
            self._stale = False
            rows = [*self._with_prompt, *self._without_prompt]
            if self._with_prompt and any(decode_rows for decode_rows, _, _ in rows) and len(rows) >= 3:
                x = np.array([[1.0, decode_rows, prompt_tokens] for decode_rows, prompt_tokens, _ in rows])
                y = np.array([seconds for _, _, seconds in rows])
                ages = [*range(len(self._with_prompt) - 1, -1, -1), *range(len(self._without_prompt) - 1, -1, -1)]
                # Relative error, as the calibrated fit weighs it (a 30 ms decode step counts as much as a 1 s
                # prefill), times the step's recency.
                weight = np.power(RECENCY, ages) / y
                a, b = x * weight[:, None], weight * y
                batch_sizes = [decode_rows for decode_rows, _, _ in self._without_prompt]
                measured_slope = bool(batch_sizes) and max(batch_sizes) - min(batch_sizes) >= SLOPE_SPAN
                if self.decode_row_ratio and not measured_slope:
                    # A decode row is `ratio` prompt tokens: fit c_step and c_prompt on the tokens so counted.
                    ratio = self.decode_row_ratio
                    c_step, c_prompt = nonnegative_least_squares(a[:, [0, 2]] + np.outer(a[:, 1], [0.0, ratio]), b)
                    self._coefficients = (float(c_step), float(ratio * c_prompt), float(c_prompt))
                else:
                    # c_decode ~ 0, weighed against the heaviest decode column entry: a tie-breaker.
                    strength = DECODE_PULL * np.abs(a[:, 1]).max()
                    pull = np.array([[0.0, strength, 0.0]])
                    coefficients = nonnegative_least_squares(np.vstack([a, pull]), np.append(b, 0.0))
                    self._coefficients = tuple(float(c) for c in coefficients)
        return self._coefficients

    def predict(self, chunks: Iterable[StepChunk]) -> float | None:
        coefficients = self.coefficients
        if coefficients is None:
            return None
        decode_rows, prompt_tokens = step_features(chunks)
        c_step, c_decode, c_prompt = coefficients
        return c_step + c_decode * decode_rows + c_prompt * prompt_tokens
