"""uvicorn's private surface, pinned: ``api/serving/server.py`` subclasses uvicorn's httptools protocol
(``HardenedHttpToolsProtocol``) and ``api/serving/onewrite.py`` its request-response cycle
(``OneWriteCycle``), overriding their callbacks and reading and writing their attributes, none of
which uvicorn documents. A uvicorn or httptools release that renames, re-signs or changes any of
it must fail here, naming it, rather than as a server that quietly stops bounding its requests.
``pyproject.toml`` allows only the releases this passed on."""

from __future__ import annotations

import asyncio
import collections
import importlib
import inspect
import logging
import re
from collections.abc import Callable
from typing import Any

import httptools
import pytest
import uvicorn
from starlette.types import Message, Receive, Scope, Send
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from api.serving.onewrite import HeldHead, OneWriteCycle
from api.serving.server import HardenedHttpToolsProtocol, Server
from tests.pins import assert_tested_release

# Every name of uvicorn (and httptools) the API relies on, by where it lives; the comment above
# each says which of our modules uses it.
SURFACE: dict[str, tuple[str, ...]] = {
    # server.py: the class HardenedHttpToolsProtocol extends, and the status lines _refuse writes;
    # onewrite.py: the class OneWriteCycle extends, and install() swaps in for a cycle uvicorn made.
    "uvicorn.protocols.http.httptools_impl": ("HttpToolsProtocol", "RequestResponseCycle", "STATUS_LINE"),
    # onewrite.py, for the type checker only: the message type of the send it overrides.
    "uvicorn._types": ("ASGISendEvent",),
    # server.py: Server runs its collector set-up after uvicorn's.
    "uvicorn.Server methods overridden": ("startup",),
    # server.py: HardenedHttpToolsProtocol's overrides; each calls uvicorn's own.
    "HttpToolsProtocol methods overridden": (
        "connection_made", "connection_lost", "eof_received", "data_received", "on_headers_complete",
        "on_message_complete", "on_response_complete", "_unsupported_upgrade_warning",
    ),
    # server.py: the parser callbacks that fill url, headers and scope before on_headers_complete
    # (which _host_from_target rewrites), and the constructor uvicorn calls the protocol class with.
    "HttpToolsProtocol methods relied on": ("__init__", "on_message_begin", "on_url", "on_header"),
    # server.py: what HardenedHttpToolsProtocol reads or writes on itself.
    "HttpToolsProtocol attributes": (
        "app", "client", "cycle", "flow", "headers", "logger", "loop", "pipeline", "scheme", "scope",
        "server_state", "transport", "url",
    ),
    # server.py: _body_timeout_expired (flow) and _refuse (server_state).
    "FlowControl attributes": ("read_paused",),
    "ServerState attributes": ("default_headers",),
    # server.py (connection_lost, eof_received, _body_timeout_expired) and onewrite.py (send, install).
    "RequestResponseCycle attributes": (
        "disconnected", "keep_alive", "message_event", "response_complete", "response_started", "scope",
        "transport", "waiting_for_100_continue",
    ),
    "RequestResponseCycle methods overridden": ("send",),
    # onewrite.py: HeldHead stands in for the cycle's transport, so these are all a cycle may call on it.
    "RequestResponseCycle transport methods": ("close", "is_closing", "write"),
    # server.py's _host_from_target, on uvicorn's raw request target (public httptools API).
    "httptools": ("HttpParserInvalidURLError", "parse_url"),
}

# What each method named above looks like in the uvicorn we support (uvicorn's annotations are strings).
SIGNATURES = {
    "HttpToolsProtocol.__init__": ("(self, config: 'Config', server_state: 'ServerState', app_state: "
                                   "'dict[str, Any]', _loop: 'asyncio.AbstractEventLoop | None' = None) -> 'None'"),
    "HttpToolsProtocol.connection_made": "(self, transport: 'asyncio.Transport') -> 'None'",
    "HttpToolsProtocol.connection_lost": "(self, exc: 'Exception | None') -> 'None'",
    "HttpToolsProtocol.eof_received": "(self) -> 'None'",
    "HttpToolsProtocol.data_received": "(self, data: 'bytes') -> 'None'",
    "HttpToolsProtocol.on_message_begin": "(self) -> 'None'",
    "HttpToolsProtocol.on_url": "(self, url: 'bytes') -> 'None'",
    "HttpToolsProtocol.on_header": "(self, name: 'bytes', value: 'bytes') -> 'None'",
    "HttpToolsProtocol.on_headers_complete": "(self) -> 'None'",
    "HttpToolsProtocol.on_message_complete": "(self) -> 'None'",
    "HttpToolsProtocol.on_response_complete": "(self) -> 'None'",
    # Absent before uvicorn 0.30.6: an override of nothing would let the warning through again.
    "HttpToolsProtocol._unsupported_upgrade_warning": "(self) -> 'None'",
    "RequestResponseCycle.send": "(self, message: 'ASGISendEvent') -> 'None'",
    "Server.startup": "(self, sockets: 'list[socket.socket] | None' = None) -> 'None'",
}

