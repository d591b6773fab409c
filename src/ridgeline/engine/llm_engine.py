"""The engine core: a step function over the scheduler, the model runner and the sampler.

`add_request`, `step`, `abort` are all the server, the offline API and (later) the disaggregated workers drive.
One step = schedule (decodes first, then prefill chunks) -> run (one forward pass) -> sample -> update (the
scheduler records what was computed and finishes what ended). Text, stop strings and `RequestOutput`s are the
output processor's (engine/output_processor.py); what a request must satisfy to get in is admission's
(engine/admission.py).
"""

import itertools
import time
from dataclasses import dataclass, field

import torch

from ridgeline.model.model_source import load_model_shape
from ridgeline.engine.admission import Admission, AdmissionLimits, AdmittedRequest
from ridgeline.engine.assemble import assemble_model
from ridgeline.engine.kv_cache import KVCacheConfig, describe_capacity
from ridgeline.engine.kv_handoff import (KVHandoffError, KVLayout, KVManifest, PageRef, pages_to_move, read_page,
                                         write_page)
from ridgeline.engine.kv_populate import populate_in_background
from ridgeline.engine.output_processor import OutputProcessor, Sample
from ridgeline.engine.outputs import EngineStats, RequestOutput
from ridgeline.engine.sampler import Sampler, TokenLogprobs, checks_before_mask
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import ScheduledChunk, Scheduler, SchedulerConfig, SchedulerOutput
from ridgeline.engine.speculative import NgramProposer, SpeculativeConfig
from ridgeline.engine.step_cost import OnlineStepCost
from ridgeline.engine.sequence import Sequence
from ridgeline.engine.step_record import StepRecorder
from ridgeline.engine.structured.compiler import GrammarCompiler
from ridgeline.engine.structured.masks import MaskPrefetcher
from ridgeline.errors import RidgelineError
from ridgeline.model.attention_batch import ForwardChunk
from ridgeline.model.transformer import ModelOptions

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # GGUF file or HF directory; None = the bundled default model
    device: str = "cpu"
    dtype: str = "float32"  # activation dtype: float32 or bfloat16
    lm_head: str = "keep"  # "keep" the LM head as stored, or requantise it: "q8", "q4" (model/quant/requantize.py)
    threads: int | None = None  # torch intra-op threads; None = torch's default
    kv_cache: KVCacheConfig = field(default_factory=KVCacheConfig)  # owns the block (page) size
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    max_model_len: int | None = None  # cap on prompt + output tokens (vLLM's --max-model-len); None = the model's
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)  # n-gram speculative decoding (off)
    seed: int | None = None  # for unseeded sampled requests

    def __post_init__(self) -> None:
        if self.max_model_len is not None and self.max_model_len < 2:
            raise RidgelineError(f"max_model_len must be at least 2 (a prompt token and one to generate), "
                                 f"got {self.max_model_len}")

    def model_options(self) -> ModelOptions:
        if self.dtype not in DTYPES:
            raise RidgelineError(f"unknown dtype {self.dtype!r} (choose from {', '.join(DTYPES)})")
        return ModelOptions(device=torch.device(self.device), dtype=DTYPES[self.dtype], lm_head=self.lm_head)


