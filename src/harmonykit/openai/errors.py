"""RequestError: a bad request, described the way the OpenAI API describes one."""

from __future__ import annotations

import reprlib
from typing import Any

_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 3, 80, 80
_SHOWN.maxlist = _SHOWN.maxdict = _SHOWN.maxtuple = _SHOWN.maxset = 4


def shown(value: Any) -> str:
    """A client's value as an error message repeats it: short, and shallow however deep it nests
    (a 1 MB role comes back as 80 characters, a value nested 10,000 deep costs nothing).

    >>> shown("x" * 1000)[:12], len(shown("x" * 1000)) <= 80
    ("'xxxxxxxxxxx", True)
    >>> deep = []
    >>> for _ in range(5000):
    ...     deep = [deep]
    >>> shown(deep)
    '[[[[...]]]]'
    """
    try:
        return _SHOWN.repr(value)
    except Exception:  # a value whose own repr fails
        return f"<{type(value).__name__}>"


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
