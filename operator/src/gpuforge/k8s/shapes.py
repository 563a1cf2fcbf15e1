"""The parts of Nodes, Pods, ResourceSlices and ResourceClaims that `gpuforge status` and `gpuforge plan`
read, as typed dicts that list pages are decoded into.

A Node as the API server sends it is mostly what neither command reads: managedFields, images, addresses,
daemon endpoints; a Pod carries its containers' commands, environment, volumes' sources, tolerations.
Decoding a page into these shapes (msgspec) skips all of that without building a Python object for it,
and gives plain dicts with the fields below, where the API server sent them, so the code reading them
(`gpuforge.upgrade.convert`, `node_facts`, `plugin_nodes`) is the same for whole objects and for these.
Whoever reads a new field through these shapes adds it here; a unit test compares what both decodings
give those readers on full objects.

Leaves are `Any`: small (labels, a condition's status), decoded as sent, whatever their type.
"""

from __future__ import annotations

from typing import Any, Generic, TypedDict, TypeVar

import msgspec

from gpuforge.k8s.client import PageDecoder

# --- shared -------------------------------------------------------------------------------------------

ListMeta = TypedDict("ListMeta", {"continue": str, "resourceVersion": str}, total=False)
Item = TypeVar("Item")


class Page(TypedDict, Generic[Item], total=False):
    """A list page of one of the shapes below."""

    metadata: ListMeta
    items: list[Item] | None


class Owner(TypedDict, total=False):
    kind: Any
    controller: Any


class Meta(TypedDict, total=False):
    name: Any
    namespace: Any
    uid: Any
    resourceVersion: Any
    labels: Any
    annotations: Any
    deletionTimestamp: Any
    ownerReferences: list[Owner] | None


class Condition(TypedDict, total=False):
    type: Any
    status: Any


# --- Node ---------------------------------------------------------------------------------------------


class NodeSpec(TypedDict, total=False):
    unschedulable: Any


class NodeInfo(TypedDict, total=False):
    kubeletVersion: Any


class NodeStatus(TypedDict, total=False):
    conditions: list[Condition] | None
    nodeInfo: NodeInfo | None
    capacity: Any
    allocatable: Any


class Node(TypedDict, total=False):
    metadata: Meta
    spec: NodeSpec | None
    status: NodeStatus | None


# --- Pod ----------------------------------------------------------------------------------------------


class Resources(TypedDict, total=False):
    requests: Any
    limits: Any


class Container(TypedDict, total=False):
    image: Any
    resources: Resources | None


class Volume(TypedDict, total=False):
    emptyDir: Any  # only whether it is there is read


class PodSpec(TypedDict, total=False):
    nodeName: Any
    containers: list[Container] | None
    initContainers: list[Container] | None
    volumes: list[Volume] | None


class PodStatus(TypedDict, total=False):
    phase: Any
    conditions: list[Condition] | None


class Pod(TypedDict, total=False):
    metadata: Meta
    spec: PodSpec | None
    status: PodStatus | None


# --- ResourceSlice ------------------------------------------------------------------------------------


class Device(TypedDict, total=False):
    """Only how many devices a slice lists is read: nothing of each."""


class SliceSpec(TypedDict, total=False):
    nodeName: Any
    driver: Any
    devices: list[Device] | None


class Slice(TypedDict, total=False):
    metadata: Meta
    spec: SliceSpec | None


# --- ResourceClaim ------------------------------------------------------------------------------------


class Result(TypedDict, total=False):
    driver: Any


class AllocatedDevices(TypedDict, total=False):
    results: list[Result] | None


class Allocation(TypedDict, total=False):
    devices: AllocatedDevices | None


class Consumer(TypedDict, total=False):
    resource: Any
    uid: Any


class ClaimStatus(TypedDict, total=False):
    allocation: Allocation | None
    reservedFor: list[Consumer] | None


class Claim(TypedDict, total=False):
    metadata: Meta
    status: ClaimStatus | None


def page_decoder(item: type[Any]) -> PageDecoder:
    """A function decoding a list page's JSON into a `Page` of `item` (one of the shapes above)."""
    decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(Page[item])  # type: ignore[valid-type]

    def decode(data: bytes) -> dict[str, Any]:
        decoded: dict[str, Any] = decoder.decode(data)
        return decoded

    return decode


# By the names `gpuforge status` and `gpuforge plan` give the collections they list.
OF_COLLECTIONS = {
    "nodes": page_decoder(Node),
    "pods": page_decoder(Pod),
    "slices": page_decoder(Slice),
    "claims": page_decoder(Claim),
}
