"""The HTTP protocol the gateway runs on: uvicorn's (httptools), with a deadline on request
headers, which uvicorn does not have: a socket that opens and sends its headers slowly, or
never, is closed after ``header_timeout`` seconds instead of held for ever."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def header_deadline_protocol(header_timeout: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, closing connections whose request headers take longer than
    ``header_timeout`` seconds (from the connection, or from the request's first byte)."""

    class HeaderDeadline(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(header_timeout, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if self.cycle is None or self.cycle.response_complete:  # still waiting for headers
                self.transport.close()

    return HeaderDeadline


#: Seconds an idle keep-alive connection is kept. Past the 5 s after which clients built on httpx
#: (the openai SDK) let theirs go: with uvicorn's own 5 s the two closes race, and a request sent
#: on a connection the server is closing is reset.
KEEP_ALIVE = 30


def uvicorn_options(header_timeout: float) -> dict[str, Any]:
    """What ``uvicorn.Config`` needs for the gateway's protocol."""
    return {"http": header_deadline_protocol(header_timeout), "timeout_keep_alive": KEEP_ALIVE}
