"""A calibration the simulator should not trust is refused or flagged (issue 32): a fit above MAX_FIT_ERROR, or
one measured while other processes held the cores (machine/busy.py); and the fit's terms are identifiable."""

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from ridgeline.cli import register_commands
from ridgeline.cli.app import app as cli_app
from ridgeline.errors import RidgelineError
from ridgeline.machine import busy
from ridgeline.machine.busy import BUSY_LIMIT, LoadMeter, LoadReading
from ridgeline.napkin.model_specs import model_spec
from ridgeline.sim.calibrated import MAX_FIT_ERROR, TERMS, CalibratedStepTime, Profile, fit_coefficients, features
from ridgeline.sim import profile as profile_module
from ridgeline.sim.engine_path import EnginePath
from ridgeline.sim.stamp import Stamp
from ridgeline.sim.step_time import TermsOf

STAMP = Stamp("0" * 40, "test cpu", 2, "test-model")
TORCH_PATH = EnginePath(decode_tile=8, prompt_tile=64, logit_tile=8, chunk_span_attention=True, logits_every_chunk=True)
COMPILED_PATH = EnginePath(logits_every_chunk=True)
QUIET = LoadReading(600.0, 0.01, 0.9)
BUSY = LoadReading(600.0, 0.45, 0.5)


def write_proc(root, cpu: list[int], processes: dict[int, tuple[int, int, int]]) -> None:
    """A /proc with a /proc/stat of `cpu` jiffies (user nice system idle iowait irq softirq steal) and one
    /proc/PID/stat per process: pid -> (ppid, utime + stime, cutime + cstime)."""
    root.mkdir(exist_ok=True)
    (root / "stat").write_text("cpu  " + " ".join(map(str, cpu)) + " 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")
    for entry in root.iterdir():
        if entry.is_dir():
            (entry / "stat").unlink()
            entry.rmdir()
    for pid, (ppid, own, children) in processes.items():
        (root / str(pid)).mkdir()
        # comm with a space and a parenthesis, as a real one may have; fields 14-17 are utime stime cutime cstime
        fields = ["S", ppid] + [0] * 9 + [own, 0, children, 0] + [0] * 30
        (root / str(pid) / "stat").write_text(f"{pid} (python (x) y) " + " ".join(map(str, fields)))


def test_the_load_meter_counts_what_other_processes_took(tmp_path):
    proc = tmp_path / "proc"
    # Ours: 10 (this process), its server 20 and the server's worker 30; 99 is somebody else's.
    write_proc(proc, [1000, 0, 100, 5000, 0, 0, 0, 0], {10: (1, 100, 0), 20: (10, 300, 0), 30: (20, 50, 0),
                                                          99: (1, 400, 0)})
    meter = LoadMeter(proc, roots=(10,))
    meter.start()
    # 2,000 jiffies later, 1,200 of them busy: ours grew by 100 + 500 + 200 = 800, steal (another guest) 100,
    # the other process 300.
    write_proc(proc, [2000, 0, 200, 5800, 0, 0, 0, 100], {10: (1, 200, 0), 20: (10, 800, 0), 30: (20, 250, 0),
                                                           99: (1, 700, 0)})
    reading = meter.stop()
    assert reading.other_share == pytest.approx(400 / 2000)
    assert reading.our_share == pytest.approx(800 / 2000)
    assert reading.busy and "20% of the cores' time" in reading.describe()


def test_a_child_that_exits_inside_the_window_stays_ours(tmp_path):
    proc = tmp_path / "proc"
    write_proc(proc, [100, 0, 0, 900, 0, 0, 0, 0], {10: (1, 50, 0), 20: (10, 40, 0)})
    meter = LoadMeter(proc, roots=(10,))
    meter.start()
    # The server (20) ran 500 more jiffies, was stopped and waited for: its 540 are now this process's cutime.
    write_proc(proc, [660, 0, 0, 1300, 0, 0, 0, 0], {10: (1, 110, 540)})
    reading = meter.stop()
    assert reading.other_share == pytest.approx(0.0)
    assert not reading.busy


