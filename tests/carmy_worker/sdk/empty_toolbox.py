"""Fixture for ``load_tools``: a Toolbox with no tools."""

from __future__ import annotations

from carmy_worker import Toolbox

tools = Toolbox()
