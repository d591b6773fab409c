"""The dashboard's routes: the page and its assets (open: code only, no data), and the data behind the API key.

  GET /dashboard                 the page (asks for the API key when the data answers 401)
  GET /dashboard/assets/NAME     its script and style, shipped in the package
  GET /dashboard/state           every worker's figure with its last steps, queue, KV cache; latency; counters
  GET /dashboard/events          server-sent events: what changed, every `interval` seconds
  GET /v1/steps                  the engine's step records (?after=INDEX, ?since=UNIX_TIME, ?limit=N)
  GET /v1/steps/figure           the roofline figure of those steps (what `bench serve --plot` draws)

The key travels in the Authorization header of fetch() calls, never in a URL or a cookie: the page reads the
server-sent events with fetch() and a stream reader rather than EventSource (which cannot send headers), so
there is one way to authenticate for every route and nothing a cross-site request could ride on.
"""

import asyncio
import json

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from ridgeline.dashboard.assets import asset
from ridgeline.dashboard.worker import LocalWorker
from ridgeline.server.errors import APIError
from ridgeline.server.metrics import ServerMetrics

ASSETS = {"dashboard.js": "text/javascript", "roofline.js": "text/javascript", "dashboard.css": "text/css"}
OPEN_DASHBOARD_PATHS = frozenset({"/dashboard", *(f"/dashboard/assets/{name}" for name in ASSETS)})
DEFAULT_POINTS = 600  # steps a panel keeps on its roofline
# The page may load and connect to this server only: nothing from the internet, even if a script tried.
PAGE_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self'; "
               "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
STREAM_SECONDS = 15.0  # an event stream ends after this and the page reconnects, so no open page holds up shutdown


def query_int(request: Request, name: str, default: int | None, low: int) -> int | None:
    value = request.query_params.get(name)
    if value is None:
        return default
    if not value.lstrip("-").isdigit() or int(value) < low:
        raise APIError(400, f"{name} must be an integer >= {low}, got {value!r}", param=name)
    return int(value)


def query_float(request: Request, name: str) -> float | None:
    value = request.query_params.get(name)
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise APIError(400, f"{name} must be a number, got {value!r}", param=name) from None


def counters(metrics: ServerMetrics) -> dict:
    """The /metrics counters the page shows, read from the same registry (so the two always agree; with several API
    processes, the whole server's)."""
    labels = {"model_name": metrics.model_name}

    def value(name: str, **extra: str) -> float:
        return metrics.exposed.get_sample_value(name, labels | extra) or 0.0

    return {
        "requests": {reason: value("ridgeline_request_success_total", finished_reason=reason)
                     for reason in metrics.finished},
        "prompt_tokens": value("ridgeline_prompt_tokens_total"),
        "generation_tokens": value("ridgeline_generation_tokens_total"),
        "cost": live_cost(metrics),
    }


def live_cost(metrics: ServerMetrics) -> dict | None:
    """This machine's $/Mtok over the last window at its configured price (serve --usd-per-hour); None: unpriced."""
    cost = metrics.refresh_cost()
    if cost is None:
        return None
    return cost.as_dict() | {"window_s": metrics.live_cost.window_s}


def install_dashboard(app: FastAPI, workers: list[LocalWorker], metrics: ServerMetrics, accepting,
                      interval: float = 0.5) -> None:
    """`accepting()` says whether the server still serves (event streams end when it stops)."""
    by_id = {worker.id: worker for worker in workers}
    local = workers[0]

    def frame(after: dict[str, int]) -> dict:
        updates = [worker.update(after.get(worker.id, -1)) for worker in workers]
        for update in updates:
            after[update["id"]] = update["last_step"]
        return {"workers": updates, "latency": local.feed.latency(), "counters": counters(metrics)}

    @app.get("/dashboard", include_in_schema=False)  # a page for browsers, not an API
    async def page() -> Response:
        return HTMLResponse(asset("index.html"), headers={"Cache-Control": "no-store", "Content-Security-Policy": PAGE_POLICY,
                                                          "Referrer-Policy": "no-referrer"})

    @app.get("/dashboard/assets/{name}", include_in_schema=False)
    async def dashboard_asset(name: str) -> Response:
        if name not in ASSETS:
            raise APIError(404, f"no dashboard asset {name!r}", code="not_found")
        return Response(asset(name), media_type=ASSETS[name])

    @app.get("/dashboard/state")
    async def state(request: Request) -> Response:
        points = query_int(request, "points", DEFAULT_POINTS, 0)
        described = [await asyncio.to_thread(worker.describe, points) for worker in workers]
        return JSONResponse({"workers": described, "latency": local.feed.latency(), "counters": counters(metrics),
                             "interval_s": interval})

    @app.get("/dashboard/events", include_in_schema=False)  # server-sent events for the page
    async def events(request: Request) -> Response:
        after = parse_after(request.query_params.get("after", ""), by_id)
        await asyncio.to_thread(local.roofline)  # the first call may measure this machine

        async def stream():
            loop = asyncio.get_running_loop()
            ends = loop.time() + STREAM_SECONDS
            while accepting() and loop.time() < ends:
                yield f"data: {json.dumps(frame(after))}\n\n"
                await asyncio.sleep(interval)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    @app.get("/v1/steps")
    async def steps(request: Request) -> Response:
        after = query_int(request, "after", -1, -1)
        data = local.steps(after, query_float(request, "since"), query_int(request, "limit", None, 1))
        recorder = local.engine.steps
        return JSONResponse({"object": "list", "worker": local.id, "model": local.model_name,
                             "recorded": recorder.num_recorded, "data": data})

    @app.get("/v1/steps/figure")
    async def steps_figure(request: Request) -> Response:
        data = local.steps(-1, query_float(request, "since"), query_int(request, "limit", None, 1))
        return JSONResponse(await asyncio.to_thread(local.figure, data))


def parse_after(text: str, workers: dict) -> dict[str, int]:
    """'local:120,prefill-0:33' -> the last step each worker's page already has."""
    after = {}
    for part in filter(None, text.split(",")):
        worker, _, index = part.rpartition(":")
        if worker not in workers or not index.lstrip("-").isdigit():
            raise APIError(400, f"after must look like WORKER:INDEX[,...] with known workers, got {text!r}",
                           param="after")
        after[worker] = int(index)
    return after
