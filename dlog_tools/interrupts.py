"""Ctrl-C, counted, for a command that must stop cleanly and, when asked twice, at once.

The first Ctrl-C cancels the command's main task, as asyncio.run does, so its clean-up runs (the
console producer flushes what it has and closes its writer). The second calls what the command
registered with `on_second` (the producer aborts its writer: what is not acknowledged ends with an
unknown outcome), and the main task is cancelled once more `ABORT_EXIT_S` later whatever is still
pending, so the process ends within a bounded time. asyncio.run's own handler would raise
KeyboardInterrupt at the second Ctrl-C wherever the loop happened to be (inside a callback, half
way through a writer's bookkeeping), then cancel every task and wait for all of them, which could
hang, and leave futures whose exceptions nobody retrieved.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

ABORT_EXIT_S = 10.0  # after the second Ctrl-C, what is still pending is cancelled this much later


class Interrupts:
    def __init__(self) -> None:
        self.count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[object] | None = None
        self._on_second: list[Callable[[], None]] = []

    def install(self) -> None:
        """Take over SIGINT for the running task (call it first thing in the main task)."""
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            return  # a background job of a shell: Ctrl-C is not meant for it
        try:
            loop.add_signal_handler(signal.SIGINT, self._on_signal)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread: asyncio's own
            return
        self._loop, self._task = loop, task

    def uninstall(self) -> None:
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGINT)
            self._loop = None

    def on_second(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` at the second Ctrl-C (now, if it came already); returns what undoes it."""
        if self.count >= 2:
            callback()
            return lambda: None
        self._on_second.append(callback)

        def remove() -> None:
            if callback in self._on_second:
                self._on_second.remove(callback)

        return remove

    def _on_signal(self) -> None:
        self.count += 1
        if self._loop is None or self._task is None:  # uninstalled meanwhile
            return
        if self.count == 1:
            self._task.cancel()
        elif self.count == 2:
            for callback in list(self._on_second):
                callback()
            self._loop.call_later(ABORT_EXIT_S, self._task.cancel)
