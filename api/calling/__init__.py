"""The call path, whichever door a call came in by (HTTP or MCP): the catalog of tools
(``catalog``, ``schemas``), what every call must pass (``checks``), and submitting, finding,
cancelling and waiting for executions (``calls``, ``executions``)."""
