"""Deadlines for many awaits, kept by one timer: ``asyncio.timeout`` without a timer each.

A worker bounds every wait for work (``store.leases``: a Redis node that hangs must not hold it),
and it waits once per call. ``asyncio.timeout`` makes a timer for each (a handle in the loop's
heap, then its cancellation): at one client that was a few µs of the worker's CPU per call, for
a deadline that almost never fires. ``Deadlines`` lists the tasks under way with their deadlines
and looks at them with one timer, every ``tick`` seconds while any is listed: a deadline fires up
to ``tick`` late, which is fine for deadlines of seconds. It cancels the task, as
``asyncio.timeout`` does, and ``expired`` tells that cancellation from any other.
"""

from __future__ import annotations

import asyncio

from carmy_worker.loop import running_loop

# A look this much later than due means the process itself did not run meanwhile (stopped, a
# frozen VM, a loop held up): the deadlines are not fired on that look but on the next, a tick
# later. The loop runs its timers before it reads its sockets, so replies that came while the
# process stood still (they were due, and came in time) would otherwise be taken for none: a
# worker paused for 10 s dropped, on waking, every connection with a call in flight.
LATE_S = 1.0


class Deadlines:
    """Deadlines of the tasks of one event loop, looked at every ``tick`` s.

    Use::

        task = deadlines.start(seconds)
        try:
            await something()
        except asyncio.CancelledError:
            if deadlines.expired(task):
                raise TimeoutError from None  # or what the caller makes of it
            raise
        finally:
            deadlines.stop(task)
    """

    def __init__(self, tick: float) -> None:
        self.tick = tick
        # task -> its deadline (the loop's time), and how many cancellations it had pending then
        self._due: dict[asyncio.Task[object], tuple[float, int]] = {}
        self._fired: set[asyncio.Task[object]] = set()  # cancelled by a deadline, until stopped
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's
        self._due_look = 0.0  # when the timer's look is due (the loop's time)

    def start(self, seconds: float) -> asyncio.Task[object]:
        """A deadline ``seconds`` from now for the current task (one at a time per task)."""
        loop = running_loop()
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("a deadline is a task's")
        if loop is not self._loop:  # a first deadline, or one in a new loop (tests run several)
            self._due.clear()
            self._fired.clear()
            self._loop, self._timer = loop, None
        self._due[task] = (loop.time() + seconds, task.cancelling())
        if self._timer is None:
            self._arm(loop)
        return task

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._due_look = loop.time() + self.tick
        self._timer = loop.call_later(self.tick, self._look)

    def stop(self, task: asyncio.Task[object]) -> None:
        """The task's deadline is over (met or fired)."""
        self._due.pop(task, None)
        self._fired.discard(task)

    def expired(self, task: asyncio.Task[object]) -> bool:
        """Whether the cancellation ``task`` is handling is its deadline's alone, told as
        ``asyncio.timeout`` tells it: no other cancellation of the task came meanwhile."""
        if task not in self._fired:
            return False
        due = self._due.get(task)
        return task.uncancel() <= (due[1] if due is not None else 0)

    def _look(self) -> None:
        loop = running_loop()
        now = loop.time()
        if now - self._due_look < LATE_S:  # else the process stood still: the next look decides
            for task, (deadline, _) in list(self._due.items()):
                if deadline <= now and task not in self._fired:
                    self._fired.add(task)
                    task.cancel()
        if self._due:
            self._arm(loop)
        else:
            self._timer = None
