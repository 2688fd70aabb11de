"""``POST /agent/webhooks/{name}``: a verified delivery becomes a call or a job of its webhook's
tool (``CARMY_WEBHOOKS``; docs/protocol.md, "Webhooks in").

In order: the name (``404 WEBHOOK_NOT_FOUND``), an API key if the webhook asks for one, the body
with the limit of ``/agent/execute`` (``413``), its signature over the raw bytes
(``401 WEBHOOK_UNAUTHORIZED``: nothing parsed, recorded or run), then JSON (``400
INVALID_REQUEST``). The body, or the part the ``arguments`` pointer names, is the tool's
arguments; the event id (a pointer into the body, or a header) is the call's ``request_id``, so
a redelivery replays instead of running again. The caller is ``webhook:<name>`` (its own
quota and request ids) unless the webhook asks for an API key, whose principal it then is.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from redis.exceptions import RedisError
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from api.calling.checks import Rejected
from api.calling.jobs import Jobs
from api.endpoints.execute import ExecuteEndpoint
from api.endpoints.jobs import location
from api.guards.auth import CONTEXT_SCOPE_KEY, Authenticator, RequireAuth, trusted_context
from api.guards.body import BodyTooLarge, ClientGone, read_body
from api.guards.webhooks import refusal
from api.http.fields import fields
from api.http.pointer import MISSING, resolve
from api.http.responses import NO_STORE, envelope, envelope_error
from api.settings import ApiSettings
from api.settings.webhooks import Webhook
from carmy_worker.logs import info_line, request_id_hash
from carmy_worker.sdk.context import AgentContext
from carmy_worker.sdk.errors import clip, store_unavailable
from carmy_worker.wire import ExecuteRequest, JobRequest, json_encoder

log = logging.getLogger("carmy.api")

WEBHOOKS_PATH = "/agent/webhooks"


class Invalid(Exception):
    """A verified delivery that is not one this webhook can run: ``400 INVALID_REQUEST``."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


class WebhookEndpoint:
    """ASGI, to read the body with its limit before anything is decoded."""

    def __init__(self, *, settings: ApiSettings, execute: ExecuteEndpoint, jobs: Jobs,
                 auth: Authenticator | None) -> None:
        self.settings = settings
        self.execute = execute
        self.jobs = jobs
        self.keyed = {name: RequireAuth(self._received(hook), auth) for name, hook in settings.webhooks.items()
                      if hook.config.auth == "api-key"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        name = scope["path_params"]["name"]
        hook = self.settings.webhooks.get(name)
        if hook is None:
            response = envelope_error("WEBHOOK_NOT_FOUND", f"No webhook named {clip(name)!r} is configured.")
            return await response(scope, receive, send)
        keyed = self.keyed.get(name)
        if keyed is not None:
            return await keyed(scope, receive, send)
        scope[CONTEXT_SCOPE_KEY] = AgentContext(principal=f"webhook:{name}")
        await self._received(hook)(scope, receive, send)

    def _received(self, hook: Webhook) -> Any:
        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            outcome, status, request_id = await self._receive(hook, scope, receive, send)
            # Never the secret nor the body: what was received, and how it was answered.
            info_line(log, "webhook", {"event": "webhook", "webhook": hook.name, "tool": hook.config.tool,
                                       "mode": hook.config.mode, "outcome": outcome, "status_code": status,
                                       "request_id_hash": request_id_hash(request_id)})

        return app

    async def _receive(self, hook: Webhook, scope: Scope, receive: Receive, send: Send) -> tuple[str, int, str | None]:
        try:
            body = await read_body(scope, receive, self.settings.max_body)
        except BodyTooLarge:
            await envelope_error("PAYLOAD_TOO_LARGE", f"The body exceeds {self.settings.max_body} bytes.")(
                scope, receive, send)
            return "invalid", 413, None
        except ClientGone:
            return "disconnected", 499, None
        why = refusal(hook, fields(scope), body)
        if why is not None:
            await envelope_error("WEBHOOK_UNAUTHORIZED", why)(scope, receive, send)
            return "unverified", 401, None
        try:
            request = self._request(hook, scope, body)
        except Invalid as exc:
            await envelope_error("INVALID_REQUEST", str(exc), reason=exc.field)(scope, receive, send)
            return "invalid", 400, None
        if hook.config.mode == "job":
            response = await self._job(request, trusted_context(scope), scope)
            await response(scope, receive, send)
            return "queued", response.status_code, request.request_id
        answer = await self.execute.call(request, (scope, receive, send), via="webhook")
        return answer.outcome, answer.status_code, request.request_id

    def _request(self, hook: Webhook, scope: Scope, body: bytes) -> ExecuteRequest:
        """The call a verified delivery stands for."""
        try:
            document = msgspec.json.decode(body)
        except (msgspec.DecodeError, RecursionError):
            raise Invalid("The delivery's body is not JSON.", "body") from None
        pointer = hook.config.arguments
        arguments = document if pointer is None else resolve(document, pointer)
        if arguments is MISSING:
            raise Invalid(f"The delivery has nothing at {pointer!r}, this webhook's arguments.", "arguments")
        return ExecuteRequest(hook.config.tool, arguments, event_id(hook, scope, document))

    async def _job(self, request: ExecuteRequest, agent: AgentContext, scope: Scope) -> Response:
        """``202 {"job_id", "request_id"}`` (``200`` for a redelivery of a job already created)."""
        try:
            new = await self.jobs.create(JobRequest(tool=request.tool, arguments=request.arguments,
                                                    request_id=request.request_id), agent)
        except Rejected as rejected:
            return envelope(rejected.error)
        except (RedisError, OSError) as exc:
            log.warning("store unavailable: %s", exc)
            return envelope(store_unavailable())
        body = {"job_id": new.job.job_id, "request_id": request.request_id}
        return Response(json_encoder.encode(body), 202 if new.created else 200,
                        {**NO_STORE, "location": location(new.job.job_id, scope)}, media_type="application/json")


def event_id(hook: Webhook, scope: Scope, document: object) -> str | None:
    """The delivery's event id (None when the webhook names none): a string or an integer at a
    JSON pointer into the body, or a header's value."""
    source = hook.config.event_id
    if source is None:
        return None
    if source.startswith("/"):
        value = resolve(document, source)
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
    else:
        raw = fields(scope).get(source.strip().lower().encode())
        value = None if raw is None else raw.decode("utf-8", "replace").strip() or None
    if not isinstance(value, str):
        raise Invalid(f"The delivery has no event id ({source}): a string or an integer is required.", "event_id")
    return value
