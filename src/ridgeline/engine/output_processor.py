"""From sampled token ids to what callers read: text, stop strings, logprobs and `RequestOutput`s.

Apart from the engine core (as in vLLM V1) so the core reads schedule -> run -> sample -> update, and so a worker
that only computes KV (a prefill worker) or a simulator can run the core without any of this.

Stop strings are found here, in the detokenised text, but the scheduler owns every finish: `detokenize` reports
which requests completed a stop string, the scheduler's `update` finishes them with reason "stop" (a stop string
wins over EOS or a length limit reached at the same token), and `outputs` reads the reason from the sequence.
"""

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from ridgeline.engine.outputs import RequestOutput, RequestTimings
from ridgeline.engine.sampler import TokenLogprobs, prompt_logprobs
from ridgeline.engine.scheduler import ScheduledChunk
from ridgeline.engine.sequence import Sequence
from ridgeline.engine.stop_checker import StopChecker, StopUpdate
from ridgeline.model.tokenizer import IncrementalDetokenizer
from ridgeline.model.tokenizer.base import Tokenizer


@dataclass(frozen=True)
class Sample:
    """The tokens a sampling chunk gives its sequence this step: one, or after verified guesses (speculative
    decoding) the accepted ones and one more."""

    seq: Sequence
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


@dataclass(frozen=True)
class TextUpdate:
    text: str  # new text a stream may send now
    stopped: bool  # a stop string completed
    num_tokens: int  # of the sample's tokens, how many the text covers (fewer when a stop string came earlier)


@dataclass
class _RequestText:
    """Per-request text state the scheduler does not know about."""

    seq: Sequence
    detokenizer: IncrementalDetokenizer
    stop: StopChecker
    logprobs: list[TokenLogprobs] | None
    prompt_logprobs: list[TokenLogprobs] | None


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._requests: dict[str, _RequestText] = {}

    def __len__(self) -> int:
        return len(self._requests)

    def add(self, seq: Sequence) -> None:
        params = seq.sampling_params
        self._requests[seq.request_id] = _RequestText(
            seq, IncrementalDetokenizer(self.tokenizer), StopChecker(params.stop, params.include_stop_str_in_output),
            [] if params.logprobs is not None else None, [] if params.prompt_logprobs is not None else None)

    def abort(self, request_id: str) -> RequestOutput | None:
        """The final output of an aborted request (None if it is unknown or already finished)."""
        state = self._requests.pop(request_id, None)
        return None if state is None else self._output(state, [], state.stop.flush())

    # ---- prompt logprobs ------------------------------------------------------------------------------------
    def wants_prompt_logits(self, chunk: ScheduledChunk) -> bool:
        state = self._requests.get(chunk.seq.request_id)
        return state is not None and state.prompt_logprobs is not None and chunk.start < chunk.seq.num_prompt_tokens

    def collect_prompt_logprobs(self, chunk: ScheduledChunk, logits: torch.Tensor) -> None:
        """Logits at position p score prompt token p+1; gathered chunk by chunk, once (not again after preemption)."""
        state = self._requests.get(chunk.seq.request_id)
        if state is None or state.prompt_logprobs is None:
            return
        seq = chunk.seq
        begin = len(state.prompt_logprobs)  # position whose logits score the next unscored prompt token
        end = min(chunk.start + chunk.num_tokens, seq.num_prompt_tokens - 1)
        if chunk.start <= begin < end:
            rows = logits[begin - chunk.start:end - chunk.start]
            state.prompt_logprobs.extend(prompt_logprobs(rows, seq.prompt_token_ids[begin + 1:end + 1],
                                                         seq.sampling_params.prompt_logprobs))

    # ---- sampled tokens -------------------------------------------------------------------------------------
    def detokenize(self, samples: list[Sample]) -> dict[str, TextUpdate]:
        """Each sample's new text, token by token through its request's stop checker, up to a completed stop string
        (`.stopped`; the tokens after it are not the request's). Requests aborted since the step was scheduled are
        skipped."""
        updates = {}
        for sample in samples:
            state = self._requests.get(sample.seq.request_id)
            if state is None:
                continue
            text, used, stopped = "", 0, False
            for token_id, logprobs in zip(sample.token_ids, sample.logprobs):
                if state.logprobs is not None and logprobs is not None:
                    state.logprobs.append(logprobs)
                update: StopUpdate = state.stop.append(state.detokenizer.push(token_id))
                text, used, stopped = text + update.text, used + 1, update.stopped
                if stopped:
                    break
            updates[sample.seq.request_id] = TextUpdate(text, stopped, used)
        return updates

    def outputs(self, samples: list[Sample], updates: dict[str, TextUpdate], finished: Iterable[Sequence]) -> list[RequestOutput]:
        """One output per sampled request still tracked, plus the finished ones that sampled nothing (max_tokens=0)."""
        outputs = []
        for sample in samples:
            state = self._requests.get(sample.seq.request_id)
            if state is None:
                continue
            update = updates[sample.seq.request_id]
            new_text = update.text
            if sample.seq.is_finished and not update.stopped:
                # EOS or length: release what the detokenizer and the stop checker still hold back.
                new_text += state.stop.append(state.detokenizer.flush()).text + state.stop.flush()
            outputs.append(self._output(state, sample.token_ids[:update.num_tokens], new_text))
        for seq in finished:
            state = self._requests.get(seq.request_id)
            if state is not None and seq.request_id not in updates:
                outputs.append(self._output(state, [], ""))
        for output in outputs:
            if output.finished:
                del self._requests[output.request_id]
        return outputs

    def _output(self, state: _RequestText, new_token_ids: list[int], new_text: str) -> RequestOutput:
        seq = state.seq
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.prompt_token_ids,
            output_token_ids=list(seq.output_token_ids),
            new_token_ids=new_token_ids,
            text=state.stop.output_text,
            new_text=new_text,
            finished=seq.is_finished,
            finish_reason=seq.finish_reason,
            logprobs=list(state.logprobs) if state.logprobs is not None else None,
            prompt_logprobs=list(state.prompt_logprobs) if state.prompt_logprobs is not None else None,
            num_cached_tokens=seq.num_cached_tokens,
            timings=RequestTimings(seq.arrival_time, seq.first_scheduled_time, seq.first_token_time,
                                   seq.finish_time, list(seq.token_times)),
        )
