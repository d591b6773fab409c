"""Nothing measures this machine as a long-running process starts (issue 35): `ridgeline router` and the dashboard
read `ridgeline measure`'s cache, and with no entry draw a napkin estimate whose title says NOT MEASURED and how to
measure it. A start with an empty cache writes no cache file."""

import asyncio

import pytest
from server_helpers import tiny_engine, tiny_model_path

from ridgeline.cluster.build import build_router
from ridgeline.cluster.config import load_config
from ridgeline.dashboard.feed import DashboardFeed
from ridgeline.dashboard.machine import roof_note
from ridgeline.dashboard.worker import LocalWorker
from ridgeline.machine import this_machine
from ridgeline.napkin.hardware import THIS_MACHINE


@pytest.fixture
def empty_cache(monkeypatch, tmp_path):
    """An empty cache directory, and any measurement fails the test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def measure(*args, **kwargs):
        raise AssertionError("this machine was measured at start-up")

    monkeypatch.setattr(this_machine, "measure_this_machine", measure)
    return tmp_path


def assert_unmeasured(hardware, threads: int) -> None:
    assert hardware.name == THIS_MACHINE
    assert f"NOT MEASURED, napkin estimate for {threads} thread" in hardware.title
    assert f"ridgeline measure --threads {threads}" in hardware.title
    assert all("NOT MEASURED" in hardware.sources[figure] for figure in ("bandwidth", "flops"))
    assert hardware.bandwidth > 0 and hardware.flops("fp32") > 0


def test_a_router_start_with_an_empty_cache_measures_nothing_and_says_its_priors_are_unmeasured(empty_cache):
    """A backend without configured rates gets roofline priors: drawn from the napkin estimate, said so."""
    config_path = empty_cache / "router.toml"
    config_path.write_text(f"""
[router]
hardware = "this-machine"
memory = "64MiB"
health_interval_s = 3600

[[backend]]
model = "tiny"
path = "{tiny_model_path()}"
kv_cache_memory = "1MiB"
kv_cache_dtype = "fp32"
""")

    async def start():
        built = await build_router(load_config(config_path))
        try:
            return built.hardware, built.placements, built.router.rates["tiny/0"]
        finally:
            await built.router.close()

    hardware, (placement,), rates = asyncio.run(start())
    assert_unmeasured(hardware, this_machine.default_threads(None))
    assert placement.loaded and "napkin" in placement.reason
    assert rates.source == "roofline" and rates.decode_tokens_per_s > 0
    assert list(empty_cache.rglob("*")) == [config_path]  # no cache file written


def test_a_dashboard_view_with_an_empty_cache_measures_nothing_and_shows_the_estimate_as_unmeasured(empty_cache):
    engine = tiny_engine()
    worker = LocalWorker("local", "prefill+decode", "tiny", engine, DashboardFeed(engine), THIS_MACHINE)
    panel = worker.describe(points=10)
    assert_unmeasured(worker.roofline().hardware, worker.threads)
    assert "NOT MEASURED" in panel["hardware"]["title"] and "NOT MEASURED" in panel["figure"]["title"]
    assert "NOT MEASURED" in roof_note(THIS_MACHINE)  # what `serve` prints at start-up
    assert list(empty_cache.rglob("*")) == []


def test_a_cached_entry_is_drawn_with_its_provenance_and_left_as_it_is(empty_cache):
    from ridgeline.napkin.hardware import Hardware

    threads = this_machine.default_threads(None)
    measured = Hardware(THIS_MACHINE, "", 20e9, 8e9, {"fp32": 100e9, "bf16": 200e9}, "bf16")
    provenance = this_machine.Provenance(1.8e9, threads, 3, {"bandwidth": 0.01}, "2.5.0")
    path = this_machine.cache_path()
    path.parent.mkdir(parents=True)
    this_machine._write(path, {this_machine.entry_key(threads): this_machine.MachineEntry(
        measured, provenance, {"bandwidth": [20e9]}).to_json()})
    written = path.read_bytes()
    roof = this_machine.roof_named(THIS_MACHINE, threads)
    assert roof.bandwidth == 20e9 and f"measured 2027-01-15 08:00 UTC, {threads} thread" in roof.title
    assert roof_note(THIS_MACHINE) == f"roofline of {roof.title}"
    assert path.read_bytes() == written
