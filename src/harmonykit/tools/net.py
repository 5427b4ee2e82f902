"""The one way a tool reaches the network: the address rules, and a bounded HTTP fetch.

Every connection a tool opens (a page the browser opens, a search backend's API) goes
through ``Fetcher``. The address decision (``refused``) is a pure function of an IP
address and the operator's allowances, so it is tested on every range without
connecting anywhere; ``Fetcher`` applies it *after* DNS resolution, to the very
addresses it connects to (a resolver of its own: no second lookup a rebinding DNS
server could answer differently), to an IP written in the URL in any spelling, and
again on every redirect.

>>> refused(ipaddress.ip_address("169.254.169.254"), ())
'a link-local address (cloud metadata lives here)'
>>> refused(ipaddress.ip_address("127.0.0.1"), (ipaddress.ip_network("127.0.0.0/8"),)) is None
True
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# The ranges no tool may reach unless the operator allows them, with what to tell the model.
# Checked in order; anything not global is refused at the end whatever its kind.
_RANGES: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "an unspecified or 'this network' address"),
    ("127.0.0.0/8", "a loopback address"),
    ("::1/128", "a loopback address"),
    ("::/128", "an unspecified address"),
    ("169.254.0.0/16", "a link-local address (cloud metadata lives here)"),
    ("fe80::/10", "a link-local address"),
    ("fd00:ec2::254/128", "a cloud metadata address"),
    ("10.0.0.0/8", "a private address"),
    ("172.16.0.0/12", "a private address"),
    ("192.168.0.0/16", "a private address"),
    ("100.64.0.0/10", "a shared (carrier-grade NAT) address"),
    ("fc00::/7", "a private (unique local) address"),
    ("224.0.0.0/4", "a multicast address"),
    ("ff00::/8", "a multicast address"),
    ("240.0.0.0/4", "a reserved address"),
)
_NETWORKS = tuple((ipaddress.ip_network(net), why) for net, why in _RANGES)


def parse_allow(cidrs: Iterable[str]) -> tuple[IPNetwork, ...]:
    """``--fetch-allow`` values as networks; a bad one is a ``ValueError`` naming it."""
    out = []
    for cidr in cidrs:
        try:
            out.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError as e:
            raise ValueError(f"--fetch-allow {cidr!r} is not an address range such as 127.0.0.1/32: {e}") \
                from None
    return tuple(out)


def _embedded_v4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, compatible, 6to4, NAT64), if any: the
    packet may end up there, so it is judged by it."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    packed = ip.packed
    if packed[:12] == bytes(12) and packed[12:] != bytes(4) and int(ip) > 1:  # ::a.b.c.d (deprecated)
        return ipaddress.IPv4Address(packed[12:])
    if packed[:12] == bytes.fromhex("0064ff9b0000000000000000"):  # NAT64 well-known prefix
        return ipaddress.IPv4Address(packed[12:])
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def refused(ip: IPAddress, allow: Sequence[IPNetwork]) -> str | None:
    """Why a tool may not connect to ``ip`` (None: it may). ``allow``: the operator's
    ``--fetch-allow`` ranges, which override every rule."""
    inner = _embedded_v4(ip)
    for candidate in (ip,) if inner is None else (ip, inner):
        if any(candidate.version == net.version and candidate in net for net in allow):
            return None
    for candidate in (ip,) if inner is None else (inner, ip):
        for net, why in _NETWORKS:
            if candidate.version == net.version and candidate in net:
                return why
        if not candidate.is_global:
            return "an address that is not on the public internet"
    return None


class FetchError(Exception):
    """A fetch that did not happen or failed; ``message`` is what the model reads."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Fetched:
    url: str  # after redirects
    status: int
    content_type: str
    body: bytes

    def text(self) -> str:
        charset = "utf-8"
        for part in self.content_type.split(";")[1:]:
            key, _, value = part.strip().partition("=")
            if key.lower() == "charset" and value:
                charset = value.strip('"')
        try:
            return self.body.decode(charset, errors="replace")
        except LookupError:
            return self.body.decode("utf-8", errors="replace")


