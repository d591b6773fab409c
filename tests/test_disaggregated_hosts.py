"""Disaggregated serving across "hosts": a prefill worker and a decode worker in two network namespaces joined by
a veth pair (a real TCP path, the KV pages crossing it), the front beside the decode worker. The test process
reaches each host through a veth of its own. Greedy answers equal colocated ones; cutting the link between the
hosts fails a transfer at once with an explicit error and no page leaked on the decode host.

Needs root and iproute2 (as CI has); skipped, saying so, elsewhere."""

import contextlib
import os
import shutil
import subprocess
import sys
import time

import httpx
import openai
import pytest

from server_helpers import tiny_engine, tiny_model_path

from ridgeline.server.app import ServerConfig, create_app
from ridgeline.server.launcher import BackgroundServer

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None,
                                                   reason="network namespaces need root and iproute2")]

NET = f"10.{200 + os.getpid() % 50}"  # test hosts' own addresses, inside namespaces this test makes
PROMPTS = ["The quick brown fox jumps over the lazy dog " * 3, "Once upon a time there was a tiny model"]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def two_hosts():
    tag = str(os.getpid())[-5:]
    p, d = f"rlp{tag}", f"rld{tag}"
    names = {"link": (f"rlpd{tag}", f"rldp{tag}"), "to_p": (f"rlrp{tag}", f"rlpr{tag}"), "to_d": (f"rlrd{tag}", f"rldr{tag}")}
    try:
        ip("netns", "add", p)
        ip("netns", "add", d)
        plan = {"link": (p, f"{NET}.1.1", d, f"{NET}.1.2"), "to_p": (None, f"{NET}.2.1", p, f"{NET}.2.2"),
                "to_d": (None, f"{NET}.3.1", d, f"{NET}.3.2")}
        for key, (left_ns, left_ip, right_ns, right_ip) in plan.items():
            left, right = names[key]
            ip("link", "add", left, "type", "veth", "peer", "name", right)
            for dev, ns, address in ((left, left_ns, left_ip), (right, right_ns, right_ip)):
                prefix = ["-n", ns] if ns else []
                if ns:
                    ip("link", "set", dev, "netns", ns)
                ip(*prefix, "addr", "add", f"{address}/24", "dev", dev)
                ip(*prefix, "link", "set", dev, "up")
        for ns in (p, d):
            ip("-n", ns, "link", "set", "lo", "up")
        yield p, d, names
    finally:
        for ns in (p, d):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for left, _ in names.values():
            subprocess.run(["ip", "link", "del", left], capture_output=True)


def start(ns: str, *args: str) -> subprocess.Popen:
    command = ["ip", "netns", "exec", ns, sys.executable, "-c", "from ridgeline.cli import main; main()", *args]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_healthy(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the server behind {url} exited"
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.3)
    raise AssertionError(f"{url} never became healthy")


def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


@pytest.fixture(scope="module")
def hosts():
    model = str(tiny_model_path())
    common = ["--kv-cache-memory", "10MiB", "--kv-cache-dtype", "fp32"]
    with two_hosts() as (p, d, names):
        prefill = start(p, "serve", model, "--host", "0.0.0.0", "--port", "8001", "--role", "prefill",
                        "--kv-bind", f"tcp://{NET}.1.1:5557", *common)
        decode = start(d, "serve", model, "--host", "0.0.0.0", "--port", "8002", "--role", "decode", *common)
        proxy = start(d, "proxy", "--prefill", f"http://{NET}.1.1:8001", "--decode", f"http://{NET}.1.2:8002",
                      "--host", "0.0.0.0", "--port", "8000", "--local-prefill-tokens", "1")
        urls = {"prefill": f"http://{NET}.2.2:8001", "decode": f"http://{NET}.3.2:8002", "proxy": f"http://{NET}.3.2:8000"}
        try:
            for name, process in (("prefill", prefill), ("decode", decode), ("proxy", proxy)):
                wait_healthy(urls[name], process)
            yield urls, d, names
        finally:
            for process in (prefill, decode, proxy):
                process.kill()
                process.wait()


def test_kv_pages_cross_the_link_and_the_answers_equal_colocated(hosts):
    urls, _, _ = hosts
    with BackgroundServer(create_app(tiny_engine(), ServerConfig())) as colocated:
        for prompt in PROMPTS:
            answers = []
            for url in (urls["proxy"], colocated.url):
                api = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
                answers.append(api.completions.create(model=api.models.list().data[0].id, prompt=prompt, max_tokens=12,
                                                      temperature=0, extra_body={"ignore_eos": True}).choices[0].text)
            assert answers[0] == answers[1]
    assert metric(urls["decode"], "ridgeline_kv_transfer_bytes_received_total") > 0
    assert metric(urls["prefill"], "ridgeline_kv_transfer_bytes_sent") == metric(
        urls["decode"], "ridgeline_kv_transfer_bytes_received_total")
    for name in ("prefill", "decode"):
        assert metric(urls[name], "ridgeline_kv_cache_free_pages") == metric(urls[name], "ridgeline_kv_cache_total_pages")


def test_a_cut_link_fails_the_transfer_at_once_and_leaks_nothing(hosts):
    urls, d, names = hosts
    answer = httpx.post(f"{urls['prefill']}/v1/completions", json={
        "prompt": PROMPTS[0], "max_tokens": 1, "temperature": 0, "kv_transfer_params": {"do_remote_decode": True}}).json()
    ip("-n", d, "link", "set", names["link"][1], "down")  # the cable between the hosts is pulled
    started = time.monotonic()
    failed = httpx.post(f"{urls['decode']}/v1/completions", json={
        "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0,
        "kv_transfer_params": {**answer["kv_transfer_params"], "do_remote_prefill": True}}, timeout=60)
    assert failed.status_code == 503 and failed.json()["error"]["code"] == "kv_pages_gone"  # a front prefills again
    assert time.monotonic() - started < 20  # the fetch deadline is 30 s: the failure came first
    assert metric(urls["decode"], "ridgeline_kv_cache_free_pages") == metric(urls["decode"], "ridgeline_kv_cache_total_pages")
    ip("-n", d, "link", "set", names["link"][1], "up")
