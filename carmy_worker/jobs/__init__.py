"""Jobs: executions that run later, on a schedule, or again after a failure that may pass.

``cron``: when a schedule's occurrences fall; the rest lives in the store (``store.jobstore``)
and the worker's job loop (``jobs.driver``).
"""
