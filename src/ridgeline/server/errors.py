"""OpenAI-style error bodies, `{"error": {"message", "type", "param", "code"}}`, and the handlers that produce them.

Every failure a client can cause becomes one of these with a 4xx status; the server keeps serving.
"""

import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ridgeline.errors import RidgelineError

logger = logging.getLogger("ridgeline.server")

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}
_UNION_TAGS = {"str", "int", "float", "bool"}


class APIError(Exception):
    """An error to send to the client as it is: status, message and (when one field is to blame) its name."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def api_error(error: RidgelineError, field_names: dict[str, str] | None = None) -> APIError:
    """A user error from the engine as a 400, its field renamed to the request's where the names differ."""
    param = (field_names or {}).get(error.param, error.param)
    return APIError(400, str(error), param, error.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    error_type = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_response(
    status: int, message: str, param: str | None = None, code: str | None = None, headers: dict | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def _param_of(loc: tuple) -> str | None:
    """'messages.0.content' from pydantic's location, without the 'body' root and union-member tags."""
    parts = [str(p) for p in loc if p != "body" and "[" not in str(p) and str(p) not in _UNION_TAGS]
    return ".".join(parts) or None


def validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """One line for the client: the first field at fault and what each accepted form said about it."""
    if any(e["type"] == "json_invalid" for e in errors):
        return "request body is not valid JSON", None
    param = _param_of(errors[0]["loc"])
    reasons = list(dict.fromkeys(e["msg"].removeprefix("Value error, ") for e in errors if _param_of(e["loc"]) == param))
    where = f"'{param}': " if param else ""
    return f"invalid request: {where}{' or '.join(reasons[:3])}", param


async def _on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    message, param = validation_message(list(exc.errors()))
    return error_response(400, message, param)


async def _on_api_error(_: Request, exc: APIError) -> JSONResponse:
    return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)


async def _on_user_error(_: Request, exc: RidgelineError) -> JSONResponse:
    return error_response(400, str(exc), exc.param, exc.code)


async def _on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
    return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))


async def _on_unexpected_error(_: Request, exc: Exception) -> JSONResponse:
    logger.exception("internal error while serving a request")
    return error_response(500, f"internal server error: {type(exc).__name__}")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(APIError, _on_api_error)
    app.add_exception_handler(RidgelineError, _on_user_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected_error)