def sampled_rows(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The logits rows to sample from, without copying [rows, vocab] when they are one run of rows. A decode step
    samples every row; a step with a prefill chunk that does not finish its prompt samples the decode rows in
    front of it, and a gathered copy of those (16 MB for 16 rows of Gemma's 262k vocabulary) took ~4 % of the
    engine thread's time in a served burst (py-spy)."""
    if rows and rows == list(range(rows[0], rows[0] + len(rows))):
        return logits[rows[0]:rows[0] + len(rows)]
    return logits[rows]


class LLMEngine:
    def __init__(self, config: EngineConfig):
        if config.threads:
            torch.set_num_threads(config.threads)
        self.config = config
        assembled = assemble_model(config.model, config.model_options(), config.kv_cache, tokenizer=True)
        self.model_name, self.model_config, self.tokenizer = assembled.name, assembled.config, assembled.tokenizer
        self.runner = assembled.runner
        # The napkin model's view of the same file (its header only): what each step reads and computes.
        model_path = None if config.model is None else str(config.model)
        self.steps = StepRecorder(load_model_shape(model_path), config.kv_cache.bytes_per_value)
        self.num_pages = assembled.kv_cache.num_pages
        self.capacity_report = describe_capacity(self.model_config, config.kv_cache, self.num_pages,
                                                 config.scheduler.max_num_batched_tokens)
        context = self.model_config.max_context
        if config.max_model_len is not None:
            if config.max_model_len > context:
                raise RidgelineError(f"--max-model-len {config.max_model_len} exceeds the model's context of "
                                     f"{context} tokens")
            context = config.max_model_len
        self.proposer = NgramProposer(config.speculative) if config.speculative.num_tokens else None
        # Structured outputs: constraints compiled once (admission checks them, add_admitted takes a matcher from the
        # same cache) and masks computed while each step's forward pass runs.
        self.grammars = GrammarCompiler(self.tokenizer, self.model_config.vocab_size)
        self.masks = MaskPrefetcher()
        self.num_constrained_requests = 0
        # With an ITL target the scheduler prices steps with what this engine's own steps measured, a decode row
        # priced, until decode steps of a full batch say otherwise, at the model's FLOPs against a prompt token's.
        self.step_cost = (OnlineStepCost(decode_row_ratio=self.steps.shape.decode_row_flops_ratio())
                          if config.scheduler.itl_target is not None else None)
        self.scheduler = Scheduler(config.scheduler, self.num_pages, context, self.tokenizer.eos_ids,
                                   windows=[group.window for group in assembled.kv_cache.groups],
                                   block_size=config.kv_cache.block_size,
                                   proposer=self._propose if self.proposer else None,
                                   step_cost=self.step_cost.predict if self.step_cost else None)
        self.admission = Admission(
            AdmissionLimits(self.model_config.vocab_size, self.scheduler.max_seq_len,
                            config.scheduler.max_num_batched_tokens, config.scheduler.enable_chunked_prefill),
            self.tokenizer, self.grammars)
        self.sampler = Sampler(config.seed)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._aborted: list[RequestOutput] = []
        self._arrived: list[Sample] = []  # first tokens of requests whose KV came from a prefill engine
        self._first_tokens: dict[str, Sample] = {}  # ... and of those whose KV is still on its way

    # ---- requests -------------------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    arrival_time: float | None = None, fork_of: str | None = None, hold_kv: bool = False) -> None:
        """Admit and queue a request (raises RidgelineError naming the field at fault). `fork_of`: another
        request with the same prompt (the n samples of one prompt) whose prefilled pages this one shares.
        `hold_kv`: keep its pages once it finishes, for another engine to collect (see offer_kv)."""
        self.add_admitted(request_id, self.admission.admit(prompt, params), arrival_time, fork_of, hold_kv)

    def add_admitted(self, request_id: str, request: AdmittedRequest, arrival_time: float | None = None,
                     fork_of: str | None = None, hold_kv: bool = False) -> None:
        """Queue a request that already passed `self.admission` (the server admits on its own thread)."""
        seq = Sequence(request_id, list(request.prompt_token_ids), request.params,
                       time.monotonic() if arrival_time is None else arrival_time, hold_kv=hold_kv,
                       grammar=self._grammar(request.params))
        self.scheduler.add_request(seq, fork_of=fork_of)
        self.output_processor.add(seq)

    def _grammar(self, params: SamplingParams):
        if params.structured_outputs is None:
            return None
        self.num_constrained_requests += 1
        matcher = self.grammars.compile(params.structured_outputs).matcher(
            params.max_tokens if self.grammars.close_json else None)
        return matcher

    def _propose(self, seq: Sequence, max_tokens: int) -> list[int]:
        """Speculative guesses, none for a constrained request: its guesses would have to pass its grammar, and a
        constrained decode is rarely the copy-heavy kind n-grams guess well."""
        return [] if seq.grammar is not None else self.proposer.propose(seq, max_tokens)

    def abort(self, request_id: str) -> None:
        """Stop a request now; its KV pages are free when this returns. Its final output comes from the next step."""
        self._first_tokens.pop(request_id, None)
        self.scheduler.abort(request_id)
        output = self.output_processor.abort(request_id)
        if output is not None:
            self._aborted.append(output)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._aborted) or bool(self._arrived)

    def has_work(self) -> bool:
        """A step would do something now (has_unfinished also counts requests whose KV is still arriving)."""
        return self.scheduler.has_runnable() or bool(self._aborted) or bool(self._arrived)

    # ---- the step -------------------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        outputs, self._aborted = self._aborted, []
        if self._arrived:  # their first token was sampled by the prefill engine: it reaches the caller from here
            arrived, self._arrived = self._arrived, []
            outputs += self.output_processor.outputs(arrived, self.output_processor.detokenize(arrived), [])
        started = time.perf_counter()
        plan = self.scheduler.schedule()
        if not plan.chunks:
            return outputs
        # The grammar masks of this step's constrained samples, computed on a worker thread during the pass. Not for
        # plain greedy rows or rows sampled with temperature alone: they check the one token they chose unmasked
        # (~2 us) and need the mask only if the grammar refuses it (engine/sampler.py). On a machine whose cores
        # the pass fills, the worker's time is taken from the pass: measured on 2 cores, its 0.17-0.19 ms a row
        # (contended) cost greedy decode 6-7 % at batch 1 and 16, where a refused row's mask computed at sampling
        # time costs ~0.04 ms, and most tokens are not refused. Rows in their closing window too (matcher.allows).
        vocab = self.model_config.vocab_size
        self.masks.ahead(chunk.seq.grammar for chunk in plan.chunks
                         if chunk.samples and chunk.seq.grammar is not None
                         and not checks_before_mask(chunk.seq.sampling_params, vocab))
        logits, row_ranges = self._run(plan)
        samples = self._sample(plan, logits, row_ranges)
        updates = self.output_processor.detokenize(samples)
        samples = [Sample(s.seq, s.token_ids[:update.num_tokens], s.logprobs)
                   if (update := updates.get(s.seq.request_id)) is not None and update.num_tokens < len(s.token_ids)
                   else s for s in samples]  # cut after a stop string (the tokens past it are not the request's)
        stop_string_hits = {request_id for request_id, update in updates.items() if update.stopped}
        stop_string_hits |= self._advance_grammars(samples)
        finished = self.scheduler.update(plan, [sample.token_ids for sample in samples], stop_string_hits)
        if self.step_cost is not None:  # the whole step, scheduling to sampled tokens: the gap a stream sees
            self.step_cost.observe(plan.step_chunks,
                                   time.perf_counter() - started)
        return outputs + self.output_processor.outputs(samples, updates, finished)

    def _run(self, plan: SchedulerOutput) -> tuple[torch.Tensor, list[range]]:
        """One forward pass over the plan's chunks: a logits row per chunk, or per token of chunks that score
        their prompt (prompt logprobs, collected here) or verify guesses. Also returns each chunk's rows."""
        started, cpu_started = time.perf_counter(), time.thread_time()
        logits, counts = self.runner.forward([self._forward_chunk(chunk) for chunk in plan.chunks])
        self.steps.record(plan, time.perf_counter() - started, time.thread_time() - cpu_started)
        ranges = [range(end - count, end) for end, count in zip(itertools.accumulate(counts), counts)]
        for chunk, rows in zip(plan.chunks, ranges):
            if chunk.seq.sampling_params.prompt_logprobs is not None:  # (no view of the logits for the others)
                self.output_processor.collect_prompt_logprobs(chunk, logits[rows.start:rows.stop])
        return logits, ranges

    def _sample(self, plan: SchedulerOutput, logits: torch.Tensor, row_ranges: list[range]) -> list[Sample]:
        """Tokens for every chunk that ends at its sequence's last token: one from its last logits row or, for a
        decode that verifies guesses, the guesses the model agrees with and one more (engine/speculative.py)."""
        sampling = [(chunk, rows if chunk.draft_token_ids else rows[-1:])
                    for chunk, rows in zip(plan.chunks, row_ranges) if chunk.samples]
        if not sampling:
            return []
        # Sampled requests' guesses are verified apart (rejection sampling); everything else in one batched call.
        batched = [(chunk, rows) for chunk, rows in sampling
                   if not (chunk.draft_token_ids and not chunk.seq.sampling_params.is_greedy)]
        seqs = [chunk.seq for chunk, rows in batched for _ in rows]
        rows = [row for _, rows in batched for row in rows]
        result = None
        if rows:
            sample_logits = sampled_rows(logits, rows)
            grammars = None
            if any(s.grammar is not None for s in seqs):
                self.masks.wait()
                grammars = [s.grammar for s in seqs]
            result = self.sampler(sample_logits, [s.sampling_params for s in seqs],
                                  [s.prompt_token_ids for s in seqs], [s.output_token_ids for s in seqs], grammars)
        samples, first = [], 0
        for chunk, chunk_rows in sampling:
            if chunk.draft_token_ids and not chunk.seq.sampling_params.is_greedy:
                seq = chunk.seq
                tokens = self.sampler.verify_guesses(logits[chunk_rows.start:chunk_rows.stop], seq.sampling_params,
                                                     chunk.draft_token_ids, len(seq.output_token_ids))
                accepted = len(tokens) - 1 if tokens[:-1] == list(chunk.draft_token_ids[:len(tokens) - 1]) else 0
                self.proposer.verified(seq, len(chunk.draft_token_ids), accepted)
                tokens = self.scheduler.accepted_prefix(seq, tokens)
                samples.append(Sample(seq, tokens, [None] * len(tokens)))
                continue
            targets = result.token_ids[first:first + len(chunk_rows)]
            logprobs = result.logprobs[first:first + len(chunk_rows)]
            first += len(chunk_rows)
            if chunk.draft_token_ids:
                accepted = 0
                while accepted < len(chunk.draft_token_ids) and chunk.draft_token_ids[accepted] == targets[accepted]:
                    accepted += 1
                self.proposer.verified(chunk.seq, len(chunk.draft_token_ids), accepted)
                targets = self.scheduler.accepted_prefix(chunk.seq, targets[:accepted + 1])
            samples.append(Sample(chunk.seq, targets, logprobs[:len(targets)]))
        return samples

    def _advance_grammars(self, samples: list[Sample]) -> set[str]:
        """Each constrained request's grammar takes its new tokens; the requests whose grammar is now complete
        (nothing more can follow) end here, with reason "stop", as vLLM ends them, without spending a step on an
        end token. A grammar that refuses a token (only an end token under ignore_eos gets here) ends it too."""
        done = set()
        for sample in samples:
            grammar = sample.seq.grammar
            if grammar is None:
                continue
            if not grammar.consume(sample.token_ids) or grammar.is_terminated:
                done.add(sample.seq.request_id)
        return done

    def _forward_chunk(self, chunk: ScheduledChunk) -> ForwardChunk:
        return ForwardChunk(chunk.token_ids, chunk.start, chunk.block_tables,
                            all_logits=self.output_processor.wants_prompt_logits(chunk) or bool(chunk.draft_token_ids),
                            num_prompt_tokens=chunk.seq.num_prompt_tokens)

    # ---- KV handoff (disaggregated prefill and decode; engine/kv_handoff.py) -----------------------------------
    def populate_kv_in_background(self) -> None:
        """Fault the KV pool's pages in on an idle-priority thread (engine/kv_populate.py): for a server, whose
        pool serves one burst after another, so the first bursts do not pay for fresh pages in their steps."""
        populate_in_background(self.runner.kv_cache.tensors)

    def kv_layout(self) -> KVLayout:
        cache = self.runner.kv_cache
        config = self.model_config
        # The weights' identity: the file's name, its shape, and how it was loaded (a Q4 and an f32 model of one
        # shape write different K and V for the same prompt). Named fields, not the whole config's repr: two engines
        # that read one file must agree however each came by its config (a start-up cache, say).
        shape = (config.architecture, config.vocab_size, config.hidden_size, config.num_layers, config.num_heads,
                 config.num_kv_heads, config.head_dim, config.sliding_window, tuple(config.sliding_layers))
        model = f"{self.model_name}:{shape}:{self.config.dtype}:{self.config.lm_head}"
        return KVLayout(model=model, k_dtype=self.config.kv_cache.k_dtype, v_dtype=self.config.kv_cache.v_dtype,
                        block_size=cache.block_size, windows=tuple(group.window for group in cache.groups),
                        layers_per_group=len(cache.groups[0].layers), num_kv_heads=config.num_kv_heads,
                        head_dim=config.head_dim)

    def cached_prefix_tokens(self, prompt_token_ids: list[int]) -> int:
        """Leading prompt tokens this engine's prefix cache holds now, in whole blocks, as admitting the prompt
        would find them: what a front asks a decode worker before choosing where to prefill. Takes no page.
        Safe off the engine thread: it only hashes the prompt and looks names up in a dict (atomic under the GIL);
        the answer may be a step stale, which costs at most a prefill, never a wrong token (admission looks again)."""
        seq = Sequence("cache-lookup", list(prompt_token_ids), SamplingParams(), 0.0)
        cached = self.scheduler.block_manager.find_cached_prefix(seq)
        return len(cached[0]) * self.runner.kv_cache.block_size if cached else 0

    def offer_kv(self, request_id: str) -> KVManifest:
        """Prefill side: the pages a finished hold_kv request kept, named for the decode side."""
        seq = self._held(request_id)
        hashes = self.scheduler.block_manager.block_hashes(seq, seq.num_computed_tokens // self.runner.kv_cache.block_size)
        pages = pages_to_move(seq.num_computed_tokens, self.kv_layout().windows, self.runner.kv_cache.block_size, hashes)
        return KVManifest(request_id, tuple(seq.prompt_token_ids), seq.output_token_ids[0], tuple(pages),
                          self.kv_layout().digest(), seq.num_cached_tokens)

    def read_kv_pages(self, request_id: str, refs: list[PageRef]) -> list[bytes]:
        seq = self._held(request_id)
        return [read_page(self.runner.kv_cache, seq.block_tables[ref.group][ref.block]) for ref in refs]

    def release_kv(self, request_id: str) -> bool:
        """Prefill side: the pages were collected (or their lease lapsed): free them."""
        return self.scheduler.release_held(request_id)

    def receive_kv(self, request_id: str, request: AdmittedRequest, manifest: KVManifest,
                   arrival_time: float | None = None, first_logprobs: TokenLogprobs | None = None) -> list[PageRef] | None:
        """Decode side: reserve pages for a request whose prompt KV and first token come from another engine;
        returns the pages to fetch (blocks the prefix cache already holds are skipped), None if there is no room
        now. Refuses a manifest of another layout or of another prompt (its chain hashes must be this prompt's)."""
        if manifest.layout_digest != self.kv_layout().digest():
            raise KVHandoffError("the prefill side's KV layout (model, KV dtype, block size or layer groups) differs "
                                 "from this engine's")
        if tuple(request.prompt_token_ids) != manifest.prompt_token_ids:
            raise KVHandoffError(f"request {request_id!r}: the KV offered is of another prompt")
        seq = Sequence(request_id, list(request.prompt_token_ids), request.params,
                       time.monotonic() if arrival_time is None else arrival_time, grammar=self._grammar(request.params))
        bs = self.runner.kv_cache.block_size
        expected = self.scheduler.block_manager.block_hashes(seq, seq.num_prompt_tokens // bs)
        offered = {(ref.group, ref.block): ref.chain_hash for ref in manifest.pages}
        wanted = pages_to_move(seq.num_prompt_tokens, self.kv_layout().windows, bs, expected)
        if any(offered.get((ref.group, ref.block), b"missing") != ref.chain_hash for ref in wanted):
            raise KVHandoffError(f"request {request_id!r}: the pages offered do not match the prompt's chain hashes")
        seq.append_token(manifest.first_token_id, time.monotonic())
        if seq.grammar is not None and not seq.grammar.consume([manifest.first_token_id]):
            raise KVHandoffError(f"request {request_id!r}: the first token from the prefill side breaks the "
                                 f"request's grammar")
        if not self.scheduler.reserve_prefilled(seq):
            return None
        self.output_processor.add(seq)
        self._first_tokens[request_id] = Sample(seq, [manifest.first_token_id], [first_logprobs])
        first_needed = seq.num_computed_tokens // bs  # blocks before it were hits in this engine's prefix cache
        # What a client is told was cached: what the prefill engine skipped computing, as when colocated.
        seq.num_cached_tokens = manifest.num_cached_tokens
        return [ref for ref in wanted if ref.block >= first_needed]

    def write_kv_pages(self, request_id: str, refs: list[PageRef], payloads: list[bytes]) -> None:
        seq = self.scheduler.receiving(request_id)
        for ref, payload in zip(refs, payloads, strict=True):
            write_page(self.runner.kv_cache, seq.block_tables[ref.group][ref.block], payload)

    def commit_kv(self, request_id: str) -> None:
        """Decode side: every page arrived; the request decodes from the next step, whose outputs begin with the
        first token (its text, stop strings and logprobs handled as if it had been sampled here)."""
        self.scheduler.admit_prefilled(request_id)
        self._arrived.append(self._first_tokens.pop(request_id))

    def _held(self, request_id: str) -> Sequence:
        seq = self.scheduler.held.get(request_id)
        if seq is None:
            raise KVHandoffError(f"request {request_id!r} holds no KV here (unknown, not finished, or released)")
        return seq

    # ---- reporting ------------------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        pages = self.scheduler.block_manager
        cache = pages.prefix_cache
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            num_free_pages=pages.num_free_pages,
            num_total_pages=pages.num_pages,
            prefix_cache_queries=cache.num_query_tokens if cache else 0,
            prefix_cache_hits=cache.num_hit_tokens if cache else 0,
            num_preemptions=self.scheduler.num_preemptions,
            num_prefilled_tokens=self.scheduler.num_prefilled_tokens,
            num_draft_tokens=self.proposer.num_proposed if self.proposer else 0,
            num_accepted_tokens=self.proposer.num_accepted if self.proposer else 0,
            num_verifications=self.proposer.num_verifications if self.proposer else 0,
            num_constrained_requests=self.num_constrained_requests,
            grammars_compiled=self.grammars.stats.compiled,
            grammar_cache_hits=self.grammars.stats.cache_hits,
            grammars_refused=self.grammars.stats.failed,
            grammar_compile_seconds=self.grammars.stats.compile_seconds,
            grammar_masks=self.masks.num_masks,
            grammar_mask_seconds=self.masks.mask_seconds,
            grammar_mask_wait_seconds=self.masks.wait_seconds,
            grammar_masks_at_sampling=self.grammars.sampling_masks.count,
            grammar_mask_at_sampling_seconds=self.grammars.sampling_masks.seconds,
        )
