"""Keeping Python's cyclic garbage collector off a long-running process's caches.

A watch-fed cache of thousands of objects is millions of small dicts and lists that live for minutes.
Python's automatic full collections walk every tracked object, with the whole process stopped: in the
operator with 5,000 nodes cached, 49 of them in the first 28 minutes of a migration's benchmark, up to
1.09 s each and 26 s in all, and every step in flight waited for each. `Heap.settle` collects what was
made since the previous settle and freezes what survives (`gc.freeze`): later collections, automatic
ones included, skip frozen objects.
Acyclic garbage among them is still freed at once, by reference counting (cached objects are trees of
dicts and lists); a cycle that dies after it was frozen waits for the next thaw, which collects
everything in one pause.

`GcPauses` times every collection, for a metric.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any


class Heap:
    """When to collect and freeze (`settle`), and when to thaw: a thaw is due `thaw_every` seconds after
    the last one and comes at the next quiet settle (when a pause of the whole process disturbs no work
    in progress), or at any settle once `thaw_at_most` seconds have passed."""

    def __init__(
        self,
        thaw_every: float,
        thaw_at_most: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.thaw_every = thaw_every
        self.thaw_at_most = thaw_every if thaw_at_most is None else max(thaw_every, thaw_at_most)
        self._clock = clock
        self._thawed_at = clock()
        self._lock = threading.Lock()  # settles may come from several threads
        self.settles = 0
        self.thaws = 0

    def settle(self, *, quiet: bool = True, thaw: bool = False) -> None:
        """Collect what was made since the last settle and freeze the rest; first thaw everything when
        `thaw` is asked for or a thaw is due (see the class)."""
        with self._lock:
            now = self._clock()
            since = now - self._thawed_at
            if thaw or since >= self.thaw_at_most or (quiet and since >= self.thaw_every):
                gc.unfreeze()
                self._thawed_at = now
                self.thaws += 1
            gc.collect()
            gc.freeze()
            self.settles += 1


class GcPauses:
    """A `gc.callbacks` entry that reports each collection's pause: `observe(generation, seconds)`."""

    def __init__(self, observe: Callable[[int, float], None]) -> None:
        self._observe = observe
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self._observe(int(info.get("generation", 0)), time.perf_counter() - self._started)

    def install(self) -> None:
        """Once per process and timer (gc.callbacks is global)."""
        if self not in gc.callbacks:
            gc.callbacks.append(self)
