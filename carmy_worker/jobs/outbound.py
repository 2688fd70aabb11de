"""One HTTP POST to a callback's URL, with no server-side request forgery.

* Only a host ``CARMY_NOTIFY_HOSTS`` allows is called.
* The name is resolved once; if any of its addresses is not globally routable (loopback,
  private, link-local, unspecified, multicast, reserved, or shared like 100.64.0.0/10: allowed
  only with ``CARMY_NOTIFY_ALLOW_PRIVATE``), or is a cloud's metadata or credentials address
  (never allowed), nothing is called. An IPv6 address carrying an IPv4 one (mapped, 6to4,
  NAT64) is judged by the IPv4 address too.
* The connection goes to an address that was checked (no second resolution, so no DNS rebinding
  between the check and the connection): the first that takes one, in the resolver's order, so
  that an address this host has no route to (an IPv6 one, say) does not fail every attempt. The
  name goes in ``Host`` and in TLS's SNI and certificate check.
* No redirect is followed (a 3xx is a failed attempt); the whole exchange has a timeout; at most
  ``MAX_READ`` bytes of the answer are read (its status line is all that counts).

A refusal is final (``Answer.final``): retrying would be refused again.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from carmy_worker.settings import NotifySettings

TIMEOUT_S = 10.0
CONNECT_S = 3.0  # for a connection to an address with others after it: a route that drops packets
MAX_READ = 4096
MAX_ERROR = 200  # characters of an error kept in an attempt
# Where clouds serve an instance's metadata and credentials: AWS, GCP, Azure and most others
# (169.254.169.254, and AWS's IPv6 fd00:ec2::254), AWS ECS task credentials (169.254.170.2),
# EKS Pod Identity (169.254.170.23, fd00:ec2::23), Alibaba Cloud (100.100.100.200, a shared
# address) and Oracle Cloud (192.0.0.192, which Python counts as global).
METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "fd00:ec2::254", "169.254.170.2", "169.254.170.23", "fd00:ec2::23",
    "100.100.100.200", "192.0.0.192"))
NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052's well-known prefix: the last 32 bits are IPv4


@dataclass(frozen=True)
class Answer:
    """What an attempt got: the HTTP status, or why there was none (``error``); ``final``: the
    address is refused, so no later attempt would do better."""

    status: int | None = None
    error: str | None = None
    final: bool = False

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def refusal(address: str, *, allow_private: bool) -> str | None:
    """Why ``address`` (an IP) may not be called, or None."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    for each in _judged(ip):
        why = _refusal(each, allow_private=allow_private)
        if why is not None:
            return why
    return None


def _judged(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses ``ip`` is judged by: an IPv6 address that carries an IPv4 one reaches it.
    A mapped or NAT64 address is only a way of writing the IPv4 one; a 6to4 address is routed
    as itself and to the IPv4 relay, so both count."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return [ip.ipv4_mapped]
        if ip in NAT64:
            return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
        if ip.sixtofour is not None:
            return [ip, ip.sixtofour]
    return [ip]


def _refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, *, allow_private: bool) -> str | None:
    if ip in METADATA:
        return "a cloud metadata address"
    if allow_private:
        return None
    for kind, refused in (("loopback", ip.is_loopback), ("unspecified", ip.is_unspecified),
                          ("link-local", ip.is_link_local), ("multicast", ip.is_multicast),
                          ("private", ip.is_private), ("reserved", ip.is_reserved)):
        if refused:
            return f"a {kind} address"
    if not ip.is_global:
        return "not a globally routable address"  # 100.64.0.0/10: shared behind a carrier's or a cloud's NAT
    return None


def endpoint(url: str) -> str:
    """The receiver a callback URL names, ``scheme://host:port``, lowercase: the unit the callback
    loop shares its deliveries by. A URL that does not parse is its own endpoint."""
    try:
        parts = urlsplit(url)
        host, port = _host_port(parts)
    except ValueError:
        return url
    return f"{parts.scheme.lower()}://{host}:{port}"


def _host_port(parts: SplitResult) -> tuple[str, int]:
    """The host a URL names (without a root's dot) and its port, the scheme's when none is said."""
    return (parts.hostname or "").rstrip("."), parts.port or (443 if parts.scheme == "https" else 80)


def clip(message: str) -> str:
    return message if len(message) <= MAX_ERROR else message[:MAX_ERROR - 1] + "…"


async def post(url: str, body: bytes, headers: dict[str, str], *, settings: NotifySettings,
               timeout: float = TIMEOUT_S) -> Answer:
    """POST ``body`` to ``url`` under the rules above."""
    parts = urlsplit(url)
    try:
        host, port = _host_port(parts)
    except ValueError:  # a port that is no number, or out of range
        host = ""
    if parts.scheme not in ("http", "https") or not host:
        return Answer(error="not an http(s) URL", final=True)
    if not settings.allows_host(host):
        return Answer(error=f"host {host} is not in CARMY_NOTIFY_HOSTS", final=True)
    try:
        async with asyncio.timeout(timeout):
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
            for address in addresses:
                why = refusal(address, allow_private=settings.allow_private)
                if why is not None:
                    return Answer(error=f"{host} resolves to {address}, {why}: refused", final=True)
            if not addresses:
                return Answer(error=f"{host} does not resolve")
            tls = parts.scheme == "https"
            reader, writer = await _connect(addresses, port, tls, host)
            return await _exchange(reader, writer, port, tls, host, parts, body, headers)
    except TimeoutError:
        return Answer(error=f"no answer within {timeout:g} s")
    except (OSError, ssl.SSLError, ValueError) as exc:
        return Answer(error=clip(f"{type(exc).__name__}: {exc}"))


async def _connect(addresses: list[str], port: int, tls: bool,
                   host: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the first of ``addresses`` (each checked) that takes one. A TLS failure
    is the server's, not the route's: it is not tried elsewhere."""
    context = ssl.create_default_context() if tls else None
    failure: OSError | None = None
    for i, address in enumerate(addresses):
        try:
            async with asyncio.timeout(CONNECT_S if i < len(addresses) - 1 else None):
                return await asyncio.open_connection(address, port, ssl=context,
                                                     server_hostname=host if tls else None)
        except ssl.SSLError:
            raise
        except OSError as exc:
            failure = exc
    assert failure is not None  # ``addresses`` is never empty
    raise failure


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int, tls: bool, host: str,
                    parts: SplitResult, body: bytes, headers: dict[str, str]) -> Answer:
    try:
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        default = 443 if tls else 80
        authority = host if ":" not in host else f"[{host}]"
        if port != default:
            authority += f":{port}"
        lines = [f"POST {target} HTTP/1.1", f"Host: {authority}", "Content-Type: application/json",
                 f"Content-Length: {len(body)}", "Connection: close", "User-Agent: carmy-callbacks",
                 *(f"{k}: {v}" for k, v in headers.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        await writer.drain()
        head = b""
        while b"\r\n" not in head and len(head) < MAX_READ:
            chunk = await reader.read(MAX_READ - len(head))
            if not chunk:
                break
            head += chunk
    finally:
        writer.close()
    status_line = head.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/") or not status_line[1].isdigit():
        return Answer(error="not an HTTP answer")
    status = int(status_line[1])
    if 300 <= status < 400:
        return Answer(status=status, error="a redirect, not followed")
    return Answer(status=status)
