"""The simulator runs the engine's own scheduler: same objects, same decisions, same event times as a real
engine driven with the same step times; bad workloads and machines are refused in one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_models import build_hf_model, save_tokenizer

import ridgeline.engine.block_manager
import ridgeline.engine.prefix_cache
import ridgeline.engine.scheduler
import ridgeline.sim.replica
from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.errors import RidgelineError
from ridgeline.model.checkpoint import read_checkpoint
from ridgeline.napkin.hardware import catalogued
from ridgeline.model.model_source import shape_from_checkpoint
from ridgeline.napkin.model_specs import model_spec
from ridgeline.workload.serve_metrics import Slo
from ridgeline.sim.engine_path import NAPKIN
from ridgeline.sim.kv_pool import kv_pool
from ridgeline.sim.metrics import summarise_run
from ridgeline.sim.replica import Replica, request_params
from ridgeline.sim.roofline_time import RooflineStepTime
from ridgeline.sim.simulator import Deployment, simulate
from ridgeline.sim.step_time import StepTerms, TermsOf
from ridgeline.workload.trace import TraceRequest, read_trace, write_trace
from ridgeline.sim.workload import SimRequest, Workload, from_trace, synthetic

RIDGELINE = str(Path(sys.executable).parent / "ridgeline")
BLOCK = 4
BUDGET = 16
KV_BYTES = 4  # fp32 cache, so the tiny engine and the simulator size the same pool


class LinearStepTime:
    """A made-up but deterministic step cost: what matters is that engine and simulator use the same one."""

    name = "linear"
    path = NAPKIN

    def seconds(self, terms: StepTerms) -> float:
        return 0.002 + 0.0005 * terms.tokens + 0.0001 * terms.chunks


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("gemma3-sim")
    build_hf_model("gemma3", directory)  # sliding window of 8 on two of three layers: three layer groups
    save_tokenizer(directory)
    return str(directory)


def tiny_workload() -> list[SimRequest]:
    shared = [11 + i for i in range(12)]  # three full blocks every request starts with
    lengths = [(20, 6, 0.0), (9, 5, 0.0), (30, 4, 0.004), (14, 7, 0.02), (26, 3, 0.021), (6, 9, 0.05)]
    return [SimRequest(tuple(shared + [100 + 7 * k + i for i in range(n)]), out, t)
            for k, (n, out, t) in enumerate(lengths)]


def engine_run(model: str, num_pages_memory: int, requests: list[SimRequest], step_time) -> tuple[list, dict]:
    """A real LLMEngine whose scheduler reads a fake clock that the forward pass advances by the step time."""
    config = EngineConfig(model=model, kv_cache=KVCacheConfig(BLOCK, "fp32", num_pages_memory),
                          scheduler=SchedulerConfig(max_num_batched_tokens=BUDGET))
    engine = LLMEngine(config)
    now = [0.0]
    engine.scheduler.clock = lambda: now[0]
    terms_of = TermsOf(shape_from_checkpoint(read_checkpoint(model)), KV_BYTES)
    log, plan = [], []
    schedule, forward = engine.scheduler.schedule, engine.runner.forward

    def recording_schedule():
        plan[:] = [schedule()]
        return plan[0]

    def timed_forward(chunks):
        duration = step_time.seconds(terms_of(plan[0]))
        log.append((now[0], duration, [(c.seq.request_id, c.start, c.num_tokens) for c in plan[0].chunks]))
        result = forward(chunks)
        now[0] += duration
        return result

    engine.scheduler.schedule, engine.runner.forward = recording_schedule, timed_forward
    queue = sorted(enumerate(requests), key=lambda item: item[1].arrival_s)
    token_times = {}
    while queue or engine.has_unfinished():
        while queue and queue[0][1].arrival_s <= now[0]:  # as the server's engine thread: arrivals join between steps
            index, request = queue.pop(0)
            engine.add_request(f"req-{index}", list(request.prompt_ids), request_params(request.output_tokens),
                               arrival_time=now[0])
        if not engine.has_unfinished():
            now[0] = queue[0][1].arrival_s
            continue
        for output in engine.step():
            if output.finished:
                token_times[output.request_id] = output.timings.token_times
    return log, token_times


def test_simulator_runs_the_engine_scheduler_objects():
    shape = model_spec("llama-3.1-8b").shape("BF16")
    pool = kv_pool(shape, 1e9, 16, 2)
    replica = Replica("r0", SchedulerConfig(), pool, shape.max_context, shape.vocab_size, LinearStepTime(),
                      TermsOf(shape, 2))
    assert type(replica.scheduler) is ridgeline.engine.scheduler.Scheduler
    assert type(replica.scheduler.block_manager) is ridgeline.engine.block_manager.BlockManager
    assert type(replica.scheduler.block_manager.prefix_cache) is ridgeline.engine.prefix_cache.PrefixCache
    assert ridgeline.sim.replica.Scheduler is ridgeline.engine.scheduler.Scheduler


@pytest.mark.parametrize("pages", [400, 30], ids=["roomy", "preempting"])
def test_simulated_event_order_matches_a_real_engine(tiny_gemma3, pages):
    shape = shape_from_checkpoint(read_checkpoint(tiny_gemma3))
    page_bytes = shape.kv_bytes_per_token(KV_BYTES) / shape.num_layers * BLOCK  # one layer per group here
    memory = int(pages * page_bytes)
    requests = tiny_workload()
    step_time = LinearStepTime()
    pool = kv_pool(shape, memory, BLOCK, KV_BYTES)
    assert pool.num_pages == pages and pool.windows == (None, 8, 8)
    deploy = Deployment(shape, pool, SchedulerConfig(max_num_batched_tokens=BUDGET), step_time,
                        KV_BYTES)
    result = simulate(deploy, Workload(requests), log_steps=True)
    sim_log = result.replicas[0].stats.step_log

    real_log, real_times = engine_run(tiny_gemma3, memory, requests, step_time)
    assert [(round(t, 9), round(d, 9), chunks) for t, d, chunks in sim_log] == \
        [(round(t, 9), round(d, 9), chunks) for t, d, chunks in real_log]
    for track in result.tracks:
        assert track.token_times == pytest.approx(real_times[f"req-{track.index}"], abs=1e-9)
    engine_figures = summarise_run(result, Slo(), {}, shape.name)["engine"]
    assert engine_figures["prefix_hit_rate"] > 0  # the shared blocks were hit
    if pages == 30:
        assert engine_figures["preemptions"] > 0


def test_disaggregated_requests_decode_after_their_kv_crosses_the_link():
    shape = model_spec("llama-3.1-8b").shape("BF16")
    hardware = catalogued("nvidia-h100-sxm")
    step_time = RooflineStepTime(shape, hardware)
    pool = kv_pool(shape, 20e9, 16, 2)
    workload = synthetic(40, 600, 12, shape.vocab_size, rate=50.0, seed=3)
    deploy = Deployment(shape, pool, SchedulerConfig(), step_time, disaggregate=(1, 2))
    result = simulate(deploy, workload)
    transfer = deploy.link.seconds(shape.kv_bytes_for_context(600, 2))
    for track in result.tracks:
        assert len(track.token_times) == 12
        assert track.token_times[1] - track.token_times[0] >= transfer
    figures = summarise_run(result, Slo(), {}, shape.name)["engine"]
    assert figures["kv_transfers"] == 40
    decode = [r for r in result.replicas if r.role == "decode"]
    # The decode side computed only the tail after the handed-over blocks, never a whole prompt.
    assert sum(r.stats.tokens_computed for r in decode) < 40 * (16 + 12)


def test_shared_prefixes_hit_the_prefix_cache_only_when_it_is_on():
    shape = model_spec("llama-3.1-8b").shape("BF16")
    step_time = RooflineStepTime(shape, catalogued("nvidia-h100-sxm"))
    workload = synthetic(30, 256, 4, shape.vocab_size, rate=5.0, shared_prefix_len=128)
    rates = []
    for caching in (True, False):
        deploy = Deployment(shape, kv_pool(shape, 10e9, 16, 2), SchedulerConfig(enable_prefix_caching=caching),
                            step_time)
        rates.append(summarise_run(simulate(deploy, workload), Slo(), {}, shape.name)["engine"]["prefix_hit_rate"])
    assert rates[0] == pytest.approx(29 * 128 / (30 * 256)) and rates[1] == 0


def test_trace_round_trips_and_bad_lines_name_their_line(tmp_path):
    rows = [TraceRequest(0.5, 3, prompt_ids=(5, 6, 7)), TraceRequest(0.0, 2, prompt_tokens=9)]
    path = write_trace(tmp_path / "t.jsonl", rows)
    read = read_trace(path)
    assert [r.arrival_s for r in read] == [0.0, 0.5] and read[1].prompt_ids == (5, 6, 7)
    workload = from_trace(read, vocab_size=50)
    assert len(workload.requests[0].prompt_ids) == 9
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"arrival_s": 0, "output_tokens": 2, "prompt_tokens": 3}) + "\n"
                   + json.dumps({"arrival_s": -1, "output_tokens": 2, "prompt_tokens": 3}) + "\n")
    with pytest.raises(RidgelineError, match="line 2.*arrival_s"):
        read_trace(bad)
    with pytest.raises(RidgelineError, match="outside the model's vocabulary"):
        from_trace(read, vocab_size=6)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([RIDGELINE, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, fragment", [
    (["--hardware", "nvidia-h999"], "unknown hardware 'nvidia-h999'"),
    (["--hardware", "nvidia-h100-sxm", "--workload", "no-such-trace.jsonl"], "--workload must be"),
    (["--hardware", "nvidia-h100-sxm", "--disaggregate", "2"], "--disaggregate takes P:D"),
    (["--hardware", "nvidia-h100-sxm", "--workload", "rate:0"], "values must be positive, got '0'"),
    (["--hardware", "nvidia-h100-sxm", "--workload", "concurrency:two"], "takes a comma-separated list of numbers"),
    (["--calibrated", "--profile", "no-such-profile.json"], "no profile at no-such-profile.json"),
])
def test_cli_refuses_bad_simulations_in_one_line(args, fragment):
    result = run_cli("simulate", "--model", "llama-3.1-8b", *args)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], result.stderr
