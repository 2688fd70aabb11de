"""The upstream's credentials, read from the environment once, when the tools are registered.

A secret is named by its variable, never written in code or on a command line (where ``ps``
would show it), and never appears in a repr, a log line, or an answer or error sent to an agent.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

# The variables ``python -m carmy_worker --openapi`` reads (README, "Serve an existing API").
BEARER_ENV = "CARMY_OPENAPI_BEARER_TOKEN"
API_KEY_ENV = "CARMY_OPENAPI_API_KEY"
USERNAME_ENV = "CARMY_OPENAPI_USERNAME"
PASSWORD_ENV = "CARMY_OPENAPI_PASSWORD"


class AuthError(ValueError):
    """A credential's variable is unset or empty."""


@dataclass(frozen=True)
class Auth:
    """How each upstream request is authenticated: a header (``Authorization`` or an API key's)
    or a query parameter, whose value is a secret."""

    where: Literal["header", "query"]
    name: str
    _value: str = field(repr=False)
    _secrets: tuple[str, ...] = field(repr=False, default=())  # what an echo of them may contain

    def headers(self) -> dict[str, str]:
        """What a request's headers get."""
        return {self.name: self._value} if self.where == "header" else {}

    def params(self) -> dict[str, str]:
        """What a request's query gets."""
        return {self.name: self._value} if self.where == "query" else {}

    def hide(self, text: str) -> str:
        """``text`` with the secrets blanked out, as they are and as a JSON string writes them:
        for the upstream's answers, which may echo them."""
        for secret in (self._value, *self._secrets):
            for form in dict.fromkeys((secret, json.dumps(secret, ensure_ascii=False)[1:-1])):
                text = text.replace(form, "[secret]")
        return text


def _read(variable: str, environ: Mapping[str, str] | None) -> str:
    value = (os.environ if environ is None else environ).get(variable, "")
    if not value:
        raise AuthError(f"the upstream's credential variable {variable} is unset or empty")
    return value


def bearer(env: str = BEARER_ENV, *, environ: Mapping[str, str] | None = None) -> Auth:
    """``Authorization: Bearer <the value of env>``."""
    token = _read(env, environ)
    return Auth("header", "Authorization", "Bearer " + token, (token,))


def api_key_header(name: str, env: str = API_KEY_ENV, *, environ: Mapping[str, str] | None = None) -> Auth:
    """An API key in the header ``name`` (``X-API-Key``, say)."""
    return Auth("header", name, _read(env, environ))


def api_key_query(name: str, env: str = API_KEY_ENV, *, environ: Mapping[str, str] | None = None) -> Auth:
    """An API key in the query parameter ``name``."""
    return Auth("query", name, _read(env, environ))


def basic(user_env: str = USERNAME_ENV, password_env: str = PASSWORD_ENV, *,
          environ: Mapping[str, str] | None = None) -> Auth:
    """HTTP Basic authentication with a user name and a password from two variables."""
    user, password = _read(user_env, environ), _read(password_env, environ)
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    return Auth("header", "Authorization", "Basic " + pair, (pair, password))
