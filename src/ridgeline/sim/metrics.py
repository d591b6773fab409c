"""A simulated run in bench serve's terms: each request as the RequestResult a client would have measured
(times from when it was sent), summarised by bench serve's own code, plus what only a simulator sees."""

from ridgeline.napkin.token_cost import PhaseWork, token_cost
from ridgeline.workload.serve_metrics import RequestResult, Slo, summarise
from ridgeline.sim.simulator import SimResult, Track


def request_result(track: Track) -> RequestResult:
    if track.error or track.sent_s is None or not track.token_times:
        return RequestResult(prompt="", error=track.error or "did not finish")
    sent = track.sent_s
    times = [t - sent for t in track.token_times]
    return RequestResult(prompt="", ok=True, ttft_s=times[0], e2e_s=track.finish_s - sent, chunk_times_s=times,
                         chunks=len(times), usage_prompt_tokens=len(track.request.prompt_ids),
                         usage_completion_tokens=len(times))


def engine_figures(result: SimResult) -> dict:
    """KV occupancy (time-weighted over the run, and peak), preemptions, prefix hits, and the simulator's work."""
    duration = result.duration_s or 1.0
    replicas = result.replicas
    queries = hits = 0
    for replica in replicas:
        cache = replica.scheduler.block_manager.prefix_cache
        if cache is not None and replica.role != "decode":  # the decode pool's hits are KV handovers
            queries, hits = queries + cache.num_query_tokens, hits + cache.num_hit_tokens
    return {
        "kv_occupancy_mean": sum(r.stats.kv_usage_s for r in replicas) / duration / len(replicas),
        "kv_occupancy_peak": max(r.stats.kv_usage_peak for r in replicas),
        # While busy: the batch a step runs on average (idle time would drag it toward zero).
        "running_batch_mean": sum(r.stats.running_s for r in replicas) / max(sum(r.stats.busy_s for r in replicas), 1e-12),
        "preemptions": sum(r.scheduler.num_preemptions for r in replicas),
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "kv_transfers": sum(r.stats.kv_imports for r in replicas),
        "kv_transfer_waits": sum(r.stats.kv_import_waits for r in replicas),
        "busy_fraction": sum(r.stats.busy_s for r in replicas) / duration / len(replicas),
        "steps": sum(r.stats.steps for r in replicas),
        "events": result.events,
    }


def cost_figures(result: SimResult, summary: dict, usd_per_hour: float) -> dict:
    """$/Mtok of the run: every replica paid for the whole run, that cost split between prompt and completion
    tokens by the busy time each phase took (napkin/token_cost.py), over the tokens of the requests served."""
    replicas = result.replicas
    work = PhaseWork(summary["prompt_tokens"], summary["output_tokens"], sum(r.stats.prefill_s for r in replicas),
                     sum(r.stats.decode_s for r in replicas), (result.duration_s or 0.0) * len(replicas))
    return token_cost(work, usd_per_hour).as_dict() | {"machines": len(replicas)}


def summarise_run(result: SimResult, slo: Slo, load: dict, model: str, usd_per_hour: float | None = None) -> dict:
    """One load level as bench serve reports it, with the engine figures under "engine" (and, priced at
    `usd_per_hour` a machine, its $/Mtok under "cost")."""
    summary = summarise([request_result(t) for t in result.tracks], result.duration_s or 1e-9, slo)
    priced = {"cost": cost_figures(result, summary, usd_per_hour)} if usd_per_hour is not None else {}
    return {"load": load, "model": model} | summary | {"engine": engine_figures(result)} | priced
