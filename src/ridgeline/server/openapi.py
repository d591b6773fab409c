"""The OpenAPI document the server publishes (/openapi.json), made to say what the server really answers.

FastAPI derives request bodies from the protocol models (every OpenAI and vLLM field we accept, with its type)
but documents its own 422 for bad input, JSON for every 200, and nothing else. Clients, and the API fuzzer
in tests/test_api_fuzz.py, read this document: so errors are documented as the OpenAI-style 4xx/503 bodies
we send, streams as text/event-stream, /metrics as Prometheus text and /health as an empty 200.
"""

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

ERROR_SCHEMA = {
    "title": "ErrorResponse",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
ERROR_STATUSES = {
    "400": "invalid request (the message names the field)",
    "401": "missing or wrong API key (when the server has one)",
    "404": "unknown model or path",
    "413": "request body too large",
    "503": "overloaded or shutting down",
}
STREAMING_PATHS = {"/v1/completions", "/v1/chat/completions"}


def _error(description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}


def describe_api(app: FastAPI) -> dict:
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    schema.setdefault("components", {}).setdefault("schemas", {})["ErrorResponse"] = ERROR_SCHEMA
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)  # we answer bad input with 400, as OpenAI does
            responses.update({status: _error(text) for status, text in ERROR_STATUSES.items()})
            ok = responses.setdefault("200", {"description": "OK"})
            if path in STREAMING_PATHS:
                ok["content"] = {"application/json": {"schema": {}}, "text/event-stream": {"schema": {"type": "string"}}}
                responses["204"] = {"description": "the client disconnected before the answer was ready"}
            elif path == "/metrics":
                ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
            elif path == "/health":
                ok.pop("content", None)
    return schema


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = describe_api(app)
        return app.openapi_schema

    app.openapi = openapi
