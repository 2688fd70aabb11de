"""The carmy/1 HTTP endpoints: ``POST /agent/execute`` (``execute``, sent past the router by
``shortcut``), answered as JSON or SSE (``relay``); polling and cancelling (``lookup``);
discovery (``discovery``); ``/health``, ``/ready`` and ``/metrics`` (``ops``)."""
