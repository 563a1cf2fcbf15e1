"""Whole collections read by the client: every page, and several collections side by side."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from gpuforge.k8s.client import Kube, continue_token


class Paged:
    """A transport that serves each collection in pages of two items, continue tokens and all, and
    notes which threads asked."""

    def __init__(self, collections: dict[str, list[str]], metadata_last: bool = False) -> None:
        self.collections = collections
        self.metadata_last = metadata_last
        self.threads: set[int] = set()
        self.queries: list[tuple[str, dict[str, str]]] = []
        self._lock = threading.Lock()

    def request_sync(self, method: str, path: str, **options: Any) -> tuple[int, bytes]:
        query = dict(options.get("query") or {})
        with self._lock:
            self.threads.add(threading.get_ident())
            self.queries.append((path, query))
        start = int(query.get("continue", "0"))
        names = self.collections[path]
        page = names[start : start + 2]
        more = start + 2 < len(names)
        body: dict[str, Any] = {
            "kind": "List",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "7", **({"continue": str(start + 2)} if more else {})},
            "items": [{"metadata": {"name": name, "annotations": {"x": '"continue":"99"'}}} for name in page],
        }
        if self.metadata_last:
            body = {"items": body["items"], "metadata": body["metadata"]}
        return 200, json.dumps(body).encode()


@pytest.mark.parametrize("metadata_last", [False, True])
def test_side_by_side_reads_every_page_of_each_collection(metadata_last: bool) -> None:
    transport = Paged(
        {"/api/v1/nodes": ["a", "b", "c", "d", "e"], "/api/v1/pods": ["p"], "/x/empty": []}, metadata_last
    )
    kube = Kube(transport)  # type: ignore[arg-type]
    read = kube.list_side_by_side(
        {
            "nodes": ("/api/v1/nodes", None),
            "pods": ("/api/v1/pods", {"labelSelector": "app"}),
            "none": ("/x/empty", None),
        }
    )
    assert {name: [i["metadata"]["name"] for i in items] for name, items in read.items()} == {
        "nodes": ["a", "b", "c", "d", "e"],
        "pods": ["p"],
        "none": [],
    }
    # Each page asked with the collection's own query and the page size, never another's token.
    assert all(q["limit"] == "500" for _, q in transport.queries)
    assert all(
        q.get("labelSelector") == ("app" if p == "/api/v1/pods" else None) for p, q in transport.queries
    )
    assert [q.get("continue") for p, q in transport.queries if p == "/api/v1/nodes"] == [None, "2", "4"]
    assert threading.get_ident() not in transport.threads  # read by worker threads, not the caller's


@pytest.mark.parametrize(
    ("page", "token"),
    [
        (
            b'{"kind":"PodList","metadata":{"resourceVersion":"5","continue":"eyJ2Ijo="},"items":[]}',
            "eyJ2Ijo=",
        ),
        (b'{"kind":"PodList","metadata":{"resourceVersion":"5"},"items":[{"continue":"no"}]}', None),
        # Metadata after the items: the token is read from the decoded page instead.
        (b'{"items":[{"metadata":{"continue":"no"}}],"metadata":{"continue":"late"}}', None),
        (b"", None),
    ],
)
def test_continue_token_is_read_from_the_head_of_a_page_only(page: bytes, token: str | None) -> None:
    assert continue_token(page) == token


@pytest.mark.parametrize("metadata_last", [False, True])
def test_list_objects_reads_every_page_in_order(metadata_last: bool) -> None:
    transport = Paged({"/api/v1/nodes": ["a", "b", "c", "d", "e"]}, metadata_last)
    kube = Kube(transport)  # type: ignore[arg-type]
    assert [i["metadata"]["name"] for i in kube.list_objects("/api/v1/nodes")] == ["a", "b", "c", "d", "e"]
    assert [q.get("continue") for _, q in transport.queries] == [None, "2", "4"]
