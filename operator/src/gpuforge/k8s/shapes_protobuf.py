"""The shapes of `gpuforge.k8s.shapes`, read from the API server's protobuf encoding of built-in kinds.

For the same list the API server sends 76 MB of protobuf where it sends 105 MB of JSON on 5,000 nodes,
and it encodes protobuf with far less CPU, on the machine it shares with everything else. The messages
below name only the fields the shapes name, with Kubernetes' own field numbers; the rest of each object
is skipped by the parser. A page is parsed whole (upb, in C) and its items turned into the same plain
dicts the JSON shapes give, so the readers (`gpuforge.upgrade.convert`, `node_facts`, `plugin_nodes`)
see no difference: empty strings and false left out as JSON's `omitempty` leaves them, times as
RFC 3339, quantities as their strings, a volume's source inlined as in JSON.

Field numbers are those of k8s.io/api v0.36.5 (core/v1/generated.proto; resource/v1/generated.proto,
the same in v1beta1 and v1beta2) and k8s.io/apimachinery v0.36.5 (pkg/apis/meta/v1, pkg/runtime,
pkg/api/resource generated.proto). Kubernetes never renumbers a field of a served version. An answer
is the 4 bytes `k8s\\0` and a runtime.Unknown whose `raw` is the list; an answer in JSON (a server that
sent no protobuf) is read by the JSON shape instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory
from google.protobuf.descriptor_pb2 import FieldDescriptorProto as FieldProto

from gpuforge.k8s import shapes
from gpuforge.k8s.client import PROTOBUF_MAGIC as MAGIC
from gpuforge.k8s.client import ListFormat, Obj, continue_token

# Asked for first, JSON accepted: the API server answers a kind it has no protobuf for in JSON.
ACCEPT = "application/vnd.kubernetes.protobuf, application/json"
PACKAGE = "gpuforge.k8s"


class Kind(Enum):
    """How a field is read and turned into what JSON would have given."""

    STRING = FieldProto.TYPE_STRING
    BOOL = FieldProto.TYPE_BOOL
    INT64 = FieldProto.TYPE_INT64
    INT32 = FieldProto.TYPE_INT32
    BYTES = FieldProto.TYPE_BYTES
    LABELS = "map<string, string>"
    QUANTITIES = "map<string, Quantity>"
    TIME = "Time"  # meta/v1 Time: seconds and nanos; JSON says RFC 3339, to the second
    INLINE = "inline"  # a message JSON inlines into its parent (a volume's source)
    MESSAGE = "message"
    LIST = "repeated message"


SCALARS = frozenset({Kind.STRING, Kind.BOOL, Kind.INT64, Kind.INT32, Kind.BYTES})

# message -> (field, number, kind, message type of a message field or a list's items)
Field = tuple[str, int, Kind, str | None]
LIST_OF = {
    "nodes": "NodeList",
    "pods": "PodList",
    "slices": "ResourceSliceList",
    "claims": "ResourceClaimList",
}
MESSAGES: Mapping[str, tuple[Field, ...]] = {
    # runtime.Unknown, around every answer: the list is its raw bytes
    "Unknown": (("raw", 2, Kind.BYTES, None),),
    "ListMeta": (("resourceVersion", 2, Kind.STRING, None), ("continue", 3, Kind.STRING, None)),
    # meta/v1 Status: what an error answer says, in the encoding asked for
    "Status": (("message", 3, Kind.STRING, None),),
    "Time": (("seconds", 1, Kind.INT64, None), ("nanos", 2, Kind.INT32, None)),
    "Quantity": (("string", 1, Kind.STRING, None),),
    "OwnerReference": (("kind", 1, Kind.STRING, None), ("controller", 6, Kind.BOOL, None)),
    "ObjectMeta": (
        ("name", 1, Kind.STRING, None),
        ("namespace", 3, Kind.STRING, None),
        ("uid", 5, Kind.STRING, None),
        ("resourceVersion", 6, Kind.STRING, None),
        ("deletionTimestamp", 9, Kind.TIME, "Time"),
        ("labels", 11, Kind.LABELS, None),
        ("annotations", 12, Kind.LABELS, None),
        ("ownerReferences", 13, Kind.LIST, "OwnerReference"),
    ),
    # NodeCondition and PodCondition: type and status have the same numbers in both
    "Condition": (("type", 1, Kind.STRING, None), ("status", 2, Kind.STRING, None)),
    # Node
    "NodeSpec": (("unschedulable", 4, Kind.BOOL, None),),
    "NodeSystemInfo": (("kubeletVersion", 7, Kind.STRING, None),),
    "NodeStatus": (
        ("capacity", 1, Kind.QUANTITIES, None),
        ("allocatable", 2, Kind.QUANTITIES, None),
        ("conditions", 4, Kind.LIST, "Condition"),
        ("nodeInfo", 7, Kind.MESSAGE, "NodeSystemInfo"),
    ),
    "Node": (
        ("metadata", 1, Kind.MESSAGE, "ObjectMeta"),
        ("spec", 2, Kind.MESSAGE, "NodeSpec"),
        ("status", 3, Kind.MESSAGE, "NodeStatus"),
    ),
    # Pod
    "ResourceRequirements": (("limits", 1, Kind.QUANTITIES, None), ("requests", 2, Kind.QUANTITIES, None)),
    "Container": (("image", 2, Kind.STRING, None), ("resources", 8, Kind.MESSAGE, "ResourceRequirements")),
    "EmptyDirVolumeSource": (),  # only whether it is there is read
    "VolumeSource": (("emptyDir", 2, Kind.MESSAGE, "EmptyDirVolumeSource"),),
    "Volume": (("volumeSource", 2, Kind.INLINE, "VolumeSource"),),
    "PodSpec": (
        ("volumes", 1, Kind.LIST, "Volume"),
        ("containers", 2, Kind.LIST, "Container"),
        ("nodeName", 10, Kind.STRING, None),
        ("initContainers", 20, Kind.LIST, "Container"),
    ),
    "PodStatus": (("phase", 1, Kind.STRING, None), ("conditions", 2, Kind.LIST, "Condition")),
    "Pod": (
        ("metadata", 1, Kind.MESSAGE, "ObjectMeta"),
        ("spec", 2, Kind.MESSAGE, "PodSpec"),
        ("status", 3, Kind.MESSAGE, "PodStatus"),
    ),
    # ResourceSlice
    "Device": (),  # only how many a slice lists is read
    "ResourceSliceSpec": (
        ("driver", 1, Kind.STRING, None),
        ("nodeName", 3, Kind.STRING, None),
        ("devices", 6, Kind.LIST, "Device"),
    ),
    "ResourceSlice": (
        ("metadata", 1, Kind.MESSAGE, "ObjectMeta"),
        ("spec", 2, Kind.MESSAGE, "ResourceSliceSpec"),
    ),
    # ResourceClaim
    "DeviceRequestAllocationResult": (("driver", 2, Kind.STRING, None),),
    "DeviceAllocationResult": (("results", 1, Kind.LIST, "DeviceRequestAllocationResult"),),
    "AllocationResult": (("devices", 1, Kind.MESSAGE, "DeviceAllocationResult"),),
    "ResourceClaimConsumerReference": (("resource", 3, Kind.STRING, None), ("uid", 5, Kind.STRING, None)),
    "ResourceClaimStatus": (
        ("allocation", 1, Kind.MESSAGE, "AllocationResult"),
        ("reservedFor", 2, Kind.LIST, "ResourceClaimConsumerReference"),
    ),
    "ResourceClaim": (
        ("metadata", 1, Kind.MESSAGE, "ObjectMeta"),
        ("status", 3, Kind.MESSAGE, "ResourceClaimStatus"),
    ),
    **{
        list_name: (
            ("metadata", 1, Kind.MESSAGE, "ListMeta"),
            ("items", 2, Kind.LIST, list_name[: -len("List")]),
        )
        for list_name in LIST_OF.values()
    },
    # any list read for its head only: the next page's token, before the page is parsed
    "ListHead": (("metadata", 1, Kind.MESSAGE, "ListMeta"),),
}
HEAD = "ListHead"


def file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """The messages above as one proto2 file."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="gpuforge/k8s/lists.proto", package=PACKAGE, syntax="proto2"
    )
    for name, fields in MESSAGES.items():
        described = proto.message_type.add(name=name)
        for field_name, number, kind, of in fields:
            field = described.field.add(name=field_name, number=number, json_name=field_name)
            repeated = kind in (Kind.LIST, Kind.LABELS, Kind.QUANTITIES)
            field.label = FieldProto.LABEL_REPEATED if repeated else FieldProto.LABEL_OPTIONAL
            if kind in SCALARS:
                field.type = kind.value
                continue
            field.type = FieldProto.TYPE_MESSAGE
            if kind in (Kind.LABELS, Kind.QUANTITIES):  # a map is a list of key/value entries on the wire
                entry = described.nested_type.add(name=field_name[0].upper() + field_name[1:] + "Entry")
                entry.options.map_entry = True
                entry.field.add(
                    name="key",
                    number=1,
                    type=FieldProto.TYPE_STRING,
                    label=FieldProto.LABEL_OPTIONAL,
                )
                value = entry.field.add(name="value", number=2, label=FieldProto.LABEL_OPTIONAL)
                if kind is Kind.LABELS:
                    value.type = FieldProto.TYPE_STRING
                else:
                    value.type, value.type_name = FieldProto.TYPE_MESSAGE, f".{PACKAGE}.Quantity"
                field.type_name = f".{PACKAGE}.{name}.{entry.name}"
            else:
                field.type_name = f".{PACKAGE}.{of}"
    return proto


