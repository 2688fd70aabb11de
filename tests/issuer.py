"""A stand-in OAuth authorization server for tests: keys generated per test run, tokens signed
with them, and its JWK Set served over HTTP on 127.0.0.1 (what it serves can change, to rotate
keys or fail)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support import serving

ISSUER = "https://issuer.test"
RESOURCE = "https://carmy.test"

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


@dataclass
class SigningKey:
    kid: str
    alg: str
    private: PrivateKey

    def jwk(self) -> dict[str, Any]:
        """The public half as a JWK, with its kid, use and alg."""
        jwk = jwt.get_algorithm_by_name(self.alg).to_jwk(self.private.public_key(), as_dict=True)
        return {**jwk, "kid": self.kid, "use": "sig", "alg": self.alg}

    def public_pem(self) -> bytes:
        return self.private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)


def new_key(kid: str, alg: str = "RS256") -> SigningKey:
    private: PrivateKey
    if alg.startswith(("RS", "PS")):
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif alg == "ES256":
        private = ec.generate_private_key(ec.SECP256R1())
    elif alg == "EdDSA":
        private = ed25519.Ed25519PrivateKey.generate()
    else:
        raise ValueError(alg)
    return SigningKey(kid, alg, private)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class Issuer:
    """Signs tokens; serves ``jwks`` (its keys' public halves) with ``status`` at ``jwks_url``."""

    keys: list[SigningKey]
    status: int = 200
    hits: int = 0
    jwks_url: str = ""
    extra: list[dict[str, Any]] = field(default_factory=list)  # more JWKs to publish as they are
    raw: bytes | None = None  # served instead of the key set, when set

    def claims(self, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {"iss": ISSUER, "aud": RESOURCE, "sub": "user-1", "iat": now, "exp": now + 300,
                                  "scope": "confirm:wipe tools:read"}
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not None}

    def token(self, key: SigningKey | None = None, headers: dict[str, Any] | None = None, **claims: Any) -> str:
        """A token signed by ``key`` (the first key by default), with ``claims`` over the defaults
        (a claim given as None is left out)."""
        key = key or self.keys[0]
        return jwt.encode(self.claims(**claims), key.private, algorithm=key.alg,
                          headers={"kid": key.kid, **(headers or {})})

    def jwks(self) -> dict[str, Any]:
        return {"keys": [key.jwk() for key in self.keys] + self.extra}

    def jwks_document(self) -> bytes:
        return json.dumps(self.jwks()).encode()

    async def endpoint(self, request: Request) -> Response:
        self.hits += 1
        if self.status != 200:
            return Response(status_code=self.status)
        if self.raw is not None:
            return Response(self.raw, media_type="application/json")
        return JSONResponse(self.jwks())


def unsigned(claims: dict[str, Any], kid: str) -> str:
    """``alg: none``: no signature at all."""
    header = b64(json.dumps({"alg": "none", "typ": "JWT", "kid": kid}).encode())
    return f"{header}.{b64(json.dumps(claims).encode())}."


def hs256_with(secret: bytes, claims: dict[str, Any], kid: str) -> str:
    """HS256 signed with ``secret``: with the issuer's public key as the secret, the classic
    algorithm-confusion forgery (anyone has that key)."""
    signing_input = f"{b64(json.dumps({'alg': 'HS256', 'typ': 'JWT', 'kid': kid}).encode())}." \
                    f"{b64(json.dumps(claims).encode())}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


def tampered(token: str, **claims: Any) -> str:
    """``token`` with its payload changed and its signature kept."""
    header, payload, signature = token.split(".")
    body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    body.update(claims)
    return f"{header}.{b64(json.dumps(body).encode())}.{signature}"


def reheaded(token: str, **header: Any) -> str:
    """``token`` with its header changed (``alg``...) and its payload and signature kept."""
    head, payload, signature = token.split(".")
    fields = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    fields.update(header)
    return f"{b64(json.dumps(fields).encode())}.{payload}.{signature}"


@contextlib.contextmanager
def issuing(*keys: SigningKey) -> Iterator[Issuer]:
    """An ``Issuer`` of ``keys`` whose JWK Set is served on 127.0.0.1 while in the block."""
    issuer = Issuer(list(keys))
    with serving(Starlette(routes=[Route("/jwks", issuer.endpoint)])) as base:
        issuer.jwks_url = base + "/jwks"
        yield issuer


def challenge(header: str) -> dict[str, str]:
    """A ``WWW-Authenticate: Bearer k="v", ...`` header as a dict (our values hold no quotes)."""
    scheme, _, params = header.partition(" ")
    assert scheme == "Bearer", header
    found: dict[str, str] = {}
    for part in params.split('", '):
        name, _, value = part.partition("=")
        found[name.strip()] = value.strip('"')
    return found
