"""The ``client`` of the in-process API tests: the app through httpx's ASGI transport, its
lifespan running, against the module's Redis (``stack``) and one real worker of
``tests.toolsets.basic``.

A module that needs something else overrides one of the fixtures it is built from, so the
difference is written in that module, next to the tests that rely on it:

* ``worker_env``: extra environment of the worker (``CARMY_CONCURRENCY``...);
* ``api_settings``: the app's ``ApiSettings`` (API keys, server name...);
* ``asgi_app``: the app served (``create_app(api_settings)``, or a host app mounting it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from api.app import create_app
from api.settings import ApiSettings
from tests.conftest import asgi_client
from tests.support import Proc, Stack, app_settings


@pytest.fixture(scope="module")
def worker_env() -> dict[str, str]:
    """Extra environment of the module's worker: none."""
    return {}


@pytest.fixture(scope="module")
def worker(stack: Stack, worker_env: dict[str, str]) -> Proc:
    """The module's worker, serving ``tests.toolsets.basic``."""
    return stack.worker(env=worker_env)


@pytest.fixture(scope="module")
def api_settings(stack: Stack) -> ApiSettings:
    """The defaults, against the module's Redis."""
    return app_settings(stack.redis_url)


@pytest.fixture(scope="module")
def asgi_app(api_settings: ApiSettings) -> Starlette:
    return create_app(api_settings)


@pytest.fixture(scope="module")
async def client(worker: Proc, asgi_app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(asgi_app) as c:
        yield c