# Statements of uvicorn's source whose meaning the overrides rely on, by the method they are in.
STATEMENTS = {
    "HttpToolsProtocol.on_headers_complete": (
        # The 431 answer: the app HardenedHttpToolsProtocol sets before calling this is the one run.
        "app = self.app",
        # A new cycle per request (``self.cycle is not previous``), calling back the override.
        "self.cycle = RequestResponseCycle(",
        "on_response=self.on_response_complete,",
        "self.pipeline.appendleft((self.cycle, app))",
    ),
    # on_response_complete tells "idle" from "a pipelined request waits" before uvicorn pops it.
    "HttpToolsProtocol.on_response_complete": ("if self.pipeline:", "cycle, app = self.pipeline.pop()"),
    # connection_lost: the cycle of a request in flight learns of it (Departure is set after this).
    "HttpToolsProtocol.connection_lost": (
        "if self.cycle and not self.cycle.response_complete:",
        "self.cycle.disconnected = True",
        "self.cycle.message_event.set()",
    ),
    "HttpToolsProtocol.data_received": ("self._unsupported_upgrade_warning()",),
    # eof_received sets waiting_for_100_continue off (the probe was the interim answer) and
    # keep_alive off (close once answered); the body deadline ends receive() with disconnected.
    "RequestResponseCycle.receive": (
        "if self.waiting_for_100_continue and not self.transport.is_closing():",
        "if self.disconnected or self.response_complete:",
        'return {"type": "http.disconnect"}',
    ),
    "RequestResponseCycle.send": ("if not self.keep_alive:", "self.response_complete = True", "self.on_response()"),
}

OWNERS = {"HttpToolsProtocol": HttpToolsProtocol, "RequestResponseCycle": RequestResponseCycle,
          "Server": uvicorn.Server}


def method(qualified: str) -> Callable[..., Any]:
    owner, name = qualified.split(".")
    found: Callable[..., Any] = getattr(OWNERS[owner], name)
    return found


@pytest.mark.parametrize("distribution", ["uvicorn", "httptools"])
def test_the_release_installed_is_a_tested_one(distribution: str) -> None:
    assert_tested_release(distribution)


def test_every_module_level_name_exists() -> None:
    for module in ("uvicorn.protocols.http.httptools_impl", "uvicorn._types", "httptools"):
        imported = importlib.import_module(module)
        missing = [name for name in SURFACE[module] if not hasattr(imported, name)]
        assert missing == [], f"{module} has no {missing}"
    assert (STATUS_LINE[408], STATUS_LINE[431]) == (b"HTTP/1.1 408 Request Timeout\r\n",
                                                      b"HTTP/1.1 431 Request Header Fields Too Large\r\n")


def test_every_method_overridden_or_relied_on_keeps_its_signature() -> None:
    named = [f"HttpToolsProtocol.{name}" for name in SURFACE["HttpToolsProtocol methods overridden"]
             + SURFACE["HttpToolsProtocol methods relied on"]]
    named += [f"RequestResponseCycle.{name}" for name in SURFACE["RequestResponseCycle methods overridden"]]
    named += [f"Server.{name}" for name in SURFACE["uvicorn.Server methods overridden"]]
    assert sorted(named) == sorted(SIGNATURES)
    changed = {name: str(inspect.signature(method(name))) for name in SIGNATURES
               if str(inspect.signature(method(name))) != SIGNATURES[name]}
    assert changed == {}
    # And ours do override them (a renamed method of uvicorn's would leave ours uncalled).
    assert issubclass(HardenedHttpToolsProtocol, HttpToolsProtocol)
    assert issubclass(OneWriteCycle, RequestResponseCycle) and issubclass(Server, uvicorn.Server)
    for name in SURFACE["HttpToolsProtocol methods overridden"]:
        assert name in vars(HardenedHttpToolsProtocol), name


def test_the_statements_the_overrides_rely_on_are_in_uvicorn_s_source() -> None:
    missing = {name: [s for s in statements if s not in inspect.getsource(method(name))]
               for name, statements in STATEMENTS.items()}
    assert {name: lines for name, lines in missing.items() if lines} == {}


