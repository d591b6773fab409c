"""Continuous batching under one token budget (vLLM V1 style, stall-free chunked prefill as in Sarathi-Serve).

One step = one forward pass. schedule() picks what it computes: every running decode first (one token each,
so streams never stall behind a long prompt), then prefill chunks, of running partially-prefilled sequences and
then of waiting ones in arrival order, until `max_num_batched_tokens` is spent. When the KV pool runs dry the
most recently admitted sequence is preempted: its pages are freed (full ones stay in the prefix cache) and it
goes back to the front of the queue to be recomputed, prompt and generated tokens alike. After the forward pass,
update() records what was computed (which also lets sliding-window layer groups give up the pages that fell
out of their window) and appends the sampled tokens.

With an ITL target (SchedulerConfig.itl_target), a step that carries decodes takes only as many prefill tokens
as keep its predicted time within the target: every running stream waits one step per token, so a step's time
is each stream's inter-token latency. The prediction is the caller's step-cost model (`step_cost`: the engine's
estimate fitted to its own steps, engine/step_cost.py, or a simulator's step-time model); a step without decodes
spends the whole budget on prefill (time to first token). Chunking never changes a token (batch invariance), so
the target only moves latency between prompts and streams.

Priorities (SamplingParams.priority, vLLM's semantics: lower is served first) order all of this: the queue is kept
sorted by priority, arrival order within one (a preempted sequence at the front of its own priority), so the
queue's head is the most urgent request; the victim of a preemption is the running sequence of the lowest priority
(largest value), the most recently admitted among those; and a waiting head that finds no room (KV pages or a
slot in the batch) may preempt running sequences of strictly lower priority, never of its own or higher; and a
step's prefill budget goes to running prompts of the head's priority or higher, then the head, then running
prompts of lower priority (a long low-priority prompt does not take every step while an urgent one waits). With an
ITL target, prefill of a lower priority than the most urgent request around (running, waiting, or seen within
priority_hold_s) gets only what keeps the step within that urgent class's own target, decodes or not
(_background_room): a batch tenant's prompt neither stretches an interactive stream's steps nor keeps an arriving
interactive prompt behind a long step. With every priority equal (the default, 0) each of these is exactly the
first-come-first-served rule above.
With ageing on (SchedulerConfig.priority_aging_steps) every waiting request gains a priority level each that many
steps, which bounds how long a low priority can be kept out by later, higher-priority arrivals.

A waiting request whose next uncached block a running sequence is about to compute (the same prompt, sent twice
at once) is not admitted until that sequence has computed it: it then finds it in the prefix cache, so one prompt
is prefilled once however many requests carry it (see _prefix_in_flight).

No model code here: the caller turns a SchedulerOutput into a forward pass, or a cost model into a duration.
"""

import itertools
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from ridgeline.engine.block_manager import BlockManager, longest_fitting_sequence, resume_position
from ridgeline.engine.sequence import Sequence, SequenceStatus
from ridgeline.errors import RidgelineError


StepChunk = tuple[int, int, bool]  # (start, num_tokens, samples): what a step-cost model prices of a chunk


