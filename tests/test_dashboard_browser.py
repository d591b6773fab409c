"""The dashboard in a real browser: headless Chromium (Debian's `chromium` package) driven by Playwright, against a
real server over the tiny random model behind an API key.

Traffic of long prompts and short outputs gives compute-heavy prefill steps and bandwidth-bound decode steps;
the page must put them on the two sides of this machine's ridge, draw the ridge at the hardware figure, agree
with /metrics, follow new steps live, and never put the key in a URL or reach past the server. The screenshot
is kept in test-artifacts/ (RIDGELINE_TEST_ARTIFACTS overrides).
"""

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import serve_tiny_model

from ridgeline.dashboard.machine import machine_named
from ridgeline.napkin.hardware import THIS_MACHINE

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason="the browser test needs Chromium: apt-get install -y chromium")
KEY = "dashboard-test-key-7f3a"
ARTIFACTS = Path(os.environ.get("RIDGELINE_TEST_ARTIFACTS", Path(__file__).parent.parent / "test-artifacts"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def send_traffic(url: str, prompts: int, words: int, max_tokens: int) -> None:
    def one(i: int) -> None:
        prompt = f"request {i}: " + "the quick brown fox jumps over the lazy dog " * (words // 9)
        response = httpx.post(f"{url}/v1/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=120,
                              json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
        assert response.status_code == 200, response.text

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(one, range(prompts)))


def metrics(url: str) -> dict[str, float]:
    """Every sample of /metrics by name (+ finished_reason where there is one)."""
    text = httpx.get(f"{url}/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            reason = sample.labels.get("finished_reason")
            samples[sample.name + (f":{reason}" if reason else "")] = sample.value
    return samples


def wait_idle(url: str) -> dict[str, float]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sample = metrics(url)
        if sample["ridgeline_num_requests_running"] == 0 and sample["ridgeline_num_requests_waiting"] == 0:
            return sample
        time.sleep(0.1)
    raise AssertionError("the server did not become idle")


def wait_until(page, expression: str, timeout_s: float = 30) -> None:
    """Poll `expression` in the page (wait_for_function would eval a string, which the page's CSP forbids)."""
    deadline = time.monotonic() + timeout_s
    while not page.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"still false after {timeout_s} s: {expression}")
        time.sleep(0.1)


def field(page, name: str) -> str:
    return page.locator(f'[data-worker="local"] [data-field="{name}"]').inner_text()


def number(text: str) -> float:
    return float(text.split()[0].replace(",", ""))


def test_dashboard_in_chromium(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    hardware = machine_named(THIS_MACHINE)  # the cached entry (as `ridgeline roofline` draws it), else the napkin estimate
    with serve_tiny_model(api_key=KEY, hardware=THIS_MACHINE) as server:
        url = server.url
        send_traffic(url, prompts=6, words=250, max_tokens=12)
        assert httpx.get(f"{url}/dashboard/state").status_code == 401  # the data is behind the key
        assert httpx.get(f"{url}/v1/steps").status_code == 401

        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                viewport={"width": 1400, "height": 1000})
            requests, outside = [], []
            server_host = urlsplit(url).netloc

            def guard(route):
                if urlsplit(route.request.url).netloc != server_host:
                    outside.append(route.request.url)  # the page must need nothing but this server
                    route.abort()
                else:
                    route.continue_()

            context.route("**/*", guard)
            page = context.pages[0] if context.pages else context.new_page()
            page.on("request", lambda request: requests.append((request.url, request.headers.get("authorization"))))

            page.goto(f"{url}/dashboard")
            expect(page.locator("#key-form")).to_be_visible()  # no data without the key
            page.fill("#key-input", "not-the-key")
            page.click("#key-form button")
            expect(page.locator("#key-error")).to_contain_text("refused")
            page.fill("#key-input", KEY)
            page.click("#key-form button")
            expect(page.locator("#connection")).to_have_text("live", timeout=30_000)

            # The ridge at this machine's figure, where the roof bends.
            ridge = page.locator("svg.roofline line.ridge")
            assert float(ridge.get_attribute("data-ridge")) == pytest.approx(hardware.ridge_point())
            ridge_x = float(ridge.get_attribute("x1"))
            roof = [tuple(map(float, p.split(","))) for p in page.locator("svg.roofline polyline.roof").get_attribute("points").split()]
            assert roof[1][0] == pytest.approx(ridge_x)
            assert f"{hardware.bandwidth / 1e9:,.1f} GB/s" in page.locator("svg.roofline").inner_html()

            # Steps from before the page opened: prefill right of the ridge, decode left of it.
            def points(kind: str) -> list[tuple[float, float]]:
                dots = page.locator(f"svg.roofline circle.point.kind-{kind}")
                return [(float(d.get_attribute("data-x")), float(d.get_attribute("cx"))) for d in dots.all()]

            prefill, decode = points("prefill"), points("decode")
            assert any(x > hardware.ridge_point() and cx > ridge_x for x, cx in prefill), prefill
            assert any(x < hardware.ridge_point() and cx < ridge_x for x, cx in decode), decode

            # Live: new traffic adds points through the event stream.
            shown = page.locator("svg.roofline circle.point").count()
            frames = page.evaluate("window.ridgeline.frames")
            send_traffic(url, prompts=3, words=200, max_tokens=8)
            wait_until(page, f"document.querySelectorAll('svg.roofline circle.point').length > {shown}")
            assert page.evaluate("window.ridgeline.frames") > frames

            # Hover: composition, duration, bytes read, share of the roof.
            page.locator("svg.roofline circle.point.kind-prefill").last.hover(force=True)
            tooltip = page.locator(".roofline-tooltip")
            expect(tooltip).to_be_visible()
            for text in ("prefill step", "ms", "MB of weights", "of the roof"):
                expect(tooltip).to_contain_text(text)

            # Counters agree with /metrics once the engine is idle and a frame has come after that.
            sample = wait_idle(url)
            seen = page.evaluate("window.ridgeline.frames")
            wait_until(page, f"window.ridgeline.frames > {seen + 1}", timeout_s=10)
            assert number(field(page, "num_running")) == sample["ridgeline_num_requests_running"] == 0
            assert number(field(page, "num_waiting")) == sample["ridgeline_num_requests_waiting"] == 0
            assert number(field(page, "free_pages")) == sample["ridgeline_kv_cache_free_pages"]
            assert number(field(page, "total_pages")) == sample["ridgeline_kv_cache_total_pages"]
            assert number(field(page, "preemptions")) == sample["ridgeline_num_preemptions"]
            assert number(field(page, "prefix_hit_rate")) == pytest.approx(100 * sample["ridgeline_prefix_cache_hit_rate"], abs=0.05)
            assert number(page.locator('[data-counter="length"]').inner_text()) == sample["ridgeline_request_success_total:length"] == 9
            assert number(page.locator('[data-counter="prompt_tokens"]').inner_text()) == sample["ridgeline_prompt_tokens_total"]
            assert number(page.locator('[data-counter="generation_tokens"]').inner_text()) == sample["ridgeline_generation_tokens_total"] == 6 * 12 + 3 * 8
            assert page.locator('[data-stat="ttft_ms.p50"]').inner_text().endswith("ms")
            assert page.locator(".groups .group").count() == 1  # the tiny llama: one full-attention group

            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard-browser.png"), full_page=True)
            context.close()

    assert not outside, f"the page reached past the server: {outside}"
    assert requests and all(KEY not in request_url for request_url, _ in requests)
    data_requests = [(u, auth) for u, auth in requests if "/dashboard/state" in u or "/dashboard/events" in u]
    assert data_requests and all(auth == f"Bearer {KEY}" for u, auth in data_requests[-2:])