def literal_ip(host: str) -> IPAddress | None:
    """``host`` as an IP address when it is one in the usual spellings (``[::1]`` too)."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


@dataclass
class Fetcher:
    """HTTP(S) GETs and POSTs for tools, with the address rules and limits.

    ``max_bytes``: the largest body read (more is cut and said so); ``timeout``: seconds for
    the whole exchange; ``max_redirects``: hops followed, each one checked again.
    """

    allow: tuple[IPNetwork, ...] = ()
    max_bytes: int = 5 * 1024 * 1024
    timeout: float = 20.0
    max_redirects: int = 5
    user_agent: str = "harmonykit-browser/1"
    _session: Any = field(default=None, init=False, repr=False)

    def check_url(self, url: str) -> tuple[str, str, int]:
        """(scheme, host, port) of a URL a tool may fetch, else ``FetchError``: only http and
        https, a host, and a literal IP (any spelling) that the rules allow."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as e:
            raise FetchError(f"invalid URL: {e}") from None
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise FetchError("only http and https URLs can be opened, not "
                             f"{scheme or 'one without a scheme'}")
        host = parts.hostname
        if not host:
            raise FetchError("the URL has no host")
        ip = literal_ip(host)
        if ip is not None:
            why = refused(ip, self.allow)
            if why:
                raise FetchError(f"{ip} is {why}, which tools may not reach")
        return scheme, host, port or (443 if scheme == "https" else 80)

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """The addresses ``host`` resolves to, every one allowed (else ``FetchError``)."""
        ip = literal_ip(host)
        if ip is not None:
            found = [ip]
        else:
            loop = asyncio.get_running_loop()
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except (socket.gaierror, UnicodeError) as e:
                raise FetchError(f"cannot resolve {host}: {e}") from None
            found = []
            for info in infos:
                addr = ipaddress.ip_address(str(info[4][0]).split("%")[0])
                if addr not in found:
                    found.append(addr)
        for addr in found:
            why = refused(addr, self.allow)
            if why:
                raise FetchError(f"{host} resolves to {addr}, {why}, which tools may not reach")
        if not found:
            raise FetchError(f"cannot resolve {host}")
        return found

    def session(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(resolver=_resolver(self), limit=64, ttl_dns_cache=None,
                                             use_dns_cache=False)
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False,
                                                  headers={"user-agent": self.user_agent})
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, url: str, *, headers: dict[str, str] | None = None,
                      json: Any = None, params: dict[str, Any] | None = None) -> Fetched:
        """One request, redirects followed (GET after a 303, each hop checked), the body read up
        to ``max_bytes``."""
        import aiohttp

        try:
            return await asyncio.wait_for(self._request(method, url, headers, json, params), self.timeout)
        except asyncio.TimeoutError:
            raise FetchError(f"no answer within {self.timeout:g} s") from None
        except aiohttp.ClientError as e:
            raise FetchError(_client_error(e)) from None

    async def _request(self, method: str, url: str, headers: dict[str, str] | None, json: Any,
                       params: dict[str, Any] | None) -> Fetched:
        session = self.session()
        for _ in range(self.max_redirects + 1):
            self.check_url(url)
            async with session.request(method, url, headers=headers, json=json, params=params,
                                       allow_redirects=False) as resp:
                if resp.status in (301, 302, 303, 307, 308) and "location" in resp.headers:
                    url = urljoin(str(resp.url), resp.headers["location"])
                    if resp.status == 303 or (resp.status in (301, 302) and method == "POST"):
                        method, json = "GET", None
                    params = None
                    continue
                body = await resp.content.read(self.max_bytes + 1)
                if len(body) > self.max_bytes:
                    body = body[: self.max_bytes]
                return Fetched(str(resp.url), resp.status, resp.headers.get("content-type", ""), body)
        raise FetchError(f"more than {self.max_redirects} redirects")


def _resolver(fetcher: Fetcher) -> Any:
    """aiohttp's resolver over ``Fetcher.resolve``: the connection goes to exactly the addresses
    that were checked (aiohttp imported here: the core never imports it)."""
    from aiohttp.abc import AbstractResolver

    class Resolver(AbstractResolver):
        async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[Any]:
            try:
                addrs = await fetcher.resolve(host, port)
            except FetchError as e:
                raise OSError(e.message) from None
            return [{"hostname": host, "host": str(a), "port": port, "family":
                     socket.AF_INET6 if a.version == 6 else socket.AF_INET, "proto": 0,
                     "flags": socket.AI_NUMERICHOST} for a in addrs]

        async def close(self) -> None:
            return None

    return Resolver()


def _client_error(e: Exception) -> str:
    text = str(e) or type(e).__name__
    # aiohttp wraps the resolver's refusal: show the refusal itself
    cause = getattr(e, "os_error", None)
    if cause is not None and str(cause):
        return str(cause)
    return text
