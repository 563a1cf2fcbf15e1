"""List pages read from protobuf give the readers what the JSON shapes give them.

The pages are encoded here from the objects `test_shapes` uses (recorded from the local control plane,
and their variants) through the same message table the decoder is built from, so these tests cover how
messages become dicts, not the field numbers: the integration test against the real API server
(tests/integration/k8s/test_list_formats_cluster.py) reads both encodings of the same objects.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
import pytest
from google.protobuf.message import DecodeError

from gpuforge.k8s import shapes, shapes_protobuf
from gpuforge.k8s.client import ApiError, Kube, node_facts, plugin_nodes, slices_per_node
from gpuforge.k8s.shapes_protobuf import CLASSES, LIST_OF, MAGIC, MESSAGES, SCALARS, Kind
from gpuforge.upgrade.convert import snapshot_from_objects

from .test_shapes import CLAIMS, NODES, NOW, PODS, SLICES, _page

OBJECTS = {"nodes": NODES, "pods": PODS, "slices": SLICES, "claims": CLAIMS}


def _fill(message: Any, name: str, obj: dict[str, Any]) -> None:
    """`obj` (an object as JSON has it) written into a `name` message, field by field of the table."""
    for field, _, kind, of in MESSAGES[name]:
        if kind is Kind.INLINE:
            assert of is not None
            inlined = {key: obj[key] for key, *_ in MESSAGES[of] if key in obj}
            if inlined:
                _fill(getattr(message, field), of, inlined)
            continue
        value = obj.get(field)
        if value is None:
            continue
        if kind in SCALARS:
            setattr(message, field, value)
        elif kind is Kind.LIST:
            assert of is not None
            for item in value:
                _fill(getattr(message, field).add(), of, item)
        elif kind is Kind.LABELS:
            getattr(message, field).update(value)
        elif kind is Kind.QUANTITIES:
            for key, quantity in value.items():
                getattr(message, field)[key].string = quantity
        elif kind is Kind.TIME:
            getattr(message, field).seconds = int(datetime.fromisoformat(value).timestamp())
        else:
            assert of is not None
            inner = getattr(message, field)
            inner.SetInParent()
            _fill(inner, of, value)


def _protobuf_page(collection: str, items: list[dict[str, Any]], token: str = "") -> bytes:
    """An answer as the API server sends it: `k8s\\0`, then a runtime.Unknown around the list."""
    listed = CLASSES[LIST_OF[collection]]()
    _fill(
        listed, LIST_OF[collection], {"metadata": {"resourceVersion": "1", "continue": token}, "items": items}
    )
    unknown = CLASSES["Unknown"]()
    unknown.raw = listed.SerializeToString()  # type: ignore[attr-defined]
    return MAGIC + unknown.SerializeToString()


def _read(collection: str) -> list[Any]:
    page = shapes_protobuf.OF_COLLECTIONS[collection].decode(_protobuf_page(collection, OBJECTS[collection]))
    items: list[Any] = page["items"]
    return items


@pytest.mark.parametrize("collection", sorted(OBJECTS))
def test_items_are_the_json_shapes_dicts(collection: str) -> None:
    assert _read(collection) == shapes.OF_COLLECTIONS[collection](_page(OBJECTS[collection]))["items"]


def test_the_readers_see_the_same() -> None:
    nodes, pods, slices, claims = (orjson.loads(_page(OBJECTS[c]))["items"] for c in OBJECTS)
    read = {collection: _read(collection) for collection in OBJECTS}
    whole = snapshot_from_objects(nodes, pods, slices, now=NOW, claims=claims)
    assert (
        snapshot_from_objects(read["nodes"], read["pods"], read["slices"], now=NOW, claims=read["claims"])
        == whole
    )
    assert plugin_nodes(read["pods"]) == plugin_nodes(pods)
    assert slices_per_node(read["slices"]) == slices_per_node(slices)
    per_node, with_plugin = slices_per_node(slices), plugin_nodes(pods)
    assert [node_facts(n, per_node, with_plugin) for n in read["nodes"]] == [
        node_facts(n, per_node, with_plugin) for n in nodes
    ]


def test_times_quantities_and_inlined_volumes_read_as_json_writes_them() -> None:
    pod = next(p for p in _read("pods") if p["metadata"]["name"] == "gpus-device-plugin-x1")
    assert pod["metadata"]["deletionTimestamp"] == "2026-11-29T11:59:00Z"
    scratch = next(p for p in _read("pods") if p["metadata"]["name"] == "scratch")
    assert scratch["spec"]["volumes"] == [{"emptyDir": {}}, {}]
    limits = next(p for p in _read("pods") if p["metadata"]["name"] == "limits")
    assert limits["spec"]["containers"] == [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]


@pytest.mark.parametrize("token", ["", "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"])
def test_the_next_pages_token_is_read_from_the_head(token: str) -> None:
    form = shapes_protobuf.OF_COLLECTIONS["nodes"]
    page = _protobuf_page("nodes", NODES, token)
    assert form.token(page) == (token or None)
    assert form.decode(page)["metadata"] == {"continue": token, "resourceVersion": "1"}


def test_an_answer_in_json_is_read_by_the_json_shape() -> None:
    form = shapes_protobuf.OF_COLLECTIONS["nodes"]
    page = orjson.dumps({"metadata": {"continue": "abc"}, "items": NODES})
    assert form.token(page) == "abc"
    assert form.decode(page) == shapes.OF_COLLECTIONS["nodes"](page)
    assert form.accept.startswith("application/vnd.kubernetes.protobuf")


def test_an_error_answer_in_protobuf_says_its_message() -> None:
    status = CLASSES["Status"]()
    status.message = "unable to parse requirement"  # type: ignore[attr-defined]
    unknown = CLASSES["Unknown"]()
    unknown.raw = status.SerializeToString()  # type: ignore[attr-defined]

    class Refusing:
        def request_sync(self, method: str, path: str, **options: Any) -> tuple[int, bytes]:
            return 400, MAGIC + unknown.SerializeToString()

    kube = Kube(Refusing())  # type: ignore[arg-type]
    with pytest.raises(ApiError, match=r"400 .*unable to parse requirement"):
        kube.list_side_by_side({"nodes": ("/api/v1/nodes", None)}, shapes_protobuf.OF_COLLECTIONS)


def test_a_page_that_is_not_a_list_is_an_error() -> None:
    with pytest.raises(DecodeError):
        shapes_protobuf.OF_COLLECTIONS["nodes"].decode(MAGIC + b"\xff\xff\xff")
