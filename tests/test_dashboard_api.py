"""The dashboard's data without a browser: /v1/steps, /dashboard/state and events, the key, the shared figure and its
static exports (`roofline --plot x.html`, `bench serve --plot`)."""

import json

import httpx
import pytest
from server_helpers import serve_tiny_model, tiny_engine
from typer.testing import CliRunner

from ridgeline.cli import register_commands
from ridgeline.cli.app import app as cli_app
from ridgeline.dashboard.engine_view import engine_view
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.dashboard.machine import machine_named

KEY = "k-123"
MACHINE = "apple-m4-max"  # a catalogue machine: nothing to measure
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "the quick brown fox jumps over the lazy dog " * 20


@pytest.fixture(scope="module")
def server():
    with serve_tiny_model(api_key=KEY, hardware=MACHINE) as server:
        for max_tokens in (5, 7):
            body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            assert httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=60).status_code == 200
        yield server


def get(server, path: str, **params) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", params=params, headers=AUTH, timeout=60)


def test_steps_are_served_with_their_costs(server):
    steps = get(server, "/v1/steps").json()
    assert steps["object"] == "list" and steps["recorded"] == len(steps["data"])
    data = steps["data"]
    # Two requests one after the other: a prefill, then decodes of its sequence; the second prompt is cached but
    # for its last block, which is computed again (as a decode-sized step if it is one token).
    kinds = [step["kind"] for step in data]
    assert kinds[0] == "prefill" and kinds[1:5] == ["decode"] * 4 and kinds.count("decode") >= 4 + 6
    assert all(step["tokens"] == step["prefill_tokens"] + step["decode_rows"] for step in data)
    assert all(step["flops"] > 0 and step["weight_bytes"] > 0 and step["seconds"] > 0 for step in data)
    assert [s["index"] for s in get(server, "/v1/steps", after=data[-3]["index"]).json()["data"]] == [s["index"] for s in data[-2:]]
    assert len(get(server, "/v1/steps", limit=3).json()["data"]) == 3
    assert get(server, "/v1/steps", since=data[-1]["timestamp"]).json()["data"][0]["index"] == data[-1]["index"]


@pytest.mark.parametrize("query,param", [({"after": "x"}, "after"), ({"limit": "0"}, "limit"), ({"since": "soon"}, "since")])
def test_bad_step_queries_are_400_naming_the_parameter(server, query, param):
    response = get(server, "/v1/steps", **query)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_the_page_is_open_but_its_data_needs_the_key(server):
    page = httpx.get(f"{server.url}/dashboard")
    assert page.status_code == 200 and "/dashboard/assets/dashboard.js" in page.text
    assert "connect-src 'self'" in page.headers["content-security-policy"]  # nothing from anywhere else
    assert httpx.get(f"{server.url}/dashboard/assets/roofline.js").headers["content-type"].startswith("text/javascript")
    assert httpx.get(f"{server.url}/dashboard/assets/secrets.txt").status_code in (401, 404)
    for path in ("/dashboard/state", "/dashboard/events", "/v1/steps", "/v1/steps/figure"):
        assert httpx.get(f"{server.url}{path}").status_code == 401, path


def test_state_has_one_panel_per_worker_with_this_machines_roofline(server):
    state = get(server, "/dashboard/state", points=4).json()
    (worker,) = state["workers"]
    figure = worker["figure"]
    machine = machine_named(MACHINE)
    assert worker["id"] == "local" and worker["hardware"]["name"] == MACHINE
    assert figure["ridge"] == pytest.approx(machine.ridge_point()) and figure["bandwidth"] == machine.bandwidth
    assert len(figure["points"]) == 4 and worker["last_step"] == get(server, "/v1/steps").json()["data"][-1]["index"]
    assert {"of the roof" in point["detail"][-1] for point in figure["points"]} == {True}
    view = worker["view"]
    assert view["num_running"] == 0 and view["used_pages"] + view["free_pages"] == view["total_pages"]
    assert state["counters"]["requests"]["length"] == 2 and state["counters"]["generation_tokens"] == 12
    assert state["latency"]["requests"] == 2 and state["latency"]["ttft_ms"]["p50"] > 0


def test_events_stream_what_is_new(server):
    last = get(server, "/v1/steps").json()["data"][-1]["index"]
    with httpx.stream("GET", f"{server.url}/dashboard/events", params={"after": f"local:{last - 2}"}, headers=AUTH,
                      timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        line = next(line for line in response.iter_lines() if line.startswith("data:"))
    frame = json.loads(line[5:])
    (update,) = frame["workers"]
    assert [p["label"] for p in update["points"]] == [f"#{last - 1}", f"#{last}"] and update["last_step"] == last
    assert get(server, "/dashboard/events", after="nobody:3").status_code == 400


def test_the_figure_endpoint_and_its_html_export_carry_the_same_points(server, tmp_path):
    from ridgeline.dashboard.export import render_roofline

    figure = get(server, "/v1/steps/figure").json()
    assert len(figure["points"]) == get(server, "/v1/steps").json()["recorded"]
    page = render_roofline(figure, tmp_path / "steps.html").read_text()
    assert "class RooflineChart" in page and json.dumps(figure["points"][0]) in page and "http" not in page.split("<script>")[0]
    assert render_roofline(figure, tmp_path / "steps.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_serve_plot_leaves_the_roofline_of_its_steps(tmp_path):
    register_commands()
    with serve_tiny_model(hardware=MACHINE) as server:
        args = ["bench", "serve", "--base-url", server.url, "--num-prompts", "2", "--input-len", "40", "--output-len",
                "4", "--json", "--plot", str(tmp_path / "run")]
        result = CliRunner().invoke(cli_app, args)
    assert result.exit_code == 0, result.output
    html = (tmp_path / "run-roofline.html").read_text()
    figure = json.loads(html.split("RooflineChart(document.getElementById(\"chart\"), ")[1].rsplit(", {maxPoints", 1)[0])
    assert {p["kind"] for p in figure["points"]} >= {"prefill", "decode"}
    assert (tmp_path / "run-roofline.png").read_bytes()[:4] == b"\x89PNG"


def test_roofline_plot_writes_html_with_the_dashboards_drawing(tmp_path):
    register_commands()
    chart = tmp_path / "roofline.html"
    result = CliRunner().invoke(cli_app, ["roofline", "--model", "llama-3.1-8b", "--hardware", MACHINE, "--plot", str(chart)])
    assert result.exit_code == 0, result.output
    assert "class RooflineChart" in chart.read_text() and '"kind": "model-prefill"' in chart.read_text()


def test_engine_view_counts_pages_per_group_and_the_batch_the_free_pages_allow():
    engine = tiny_engine(num_blocks=64)
    prompt = engine.tokenizer.encode(PROMPT)
    for i in range(3):  # shifted by i tokens: no shared prefix (a request would wait for another's, in flight)
        engine.add_request(str(i), prompt[i: i + 40 + 20 * i], SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()
    view = engine_view(engine)
    (group,) = view.groups
    assert view.num_running == 3 and group.window is None
    assert group.used == view.total_pages - view.free_pages == sum(-(-n // 16) for n in (40, 60, 80))
    assert view.mean_context == 61  # each has its first sampled token
    assert view.pages_per_sequence == 4  # 62 tokens (the next one included) in pages of 16
    assert view.largest_batch == 3 + view.free_pages // 4
