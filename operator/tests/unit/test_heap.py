"""gpuforge.heap: when a settle thaws, what it freezes, and the pauses it times."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gpuforge.heap import GcPauses, Heap


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    """Nothing frozen outlives a test: other tests' garbage must stay collectable."""
    gc.unfreeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize(
    ("since_thaw", "quiet", "thaw", "thaws"),
    [
        (0, True, False, 0),  # just thawed
        (599, True, False, 0),
        (600, True, False, 1),  # due, and nothing in flight
        (600, False, False, 0),  # due, but steps in flight wait for no pause
        (3599, False, False, 0),
        (3600, False, False, 1),  # overdue: thawed anyway
        (0, False, True, 1),  # asked for
    ],
)
def test_a_thaw_comes_when_due_at_a_quiet_settle_or_when_overdue(
    since_thaw: float, quiet: bool, thaw: bool, thaws: int
) -> None:
    now = [1000.0]
    heap = Heap(600, 3600, clock=lambda: now[0])
    now[0] += since_thaw
    heap.settle(quiet=quiet, thaw=thaw)
    assert (heap.thaws, heap.settles) == (thaws, 1)


def test_a_settle_freezes_what_survives_and_a_thaw_collects_cycles_that_died_frozen() -> None:
    now = [0.0]
    heap = Heap(600, clock=lambda: now[0])
    heap.settle()
    frozen = gc.get_freeze_count()
    cycle: list[list[object]] = [[] for _ in range(1000)]
    for item in cycle:
        item.append(cycle)
    heap.settle()  # alive: frozen
    assert gc.get_freeze_count() >= frozen + len(cycle)
    del cycle, item
    heap.settle()  # dead, but frozen: kept...
    assert gc.get_freeze_count() >= frozen + 1000
    now[0] += 600
    heap.settle()  # ...until the thaw collects it
    assert gc.get_freeze_count() < frozen + 1000


def test_a_frozen_heap_still_frees_acyclic_garbage_at_once() -> None:
    import weakref

    class Cached:
        pass

    heap = Heap(600)
    obj = Cached()
    alive = weakref.ref(obj)
    heap.settle()
    del obj  # a cache replacing an object: reference counting frees it, frozen or not
    assert alive() is None


def test_pauses_are_observed_by_generation() -> None:
    seen: list[tuple[int, float]] = []
    pauses = GcPauses(lambda generation, seconds: seen.append((generation, seconds)))
    pauses.install()
    pauses.install()  # once per process
    try:
        gc.collect(1)
    finally:
        gc.callbacks.remove(pauses)
    assert pauses not in gc.callbacks
    assert len(seen) == 1 and seen[0][0] == 1 and seen[0][1] >= 0
