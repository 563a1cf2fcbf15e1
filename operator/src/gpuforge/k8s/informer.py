"""Watch-fed caches (informers): list a kind once, then follow its watch. The one implementation, shared by
the GpuStack operator (Nodes, Pods, ResourceSlices, ResourceClaims) and the GpuQuota webhook.

`Store` is the pure part (no I/O): objects by (namespace, name), resourceVersion bookkeeping so a late
copy never replaces a newer one (our own write answers are `offer`ed, so a pass right after a write does
not act on what it just changed), and a lock so a reconcile thread can read while the event loop writes.
`Informer` runs on an asyncio loop: list, watch from the list's resourceVersion with bookmarks, resume
after the server closes the stream, list again on 410 Gone, back off on errors. `HttpSource` lists and
watches arbitrary collections (the webhook's `QuotaApi` is another source); both go through the shared
transport (k8s.transport).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Mapping
from typing import Any, Protocol

import orjson

from gpuforge.k8s.transport import ApiError as ApiError
from gpuforge.k8s.transport import ApiTransport, error_message, selectors

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped objects
ChangeHandler = Callable[[str, Mapping[str, Any]], None]  # (ADDED | MODIFIED | DELETED, object)
Transform = Callable[[Obj], Obj]  # trims an object before it is stored (e.g. drops managedFields)
RequestHook = Callable[[str, str], None]  # (verb, resource), as `gpuforge.k8s.client` counts them

GONE = 410


# How long work on the event loop runs before it hands the loop back (to admissions, other watches).
TIME_SLICE_SECONDS = 0.002


class TimeSlice:
    """Paces a loop over many items on the event loop by time, not by count: an item can cost a
    microsecond (a workload whose usage is remembered) or about 140 us (one counted afresh), so the fixed
    count of 256 it replaced held the loop for up to 36 ms. Per item: `if pace.spent(): await
    pace.pause()`."""

    def __init__(self, seconds: float = TIME_SLICE_SECONDS) -> None:
        self.seconds = seconds
        self.started = time.perf_counter()

    def spent(self) -> bool:
        return time.perf_counter() - self.started >= self.seconds

    async def pause(self) -> None:
        await asyncio.sleep(0)
        self.started = time.perf_counter()


def key_of(obj: Mapping[str, Any]) -> Key:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace") or ""), str(metadata.get("name") or "")


def resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def newer(candidate: str, current: str) -> bool:
    """Is `candidate` a later resourceVersion than `current`? Versions are opaque to clients, but etcd's
    are increasing integers; anything else counts as newer (a stale copy only costs a 409 and a read)."""
    if candidate.isdigit() and current.isdigit():
        return int(candidate) > int(current)
    return True


def without_managed_fields(obj: Obj) -> Obj:
    """managedFields are most of a Node's bytes and nobody here reads them."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and "managedFields" in metadata:
        obj = {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}
    return obj


# The value an object is filed under, e.g. the node a pod is on, or a small summary of it (any hashable
# value); None: not indexed.
Index = Callable[[Mapping[str, Any]], Hashable | None]


