"""One simulated engine: the real Scheduler (block manager, prefix cache, layer groups) on a virtual clock.

A step here is what LLMEngine.step is: schedule, one forward pass, update. The forward pass is replaced by the
step-time model's duration, and every sampled token is SYNTHETIC_TOKEN (the requests ignore EOS and stop at
their output length, so the token's value never matters except in the prefix hashes of generated blocks).
Requests that arrive during a step join the waiting queue, which only the next schedule reads (the server's
engine thread applies its commands between steps, to the same effect).
"""

from dataclasses import dataclass, field

from ridgeline.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.sequence import Sequence
from ridgeline.sim.kv_pool import KVPool
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
    kv_import_misses: int = 0  # ... but found no room, so the decode side recomputes them
    tokens_computed: int = 0
    step_log: list[tuple[float, float, list[tuple[str, int, int]]]] | None = field(default=None)


class Replica:
    def __init__(self, name: str, config: SchedulerConfig, pool: KVPool, max_model_len: int,
                 step_time: StepTimeModel, terms_of: TermsOf, log_steps: bool = False, role: str = "colocated"):
        self.name, self.role = name, role  # role: colocated, prefill or decode
        self.now = 0.0
        self.scheduler = Scheduler(config, pool.num_pages, max_model_len, clock=lambda: self.now, windows=pool.windows)
        self.step_time, self.terms_of = step_time, terms_of
        # (sequence, tokens whose KV arrived over the link): landed before the next schedule (disaggregated decode).
        self.imports: list[tuple[Sequence, int]] = []
        self.plan: SchedulerOutput | None = None  # the step in flight
        self.start_queued = False
        self.stats = ReplicaStats(step_log=[] if log_steps else None)

    @property
    def outstanding(self) -> int:
        return self.scheduler.num_running + self.scheduler.num_waiting

    @property
    def busy(self) -> bool:
        return self.plan is not None

    def start_step(self, now: float) -> float | None:
        """Admit what arrived, schedule, and return when the step ends (None: nothing to run, the replica idles)."""
        self.now = now
        for seq, num_tokens in self.imports:
            self._import_kv(seq, num_tokens)
        self.imports.clear()
        plan = self.scheduler.schedule()
        if not plan.chunks:
            return None
        duration = self.step_time.seconds(self.terms_of(plan))
        self.plan = plan
        stats = self.stats
        stats.steps += 1
        stats.busy_s += duration
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

    def _import_kv(self, seq: Sequence, num_tokens: int) -> None:
        """Land a prompt's KV from a prefill replica: the pages are filled and named in the prefix cache, so the
        scheduler admits seq with them as a prefix hit, exactly how a KV connector hands pages to vLLM. Only full
        blocks are named, so the last partial block and the first token are recomputed here (a handful of tokens)."""
        blocks = self.scheduler.block_manager
        carrier = Sequence(f"{seq.request_id}/kv", seq.token_ids[:num_tokens], seq.sampling_params, self.now)
        self.stats.kv_imports += 1
        if blocks.prefix_cache is None or not blocks.allocate(carrier, num_tokens):
            self.stats.kv_import_misses += 1
            return
        blocks.mark_computed(carrier, num_tokens)
        blocks.free(carrier)
