"""A router built from its TOML file: tiers placed in a memory budget (the ones left out say why), `auto`
calibrated on a traffic sample; and the CLI's one-line errors."""

import asyncio
import json
import os
import subprocess
import sys

from ridgeline.cluster.build import build_router, estimate_tokens
from ridgeline.cluster.config import load_config
from ridgeline.napkin.hardware import catalogue
from server_helpers import tiny_model_path


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from ridgeline.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=120, env=os.environ)


def test_memory_budget_leaves_out_what_does_not_fit_and_says_why(tmp_path):
    sample = tmp_path / "sample.jsonl"
    sample.write_text("\n".join(json.dumps({"prompt": "word " * n}) for n in (1, 3, 10, 40, 120, 300)))
    config_path = tmp_path / "router.toml"
    config_path.write_text(f"""
[router]
memory = "5MiB"
target_large_share = 0.5
calibration_sample = "sample.jsonl"
health_interval_s = 3600

[[backend]]
model = "small"
path = "{tiny_model_path()}"
replicas = 2
kv_cache_memory = "1MiB"
kv_cache_dtype = "fp32"
quality = 0.3
prefill_tokens_per_s = 5000
decode_tokens_per_s = 200

[[backend]]
model = "large"
path = "{tiny_model_path()}"
kv_cache_memory = "1MiB"
kv_cache_dtype = "fp32"
quality = 0.8
prefill_tokens_per_s = 1000
decode_tokens_per_s = 40

[[backend]]
model = "huge"
path = "{tiny_model_path()}"
kv_cache_memory = "8MiB"
quality = 0.9
""")
    hardware = next(iter(catalogue().values()))

    async def main():
        built = await build_router(load_config(config_path), hardware=hardware)
        try:
            placed = {p.backend.model: p for p in built.placements}
            assert placed["small"].loaded and placed["large"].loaded
            assert not placed["huge"].loaded and "needs" in placed["huge"].reason and "budget left" in placed["huge"].reason
            router = built.router
            assert router.model_names() == ["small", "large"]
            texts = ["word " * n for n in (1, 3, 10, 40, 120, 300)]
            decisions = [router.decide_auto(estimate_tokens(t, 4.0), None, t).model for t in texts]
            assert 2 <= decisions.count("large") <= 4 and decisions[0] == "small" and decisions[-1] == "large"
            assert router.groups["small"].max_model_len > 0
        finally:
            await built.router.close()

    asyncio.run(main())


def test_cli_errors_are_one_line(tmp_path):
    result = cli("router", str(tmp_path / "missing.toml"))
    assert result.returncode == 1 and "router config not found" in result.stderr and "Traceback" not in result.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[[backend]]\nmodel = "a"\nkind = "tcp"\n')
    result = cli("router", str(bad))
    assert result.returncode == 1 and "kind must be one of" in result.stderr
    result = cli("quantize", str(tiny_model_path()), str(tmp_path / "o.gguf"), "--type", "q3_z")
    assert result.returncode == 1 and "unknown quantisation type" in result.stderr


def test_the_replica_policy_is_the_configs_or_the_flags(tmp_path):
    import pytest

    from ridgeline.cli.router import with_policy
    from ridgeline.cluster.config import parse_config
    from ridgeline.errors import RidgelineError

    backend = {"model": "m", "path": str(tiny_model_path()), "replicas": 2, "kv_cache_memory": "1MiB",
               "kv_cache_dtype": "fp32", "prefill_tokens_per_s": 1000, "decode_tokens_per_s": 100}
    assert parse_config({"backend": [backend]}).router.policy == "cost"
    config = parse_config({"router": {"policy": "round_robin", "health_interval_s": 3600}, "backend": [backend]})
    with pytest.raises(RidgelineError, match="policy must be one of cost, round_robin"):
        parse_config({"router": {"policy": "random"}, "backend": [backend]})
    assert with_policy(config, "cost").router.policy == "cost"
    with pytest.raises(RidgelineError, match="policy"):
        with_policy(config, "fastest")

    async def main():
        built = await build_router(config, hardware=next(iter(catalogue().values())))
        try:
            order = [built.router.rank("m", 10)[0].replica for _ in range(4)]
            assert order == ["m/0", "m/1", "m/0", "m/1"]  # each in turn
        finally:
            await built.router.close()

    asyncio.run(main())
