"""RequestError: a bad request, described the way the OpenAI API describes one."""

from __future__ import annotations

from typing import Any


class RequestError(ValueError):
    """A request harmonykit cannot render; ``param`` names the offending field.

    >>> e = RequestError("messages[2].tool_call_id", "no assistant tool call has id 'x'")
    >>> e.to_dict()["error"]["param"]
    'messages[2].tool_call_id'
    """

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param
        self.message = message

    def to_dict(self) -> dict[str, Any]:
        """The body of an OpenAI-style 400 response."""
        return {"error": {"message": self.message, "type": "invalid_request_error",
                          "param": self.param, "code": None}}


class StreamClosed(RuntimeError):
    """``feed()`` on an output stream after ``close()``: the output has ended."""