@dataclass(frozen=True)
class ItlTarget:
    """How long a step that carries decodes may take: the inter-token latency its streams see."""
    seconds: float | None = None  # a fixed target; None: decode_multiple x a predicted decode-only step (below)
    # The default follows the machine and the load: a step may take 1.75x the predicted time of a decode-only step
    # of the batch the queue heads to (the decodes running now and the prompts being prefilled or waiting, up to
    # max_num_seqs). Once those prompts are in, that decode step is a stream's usual gap, so its worst one stays
    # within ~1.75x of it: issue 16 asks p99 <= 3x p50, and the rest is margin for the estimate's error. Until a
    # full batch has decoded, that step is extrapolated (engine/step_cost.py prices a decode row by the model's
    # FLOPs). With that extrapolation exact (2026-12-03; before, a pull toward the FLOPs ratio let it read 0.3-2x
    # the real step within one burst), benchmarks/token_budget.py's burst gave p99/p50 2.06-2.73x at 2x and
    # 1.47-1.60x at 1.75x, at output tok/s the noise could not tell apart (docs/token_budget.md, last section).
    # Pricing against the decodes running now instead would, in a burst, hold prefill to a trickle while few
    # streams run, the time most prompts wait: more steps, each paying the fixed cost of a step, for gaps the
    # full batch brings anyway.
    decode_multiple: float = 1.75

    def __post_init__(self) -> None:
        if self.seconds is not None and not self.seconds > 0:
            raise RidgelineError(f"the ITL target must be a positive number of seconds, got {self.seconds}")
        if not self.decode_multiple > 1:
            raise RidgelineError(f"the ITL target's decode multiple must exceed 1 (room for prefill), "
                                 f"got {self.decode_multiple}")

    def describe(self) -> str:
        if self.seconds is not None:
            return f"ITL target {self.seconds * 1e3:g} ms"
        return f"ITL target {self.decode_multiple:g}x the measured decode step of the batch to come"


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 2048  # tokens computed per step, decodes and prefill chunks together
    max_num_seqs: int = 256  # running sequences at once (decodes beyond the token budget wait a step)
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True  # off: a prompt is prefilled whole in one step or waits
    itl_target: ItlTarget | None = None  # None: prefill chunks fill the token budget whatever decodes run
    # Ageing: every this many steps, every waiting request goes one priority level earlier, so a low priority is
    # admitted at last under any sustained higher-priority load. None: strict priority, no ageing.
    priority_aging_steps: int | None = None
    # With an ITL target, work of a lower priority than the most urgent class around is bounded by that class's
    # own target (Scheduler._background_room); "around" means present, or present within this many seconds.
    priority_hold_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, name) < 1:
                raise RidgelineError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.priority_hold_s >= 0:
            raise RidgelineError(f"priority_hold_s must be a number of seconds >= 0, got {self.priority_hold_s}")
        if self.priority_aging_steps is not None and self.priority_aging_steps < 1:
            raise RidgelineError(f"priority_aging_steps must be at least 1, got {self.priority_aging_steps}")
        if self.itl_target is not None and not self.enable_chunked_prefill:
            # A prompt that only fits whole would wait for a step without decodes, which steady load never gives.
            raise RidgelineError("an ITL target needs chunked prefill (it caps the prefill chunk of a step)")


@dataclass(frozen=True)
class StepBudget:
    """What the ITL target did to one step (SchedulerOutput.budget; /v1/steps shows it)."""
    prefill_limit: int  # prefill tokens the step could take
    target_s: float | None  # the target in seconds; None while the step-cost model has no estimate yet
    predicted_s: float | None  # the model's prediction for the step as scheduled


@dataclass(frozen=True)
class ScheduledChunk:
    seq: Sequence
    start: int  # index (= position) of the first token to compute
    num_tokens: int
    samples: bool  # ends at the sequence's last token, so its last logits give the next token
    # Per layer group, the sequence's pages as of this step: token i's KV for group g lives in page
    # block_tables[g][i // bs]; RELEASED (-1) for blocks a sliding-window group no longer reads.
    block_tables: tuple[tuple[int, ...], ...]
    # A decode with guessed next tokens to verify in the same pass (engine/speculative.py): they follow the
    # sequence's last token and count in num_tokens.
    draft_token_ids: tuple[int, ...] = ()

    @property
    def step_chunk(self) -> StepChunk:
        return (self.start, self.num_tokens, self.samples)

    @property
    def token_ids(self) -> list[int]:
        own = self.seq.token_ids[self.start : self.start + self.num_tokens - len(self.draft_token_ids)]
        return own + list(self.draft_token_ids) if self.draft_token_ids else own


