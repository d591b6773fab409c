"""`simulate --search`: the highest Poisson rate a deployment sustains under SLOs, and the smallest catalogue
fleet (machine x replicas x prefill:decode split) that sustains a target rate.

A rate is sustained when at least GOOD_SHARE of its requests meet every SLO (TTFT, and mean inter-token time):
past that rate queues grow without bound and the share collapses, so the search doubles the rate until it
fails, then bisects. The catalogue holds no prices, so "cheapest" counts machines: fewer is cheaper, and
among equal counts the list keeps every machine type that makes it, for the reader's own prices.
"""

import dataclasses
from collections.abc import Callable

from ridgeline.errors import RidgelineError
from ridgeline.napkin.hardware import catalogue
from ridgeline.workload.serve_metrics import Slo
from ridgeline.sim.metrics import request_result
from ridgeline.sim.setup import SimOptions, deployment
from ridgeline.sim.simulator import Deployment, simulate
from ridgeline.sim.workload import Workload

GOOD_SHARE = 0.9
BISECTIONS = 7


def good_share(deploy: Deployment, workload: Workload, slo: Slo) -> float:
    results = [request_result(track) for track in simulate(deploy, workload).tracks]
    return sum(1 for r in results if r.ok and slo.met_by(r)) / len(results)


def max_rate(deploy: Deployment, workload_at: Callable[[float], Workload], slo: Slo, start: float = 1.0) -> float:
    """Highest rate (requests/s) with good_share >= GOOD_SHARE; 0 if even a trickle misses the SLOs."""
    if slo.ttft_ms is None and slo.itl_ms is None:
        raise RidgelineError("--search needs an SLO: give --slo-ttft-ms and/or --slo-itl-ms")
    ok = lambda rate: good_share(deploy, workload_at(rate), slo) >= GOOD_SHARE  # noqa: E731
    low, high = 0.0, start
    while ok(high):
        low, high = high, high * 2
        if high > 1e6:
            return low
    if low == 0.0:  # the starting rate already fails: look below it
        high_fail = high
        while high_fail > 1e-3 and not ok(high_fail / 2):
            high_fail /= 2
        low, high = high_fail / 2, high_fail
        if not ok(low):
            return 0.0
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        low, high = (middle, high) if ok(middle) else (low, middle)
    return low


def fleets(options: SimOptions, workload_at: Callable[[float], Workload], slo: Slo, target_rate: float,
           max_machines: int = 8) -> list[dict]:
    """For each catalogue machine the model fits on, the fewest machines (colocated replicas, or any P:D split
    of them) that sustain target_rate, sorted by machine count."""
    found = []
    for name in catalogue():
        try:
            base = deployment(dataclasses.replace(options, hardware=name, replicas=1, disaggregate=None,
                                                  calibrated=False))
        except RidgelineError:
            continue  # the weights do not fit this machine
        for count in range(1, max_machines + 1):
            layouts = [("colocated", dataclasses.replace(base, replicas=count))]
            layouts += [(f"{p}:{count - p}", dataclasses.replace(base, disaggregate=(p, count - p)))
                        for p in range(1, count)]
            best = max(((label, good_share(d, workload_at(target_rate), slo)) for label, d in layouts),
                       key=lambda pair: pair[1])
            if best[1] >= GOOD_SHARE:
                price = catalogue()[name].price
                found.append({"hardware": name, "machines": count, "layout": best[0], "good_share": best[1],
                              "usd_per_hour": count * price.usd_per_hour if price else None})
                break
    return sorted(found, key=lambda row: row["machines"])
