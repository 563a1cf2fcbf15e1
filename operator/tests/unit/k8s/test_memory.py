"""What passes remember between them: applied digests resync on time, renders are reused as copies."""

from __future__ import annotations

from gpuforge.clock import ManualClock
from gpuforge.k8s.memory import AppliedDigests, RenderCache, StackMemory


def test_unchanged_objects_are_applied_again_only_to_resync() -> None:
    clock = ManualClock()
    applied = AppliedDigests(clock)
    assert applied.due("uid", "d1", 25.0)  # never applied
    applied.applied("uid", "d1")
    assert not applied.due("uid", "d1", 25.0)
    assert applied.due("uid", "d2", 25.0)  # changed
    clock.advance(25.0)
    assert not applied.due("uid", "d1", 25.0)
    clock.advance(0.5)
    assert applied.due("uid", "d1", 25.0)  # drift is corrected now and then
    assert not applied.due("uid", "d1", 25.0, may_resync=False)  # but not while nodes are in flight
    applied.forget("uid")
    assert applied.due("uid", "d1", 25.0, may_resync=False)


def test_renders_are_reused_as_copies_and_the_oldest_goes_first() -> None:
    cache, calls = RenderCache(size=2), []

    def render(name: str) -> list[dict[str, object]]:
        calls.append(name)
        return [{"metadata": {"name": name}}]

    first = cache.get("a", lambda: render("a"))
    first[0]["changed"] = True  # the caller's copy
    assert cache.get("a", lambda: render("a")) == [{"metadata": {"name": "a"}}] and calls == ["a"]
    cache.get("b", lambda: render("b"))
    cache.get("c", lambda: render("c"))  # "a" makes room
    cache.get("a", lambda: render("a"))
    assert calls == ["a", "b", "c", "a"]


def test_each_memory_is_its_own() -> None:
    one, other = StackMemory(), StackMemory()
    one.operands.applied("uid", "d")
    assert not one.operands.due("uid", "d", 25.0) and other.operands.due("uid", "d", 25.0)
