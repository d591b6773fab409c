"""One simulated engine: the real Scheduler (block manager, prefix cache, layer groups) and the real admission
check, on a virtual clock.

A step here is what LLMEngine.step is: schedule, one forward pass, update. The forward pass is replaced by the
step-time model's duration, and every sampled token is SYNTHETIC_TOKEN (the requests ignore EOS and stop at
their output length, so the token's value never matters except in the prefix hashes of generated blocks).
Requests that arrive during a step join the waiting queue, which only the next schedule reads (the server's
engine thread applies its commands between steps, to the same effect). Disaggregated decode goes through the
scheduler's own KV handoff: reserve_prefilled when the offer is taken, admit_prefilled once the pages landed.
"""

import random
from dataclasses import dataclass, field

from ridgeline.engine.admission import Admission, AdmissionLimits
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from ridgeline.engine.sequence import Sequence
from ridgeline.sim.kv_pool import KVPool
from ridgeline.napkin.token_cost import split_step
from ridgeline.sim.step_time import StepTimeModel, TermsOf

SYNTHETIC_TOKEN = 0


def request_params(output_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True)


@dataclass
class ReplicaStats:
    steps: int = 0
    busy_s: float = 0.0
    kv_usage_s: float = 0.0  # integral of the pool's usage over time (usage x step duration)
    kv_usage_peak: float = 0.0
    running_s: float = 0.0  # integral of the running batch over time
    kv_imports: int = 0  # disaggregated decode: prompts whose KV arrived over the link
    kv_import_waits: int = 0  # ... offers that found no room at a step boundary and waited for the next
    tokens_computed: int = 0
    # Busy time by phase (a mixed step shared by rows: napkin/token_cost.split_step), what the $/Mtok split is by.
    prefill_s: float = 0.0
    decode_s: float = 0.0
    step_log: list[tuple[float, float, list[tuple[str, int, int]]]] | None = field(default=None)


class Replica:
    def __init__(self, name: str, config: SchedulerConfig, pool: KVPool, max_model_len: int, vocab_size: int,
                 step_time: StepTimeModel, terms_of: TermsOf, log_steps: bool = False, role: str = "colocated",
                 seed: int = 0):
        self.name, self.role = name, role  # role: colocated, prefill or decode
        self.now = 0.0
        self.rng = random.Random(f"{name}/{seed}")  # step-time jitter, seeded: a run repeats exactly
        # An ITL target prices candidate steps with the same model that times them here.
        self.scheduler = Scheduler(config, pool.num_pages, max_model_len, clock=lambda: self.now,
                                   windows=pool.windows, block_size=pool.block_size,
                                   step_cost=lambda chunks: step_time.seconds(terms_of.of_chunks(chunks)))
        self.admission = Admission(AdmissionLimits(vocab_size, self.scheduler.max_seq_len, config.max_num_batched_tokens,
                                                   config.enable_chunked_prefill))
        self.step_time, self.terms_of = step_time, terms_of
        self.offers: list[Sequence] = []  # prefilled elsewhere, waiting for pages here (disaggregated decode)
        self.landed: list[Sequence] = []  # their KV has arrived: admitted before the next schedule
        self.reserved: list[Sequence] = []  # pages reserved at the last boundary: the caller starts their transfer
        self.plan: SchedulerOutput | None = None  # the step in flight
        self.start_queued = False
        self.stats = ReplicaStats(step_log=[] if log_steps else None)

    @property
    def outstanding(self) -> int:
        return self.scheduler.num_running + self.scheduler.num_waiting + len(self.offers)

    @property
    def busy(self) -> bool:
        return self.plan is not None

    def add(self, request_id: str, prompt_ids: tuple[int, ...], output_tokens: int, now: float,
            hold_kv: bool = False) -> Sequence:
        """Admit (raises RidgelineError as the server would answer 400) and queue a request."""
        admitted = self.admission.admit_ids(list(prompt_ids), request_params(output_tokens))
        seq = Sequence(request_id, list(admitted.prompt_token_ids), admitted.params, now, hold_kv=hold_kv)
        self.scheduler.add_request(seq)
        return seq

    def start_step(self, now: float) -> float | None:
        """Take landed KV and offers, schedule, and return when the step ends (None: nothing to run, so idle)."""
        self.now = now
        for seq in self.landed:
            self.scheduler.admit_prefilled(seq.request_id)
        self.landed.clear()
        waiting = []
        for seq in self.offers:
            if self.scheduler.reserve_prefilled(seq):
                self.reserved.append(seq)
                self.stats.kv_imports += 1
            else:
                waiting.append(seq)
                self.stats.kv_import_waits += 1
        self.offers = waiting
        plan = self.scheduler.schedule()
        if not plan.chunks:
            return None
        terms = self.terms_of(plan)
        duration = self.step_time.seconds(terms)
        spread = getattr(self.step_time, "spread", ())  # a calibrated model's measured jitter (sim/calibrated.py)
        if spread:
            duration *= spread[self.rng.randrange(len(spread))]
        self.plan = plan
        stats = self.stats
        stats.steps += 1
        stats.busy_s += duration
        prefill_s, decode_s = split_step(duration, terms.prompt_rows, terms.decode_rows)
        stats.prefill_s += prefill_s
        stats.decode_s += decode_s
        stats.tokens_computed += plan.num_batched_tokens
        usage = self.scheduler.block_manager.usage
        stats.kv_usage_s += usage * duration
        stats.kv_usage_peak = max(stats.kv_usage_peak, usage)
        stats.running_s += self.scheduler.num_running * duration
        if stats.step_log is not None:
            stats.step_log.append((now, duration, [(c.seq.request_id, c.start, c.num_tokens) for c in plan.chunks]))
        return now + duration

    def finish_step(self, now: float) -> list[Sequence]:
        self.now = now
        plan, self.plan = self.plan, None
        return self.scheduler.update(plan, [SYNTHETIC_TOKEN] * len(plan.sampling_chunks))
