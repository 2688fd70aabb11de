"""Carmy's HTTP front end (carmy/1 over Starlette). ``create_app()`` builds it."""

from api.app import create_app

__all__ = ["create_app"]
