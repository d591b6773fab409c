"""`ridgeline serve` never measures this machine at start-up (machine/this_machine.py): it reads the cached entry for
its thread count, and the dashboard draws that entry's roof, provenance and all; with none cached it starts as fast,
and says how to measure."""

import json

import httpx
import torch

from ridgeline.dashboard.machine import roof_note
from ridgeline.machine import this_machine
from ridgeline.napkin.hardware import Hardware
from server_helpers import serve_tiny_model_process

SEEDED_AT = 1_700_000_000.0  # 2023-11-14 22:13 UTC: a measurement no start-up could have made


def seed_entry(threads: int) -> this_machine.MachineEntry:
    """A cached entry for `threads` with figures no real measurement reads, written as `ridgeline measure` writes."""
    hardware = Hardware(name="this-machine", title="", bandwidth=12.5e9, memory_bytes=8e9,
                        dense_flops={"bf16": 123e9, "fp32": 61e9}, default_precision="bf16")
    provenance = this_machine.Provenance(SEEDED_AT, threads, 3, {"bandwidth": 0.04, "bf16": 0.01, "fp32": 0.0},
                                         torch.__version__)
    entry = this_machine.MachineEntry(hardware, provenance, {"bandwidth": [12.5e9] * 3})
    path = this_machine.cache_path()
    path.parent.mkdir(parents=True)
    this_machine._write(path, {this_machine.entry_key(threads): entry.to_json()})
    return entry


def test_serve_start_does_not_measure_this_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with serve_tiny_model_process("--threads", "1") as (process, url):
        assert httpx.get(f"{url}/health", timeout=30).status_code == 200
        # Measuring writes the cache; a started server has written nothing.
        assert not this_machine.cache_path().exists()


def test_serve_draws_the_cached_roof_with_its_provenance(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    seed_entry(threads=1)
    before = this_machine.cache_path().read_text()
    with serve_tiny_model_process("--threads", "1") as (process, url):
        state = httpx.get(f"{url}/dashboard/state", params={"points": 1}, timeout=60).json()
    (worker,) = state["workers"]
    assert worker["figure"]["bandwidth"] == 12.5e9
    title = worker["hardware"]["title"]
    assert "measured 2023-11-14 22:13 UTC, 1 thread, best of 3 rounds, spread up to 4% (bandwidth)" in title
    assert this_machine.cache_path().read_text() == before  # read, never re-measured
    assert json.loads(before)["entries"]


def test_without_an_entry_serve_says_how_to_measure(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    threads = torch.get_num_threads()
    note = roof_note("this-machine")
    assert "NOT MEASURED" in note and f"`ridgeline measure --threads {threads}` measures it" in note
    assert not this_machine.cache_path().exists()
    seed_entry(threads)
    assert roof_note("this-machine").startswith("roofline of this machine (") and "measured 2023-11-14" in roof_note("this-machine")
