"""An asyncio event loop on simulated time: deterministic, and as fast as the CPU allows.

The loop's selector never waits: asked to block for `timeout` seconds it moves the simulated clock
forward by that much and reports no I/O (the simulation does none). So `asyncio.sleep`, timeouts
and `call_later` all run on simulated time, in a fixed order for a fixed seed: the ready queue is
FIFO and timers fire in (time, scheduling order). Real drivers (`dlog.writer`, `dlog.reader`, the
namespace) run on it unchanged. A loop with nothing ready and nothing scheduled is deadlocked:
`select` raises instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Mapping
from typing import Any

EPOCH_MS = 1_700_000_000_000  # the simulated wall clock starts here
SPIN_TURNS_MAX = 200_000


class SimulatedTimeSelector(selectors.BaseSelector):
    def __init__(self) -> None:
        self.now_s = 0.0
        self.turns = 0  # loop iterations so far (the ledger simulator bounds its fault phase by them)
        self._keys: dict[Any, selectors.SelectorKey] = {}
        self._turns_at_now = 0  # loop turns since the clock last moved: a spin never lets it move

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, fileobj if isinstance(fileobj, int) else fileobj.fileno(),
                                    events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self.turns += 1
        if timeout is None:
            raise RuntimeError("the simulation is deadlocked: nothing is ready and nothing is scheduled")
        if timeout > 0:
            self.now_s += timeout
            self._turns_at_now = 0
        else:
            self._turns_at_now += 1
            if self._turns_at_now > SPIN_TURNS_MAX:
                raise RuntimeError(f"the simulation spins at t={self.now_s:.6f} s: {SPIN_TURNS_MAX} loop turns "
                                   "without simulated time moving (a timer or task that reschedules itself at once)")
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return dict(self._keys)

    def close(self) -> None:
        self._keys.clear()


class SimulatedTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.clock_selector = SimulatedTimeSelector()
        super().__init__(self.clock_selector)
        # every task stays referenced until it ends: a dead client's tasks wait forever, and a
        # task the garbage collector destroys would make a replay depend on when GC runs
        self.live_tasks: dict[asyncio.Task[Any], None] = {}

    def time(self) -> float:
        return self.clock_selector.now_s

    def create_task(self, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:  # type: ignore[override]
        task = super().create_task(coro, **kwargs)
        self.live_tasks[task] = None
        task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self.live_tasks.pop(task, None)


class SimulatedClock:
    """The `bookkeeper.clock.Clock` of a simulated-time loop."""

    def __init__(self, loop: SimulatedTimeLoop) -> None:
        self.loop = loop

    def wall_ms(self) -> int:
        return EPOCH_MS + int(self.loop.time() * 1000)

    def monotonic_s(self) -> float:
        return self.loop.time()
