"""Drive schemathesis over a running server's own /openapi.json: every generated request (valid and invalid
by the schema) must get a 2xx, or a 4xx with an OpenAI-style JSON error; never a 5xx, a hang or a dropped
connection. Used by tests/test_api_fuzz.py (short, fixed seed) and scripts/fuzz_api.py (long)."""

from dataclasses import dataclass, field

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as fixed_seed
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, negative_data_rejection, status_code_conformance

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance]


@dataclass
class Report:
    requests: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # operation and mode with nothing to generate


def bounded_work(case, max_tokens: int, max_n: int) -> None:
    """Cap the generation a valid request may ask for, so a short run tries many requests rather than
    decoding a few long ones (what the caps guard is tested in tests/test_hostile_requests.py)."""
    body = case.body
    if not isinstance(body, dict):
        return
    for key, cap in (("max_tokens", max_tokens), ("max_completion_tokens", max_tokens), ("n", max_n), ("best_of", max_n)):
        if type(body.get(key)) is int and body[key] > cap:
            body[key] = cap
    if body.get("best_of") is not None and type(body.get("n")) is int:
        body["best_of"] = body["n"]


def openai_error_problem(response: requests.Response) -> str | None:
    if response.status_code < 400 or response.status_code >= 500:
        return None
    try:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    except (ValueError, KeyError, TypeError, AssertionError):
        return f"{response.status_code} without an OpenAI-style error body: {response.text[:200]!r}"
    return None


def fuzz_api(base_url: str, examples: int, seed: int, max_tokens: int = 4, max_n: int = 2, timeout: float = 60) -> Report:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    report = Report()
    session = requests.Session()
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            checks = CHECKS + ([negative_data_rejection] if mode == GenerationMode.NEGATIVE else [])

            @fixed_seed(seed)
            @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case) -> None:
                bounded_work(case, max_tokens, max_n)
                label = f"{operation.label} [{mode.value}]"
                try:
                    response = case.call(base_url=base_url, session=session, timeout=timeout)
                except requests.RequestException as error:  # a hang past the timeout, or a dropped connection
                    report.failures.append(f"{label}: {type(error).__name__} {error} for {case.as_curl_command()}")
                    return
                report.requests += 1
                report.by_status[response.status_code] = report.by_status.get(response.status_code, 0) + 1
                problem = openai_error_problem(response)
                try:
                    case.validate_response(response, checks=checks)
                except Exception as failure:  # noqa: BLE001 - schemathesis raises its own failure types
                    problem = problem or " ".join(str(failure).split())[:400]
                if problem:
                    report.failures.append(f"{label}: {problem} for {case.as_curl_command()[:600]}")

            try:
                run()
            except Unsatisfiable:  # no invalid request exists for it (GET /health takes no input at all)
                report.skipped.append(f"{operation.label} [{mode.value}]")
    return report
