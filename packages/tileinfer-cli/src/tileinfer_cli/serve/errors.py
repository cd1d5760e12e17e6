"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}`` with a status."""

from __future__ import annotations

import json
import re


class APIError(Exception):
    """An error answered to the client. type follows OpenAI's names (invalid_request_error,
    authentication_error, not_found_error, rate_limit_error, server_error); code is a short
    machine-readable reason or None; headers are extra response headers (Retry-After)."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers=None):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, dict(headers or {})

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def json(self) -> str:
        return json.dumps(self.body())


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def error_response(error: APIError):
    from starlette.responses import JSONResponse

    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


# An absolute filesystem path (two components at least), not the path part of a URL.
_PATH = re.compile(r"(?<![\w.:/~-])/(?:[^\s/'\"`:,;()\[\]{}<>]+/)+([^\s/'\"`:,;()\[\]{}<>]*)")


def redact(text: str) -> str:
    """text with each absolute path cut to its last part (``/home/x/models/foo`` -> ``foo``): for
    messages of exceptions raised below the server, which clients see."""
    return _PATH.sub(lambda m: m.group(1) or "<path>", text)
