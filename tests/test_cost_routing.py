"""`auto` told to minimise cost: the cheapest model predicted to meet the TTFT/ITL SLO, else the one missing it
least; the router's $/Mtok per replica in /metrics; and the config that asks for it."""

from dataclasses import dataclass

import pytest

from ridgeline.cluster.config import parse_config
from ridgeline.cluster.rates import Rates
from ridgeline.cluster.router import ModelGroup, Router
from ridgeline.cluster.tier_policy import TierCandidate, decide_cheapest
from ridgeline.errors import RidgelineError


def test_the_cheaper_tier_wins_while_it_meets_the_slo():
    small = TierCandidate("small", 0.5, 1.0, "small/0", usd=0.001, ttft_s=0.2, itl_s=0.03)
    large = TierCandidate("large", 0.9, 2.0, "large/0", usd=0.004, ttft_s=0.4, itl_s=0.04)
    decision = decide_cheapest([small, large], 0.5, slo_ttft_s=0.5, slo_itl_s=0.05)
    assert (decision.model, decision.kind) == ("small", "cheapest_in_slo")
    assert decision.usd == {"small": 0.001, "large": 0.004}
    # The cheaper one misses the ITL target: the dearer one that meets it.
    slow_small = TierCandidate("small", 0.5, 1.0, "small/0", usd=0.001, ttft_s=0.2, itl_s=0.08)
    assert decide_cheapest([slow_small, large], 0.5, 0.5, 0.05).model == "large"
    # Neither meets it: the one that misses it by least, whatever it costs.
    late_large = TierCandidate("large", 0.9, 2.0, "large/0", usd=0.004, ttft_s=0.7, itl_s=0.04)
    missed = decide_cheapest([slow_small, late_large], 0.5, 0.5, 0.05)
    assert (missed.model, missed.kind) == ("large", "slo_missed")  # 0.7 / 0.5 = 1.4x its TTFT; small 1.6x its ITL
    with pytest.raises(ValueError, match="price"):
        decide_cheapest([small, TierCandidate("free", 0.5, 1.0)], 0.5, 0.5, 0.05)


@dataclass
class FakeReplica:
    """Enough of a replica for the router's decisions (none of these tests sends a request)."""

    name: str
    model: str
    kind: str = "engine"


def two_tier_router(small_decode_tokens_per_s: float) -> Router:
    groups = [ModelGroup("small", 0.5, [FakeReplica("small/0", "small")]),
              ModelGroup("large", 0.9, [FakeReplica("large/0", "large")])]
    rates = {"small/0": Rates(2000.0, small_decode_tokens_per_s, "configured"),
             "large/0": Rates(1000.0, 50.0, "configured")}
    return Router(groups, rates, health_interval_s=3600, learn_rates=False, prices={"small/0": 1.0, "large/0": 4.0},
                  objective="cost", slo_ttft_s=0.5, slo_itl_s=0.05)


def test_router_auto_minimises_cost_subject_to_the_slo():
    # 100 prompt tokens, 10 out. small: TTFT 100 / 2000 = 0.05 s, ITL 1 / 100 = 0.01 s at $1/h; large: 0.1 s and
    # 0.02 s at $4/h. Both meet 0.5 s / 0.05 s, and small is cheaper.
    router = two_tier_router(100.0)
    decision = router.decide_auto(100, 10, "hi")
    assert (decision.model, decision.kind) == ("small", "cheapest_in_slo")
    # small: 100 prompt tokens at $1/h / 2000 tok/s ($0.1389/Mtok) + 10 at $1/h / 100 tok/s ($2.778/Mtok).
    assert decision.usd["small"] == pytest.approx((100 / 2000 + 10 / 100) / 3600)
    assert decision.usd["large"] == pytest.approx(4 * (100 / 1000 + 10 / 50) / 3600)
    # Decoding at 10 tokens/s, small's ITL is 0.1 s: over the SLO, so the dearer large model takes the request.
    assert router_decides(two_tier_router(10.0)) == "large"
    assert router.metrics.registry.get_sample_value("ridgeline_router_auto_decisions_total",
                                                    {"model": "small", "kind": "cheapest_in_slo"}) == 1


def router_decides(router: Router) -> str:
    return router.decide_auto(100, 10, "hi").model


def test_router_reports_dollars_per_million_tokens_per_replica():
    router = two_tier_router(100.0)
    for name in router.replicas:
        router._update_gauges(name)

    def gauge(replica: str, tokens: str) -> float:
        return router.metrics.registry.get_sample_value("ridgeline_router_usd_per_mtok",
                                                        {"replica": replica, "tokens": tokens})

    assert gauge("small/0", "prompt") == pytest.approx(1.0 / 3600 / 2000 * 1e6)  # $0.1389
    assert gauge("small/0", "completion") == pytest.approx(1.0 / 3600 / 100 * 1e6)  # $2.778
    assert gauge("large/0", "completion") == pytest.approx(4.0 / 3600 / 50 * 1e6)  # $22.22
    assert b"ridgeline_router_usd_per_mtok" in router.metrics.render()


def test_the_config_asks_for_the_cost_objective_and_a_price_per_backend():
    backends = [{"model": "small", "usd_per_hour": 1.0}, {"model": "large", "usd_per_hour": 4.0}]
    config = parse_config({"router": {"objective": "cost", "slo_itl_ms": 50}, "backend": backends})
    assert config.router.objective == "cost" and [b.usd_per_hour for b in config.backends] == [1.0, 4.0]
    with pytest.raises(RidgelineError, match="usd_per_hour on every"):
        parse_config({"router": {"objective": "cost", "slo_itl_ms": 50}, "backend": [{"model": "small"}]})
    with pytest.raises(RidgelineError, match="needs an SLO"):
        parse_config({"router": {"objective": "cost"}, "backend": backends})
    with pytest.raises(RidgelineError, match="objective must be"):
        parse_config({"router": {"objective": "cheap"}, "backend": backends})
    with pytest.raises(RidgelineError, match="usd_per_hour must be"):
        parse_config({"backend": [{"model": "small", "usd_per_hour": -1}]})
