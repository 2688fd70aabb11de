"""The callbacks' outbound HTTP: which addresses are refused, that the address checked is the one
connected to (a name resolved once), and that a refusal calls nothing."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from carmy_worker.jobs import outbound
from carmy_worker.jobs.outbound import refusal
from carmy_worker.settings import NotifySettings, SettingsError, notify_from_env

ANY = NotifySettings(secret="whsec_x", hosts=("*",))


@pytest.mark.parametrize(("address", "why"), [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"), ("fd12::1", "private"),
    ("169.254.1.1", "link-local"), ("fe80::1", "link-local"), ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("224.0.0.1", "multicast"), ("ff02::1", "multicast"),
    ("169.254.169.254", "cloud metadata"), ("fd00:ec2::254", "cloud metadata"),
    # Shared address space (RFC 6598) is neither private nor global to Python: refused as not global.
    ("100.64.0.1", "not a globally routable"), ("100.127.255.254", "not a globally routable"),
    # IPv6 that carries an IPv4 address is judged by it: 6to4 and NAT64 of loopback and private ones.
    ("2002:7f00:1::", "loopback"), ("2002:a00:1::", "private"), ("64:ff9b::7f00:1", "loopback"),
    ("64:ff9b::a00:1", "private"),
])
def test_forbidden_addresses(address: str, why: str) -> None:
    found = refusal(address, allow_private=False)
    assert found is not None and why in found


def test_public_addresses_pass_and_private_ones_when_allowed_but_never_metadata() -> None:
    assert refusal("93.184.216.34", allow_private=False) is None
    assert refusal("2606:4700::6810:84e5", allow_private=False) is None
    assert refusal("127.0.0.1", allow_private=True) is None
    assert refusal("10.0.0.1", allow_private=True) is None
    assert refusal("169.254.169.254", allow_private=True) == "a cloud metadata address"
    assert refusal("100.64.0.1", allow_private=True) is None
    # A public IPv4 address reached through NAT64 or 6to4 is public.
    assert refusal("64:ff9b::5db8:d822", allow_private=False) is None
    assert refusal("2002:5db8:d822::1", allow_private=False) is None


@pytest.mark.parametrize("address", [
    "169.254.169.254", "fd00:ec2::254",  # AWS, GCP, Azure and most clouds; AWS over IPv6
    "169.254.170.2",  # AWS ECS task credentials
    "169.254.170.23", "fd00:ec2::23",  # EKS Pod Identity
    "100.100.100.200",  # Alibaba Cloud
    "192.0.0.192",  # Oracle Cloud, which Python's ipaddress counts as global
    "::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "64:ff9b::6464:64c8",  # the same, written as IPv6
])
def test_cloud_metadata_and_credentials_addresses_are_refused_even_when_private_ones_are_allowed(address: str) -> None:
    for allow_private in (False, True):
        assert refusal(address, allow_private=allow_private) == "a cloud metadata address"


def test_hosts_are_allowed_by_name() -> None:
    s = notify_from_env({"CARMY_NOTIFY_HOSTS": "Hooks.Example.com., 127.0.0.1", "CARMY_NOTIFY_SECRET": ""})
    assert s.allows_host("hooks.example.com") and s.allows_host("hooks.example.com.")
    assert not s.allows_host("evil.example.com") and not s.enabled
    assert notify_from_env({}).hosts == () and not notify_from_env({}).allows_host("a")
    assert ANY.allows_host("anything")


@pytest.mark.parametrize("secret", ["abc", "whsec_not base64!", "whsec_YWJj"])
def test_a_malformed_secret_is_refused(secret: str) -> None:
    with pytest.raises(SettingsError, match="CARMY_NOTIFY_SECRET"):
        notify_from_env({"CARMY_NOTIFY_SECRET": secret})


async def test_a_name_is_resolved_once_and_its_address_connected_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name that resolves to a private address on its second resolution (DNS rebinding) is
    never resolved twice: the connection goes to the address checked."""
    resolved: list[str] = []
    connected: list[tuple[Any, ...]] = []
    answers = iter(["93.184.216.34", "127.0.0.1"])

    async def getaddrinfo(self: Any, host: str, port: int, **kw: Any) -> list[Any]:
        resolved.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (next(answers), port))]

    async def open_connection(host: str, port: int, **kw: Any) -> Any:
        connected.append((host, port, kw.get("server_hostname")))
        raise ConnectionRefusedError("test: nothing listens")

    monkeypatch.setattr(asyncio.get_running_loop().__class__, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(asyncio, "open_connection", open_connection)
    answer = await outbound.post("https://hooks.example.com/x", b"{}", {}, settings=ANY)
    assert resolved == ["hooks.example.com"]
    assert connected == [("93.184.216.34", 443, "hooks.example.com")]
    assert answer.error is not None and "ConnectionRefusedError" in answer.error and not answer.final


async def test_any_forbidden_address_of_a_name_refuses_it_without_connecting(monkeypatch: pytest.MonkeyPatch) -> None:
    async def getaddrinfo(self: Any, host: str, port: int, **kw: Any) -> list[Any]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in ("93.184.216.34", "10.0.0.7")]

    async def open_connection(*a: Any, **kw: Any) -> Any:
        raise AssertionError("connected")

    monkeypatch.setattr(asyncio.get_running_loop().__class__, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(asyncio, "open_connection", open_connection)
    answer = await outbound.post("http://mixed.example.com/", b"{}", {}, settings=ANY)
    assert answer.final and answer.error == "mixed.example.com resolves to 10.0.0.7, a private address: refused"


async def test_a_host_not_allowed_or_not_http_is_final_without_resolving() -> None:
    only = NotifySettings(secret="whsec_x", hosts=("a.example",))
    answer = await outbound.post("http://b.example/", b"{}", {}, settings=only)
    assert answer.final and answer.error == "host b.example is not in CARMY_NOTIFY_HOSTS"
    assert (await outbound.post("file:///etc/passwd", b"", {}, settings=ANY)).final
    # A port that is no port: refused as final, like a URL that is not http(s), not raised.
    for url in ("http://a.example:99999/", "http://a.example:x/"):
        answer = await outbound.post(url, b"{}", {}, settings=only)
        assert answer.final and answer.error == "not an http(s) URL"
        assert outbound.endpoint(url) == url  # its own receiver


async def test_an_address_that_takes_no_connection_is_passed_for_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name whose first address this host cannot reach (here ``::1``, where nothing listens;
    in life an IPv6 address without an IPv6 route) is delivered to through the next one, checked
    as well: it used to fail every attempt."""
    got: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def getaddrinfo(self: Any, host: str, port: int, **kw: Any) -> list[Any]:
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(asyncio.get_running_loop().__class__, "getaddrinfo", getaddrinfo)
    allowed = NotifySettings(secret="whsec_x", hosts=("*",), allow_private=True)
    async with server:
        answer_ = await outbound.post(f"http://two.example:{port}/hook", b"{}", {}, settings=allowed)
    assert answer_.ok and answer_.status == 204, answer_
    assert len(got) == 1 and got[0].startswith(b"POST /hook HTTP/1.1\r\nHost: two.example:")
    # Every address is still checked first: one refused refuses the name, whichever comes first.
    strict = NotifySettings(secret="whsec_x", hosts=("*",))
    refused = await outbound.post(f"http://two.example:{port}/hook", b"{}", {}, settings=strict)
    assert refused.final and "::1" in (refused.error or "") and len(got) == 1


async def test_an_address_whose_route_drops_packets_is_given_up_for_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that never completes (a route dropping packets) is given ``CONNECT_S`` when
    other addresses follow, not the whole attempt's time."""
    tried: list[str] = []

    async def open_connection(host: str, port: int, **kw: Any) -> Any:
        tried.append(host)
        if host == "2001:db8::1":
            await asyncio.sleep(60)  # SYNs dropped
        raise ConnectionRefusedError("test: nothing listens")

    async def getaddrinfo(self: Any, host: str, port: int, **kw: Any) -> list[Any]:
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("2001:db8::1", port, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(asyncio.get_running_loop().__class__, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(asyncio, "open_connection", open_connection)
    monkeypatch.setattr(outbound, "CONNECT_S", 0.05)
    allowed = NotifySettings(secret="whsec_x", hosts=("*",), allow_private=True)
    answer = await outbound.post("http://two.example/hook", b"{}", {}, settings=allowed, timeout=30)
    assert tried == ["2001:db8::1", "127.0.0.1"]
    assert answer.error is not None and "ConnectionRefusedError" in answer.error and not answer.final
