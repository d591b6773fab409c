"""The hand-off options of disaggregated serving, declared once for `ridgeline proxy` and for `ridgeline serve
--prefill-workers N --decode-workers M` (Ray pools), and read into one HandoffConfig (cluster/handoff.py)."""

import typer

from ridgeline.cluster import handoff

LOCAL_PREFILL_TOKENS = typer.Option(handoff.LOCAL_PREFILL_TOKENS, "--local-prefill-tokens", min=0, help="Prompts whose uncached part (what the decode worker's prefix cache lacks) is shorter than this are prefilled on the decode worker: below it moving the KV costs more than the prefill it saves.")
HANDOFF_WAIT = typer.Option(handoff.HANDOFF_WAIT_SECONDS, "--handoff-wait", min=0, help="Disaggregated front (proxy, or serve with Ray workers): seconds a prefilled request waits there, its KV pages kept, for a decode worker whose KV queue is full to take it, before a 503 with Retry-After.")
MAX_REPREFILLS = typer.Option(handoff.MAX_REPREFILLS, "--max-reprefills", min=0, help="Disaggregated front (proxy, or serve with Ray workers): times one request is prefilled again when its held KV pages are gone before the decode worker pulls them (a lapsed lease, a restarted prefill worker); past it, 503 with Retry-After.")
MAX_KV_WAITING = typer.Option(handoff.MAX_KV_WAITING, "--max-kv-waiting", min=1, help="A decode worker (--role decode, or each Ray decode worker): requests whose prefilled KV waits for room there beyond which new ones get 503 (and /v1/kv/lookup says not accepting, so a front refuses before it spends a prefill).")


def handoff_config(local_prefill_tokens: int = handoff.LOCAL_PREFILL_TOKENS,
                   max_reprefills: int = handoff.MAX_REPREFILLS,
                   handoff_wait: float = handoff.HANDOFF_WAIT_SECONDS,
                   max_kv_waiting: int = handoff.MAX_KV_WAITING) -> handoff.HandoffConfig:
    return handoff.HandoffConfig(local_prefill_tokens=local_prefill_tokens, max_reprefills=max_reprefills,
                                 handoff_wait=handoff_wait, max_kv_waiting=max_kv_waiting)
