"""What the operator remembers from one pass to the next, held in an object its owner passes in (the kopf
handlers make one at startup), never in module globals: two operators in one process, or two tests, do
not share it, and a test can start from a fresh one.

All of it is a cache: a pass that finds it empty does the full work (applies everything, renders and
converts again) and comes to the same result.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuforge.clock import SYSTEM, Clock
from gpuforge.render.manifests import Manifest
from gpuforge.upgrade.convert import ConversionMemo


class AppliedDigests:
    """Per GpuStack: the digest of the objects last applied, and when. Unchanged objects are applied
    again only once `resync` seconds have passed (to correct drift), not on every pass."""

    def __init__(self, clock: Clock = SYSTEM) -> None:
        self._clock = clock
        self._last: dict[str, tuple[str, float]] = {}

    def due(self, key: str, digest: str, resync: float, *, may_resync: bool = True) -> bool:
        """Must the objects with `digest` be applied now? Yes when they changed, were never applied, or
        (with `may_resync`) were applied more than `resync` seconds ago."""
        last = self._last.get(key)
        if last is None or last[0] != digest:
            return True
        return may_resync and self._clock.monotonic() - last[1] > resync

    def applied(self, key: str, digest: str) -> None:
        self._last[key] = (digest, self._clock.monotonic())

    def forget(self, key: str) -> None:
        """The next pass applies everything (after an error, or once the objects are gone)."""
        self._last.pop(key, None)


class RenderCache:
    """The last few renders by their inputs: `render` is pure, and a pass mostly renders what the last
    one did. Callers get their own copy to change."""

    def __init__(self, size: int = 16) -> None:
        self._size = size
        self._renders: dict[str, list[Manifest]] = {}

    def get(self, key: str, render: Callable[[], list[Manifest]]) -> list[Manifest]:
        if key not in self._renders:
            if len(self._renders) >= self._size:
                self._renders.pop(next(iter(self._renders)))
            self._renders[key] = render()
        return copy.deepcopy(self._renders[key])


@dataclass
class StackMemory:
    """Everything GpuStack passes remember between them."""

    operands: AppliedDigests = field(default_factory=AppliedDigests)  # the rendered operands
    quota: AppliedDigests = field(default_factory=AppliedDigests)  # the quota webhook's objects
    renders: RenderCache = field(default_factory=RenderCache)
    # Objects from the watch-fed cache are converted for the planner once per resourceVersion...
    conversions: ConversionMemo = field(default_factory=ConversionMemo)
    # ... and Nodes for placement once per resourceVersion, slice count and plugin pod.
    facts: ConversionMemo = field(default_factory=ConversionMemo)
