"""OAuth 2.0 Protected Resource Metadata (RFC 9728): the documents that tell a client which
authorization server issues tokens for this server, and where they are."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from msgspec import Struct
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.settings.oauth import OAuthSettings
from carmy_worker.wire import json_encoder

WELL_KNOWN = "/.well-known/oauth-protected-resource"
MCP_SUFFIX = "/mcp"


class ResourceMetadata(Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The fields of RFC 9728 section 2 that this server has something to say in."""

    resource: str
    authorization_servers: list[str]
    bearer_methods_supported: list[str]
    scopes_supported: list[str] | None = None
    resource_name: str | None = None


def metadata_url(resource: str) -> str:
    """Where the metadata of ``resource`` is (RFC 9728 section 3.1: the well-known path goes
    between the host and the resource's own path)."""
    parts = urlsplit(resource)
    return f"{parts.scheme}://{parts.netloc}{WELL_KNOWN}{parts.path.rstrip('/')}"


class ProtectedResources:
    """The deployment as a protected resource (``CARMY_OAUTH_RESOURCE``), and its MCP endpoint
    as one of its own, ``<resource>/mcp``, for MCP clients that look for the path-suffixed
    document first. A token for either is accepted at ``/mcp``; elsewhere, for the deployment."""

    def __init__(self, settings: OAuthSettings, name: str) -> None:
        self.resource = settings.canonical_resource
        self.mcp_resource = self.resource + MCP_SUFFIX
        self.metadata_url = metadata_url(self.resource)
        self.mcp_metadata_url = metadata_url(self.mcp_resource)
        self.scopes = settings.scopes

        def document(resource: str) -> bytes:
            return json_encoder.encode(ResourceMetadata(
                resource=resource, authorization_servers=[settings.issuer], bearer_methods_supported=["header"],
                scopes_supported=list(settings.scopes) or None, resource_name=name))

        self._documents = {False: document(self.resource), True: document(self.mcp_resource)}

    def audiences(self, mcp: bool) -> tuple[str, ...]:
        return (self.resource, self.mcp_resource) if mcp else (self.resource,)

    def url(self, mcp: bool) -> str:
        return self.mcp_metadata_url if mcp else self.metadata_url

    def routes(self) -> list[Route]:
        """The two documents, at this app's root (a host that mounts the app under a path
        forwards ``metadata_url`` and ``mcp_metadata_url`` to them)."""
        def serve(body: bytes) -> Callable[[Request], Awaitable[Response]]:
            async def endpoint(request: Request) -> Response:
                # Public and the same for everyone: caches may keep it.
                return Response(body, headers={"cache-control": "public, max-age=3600"}, media_type="application/json")
            return endpoint

        return [Route(WELL_KNOWN, serve(self._documents[False]), methods=["GET"]),
                Route(WELL_KNOWN + MCP_SUFFIX, serve(self._documents[True]), methods=["GET"])]