def _message_classes() -> dict[str, type[message.Message]]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_descriptor())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in MESSAGES
    }


CLASSES = _message_classes()
Convert = Callable[[Any], Obj]


def _rfc3339(time: Any) -> str:
    return datetime.fromtimestamp(time.seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# How `converter` handles a field, as small ints: compared for every field of every object.
_SCALAR, _LIST, _LABELS, _QUANTITIES, _TIME, _INLINE, _MESSAGE = range(7)
_HANDLING = {
    Kind.LIST: _LIST,
    Kind.LABELS: _LABELS,
    Kind.QUANTITIES: _QUANTITIES,
    Kind.TIME: _TIME,
    Kind.INLINE: _INLINE,
    Kind.MESSAGE: _MESSAGE,
}


def converter(name: str, made: dict[str, Convert] | None = None) -> Convert:
    """A function turning a parsed `name` message into the dict JSON's shape would have given."""
    made = {} if made is None else made
    if name in made:
        return made[name]
    steps: list[tuple[str, int, Convert | None]] = []

    def convert(parsed: Any) -> Obj:
        out: Obj = {}
        for field, handling, inner in steps:
            if handling == _SCALAR:
                value = getattr(parsed, field)
                if value:  # JSON leaves out empty strings, false and zero
                    out[field] = value
            elif handling == _LIST:
                items = getattr(parsed, field)
                if items:
                    out[field] = [inner(item) for item in items]  # type: ignore[misc]
            elif handling == _LABELS:
                labels = getattr(parsed, field)
                if labels:
                    out[field] = dict(labels)
            elif handling == _QUANTITIES:
                quantities = getattr(parsed, field)
                if quantities:
                    out[field] = {key: quantity.string for key, quantity in quantities.items()}
            elif parsed.HasField(field):
                if handling == _TIME:
                    out[field] = _rfc3339(getattr(parsed, field))
                elif handling == _INLINE:
                    out.update(inner(getattr(parsed, field)))  # type: ignore[misc]
                else:
                    out[field] = inner(getattr(parsed, field))  # type: ignore[misc]
        return out

    made[name] = convert
    for field, _, kind, of in MESSAGES[name]:
        inner = converter(of, made) if of is not None and kind is not Kind.TIME else None
        steps.append((field, _SCALAR if kind in SCALARS else _HANDLING[kind], inner))
    return convert


def _raw(data: bytes) -> bytes:
    raw: bytes = CLASSES["Unknown"].FromString(data[len(MAGIC) :]).raw  # type: ignore[attr-defined]
    return raw


def status_message(data: bytes) -> str:
    """The message of the Status an error answer in protobuf holds (the bytes shown if it holds none)."""
    try:
        parsed: Any = CLASSES["Status"].FromString(_raw(data))
    except message.DecodeError:
        parsed = None
    return str(parsed.message) if parsed is not None and parsed.message else repr(data[:300])


def list_format(collection: str) -> ListFormat:
    """How `status` and `plan` read one of their collections: asked for in protobuf, into the shape
    `gpuforge.k8s.shapes` gives from JSON (and read by that shape when the answer is JSON)."""
    list_class, head_class = CLASSES[LIST_OF[collection]], CLASSES[HEAD]
    convert_item = converter(LIST_OF[collection][: -len("List")])
    from_json = shapes.OF_COLLECTIONS[collection]

    def decode(data: bytes) -> Obj:
        if not data.startswith(MAGIC):
            return from_json(data)
        page: Any = list_class.FromString(_raw(data))
        meta = page.metadata
        return {
            "metadata": {"continue": getattr(meta, "continue"), "resourceVersion": meta.resourceVersion},
            "items": [convert_item(item) for item in page.items],
        }

    def token(data: bytes) -> str | None:
        if not data.startswith(MAGIC):
            return continue_token(data)
        head: Any = head_class.FromString(_raw(data))
        return getattr(head.metadata, "continue") or None

    return ListFormat(accept=ACCEPT, decode=decode, token=token)


# By the names `gpuforge status` and `gpuforge plan` give the collections they list.
OF_COLLECTIONS = {collection: list_format(collection) for collection in LIST_OF}
