"""Who is looking at a console page: the guard puts a ``Visitor`` in the request's scope before a
page runs, and ``render`` reads it for the nav and the forms' CSRF token."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from api.console.session import Session

SCOPE_KEY = "carmy.console.visitor"


@dataclass(frozen=True)
class Visitor:
    """The request's session and the CSRF token its forms must carry."""

    session: Session
    csrf: str
    browsing: bool = True  # may see the pages (False: on the sign-in form, not signed in yet)

    @property
    def principal(self) -> str | None:
        return self.session.principal if self.session.signed_in else None

    @property
    def signed_in(self) -> bool:
        return self.session.signed_in


def visitor(request: Request) -> Visitor | None:
    """The visitor the guard let in, or None outside a guarded route (an error page before the guard)."""
    found = request.scope.get(SCOPE_KEY)
    return found if isinstance(found, Visitor) else None