def test_none_of_our_own_names_is_one_uvicorn_uses() -> None:
    """The state our subclasses add must not collide with a name a uvicorn release starts using."""
    for ours, theirs in ((HardenedHttpToolsProtocol, HttpToolsProtocol), (OneWriteCycle, RequestResponseCycle)):
        added = {name for name in vars(ours) if not name.startswith("__")} - set(vars(theirs))
        used = set(dir(theirs)) | set(re.findall(r"self\.(\w+)", inspect.getsource(theirs)))
        assert sorted(added & used) == [], ours.__name__


def test_a_fin_closes_the_transport_unless_the_override_says_otherwise() -> None:
    """asyncio closes a transport whose protocol's ``eof_received`` returns a false value: uvicorn's
    returns None, so only HardenedHttpToolsProtocol's True keeps a half-closed connection open."""
    assert inspect.getsource(HttpToolsProtocol.eof_received).rstrip().endswith("pass")


def test_a_cycle_calls_only_what_held_head_offers_on_its_transport() -> None:
    called = set(re.findall(r"self\.transport\.(\w+)", inspect.getsource(RequestResponseCycle)))
    assert sorted(called) == sorted(SURFACE["RequestResponseCycle transport methods"])
    assert [name for name in called if not callable(getattr(HeldHead, name, None))] == []


def test_the_target_parser_gives_host_and_port() -> None:
    target = httptools.parse_url(b"http://[::1]:8080/path?q")
    assert (target.host, target.port, target.path) == (b"::1", 8080, b"/path")
    with pytest.raises(httptools.HttpParserInvalidURLError):
        httptools.parse_url(b"http://a b/")


async def test_every_attribute_we_touch_exists_on_uvicorn_s_own_protocol_and_cycle() -> None:
    """A plain ``HttpToolsProtocol``, made as uvicorn's Server makes it, with a request whose body
    has not arrived: the moment at which the body deadline reads most of these."""
    made: list[HttpToolsProtocol] = []
    waiting = asyncio.Event()
    received: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        waiting.set()
        received.append(await receive())

    config = uvicorn.Config(app, http="httptools", ws="none", lifespan="off", log_config=None, proxy_headers=False)
    state = ServerState()

    def protocol() -> HttpToolsProtocol:
        made.append(HttpToolsProtocol(config=config, server_state=state, app_state={}))
        return made[-1]

    loop = asyncio.get_running_loop()
    server = await loop.create_server(protocol, "127.0.0.1", 0)
    _, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
    try:
        target = b"http://example.com:8080/p?q=1"
        writer.write(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\n" % target)
        await asyncio.wait_for(waiting.wait(), 5)
        [proto] = made
        missing = [a for a in SURFACE["HttpToolsProtocol attributes"] if not hasattr(proto, a)]
        assert missing == [], f"HttpToolsProtocol has no {missing}"
        cycle = proto.cycle
        missing = [a for a in SURFACE["RequestResponseCycle attributes"] if not hasattr(cycle, a)]
        assert missing == [], f"RequestResponseCycle has no {missing}"
        assert [a for a in SURFACE["FlowControl attributes"] if not hasattr(proto.flow, a)] == []
        assert [a for a in SURFACE["ServerState attributes"] if not hasattr(proto.server_state, a)] == []

        # What the overrides take them to mean.
        assert proto.url == target  # the raw target, absolute form included (_host_from_target)
        assert proto.headers is proto.scope["headers"] and cycle.scope is proto.scope  # edited in place
        assert (proto.scope["http_version"], proto.scheme, proto.client) == ("1.1", "http", writer.get_extra_info(
            "sockname")[:2])
        assert proto.loop is loop and proto.app is config.loaded_app and proto.server_state is state
        assert isinstance(proto.pipeline, collections.deque) and not proto.pipeline
        assert isinstance(proto.flow, FlowControl) and proto.flow.read_paused is False
        assert isinstance(state.default_headers, list) and isinstance(proto.logger, logging.Logger)
        assert cycle.transport is proto.transport and isinstance(cycle.message_event, asyncio.Event)
        assert (cycle.response_started, cycle.response_complete, cycle.keep_alive, cycle.waiting_for_100_continue,
                cycle.disconnected) == (False, False, True, False, False)

        # OneWriteCycle.install swaps the class of a cycle uvicorn made; the body deadline ends
        # the handler's receive() as the server's own disconnect would.
        OneWriteCycle.install(cycle)
        assert isinstance(cycle, OneWriteCycle) and isinstance(cycle.transport, HeldHead)
        cycle.disconnected = True
        cycle.message_event.set()
        for _ in range(100):
            if received:
                break
            await asyncio.sleep(0.01)
        assert received == [{"type": "http.disconnect"}]
    finally:
        writer.close()
        server.close()
        await server.wait_closed()
