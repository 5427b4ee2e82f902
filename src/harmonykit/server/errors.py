"""The gateway's answers other than 200, OpenAI-shaped."""

from __future__ import annotations

from typing import Any

_ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
                408: "invalid_request_error",
                405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
                409: "invalid_request_error", 502: "api_error", 503: "api_error", 504: "api_error"}


class HTTPError(Exception):
    """An answer other than 200, OpenAI-shaped: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": _ERROR_TYPES.get(self.status, "api_error"),
                          "param": self.param, "code": self.code}}