def test_a_fit_taken_under_load_or_above_the_error_limit_is_flagged(tmp_path):
    terms_of = TermsOf(model_spec("gemma-3-270m").shape(None), 2, TORCH_PATH)
    rng = np.random.default_rng(0)
    truth = np.array([3e-3, 2e-4, 4e-3, 9e-3, 1e-3, 2e-12, 1e-10])
    shapes = [[(int(c), 1, True)] * int(b) + [(0, int(n), True)] * int(p)
              for b, c, n, p in zip(rng.integers(1, 20, 60), rng.integers(10, 1500, 60), rng.integers(2, 1500, 60),
                                    rng.integers(0, 2, 60))]
    rows = [(terms_of.of_chunks(chunks), float(truth @ features(terms_of.of_chunks(chunks)))) for chunks in shapes]
    quiet = Profile.fit(STAMP, rows, {}, load=QUIET)
    assert quiet.flags == () and quiet.other_cpu_share == pytest.approx(0.01)
    under_load = Profile.fit(STAMP, rows, {}, load=BUSY)
    assert len(under_load.flags) == 1 and "taken under load" in under_load.flags[0] and "45%" in under_load.flags[0]
    # A neighbour that comes and goes: each step slowed by 0-3x at random, which no term explains.
    noisy = [(terms, seconds * rng.uniform(1, 4)) for terms, seconds in rows]
    bad = Profile.fit(STAMP, noisy, {}, load=QUIET)
    assert bad.median_abs_error > MAX_FIT_ERROR and len(bad.flags) == 1 and "above the 15% limit" in bad.flags[0]
    assert Profile.load(bad.save(tmp_path / "bad.json")) == bad  # the flags travel with the profile
    model = CalibratedStepTime(Profile.load(tmp_path / "bad.json"), "bad.json")
    assert any("bad.json is flagged: fit error" in warning for warning in model.warnings(True))
    assert BUSY_LIMIT < BUSY.other_share


def test_a_simulation_in_a_mode_the_calibration_never_ran_is_warned():
    profile = Profile(STAMP, (1e-3,) * len(TERMS), 20, 0.05, {}, itl_modes=("target",))
    model = CalibratedStepTime(profile, "p.json")
    assert model.warnings(True) == []
    (warning,) = model.warnings(False)
    assert "target-mode steps only, not the fixed mode" in warning


def test_decode_attention_is_priced_once_so_the_kv_read_is_identified():
    """A decode row's attention FLOPs and KV bytes are one context times two factors: format 3 fitted both, and on
    decode steps the two columns are proportional (but for a position or so per row), so a decode row's cost was split between them at random. Now
    decode rows are priced by the KV read alone (their prompt-attention term is 0), and a calibration-like set
    (decode batches of one size at short and long contexts, prompts beside them) recovers every coefficient."""
    terms_of = TermsOf(model_spec("gemma-3-270m").shape(None), 2, TORCH_PATH)
    decodes = [[(context + d, 1, True) for d in range(rows)] for rows in (4, 10, 16) for context in (60, 400, 1500)]
    ratio = [t.span_attention_flops / t.kv_read_bytes for t in map(terms_of.of_chunks, decodes)]
    assert max(ratio) / min(ratio) < 1.02  # proportional within 2 %, well inside a real step's noise
    assert all(terms_of.of_chunks(chunks).prompt_attention_flops == 0 for chunks in decodes)
    prompts = [[(start, n, True)] for start, n in ((0, 40), (0, 600), (0, 1800), (128, 900), (512, 200))]
    mixed = [d + p for d in decodes[::2] for p in prompts[::2]]
    shapes = decodes + prompts + mixed
    x = np.array([features(terms_of.of_chunks(chunks)) for chunks in shapes])
    truth = np.array([3e-3, 2e-4, 4e-3, 9e-3, 1e-3, 2e-12, 5e-11])
    coef, error = fit_coefficients(x, x @ truth)
    assert coef == pytest.approx(truth, rel=1e-6) and error < 1e-9


def test_a_term_that_copies_another_is_left_out_not_split_at_random():
    """On the compiled path every chunk computes one LM-head row: LM-head tiles equal chunks in every step, so the
    fit keeps the earlier term (chunks) and leaves the copy at 0."""
    terms_of = TermsOf(model_spec("gemma-3-270m").shape(None), 2, COMPILED_PATH)
    rng = np.random.default_rng(2)
    shapes = [[(int(c), 1, True)] * int(b) + [(0, int(n), True)] * int(p)
              for b, c, n, p in zip(rng.integers(1, 20, 50), rng.integers(10, 1500, 50), rng.integers(2, 1500, 50),
                                    rng.integers(0, 3, 50))]
    x = np.array([features(terms_of.of_chunks(chunks)) for chunks in shapes])
    assert (x[:, TERMS.index("chunks")] == x[:, TERMS.index("logit_tiles")]).all()
    y = x @ np.array([3e-3, 5e-4, 1e-4, 9e-4, 1e-3, 2e-12, 5e-11])
    coef, error = fit_coefficients(x, y)
    assert coef[TERMS.index("logit_tiles")] == 0 and coef[TERMS.index("chunks")] == pytest.approx(1.5e-3, rel=1e-4)
    assert error < 1e-6