class Store:
    """Objects of one kind by key, and by the value of each of `indexes` (say, pods by node). Stored
    objects are never changed in place (each change replaces the object), so readers may keep the
    references `values()` returns. Safe to use from several threads."""

    MAX_TOMBSTONES = 4096

    def __init__(
        self, transform: Transform | None = None, indexes: Mapping[str, Index] | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._items: dict[Key, Obj] = {}
        # resourceVersion at deletion of recently deleted objects: a write answer that arrives after the
        # watch reported the deletion (a deleted pod's last copy) must not bring the object back.
        self._deleted: dict[Key, str] = {}
        self._transform = transform
        self._indexes = dict(indexes or {})
        self._by: dict[str, dict[Hashable, dict[Key, Obj]]] = {name: {} for name in self._indexes}

    def get(self, key: Key) -> Obj | None:
        return self._items.get(key)

    def values(self) -> list[Obj]:
        with self._lock:
            return list(self._items.values())

    def indexed(self, index: str, values: Iterable[Hashable]) -> list[Obj]:
        """The objects whose value of `index` is one of `values`."""
        with self._lock:
            by = self._by[index]
            return [obj for value in values for obj in by.get(value, {}).values()]

    def filed(self, index: str) -> list[tuple[Key, Hashable]]:
        """Each indexed object's key and its value of `index`, without the objects: the index's
        summary, kept up to date as objects change."""
        with self._lock:
            return [(key, value) for value, bucket in self._by[index].items() for key in bucket]

    def _put(self, key: Key, obj: Obj) -> None:
        """(Under the lock.)"""
        self._unindex(key)
        for name, index in self._indexes.items():
            value = index(obj)
            if value is not None:
                self._by[name].setdefault(value, {})[key] = obj
        self._items[key] = obj

    def _unindex(self, key: Key) -> None:
        """(Under the lock.)"""
        old = self._items.get(key)
        if old is None:
            return
        for name, index in self._indexes.items():
            value = index(old)
            bucket = self._by[name].get(value) if value is not None else None
            if value is not None and bucket is not None:
                bucket.pop(key, None)
                if not bucket:
                    del self._by[name][value]

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def _prepared(self, obj: Obj) -> Obj:
        return self._transform(obj) if self._transform is not None else obj

    def offer(self, obj: Obj) -> bool:
        """Keep `obj` unless a newer copy is stored already; True when it was kept."""
        key, version = key_of(obj), resource_version(obj)
        with self._lock:
            current = self._items.get(key)
            if current is not None and not newer(version, resource_version(current)):
                return False
            deleted_at = self._deleted.get(key)
            if deleted_at is not None:
                if not newer(version, deleted_at):
                    return False
                del self._deleted[key]  # created again since
            self._put(key, self._prepared(obj))
            return True

    def apply(self, event_type: str, obj: Obj) -> bool:
        """A watch event; True when the store changed."""
        if event_type == "DELETED":
            return self.forget(key_of(obj), resource_version(obj)) is not None
        return self.offer(obj)

    def forget(self, key: Key, version: str = "") -> Obj | None:
        """Drop an object; with the resourceVersion of its deletion, older copies are refused later."""
        with self._lock:
            if version:
                self._deleted[key] = version
                if len(self._deleted) > self.MAX_TOMBSTONES:  # the oldest half is long settled
                    for old in list(self._deleted)[: self.MAX_TOMBSTONES // 2]:
                        del self._deleted[old]
            self._unindex(key)
            return self._items.pop(key, None)

    def replace(self, items: Iterable[Obj]) -> list[Obj]:
        """The result of a (re)list; returns the objects that are gone since. A stored copy newer than the
        listed one (our own write, answered after the list was served) is kept."""
        with self._lock:
            listed: dict[Key, Obj] = {}
            for item in items:
                key = key_of(item)
                current = self._items.get(key)
                if current is not None and not newer(resource_version(item), resource_version(current)):
                    listed[key] = current
                else:
                    listed[key] = self._prepared(item)
            gone = [obj for key, obj in self._items.items() if key not in listed]
            self._items, self._by = {}, {name: {} for name in self._indexes}
            for key, obj in listed.items():
                self._put(key, obj)
            self._deleted.clear()  # the list is the truth now
            return gone


class WatchSource(Protocol):
    """Lists and watches one kind; `gpuforge.k8s.quota.QuotaApi` and `HttpSource` are two."""

    async def list_with_version(
        self,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Obj], str]: ...

    def watch(
        self,
        kind: str,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
        field_selector: str | None = None,
    ) -> AsyncIterator[Obj]: ...


class Informer:
    """A list-then-watch mirror of one kind (optionally label/field-selected), keyed by (namespace, name).

    Readers get the newest copy this process has seen, from the watch or from its own writes (`offer`).
    A copy may lag the API server by a watch delivery: whoever writes from it must write with its
    resourceVersion as precondition, or plan so that repeating a step is harmless.
    """

    def __init__(
        self,
        api: WatchSource,
        kind: str,
        label_selector: str | None = None,
        *,
        field_selector: str | None = None,
        transform: Transform | None = None,
        indexes: Mapping[str, Index] | None = None,
        timeout_seconds: int = 300,
        max_backoff: float = 30.0,
    ) -> None:
        self.api = api
        self.kind = kind
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.timeout_seconds = timeout_seconds
        self.max_backoff = max_backoff
        # Called with (event type, object) for every change, and ADDED for each object of a (re)list.
        self.listeners: list[ChangeHandler] = []
        self.store = Store(transform, indexes)
        self.synced = asyncio.Event()
        self.resource_version = ""  # where the watch resumes from
        self.lists = 0  # how many times the kind was listed (1 + re-lists)

    key = staticmethod(key_of)

    def get(self, name: str, namespace: str = "") -> Obj | None:
        return self.store.get((namespace, name))

    def offer(self, obj: Obj) -> None:
        """Keep `obj` (e.g. the answer to our own write) unless a newer copy is known already."""
        self.store.offer(obj)

    def forget(self, name: str, namespace: str = "") -> None:
        self.store.forget((namespace, name))

    def _changed(self, event_type: str, obj: Mapping[str, Any]) -> None:
        for listener in self.listeners:
            try:
                listener(event_type, obj)
            except Exception:  # a listener's bug must not stop the cache
                log.exception("listener of the %s informer failed", self.kind)

    async def run(self) -> None:
        """List, then watch from the list's version; on 410 Gone list again; on errors back off. Forever."""
        backoff = 0.0
        while True:
            try:
                await self._list()
                backoff = 0.0
                if not self.resource_version:  # a kind not served (a CRD not installed): look again later
                    await asyncio.sleep(self.max_backoff)
                while self.resource_version:
                    self.resource_version = await self._watch(self.resource_version)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a failed list or watch is simply started again
                if getattr(error, "status", None) == GONE:
                    log.debug("watch of %s expired (410 Gone): listing again", self.kind)
                    continue
                backoff = min(self.max_backoff, backoff * 2 or 0.5)
                log.info("%s informer restarts in %.1fs: %s", self.kind, backoff, error)
                await asyncio.sleep(backoff)

    async def _list(self) -> None:
        items, version = await self.api.list_with_version(
            self.kind, label_selector=self.label_selector, field_selector=self.field_selector
        )
        self.lists += 1
        for item in items:
            item.setdefault("kind", self.kind)
        for old in self.store.replace(items):  # deleted while we were not watching
            self._changed("DELETED", old)
        self.resource_version = version
        self.synced.set()
        for item in items:
            self._changed("ADDED", item)

    async def _watch(self, version: str) -> str:
        """Apply watch events; return the version to resume from, "" when a fresh list is needed.
        Events already buffered are read without waiting, so a burst is paced (`TimeSlice`)."""
        pace = TimeSlice()
        async for event in self.api.watch(
            self.kind, version, self.label_selector, self.timeout_seconds, self.field_selector
        ):
            event_type, obj = str(event.get("type")), event.get("object") or {}
            if event_type == "ERROR":  # usually 410 Gone: our version is too old to resume from
                log.debug("watch of %s ended: %s", self.kind, obj.get("message"))
                return ""
            version = resource_version(obj) or version
            if event_type == "BOOKMARK":
                continue
            obj.setdefault("kind", self.kind)
            self.store.apply(event_type, obj)
            self._changed(event_type, obj)
            if pace.spent():
                await pace.pause()
        return version


class HttpSource:
    """List and watch collections through the shared transport (on the caller's event loop). `paths` maps
    a kind to its collection path, e.g. {"Node": "/api/v1/nodes"}; lists are read in pages of
    `page_size`."""

    def __init__(
        self,
        transport: ApiTransport,
        paths: Mapping[str, str],
        *,
        on_request: RequestHook | None = None,
        page_size: int = 500,
    ) -> None:
        self.transport = transport
        self.paths = dict(paths)
        self.on_request = on_request
        self.page_size = page_size

    async def close(self) -> None:
        await self.transport.close()

    def _count(self, verb: str, kind: str) -> None:
        if self.on_request is not None:
            self.on_request(verb, self.paths[kind].rstrip("/").rsplit("/", 1)[-1])

    async def list_with_version(
        self,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Obj], str]:
        if namespace:
            raise ValueError("HttpSource lists whole collections")
        params = {**selectors(label_selector, field_selector), "limit": str(self.page_size)}
        items: list[Obj] = []
        while True:
            self._count("list", kind)
            status, text = await self.transport.request("GET", self.paths[kind], params=params)
            if status >= 400:
                raise ApiError(status, error_message(text))
            page = orjson.loads(text)
            items.extend(page.get("items") or [])
            metadata = page.get("metadata") or {}
            if not metadata.get("continue"):
                return items, str(metadata.get("resourceVersion") or "")
            params["continue"] = metadata["continue"]

    async def watch(
        self,
        kind: str,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
        field_selector: str | None = None,
    ) -> AsyncIterator[Obj]:
        self._count("watch", kind)
        async for event in self.transport.watch(
            self.paths[kind], resource_version, label_selector, timeout_seconds, field_selector
        ):
            yield event