@dataclass(frozen=True)
class SchedulerOutput:
    chunks: list[ScheduledChunk]  # decodes first, then prefill chunks; each list in admission order
    preempted: list[Sequence]  # sequences sent back to the queue this step
    budget: StepBudget | None = None  # set when an ITL target limited the step's prefill

    @property
    def num_batched_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)

    @property
    def step_chunks(self) -> list[StepChunk]:
        """The step as a step-cost model prices it."""
        return [chunk.step_chunk for chunk in self.chunks]

    @property
    def sampling_chunks(self) -> list[ScheduledChunk]:
        """The chunks that need a sampled token, in the order update() expects the tokens."""
        return [chunk for chunk in self.chunks if chunk.samples]


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        num_pages: int,
        max_model_len: int,
        eos_token_ids: Iterable[int] = (),
        clock: Callable[[], float] = time.monotonic,  # a simulator passes its own clock
        proposer: "Callable[[Sequence, int], list[int]] | None" = None,  # guesses for speculative decoding
        windows: Iterable[int | None] = (None,),  # attention window of each layer group (None = full attention)
        block_size: int = 16,  # tokens per KV block: the KV cache's page size (KVCacheConfig.block_size)
        # Predicted seconds of a step of these chunks (None: no estimate yet); needed with an ITL target.
        step_cost: "Callable[[list[StepChunk]], float | None] | None" = None,
    ) -> None:
        if config.itl_target is not None and step_cost is None:
            raise RidgelineError("an ITL target needs a step-cost model to predict step times")
        self.config = config
        self.step_cost = step_cost
        # The most the least prefill beside decodes can be, whatever the target: a sixteenth of the token budget
        # (128 of 2,048), at least a page. A backlog of many prompts advancing below that mostly adds steps, each
        # paying a step's fixed cost, and the streams they start straggle into a long tail of small batches: with
        # one page as the floor, the burst of benchmarks/token_budget.py ran 12 % below a fixed budget of 128
        # (docs/token_budget.md). See _least_prefill for the floor of a step.
        self.min_prefill_tokens = min(max(block_size, config.max_num_batched_tokens // 16),
                                      config.max_num_batched_tokens)
        self.block_manager = BlockManager(num_pages, block_size, windows, config.enable_prefix_caching)
        # The model's context, or less if a sequence that long, computed alone in chunks up to the token budget,
        # would at some point need more pages than the pool has (then it could never finish).
        self.max_seq_len = longest_fitting_sequence(num_pages, config.max_num_batched_tokens, self.block_manager.windows,
                                                    block_size, max_model_len)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.clock = clock
        self.proposer = proposer
        self.waiting: deque[Sequence] = deque()  # by priority, then arrival: the head is admitted first
        self._steps_scheduled = 0  # for ageing (priority_aging_steps)
        self._urgent_seen: dict[int, float] = {}  # priority -> when it was last the most urgent present (_most_urgent)
        self.running: list[Sequence] = []  # in admission order: of the lowest priority, the last one is preempted first
        self._requests: dict[str, Sequence] = {}
        # Forks waiting for their parent's prompt to be computed: parent id -> children, child id -> parent id.
        self._pending_forks: dict[str, list[Sequence]] = {}
        self._fork_parent: dict[str, str] = {}
        # KV handoff (engine/kv_handoff.py): finished sequences whose pages wait to be collected, and sequences
        # whose prompt KV is arriving from another engine into pages reserved for it.
        self.held: dict[str, Sequence] = {}
        self._receiving: dict[str, Sequence] = {}
        self.num_preemptions = 0
        self.num_prefilled_tokens = 0  # prompt tokens computed (not found in the prefix cache or shared by a fork)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self._fork_parent)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def has_runnable(self) -> bool:
        """Something a step can compute now (not merely sequences whose KV is still arriving)."""
        return bool(self.running or self.waiting)

    def add_request(self, seq: Sequence, fork_of: str | None = None) -> None:
        """Queue seq (checked by engine/admission.py beforehand). With `fork_of`, seq starts with the prompt of that
        request (the n samples of one prompt): it waits until the parent's prompt is computed and then shares
        the parent's pages of full prompt blocks, so the prompt is prefilled once, not n times."""
        if seq.request_id in self._requests:
            raise RidgelineError(f"request id {seq.request_id!r} is already in use")
        self._requests[seq.request_id] = seq
        parent = self._requests.get(fork_of) if fork_of is not None else None
        if parent is None:
            self._enqueue(seq)
        elif parent.status is SequenceStatus.RUNNING and parent.num_computed_tokens >= parent.num_prompt_tokens:
            self._fork(parent, seq)
        else:
            self._pending_forks.setdefault(parent.request_id, []).append(seq)
            self._fork_parent[seq.request_id] = parent.request_id

    def release_held(self, request_id: str) -> bool:
        """Free the pages a finished hold_kv sequence kept (collected, or its lease lapsed)."""
        seq = self.held.pop(request_id, None)
        if seq is not None:
            self.block_manager.free(seq)
        return seq is not None

    def reserve_prefilled(self, seq: Sequence) -> bool:
        """Pages for a sequence (prompt + the first token, already sampled elsewhere) whose prompt KV another
        engine computed: prefix-cache hits first, fresh pages for the rest. False, changing nothing, when there is
        no room now. The caller then writes the missing pages and calls admit_prefilled (or abort)."""
        if seq.request_id in self._requests:
            raise RidgelineError(f"request id {seq.request_id!r} is already in use")
        if len(self.running) + len(self._receiving) >= self.config.max_num_seqs:
            return False
        cached = self.block_manager.find_cached_prefix(seq, computed_elsewhere=True)
        num_cached = len(cached[0]) * self.block_manager.block_size if cached else 0
        if not self.block_manager.allocate(seq, seq.num_prompt_tokens - num_cached, cached):
            return False
        if self.block_manager.prefix_cache is not None:
            self.block_manager.prefix_cache.record_lookup(seq.num_prompt_tokens, num_cached)
        seq.num_cached_tokens = seq.num_computed_tokens = num_cached
        # Those blocks' KV never comes; what does starts at first_kept_block, so that a repeat finds it.
        self.block_manager.release_below_window(seq, resume_position(seq.num_prompt_tokens, self.block_manager.block_size))
        self._requests[seq.request_id] = seq
        self._receiving[seq.request_id] = seq
        return True

    def receiving(self, request_id: str) -> Sequence:
        """A sequence reserve_prefilled took pages for, whose KV has not all arrived."""
        seq = self._receiving.get(request_id)
        if seq is None:
            raise RidgelineError(f"request {request_id!r} is not waiting for KV pages")
        return seq

    def admit_prefilled(self, request_id: str) -> None:
        """The reserved sequence's prompt KV is written: it joins the running batch and decodes from its next step."""
        seq = self._receiving.pop(request_id)
        self.block_manager.mark_computed(seq, seq.num_prompt_tokens)
        seq.status = SequenceStatus.RUNNING
        seq.first_scheduled_time = seq.first_scheduled_time or self.clock()
        self.running.append(seq)

    def _fork(self, parent: Sequence, child: Sequence) -> None:
        """Run child now on the parent's computed full blocks that hold the child's leading tokens. With no room
        to run now, the child queues like a new request (and, with prefix caching, still finds those pages)."""
        if len(self.running) >= self.config.max_num_seqs:
            self._enqueue(child)
            return
        child.num_computed_tokens = child.num_cached_tokens = self.block_manager.fork(parent, child)
        child.status = SequenceStatus.RUNNING
        self.running.append(child)

    def _age_waiting(self) -> None:
        """Every priority_aging_steps steps, each waiting request goes one level earlier. All of them at once, so
        the queue's order (priority, then arrival) holds as it is; what changes is where a newcomer of a given
        priority queues: behind a request that has waited long enough, whatever that one's own priority was.
        A request of priority p thus queues ahead of every later arrival of priority q <= p once it has waited
        (p - q) * priority_aging_steps steps."""
        every = self.config.priority_aging_steps
        if every is None:
            return
        self._steps_scheduled += 1
        if self._steps_scheduled % every == 0:
            for seq in self.waiting:
                seq.aged += 1

    def _release_forks(self, parent: Sequence) -> None:
        for child in self._pending_forks.pop(parent.request_id, []):
            del self._fork_parent[child.request_id]
            if parent.status is SequenceStatus.RUNNING:
                self._fork(parent, child)
            else:  # the parent finished or was aborted before its prompt was computed: start on its own
                self._enqueue(child)

    def schedule(self) -> SchedulerOutput:
        now = self.clock()
        self._age_waiting()
        budget = self.config.max_num_batched_tokens
        scheduled: dict[Sequence, ScheduledChunk] = {}  # insertion order = output order
        preempted: list[Sequence] = []

        decodes = [seq for seq in self.running if seq.num_uncomputed_tokens == 1]
        # The step's prefill tokens go by priority too: running prompts of the queue head's priority or a higher one
        # first, then the head and those behind it, and only then running prompts of lower priority. Otherwise a
        # batch tenant's long prompt, admitted earlier, takes every step's budget (chunk after chunk) while an
        # interactive request waits at the queue's head: its TTFT grew 14.8x beside one (docs/tenants.md). With
        # equal priorities `later` is empty and this is the first-come-first-served step it always was.
        prefills = sorted((seq for seq in self.running if seq.num_uncomputed_tokens > 1), key=lambda seq: seq.priority)
        head = self.waiting[0].priority if self.waiting else None
        first = [seq for seq in prefills if head is None or seq.priority <= head]
        later = prefills[len(first):]
        urgent = self._most_urgent(now)
        budget = self._schedule_running(decodes, budget, scheduled, preempted, now)
        step_budget = None
        if self.config.itl_target is not None and scheduled and budget > 0 and (prefills or self.waiting):
            step_budget = self._prefill_limit(list(scheduled.values()), budget, prefills)
            budget = min(budget, step_budget.prefill_limit)
        # The most urgent class's prompts first (those running, then those waiting), then everything of a lower
        # priority: the background, which only gets what keeps the step within that class's own ITL target
        # (_background_room). (First urgent, then background is the order above: with an urgent request waiting,
        # `first` holds no background prompt.)
        urgent_first = [seq for seq in first if urgent is None or seq.priority <= urgent]
        budget = self._schedule_running(urgent_first, budget, scheduled, preempted, now)
        budget = self._admit(budget, scheduled, preempted, now, urgent)
        background = [*first[len(urgent_first):], *later]
        if urgent is not None and budget > 0 and (background or (self.waiting and self.waiting[0].priority > urgent)):
            budget = self._background_room(list(scheduled.values()), urgent, budget,
                                           background[0] if background else self.waiting[0])
        budget = self._schedule_running(first[len(urgent_first):], budget, scheduled, preempted, now)
        budget = self._admit(budget, scheduled, preempted, now, None)
        self._schedule_running(later, budget, scheduled, preempted, now)

        chunks = list(scheduled.values())
        if step_budget is not None and step_budget.target_s is not None:
            predicted = self.step_cost([chunk.step_chunk for chunk in chunks])
            step_budget = StepBudget(step_budget.prefill_limit, step_budget.target_s, predicted)
        return SchedulerOutput(chunks=chunks, preempted=preempted, budget=step_budget)

    def _admit(self, budget: int, scheduled: dict[Sequence, ScheduledChunk], preempted: list[Sequence], now: float,
               most: int | None) -> int:
        """Admit in queue order (priority, then arrival), those of priority `most` or a higher one only (None: any);
        none after a preemption (the pool is already short), except the head that preempted lower-priority
        sequences to get in. Returns the budget left."""
        while self.waiting and budget > 0 and not preempted:
            seq = self.waiting[0]
            if most is not None and seq.priority > most:
                break
            if self._prefix_in_flight(seq):
                break  # the head waits for a running sequence to compute its prefix (see _prefix_in_flight)
            if len(self.running) >= self.config.max_num_seqs:
                refund = self._preempt_lower(seq, scheduled, preempted)
                if refund is None:
                    break
                budget += refund
            while True:
                # Prompt logprobs need logits at every prompt position, so such a request computes its whole prompt.
                wants_prompt_logits = seq.sampling_params.prompt_logprobs is not None
                cached = None if wants_prompt_logits else self.block_manager.find_cached_prefix(seq)
                num_cached = len(cached[0]) * self.block_manager.block_size if cached else 0
                num_tokens = self._chunk_size(seq.num_tokens - num_cached, budget)
                if num_tokens and self.block_manager.allocate(seq, num_tokens, cached):
                    break
                refund = None if num_tokens == 0 else self._preempt_lower(seq, scheduled, preempted)
                if refund is None:
                    num_tokens = 0
                    break
                budget += refund
            if num_tokens == 0:
                break  # nobody overtakes the head of the queue: higher priority first, then first come, first served
            self.waiting.popleft()
            if seq.status is SequenceStatus.WAITING:
                seq.num_cached_tokens = num_cached
            if self.block_manager.prefix_cache is not None:
                self.block_manager.prefix_cache.record_lookup(seq.num_tokens, num_cached)
            seq.status = SequenceStatus.RUNNING
            seq.num_computed_tokens = num_cached
            self.running.append(seq)
            scheduled[seq] = self._chunk(seq, num_tokens, now)
            budget -= num_tokens
        return budget

    def _prefix_in_flight(self, seq: Sequence) -> bool:
        """Whether a running sequence has yet to compute the next block of seq's tokens past what the prefix cache
        holds for seq (the same tokens after the same prefix: the same chain hash). Then seq is better admitted a
        step or more later, when that block and those after it are cached, than computing them a second time
        alongside: two requests for one prompt arriving together, or the second during the first's prefill, pay
        for one prefill (vLLM and SGLang wait likewise). The wait ends: running prefills are scheduled before any
        waiting request, and a preempted one is no longer running. Hits reuse KV computed exactly as seq would
        compute it, so no token changes."""
        manager = self.block_manager
        if manager.prefix_cache is None or seq.sampling_params.prompt_logprobs is not None or not self.running:
            return False
        bs = manager.block_size
        block = len(manager.find_cached_prefix(seq)[0])
        if block >= (seq.num_tokens - 1) // bs:
            return False  # the hit already has every block a hit can have
        end = (block + 1) * bs
        wanted = manager.block_hashes(seq, block + 1)[block]
        return any(other.num_computed_tokens < end <= other.num_tokens and manager.block_hashes(other, block + 1)[block] == wanted
                   for other in self.running)

    def _schedule_running(self, seqs: list[Sequence], budget: int, scheduled: dict[Sequence, ScheduledChunk],
                          preempted: list[Sequence], now: float) -> int:
        """Schedule running sequences in order within `budget`, preempting the most recently admitted when
        pages run out; returns the budget left."""
        for seq in seqs:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this step
                continue
            num_tokens = self._chunk_size(seq.num_uncomputed_tokens, budget)
            if num_tokens == 0:
                continue
            draft: tuple[int, ...] = ()
            if self.proposer is not None and seq.num_uncomputed_tokens == 1:
                draft = tuple(self.proposer(seq, min(budget - 1, self._draft_room(seq))))
                num_tokens += len(draft)
            while not self.block_manager.allocate(seq, num_tokens):
                victim = self._pop_victim()
                self._preempt(victim)
                preempted.append(victim)
                if victim in scheduled:  # a later-admitted decode loses its slot to an earlier prefill
                    budget += scheduled.pop(victim).num_tokens
                if victim is seq:
                    break
            else:
                scheduled[seq] = self._chunk(seq, num_tokens, now, draft)
                budget -= num_tokens
        return budget

    def _pop_victim(self) -> Sequence:
        """Take the running sequence to preempt out of `running`: the lowest priority (largest value), and of
        those the most recently admitted (with equal priorities, the last one, as first come, first served has it)."""
        index = max(range(len(self.running)), key=lambda i: (self.running[i].priority, i))
        return self.running.pop(index)

    def _preempt_lower(self, seq: Sequence, scheduled: dict[Sequence, ScheduledChunk],
                       preempted: list[Sequence]) -> int | None:
        """Make room for the waiting `seq` by preempting one running sequence of strictly lower priority (the
        victim _pop_victim would pick); returns the tokens of this step's budget its dropped chunk gave back, or
        None, changing nothing, when there is no such sequence. A request is never preempted for one of its own
        priority or a lower one, so with equal priorities this never preempts."""
        if not self.running or max(other.priority for other in self.running) <= seq.priority:
            return None
        victim = self._pop_victim()
        self._preempt(victim)
        preempted.append(victim)
        chunk = scheduled.pop(victim, None)
        return 0 if chunk is None else chunk.num_tokens

    def _prefill_limit(self, decode_chunks: list[ScheduledChunk], budget: int, prefills: list[Sequence]) -> StepBudget:
        """The most prefill tokens (at least one page, at most `budget`) that keep the predicted time of a step of
        these decodes plus that prefill within the ITL target. Until the model can predict, the least: streams
        keep their pace while the first steps teach the estimate."""
        target, least = self.config.itl_target, min(self._least_prefill(prefills), budget)
        base = [chunk.step_chunk for chunk in decode_chunks]
        if self.step_cost(base) is None:
            return StepBudget(least, None, None)
        if target.seconds is not None:
            limit_s = target.seconds
        else:
            # The decodes of the batch the queue is heading to: those running now and, up to max_num_seqs, the
            # prompts being prefilled or waiting, each a row at its prompt's end once it decodes.
            room = self.config.max_num_seqs - len(decode_chunks)
            coming = [(seq.num_tokens, 1, True) for seq in itertools.islice(itertools.chain(prefills, self.waiting), room)]
            limit_s = target.decode_multiple * self.step_cost(base + coming)
        # The prefill priced as one chunk from where the next prompt stands (a running one's, or the queue's head's).
        start = prefills[0].num_computed_tokens if prefills else 0

        def fits(tokens: int) -> bool:
            predicted = self.step_cost(base + [(start, tokens, True)])
            return predicted is not None and predicted <= limit_s

        return StepBudget(last_that_fits(fits, least, budget), limit_s, None)

    def _most_urgent(self, now: float) -> int | None:
        """The most urgent priority around: of the running sequences and the queue's head, or one that was the most
        urgent present within the last `priority_hold_s` seconds. None without an ITL target (nothing to bound
        the background by). The memory is for a stream of urgent requests: between one request's end and the next
        one's arrival (a client's round trip, its tokenising) none of them is here, and a step of background
        prefill that started then, priced as if nothing urgent could come, would be what the next one waits for."""
        if self.config.itl_target is None:
            return None
        present = [seq.priority for seq in self.running]
        if self.waiting:
            present.append(self.waiting[0].priority)  # the queue is sorted: its head is its most urgent
        if present:
            self._urgent_seen[min(present)] = now
        hold = self.config.priority_hold_s
        for priority in [p for p, seen in self._urgent_seen.items() if now - seen > hold]:
            del self._urgent_seen[priority]
        return min(self._urgent_seen, default=None)

    def _background_room(self, chunks: list[ScheduledChunk], urgent: int, budget: int, first: Sequence) -> int:
        """The prefill tokens work of a lower priority than `urgent` may take in a step that already holds
        `chunks`: as many as keep the step within the ITL target of the urgent class alone, at least one (the
        background always advances), at most `budget`. The target is the configured one, or decode_multiple x
        the predicted decode step of the urgent class's own batch (its sequences running and those waiting, at
        least one row): what its streams' gaps are bounded by when nothing else runs, so a lower priority no
        longer stretches them, nor keeps an urgent newcomer waiting behind a long step of its own prefill.
        No floor of a page or of a share of the backlog, as _least_prefill gives a step's prefill: on this
        machine's default model a prompt token costs ~1.45 ms against a ~16 ms decode step of two streams
        (benchmarks/tenants_load.py), so that floor (50-70 tokens for two 600-word prompts) made the
        interactive tenant's steps ~110 ms, 4.4x its p99 alone."""
        target, least = self.config.itl_target, min(1, budget)
        base = [chunk.step_chunk for chunk in chunks]
        if self.step_cost(base) is None:
            return least
        if target.seconds is not None:
            limit_s = target.seconds
        else:
            ours = [seq for seq in self.running if seq.priority <= urgent]
            ours += itertools.islice(itertools.takewhile(lambda seq: seq.priority <= urgent, self.waiting),
                                     self.config.max_num_seqs)
            rows = [(seq.num_tokens, 1, True) for seq in ours[:self.config.max_num_seqs]] or [(0, 1, True)]
            limit_s = target.decode_multiple * self.step_cost(rows)
        start = first.num_computed_tokens

        def fits(tokens: int) -> bool:
            predicted = self.step_cost(base + [(start, tokens, True)])
            return predicted is not None and predicted <= limit_s

        return last_that_fits(fits, least, budget)

    def _least_prefill(self, prefills: list[Sequence]) -> int:
        """The least prefill a step with decodes takes: a sixteenth of the backlog (the uncomputed tokens of the
        prompts being prefilled and waiting), at least a page, at most min_prefill_tokens. So a backlog is through
        in at most ~16 steps however tight the target. A big backlog (a burst) is what a small floor hurts; one
        short prompt joining a few streams is not, and there a small slice keeps the streams' gaps even: with the
        budget's sixteenth as the floor, each 100-token prompt joining 8 streams went in whole, one 4x step."""
        backlog, enough = 0, 16 * self.min_prefill_tokens
        for seq in itertools.chain(prefills, self.waiting):  # (a long queue: stop once the cap is reached)
            backlog += seq.num_uncomputed_tokens
            if backlog >= enough:
                break
        return max(self.block_manager.block_size, min(backlog // 16, self.min_prefill_tokens))

    def update(self, output: SchedulerOutput, sampled_token_ids: list[int] | list[list[int]],
               stop_string_hits: Collection[str] = ()) -> list[Sequence]:
        """Record that output's chunks were computed and append the sampled token of each sampling chunk (in
        output.sampling_chunks order; a chunk with guessed tokens gives a list: the accepted guesses and one more,
        cut by accepted_prefix). `stop_string_hits` names the requests whose new token completed a stop string
        (found in the detokenised text by the output processor): they finish with reason "stop". Returns the
        sequences that finished. Sequences aborted or finished since schedule() are skipped."""
        if len(sampled_token_ids) != len(output.sampling_chunks):
            raise ValueError(f"expected {len(output.sampling_chunks)} sampled tokens, got {len(sampled_token_ids)}")
        now = self.clock()
        tokens = iter(sampled_token_ids)
        finished = []
        for chunk in output.chunks:
            token_id = next(tokens) if chunk.samples else None
            seq = chunk.seq
            if seq.status is not SequenceStatus.RUNNING:
                continue
            if chunk.draft_token_ids:
                self._update_verified(seq, chunk, token_id if isinstance(token_id, list) else [token_id], now,
                                      stop_string_hits, finished)
                continue
            if isinstance(token_id, list):
                (token_id,) = token_id
            end = chunk.start + chunk.num_tokens
            self.num_prefilled_tokens += max(0, min(end, seq.num_prompt_tokens) - chunk.start)
            # Pages filled by this pass become hits for later requests (not earlier: their KV was not written).
            # A prefill worker's sequence keeps what a repeat of its prompt needs on the engine its pages go to.
            self.block_manager.mark_computed(seq, end, keep_for_transfer=seq.hold_kv)
            if end >= seq.num_prompt_tokens and seq.request_id in self._pending_forks:
                self._release_forks(seq)  # before seq can finish below and free the pages its forks share
            if token_id is None:
                if end == seq.num_tokens:  # max_tokens=0: the prompt was only scored
                    self._finish(seq, "length")
                    finished.append(seq)
                continue
            seq.append_token(token_id, now)
            reason = "stop" if seq.request_id in stop_string_hits else self._stop_reason(seq, token_id)
            if reason is not None:
                self._finish(seq, reason)
                finished.append(seq)
        return finished

    def _update_verified(self, seq: Sequence, chunk: ScheduledChunk, token_ids: list[int], now: float,
                         stop_string_hits: Collection[str], finished: list[Sequence]) -> None:
        """A decode that verified guesses: its last token and the accepted guesses now have KV; append the new
        tokens; give back the pages that only rejected guesses used."""
        for token_id in token_ids:
            seq.append_token(token_id, now)
        # KV is valid for the last token and the guesses accepted before the final new token.
        self.block_manager.mark_computed(seq, chunk.start + len(token_ids))
        self.block_manager.trim(seq, seq.num_tokens)
        reason = "stop" if seq.request_id in stop_string_hits else self._stop_reason(seq, token_ids[-1])
        if reason is not None:
            self._finish(seq, reason)
            finished.append(seq)

    def finish_request(self, request_id: str, reason: str) -> Sequence | None:
        """End a request now (a stop string the detokenizer found, or an abort) and free its pages at once.
        Unknown or already finished ids are ignored (an abort can race the request's own finish)."""
        seq = self._requests.get(request_id)
        if seq is not None:
            self._finish(seq, reason)
        return seq

    def abort(self, request_id: str) -> Sequence | None:
        return self.finish_request(request_id, "abort")

    def _chunk_size(self, num_uncomputed: int, budget: int) -> int:
        if num_uncomputed <= budget:
            return num_uncomputed
        # Without chunking, a prefill waits until it fits whole, unless it could never fit (a preempted
        # sequence whose generated tokens grew it past the budget): that one is split anyway.
        if self.config.enable_chunked_prefill or num_uncomputed > self.config.max_num_batched_tokens:
            return budget
        return 0

    def _chunk(self, seq: Sequence, num_tokens: int, now: float, draft: tuple[int, ...] = ()) -> ScheduledChunk:
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = now
        start = seq.num_computed_tokens
        samples = start + num_tokens - len(draft) == seq.num_tokens and seq.sampling_params.max_tokens != 0
        return ScheduledChunk(seq, start, num_tokens, samples, tuple(map(tuple, seq.block_tables)), draft)

    def _draft_room(self, seq: Sequence) -> int:
        """How many guessed tokens a decode may verify: a step appends the accepted ones plus one more, which
        must stay within max_tokens and the longest sequence."""
        room = self.max_seq_len - seq.num_tokens - 1
        if seq.sampling_params.max_tokens is not None:
            room = min(room, seq.sampling_params.max_tokens - len(seq.output_token_ids) - 1)
        return room

    def accepted_prefix(self, seq: Sequence, token_ids: list[int]) -> list[int]:
        """The tokens of `token_ids` (several, after a verified guess) the sequence takes: up to and including the
        first that ends it (EOS, a stop token, max_tokens, the longest sequence)."""
        if len(token_ids) <= 1:
            return token_ids
        params, output_len, total = seq.sampling_params, len(seq.output_token_ids), seq.num_tokens
        for index, token_id in enumerate(token_ids):
            ends = ((token_id in self.eos_token_ids and not params.ignore_eos) or token_id in params.stop_token_ids
                    or (params.max_tokens is not None and output_len + index + 1 >= params.max_tokens)
                    or total + index + 1 >= self.max_seq_len)
            if ends:
                return token_ids[:index + 1]
        return token_ids

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.PREEMPTED
        self._requeue(seq)
        self.num_preemptions += 1

    def _enqueue(self, seq: Sequence) -> None:
        """Queue a new request behind every waiting one of its priority or a higher one (plain append when all
        priorities are equal)."""
        if not self.waiting or self.waiting[-1].priority <= seq.priority:
            self.waiting.append(seq)
            return
        index = next((i for i, other in enumerate(self.waiting) if other.priority > seq.priority), len(self.waiting))
        self.waiting.insert(index, seq)

    def _requeue(self, seq: Sequence) -> None:
        """Queue a preempted sequence ahead of every waiting one of its priority or a lower one (it was admitted
        before them), behind those of higher priority (the front of the queue when all priorities are equal)."""
        if not self.waiting or self.waiting[0].priority >= seq.priority:
            self.waiting.appendleft(seq)
            return
        index = next((i for i, other in enumerate(self.waiting) if other.priority >= seq.priority), len(self.waiting))
        self.waiting.insert(index, seq)

    def _stop_reason(self, seq: Sequence, token_id: int) -> str | None:
        params = seq.sampling_params
        if (token_id in self.eos_token_ids and not params.ignore_eos) or token_id in params.stop_token_ids:
            return "stop"
        if params.max_tokens is not None and len(seq.output_token_ids) >= params.max_tokens:
            return "length"
        if seq.num_tokens >= self.max_seq_len:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str) -> None:
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.request_id in self._receiving:
            del self._receiving[seq.request_id]
        elif seq.request_id in self._fork_parent:
            self._pending_forks[self._fork_parent.pop(seq.request_id)].remove(seq)
        else:
            self.waiting.remove(seq)
        if seq.hold_kv and reason != "abort":
            self.held[seq.request_id] = seq  # its pages stay referenced until release_held
        else:
            self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_time = self.clock()
        del self._requests[seq.request_id]
        if seq.request_id in self._pending_forks:
            self._release_forks(seq)


def last_that_fits(fits: Callable[[int], bool], least: int, most: int) -> int:
    """The largest token count in [least, most] that fits, by bisection (a step-cost model grows with tokens), or
    `least` when not even that does: a step always makes some progress on its prompt."""
    if not fits(least):
        return least
    low, high = least, most
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low