def test_profile_refuses_a_busy_measurement_unless_forced_and_simulate_warns(tiny_hf_llama, tmp_path, monkeypatch):
    register_commands()
    monkeypatch.setattr(busy.LoadMeter, "stop", lambda self: BUSY)  # fault injection: another job held the cores
    measured = []  # the engine's grid is timed once; the forced run writes what the refused one measured
    real_measure = profile_module.measure
    monkeypatch.setattr(profile_module, "measure", lambda *args, **kwargs: measured[0] if measured
                        else measured.append(real_measure(*args, **kwargs)) or measured[0])
    out = tmp_path / "profile.json"
    grid = ["profile", "--model", str(tiny_hf_llama), "--decode-rows", "1,3", "--contexts", "8,40", "--prefill-tokens",
            "4,30", "--max-num-batched-tokens", "64", "--kv-cache-memory", "1MiB", "--block-size", "4",
            "--threads", str(torch.get_num_threads()), "--out", str(out)]
    refused = CliRunner().invoke(cli_app, grid)
    assert refused.exit_code != 0 and isinstance(refused.exception, RidgelineError)
    message = str(refused.exception)
    assert "\n" not in message and "refused" in message and "taken under load" in message and "--force" in message
    assert not out.exists()
    forced = CliRunner().invoke(cli_app, [*grid, "--force"])
    assert forced.exit_code == 0, forced.output
    assert "flagged: taken under load" in forced.output
    assert Profile.load(out).flags and Profile.load(out).other_cpu_share == BUSY.other_share
    simulated = CliRunner().invoke(cli_app, [
        "simulate", "--model", str(tiny_hf_llama), "--calibrated", "--profile", str(out), "--kv-cache-memory", "1MiB",
        "--block-size", "4", "--max-num-batched-tokens", "64", "--threads", str(torch.get_num_threads()),
        "--workload", "rate:50", "--num-prompts", "4", "--input-len", "20", "--output-len", "4", "--json"])
    assert simulated.exit_code == 0, simulated.output
    assert f"warning: profile {out} is flagged: taken under load" in simulated.stderr.replace("\n", " ")


def test_a_calibrated_replica_draws_the_measured_jitter_reproducibly():
    """Each simulated step is the fit's prediction times a measured/predicted ratio of the profile's own steps, drawn
    by the replica's seeded generator: the same run twice gives the same times, and the mean stays the fit's."""
    from ridgeline.engine.scheduler import SchedulerConfig
    from ridgeline.sim.kv_pool import kv_pool
    from ridgeline.sim.replica import Replica

    shape = model_spec("gemma-3-270m").shape(None)
    terms_of = TermsOf(shape, 2, COMPILED_PATH)
    settings = {"engine_path": {"logits_every_chunk": True}}
    fitted = CalibratedStepTime(Profile(STAMP, (3e-3, 5e-4, 0.0, 9e-4, 0.0, 2e-12, 5e-11), 40, 0.1, settings))
    ratios = [0.9, 0.95, 1.0, 1.3] * 10  # what each kept step took against the fit's price of it
    shapes = [((300 + i, 1, True),) * (1 + i % 5) for i in range(40)]
    steps = tuple((chunks, fitted.seconds(terms_of.of_chunks(list(chunks))) * r) for chunks, r in zip(shapes, ratios))
    profile = Profile(STAMP, fitted.coefficients, 40, 0.1, settings, steps)
    model = CalibratedStepTime(profile, None, terms_of)
    assert model.spread == pytest.approx(sorted(ratios))
    assert CalibratedStepTime(profile).spread == ()  # without the engine's counting, no jitter

    def run() -> list[float]:
        replica = Replica("replica-0", SchedulerConfig(), kv_pool(shape, 1 << 30, 16, 2), 4096, shape.vocab_size,
                          model, terms_of)
        replica.add("r", tuple(range(100)), 30, 0.0)
        now, times = 0.0, []
        while (end := replica.start_step(now)) is not None:
            times.append(end - now)
            replica.finish_step(end)
            now = end
        return times

    first = run()
    assert first == run() and len(set(first)) > 2  # repeatable, and not one fixed time
