"""Every route of the console, in one list: adding a page is one line here.

* a page: ``guard.page("/console/jobs", jobs.get)``, where ``jobs.get(request)`` answers with
  ``render(request, "jobs.html", ...)`` (its template extends ``base.html``);
* a button that changes something: a ``<form method="post">`` with ``{{ csrf_field() }}`` in its
  template, and ``guard.action("/console/jobs/{job_id}/retry", jobs.retry)``, where
  ``jobs.retry(request, form)`` runs only once the form's origin and CSRF token are checked.
  Answer with a ``303`` redirect to a page (the browser's back button then never posts again).

Nothing here exists unless ``CARMY_CONSOLE`` is on: ``api/app.py`` adds these routes only then.
What none of them answers (an unknown path, another method, a fault) ``entrance.py`` answers.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from api.calling.catalog import Catalog
from api.calling.jobs import Jobs
from api.calling.schedules import Schedules
from api.console.assets import STATIC_PATH, serve
from api.console.entrance import ConsoleEntrance, not_found
from api.console.guard import SIGN_IN_PATH, Guard
from api.console.live import Sampler
from api.console.pages.execution import ExecutionPage
from api.console.pages.executions import ExecutionsPage
from api.console.pages.jobactions import JobActions
from api.console.pages.jobs import JobsPage
from api.console.pages.overview import OverviewPage
from api.console.pages.signin import SignIn
from api.console.pages.tools import ToolsPage
from api.console.session import Sessions
from api.guards.auth import Authenticator
from api.settings import ApiSettings
from carmy_worker.store.audit import AuditTrail


@dataclass(frozen=True)
class ConsoleServices:
    """What the console's pages read, built by the app factory: the console has none of its own."""

    settings: ApiSettings
    redis: Redis
    auth: Authenticator | None  # None: the API authenticates nobody, and the console is open
    catalog: Catalog
    jobs: Jobs  # what /agent/jobs does its work with: the console's buttons go through it too
    sampler: Sampler  # the live overview's frames, sampled by the app's lifespan (api/console/live.py)


def console_routes(services: ConsoleServices) -> list[BaseRoute]:
    """The app's one route for everything under ``/console`` (``entrance.py``), which routes among
    the console's routes, each behind its guard (``guard.py``)."""
    settings = services.settings
    guard = Guard(Sessions(settings, services.redis), authenticates=services.auth is not None)
    sign_in = SignIn(guard, services.auth, settings.operator_permission)
    tools = ToolsPage(services.catalog)
    trail = AuditTrail(services.redis)
    executions, execution = ExecutionsPage(trail, services.catalog), ExecutionPage(services.redis, trail)
    jobs = JobsPage(services.jobs, Schedules(services.redis, services.catalog))
    actions = JobActions(services.jobs)
    overview = OverviewPage(services.sampler)
    return [ConsoleEntrance([
        Route(STATIC_PATH + "/{name:path}", static, methods=["GET"]),
        guard.page(SIGN_IN_PATH, sign_in.form, signed_in=False),
        guard.action(SIGN_IN_PATH, sign_in.sign_in, signed_in=False),
        guard.action("/console/sign-out", sign_in.sign_out, signed_in=False),
        # The pages, in the nav's order.
        guard.page("/console", overview.get),
        guard.page("/console/live", overview.live),
        guard.page("/console/executions", executions.get),
        guard.page("/console/executions/rows", executions.rows),  # before {execution_id}: not an id
        guard.page("/console/executions/{execution_id}", execution.get),
        guard.page("/console/jobs", jobs.get),
        guard.page("/console/jobs/{job_id}", jobs.job),
        guard.page("/console/jobs/{job_id}/retry", actions.confirm("retry")),
        guard.action("/console/jobs/{job_id}/retry", actions.do("retry")),
        guard.page("/console/jobs/{job_id}/cancel", actions.confirm("cancel")),
        guard.action("/console/jobs/{job_id}/cancel", actions.do("cancel")),
        guard.page("/console/tools", tools.get),
    ])]


async def static(request: Request) -> Response:
    """A static file, or the console's 404 page."""
    return serve(request) or not_found(request)
