"""The worker process: the arq seam (``queue``), one job's run (``runner``, ``invoke``,
``publisher``, ``lock``), the worker's presence, and ``service``, which starts and stops them
together. Only the worker imports this package; the API never does."""
