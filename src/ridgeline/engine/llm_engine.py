"""The engine core: a step function over the scheduler, the model runner and the sampler.

`add_request`, `step`, `abort` are all the server, the offline API and (later) the disaggregated workers drive.
One step = schedule (decodes first, then prefill chunks) -> one forward pass -> sample -> detokenise -> stop checks.
"""

import itertools
import time
from dataclasses import dataclass, field

import torch

from ridgeline.engine.kv_cache import KVCache, KVCacheConfig, describe_capacity, pages_for_budget
from ridgeline.engine.model_runner import ModelRunner
from ridgeline.engine.outputs import EngineStats, RequestOutput, RequestTimings
from ridgeline.engine.sampler import Sampler, TokenLogprobs, prompt_logprobs
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import ScheduledChunk, Scheduler, SchedulerConfig
from ridgeline.engine.sequence import Sequence
from ridgeline.engine.stop_checker import StopChecker
from ridgeline.errors import ContextLengthError, RidgelineError
from ridgeline.model.attention_batch import SeqChunk
from ridgeline.model.checkpoint import read_checkpoint, release_loader_memory
from ridgeline.model.tokenizer import IncrementalDetokenizer
from ridgeline.model.transformer import ModelOptions, Transformer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # GGUF file or HF directory; None = the bundled default model
    device: str = "cpu"
    dtype: str = "float32"  # activation dtype: float32 or bfloat16
    lm_head: str = "keep"  # "keep" the LM head as stored, or requantise it: "q8", "q4" (model/quant/requantize.py)
    threads: int | None = None  # torch intra-op threads; None = torch's default
    kv_cache: KVCacheConfig = field(default_factory=KVCacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    seed: int | None = None  # for unseeded sampled requests

    def model_options(self) -> ModelOptions:
        if self.dtype not in DTYPES:
            raise RidgelineError(f"unknown dtype {self.dtype!r} (choose from {', '.join(DTYPES)})")
        return ModelOptions(device=torch.device(self.device), dtype=DTYPES[self.dtype], lm_head=self.lm_head)


@dataclass
class _RequestState:
    """Per-request text state the scheduler does not know about."""

    seq: Sequence
    detokenizer: IncrementalDetokenizer
    stop: StopChecker
    logprobs: list[TokenLogprobs] | None
    prompt_logprobs: list[TokenLogprobs] | None


class LLMEngine:
    def __init__(self, config: EngineConfig):
        if config.threads:
            torch.set_num_threads(config.threads)
        self.config = config
        checkpoint = read_checkpoint(config.model)
        self.model_name = checkpoint.name
        self.model_config = checkpoint.config
        self.tokenizer = checkpoint.load_tokenizer()
        model = Transformer(checkpoint, config.model_options())
        del checkpoint
        release_loader_memory()
        cache_config = KVCacheConfig(config.scheduler.block_size, config.kv_cache.dtype, config.kv_cache.memory_bytes)
        self.num_pages = pages_for_budget(self.model_config, cache_config)
        kv_cache = KVCache(self.model_config, cache_config, self.num_pages, model.options.device)
        self.runner = ModelRunner(model, kv_cache)
        self.capacity_report = describe_capacity(self.model_config, cache_config, self.num_pages,
                                                 config.scheduler.max_num_batched_tokens)
        self.scheduler = Scheduler(config.scheduler, self.num_pages, self.model_config.max_context,
                                   self.tokenizer.eos_ids, windows=[group.window for group in kv_cache.groups])
        self.sampler = Sampler(config.seed)
        self._states: dict[str, _RequestState] = {}
        self._aborted: list[RequestOutput] = []

    # ---- requests -------------------------------------------------------------------------------------------
    def tokenize_prompt(self, prompt: str | list[int]) -> list[int]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise RidgelineError("the prompt is empty")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in ids):
            raise RidgelineError(f"prompt token ids must lie in [0, {vocab})")
        return ids

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    arrival_time: float | None = None) -> None:
        params.validate(self.model_config.vocab_size)
        ids = self.tokenize_prompt(prompt)
        limit = self.scheduler.max_seq_len
        wanted = len(ids) + (params.max_tokens or 0)
        if len(ids) >= limit or (params.max_tokens is not None and wanted > limit):
            raise ContextLengthError(f"prompt of {len(ids)} tokens + max_tokens {params.max_tokens} exceeds the "
                                     f"context of {limit} tokens")
        seq = Sequence(request_id, ids, params, time.monotonic() if arrival_time is None else arrival_time)
        self.scheduler.add_request(seq)
        self._states[request_id] = _RequestState(
            seq, IncrementalDetokenizer(self.tokenizer), StopChecker(params.stop, params.include_stop_str_in_output),
            [] if params.logprobs is not None else None, [] if params.prompt_logprobs is not None else None)

    def abort(self, request_id: str) -> None:
        """Stop a request now; its KV blocks are free when this returns. Its final output comes from the next step."""
        state = self._states.pop(request_id, None)
        if state is None:
            return
        self.scheduler.abort(request_id)
        self._aborted.append(self._output(state, [], state.stop.flush()))

    def has_unfinished(self) -> bool:
        return bool(self._states) or bool(self._aborted)

    # ---- the step -------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs, self._aborted = self._aborted, []
        plan = self.scheduler.schedule()
        if not plan.chunks:
            return outputs
        logits, counts = self.runner.forward([self._seq_chunk(chunk) for chunk in plan.chunks])
        ends = list(itertools.accumulate(counts))
        for chunk, end, count in zip(plan.chunks, ends, counts):
            self._collect_prompt_logprobs(chunk, logits[end - count:end])
        sampling = [(chunk, end - 1) for chunk, end in zip(plan.chunks, ends) if chunk.samples]
        token_ids: list[int] = []
        sampled_logprobs: list[TokenLogprobs | None] = []
        if sampling:
            seqs = [chunk.seq for chunk, _ in sampling]
            rows = [row for _, row in sampling]
            # A pure decode step samples every row: hand the logits over as they are instead of copying [B, vocab].
            sample_logits = logits if rows == list(range(logits.shape[0])) else logits[rows]
            result = self.sampler(sample_logits, [s.sampling_params for s in seqs],
                                  [s.prompt_token_ids for s in seqs], [s.output_token_ids for s in seqs])
            token_ids, sampled_logprobs = result.token_ids, result.logprobs
        finished = {seq.request_id for seq in self.scheduler.update(plan, token_ids)}

        for (chunk, _), token_id, logprob in zip(sampling, token_ids, sampled_logprobs):
            seq = chunk.seq
            state = self._states.get(seq.request_id)
            if state is None:  # aborted between schedule and update
                continue
            if state.logprobs is not None and logprob is not None:
                state.logprobs.append(logprob)
            update = state.stop.append(state.detokenizer.push(token_id))
            new_text = update.text
            if update.stopped:
                self.scheduler.finish_request(seq.request_id, "stop")
                seq.finish_reason = "stop"  # a stop string wins over a length limit reached at the same token
            elif seq.is_finished:  # EOS or length: release what the detokenizer and stop checker still hold
                new_text += state.stop.append(state.detokenizer.flush()).text + state.stop.flush()
            if seq.is_finished:
                finished.add(seq.request_id)
                del self._states[seq.request_id]
            outputs.append(self._output(state, [token_id], new_text))
        for request_id in finished - {chunk.seq.request_id for chunk, _ in sampling}:
            state = self._states.pop(request_id, None)  # finished without sampling (max_tokens=0)
            if state is not None:
                outputs.append(self._output(state, [], ""))
        return outputs

    def _seq_chunk(self, chunk: ScheduledChunk) -> SeqChunk:
        state = self._states.get(chunk.seq.request_id)
        wants_prompt_logits = (state is not None and state.prompt_logprobs is not None
                               and chunk.start < chunk.seq.num_prompt_tokens)
        return SeqChunk(chunk.token_ids, chunk.start, chunk.block_tables,
                        all_logits=wants_prompt_logits, num_prompt_tokens=chunk.seq.num_prompt_tokens)

    def _collect_prompt_logprobs(self, chunk: ScheduledChunk, logits: torch.Tensor) -> None:
        """Logits at position p score prompt token p+1; gathered chunk by chunk, once (not again after preemption)."""
        state = self._states.get(chunk.seq.request_id)
        if state is None or state.prompt_logprobs is None:
            return
        seq = chunk.seq
        begin = len(state.prompt_logprobs)  # position whose logits score the next unscored prompt token
        end = min(chunk.start + chunk.num_tokens, seq.num_prompt_tokens - 1)
        if chunk.start <= begin < end:
            rows = logits[begin - chunk.start:end - chunk.start]
            state.prompt_logprobs.extend(prompt_logprobs(rows, seq.prompt_token_ids[begin + 1:end + 1],
                                                         seq.sampling_params.prompt_logprobs))

    def _output(self, state: _RequestState, new_token_ids: list[int], new_text: str) -> RequestOutput:
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

    # ---- reporting ------------------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        blocks = self.scheduler.block_manager
        cache = blocks.prefix_cache
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            num_free_blocks=blocks.num_free_pages,
            num_total_blocks=blocks.num_pages,
            prefix_cache_queries=cache.num_query_tokens if cache else 0,
            prefix_cache_hits=cache.num_hit_tokens if cache else 0,
            num_preemptions=self.scheduler.num_preemptions,
        )
