"""Which models a workload runs on, proven from where it may be placed, and the per-model keys. No I/O.

A per-model key (`requests.nvidia.com/gpu.A100`, `limits.cpu.A4`, `limits.memory.DDR5`) is charged
only for a workload whose placement proves the model: its pods' node selection (`nodeSelector` and
required node affinity) on the label that names the model on nodes (GPU Feature Discovery's
`nvidia.com/gpu.product`; `gpuforge.io/cpu-model` and `gpuforge.io/memory-type`), and for GPUs
also the DRA device selectors of its claims (CEL on the `productName` attribute of `gpu.nvidia.com`
devices). A label the workload sets on itself is a claim, never a proof: otherwise a workload could
land on A100 nodes while saying it wants L4s and be charged to neither.

Matching a key's model to a label value is by words, ignoring case: a value is split into words at
`-`, `_` and spaces (`NVIDIA-A100-SXM4-80GB`: NVIDIA, A100, SXM4, 80GB; DRA's `NVIDIA A100-SXM4-80GB`
the same) and the key's model must be a run of consecutive words of it. So `A100` and `A100-SXM4` match
that product while `A10` (a different GPU), `A100-80GB` (words not adjacent) and `SXM` do not, and
`L4` never matches `L40S`.

A workload is charged under a model key when every value it may land on matches the model, and not
when none does; when its placement is not narrowed to known values, or some values match and others do
not, its model cannot be established and a quota holding that key refuses it (`proof_problem`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from gpuforge.api.gpuquota import DEVICE_CLASS_KEY_SUFFIX
from gpuforge.constants import (
    CPU_MODEL_NODE_LABEL,
    GFD_PRODUCT_LABEL,
    GPU_MODEL_LABEL,
    GPU_RESOURCE,
    GPU_SHARED_SUFFIX,
    MEMORY_TYPE_NODE_LABEL,
)

_CASH: Final = "cash/"


@dataclass(frozen=True)
class Dimension:
    """A resource that quotas may split by model, and the node label that proves the model."""

    name: str  # "gpu", "cpu", "memory": what messages call it
    resource: str  # the resource the model keys qualify
    node_label: str
    prefixes: tuple[str, ...]  # `requests.`, `limits.`: which generic keys get a model
    noun: str  # "GPU model", "CPU model", "memory type"


GPU: Final = Dimension("gpu", GPU_RESOURCE, GFD_PRODUCT_LABEL, ("requests.",), "GPU model")
CPU: Final = Dimension("cpu", "cpu", CPU_MODEL_NODE_LABEL, ("requests.", "limits."), "CPU model")
MEMORY: Final = Dimension("memory", "memory", MEMORY_TYPE_NODE_LABEL, ("requests.", "limits."), "memory type")
DIMENSIONS: Final = (GPU, CPU, MEMORY)
# The model part of a key: letters and digits, words joined by `-`, `_` or `.`.
MODEL_PATTERN: Final = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# Words that are resource names of their own, never a model (`nvidia.com/gpu.shared`: time-sliced GPUs).
_NOT_MODELS: Final = frozenset({GPU_SHARED_SUFFIX.lstrip(".")})
_WORD_SEPARATORS: Final = re.compile(r"[-_\s]+")
# A DRA device selector clause that pins the GPU product: `device.attributes['gpu.nvidia.com'].productName`
# compared with one string, or tested against a list of them.
_PRODUCT_ATTRIBUTE: Final = (
    r"device\.attributes\[\s*(?:'gpu\.nvidia\.com'|\"gpu\.nvidia\.com\")\s*\]"
    r"(?:\.productName|\[\s*(?:'productName'|\"productName\")\s*\])"
)
_STRING: Final = r"(?:'([^'\\]*)'|\"([^\"\\]*)\")"
_PRODUCT_EQUALS: Final = re.compile(
    rf"^\(?\s*(?:{_PRODUCT_ATTRIBUTE}\s*==\s*{_STRING}|{_STRING}\s*==\s*{_PRODUCT_ATTRIBUTE})\s*\)?$"
)
_PRODUCT_IN: Final = re.compile(rf"^\(?\s*{_PRODUCT_ATTRIBUTE}\s+in\s+\[([^\]]*)\]\s*\)?$")
_LITERALS: Final = re.compile(_STRING)


def words(value: str) -> tuple[str, ...]:
    """`NVIDIA A100-SXM4-80GB` -> (NVIDIA, A100, SXM4, 80GB): upper case, split at `-`, `_`, spaces."""
    return tuple(word for word in _WORD_SEPARATORS.split(value.strip().upper()) if word)


def canonical(value: str) -> str:
    """One spelling per model or label value: its words joined by `-` (`nvidia a100` -> NVIDIA-A100)."""
    return "-".join(words(value))


def model_matches(model: str, value: str) -> bool:
    """Whether `model`'s words are consecutive words of `value` (case ignored)."""
    wanted, have = words(model), words(value)
    if not wanted:
        return False
    return any(have[index : index + len(wanted)] == wanted for index in range(len(have) - len(wanted) + 1))


def _runs(value: str) -> set[str]:
    """Every model that matches `value`: each run of its consecutive words."""
    have = words(value)
    count = len(have)
    return {"-".join(have[start:end]) for start in range(count) for end in range(start + 1, count + 1)}


@dataclass(frozen=True)
class Selection:
    """Where a workload's pods may land along one dimension: the label values (canonical) they are held
    to, or None when nothing narrows them; `source` says which selection held them (for messages)."""

    values: frozenset[str] | None = None
    source: str = ""


@dataclass(frozen=True)
class Placement:
    """A workload's selections, by dimension name."""

    selections: Mapping[str, Selection] = field(default_factory=dict)

    def of(self, dimension: Dimension) -> Selection:
        return self.selections.get(dimension.name, Selection())


def _labels_of_term(term: Mapping[str, Any], label: str) -> frozenset[str] | None:
    """The values a node selector term holds `label` to (In, intersected); None if it does not."""
    held: frozenset[str] | None = None
    for expression in term.get("matchExpressions") or ():
        if not isinstance(expression, Mapping) or expression.get("key") != label:
            continue
        values = expression.get("values") or ()
        if expression.get("operator") == "In" and isinstance(values, list):
            allowed = frozenset(canonical(str(value)) for value in values)
            held = allowed if held is None else held & allowed
    if held is not None:  # NotIn narrows a set already held, never proves one
        for expression in term.get("matchExpressions") or ():
            if (
                isinstance(expression, Mapping)
                and expression.get("key") == label
                and expression.get("operator") == "NotIn"
                and isinstance(expression.get("values"), list)
            ):
                held = held - {canonical(str(value)) for value in expression["values"]}
    return held


def node_selection(pod_spec: Mapping[str, Any], label: str, field_path: str = "spec") -> Selection:
    """The values of node label `label` a pod may land on: from `nodeSelector` and the required node
    affinity's terms (ORed: every term must hold the label for the pod to be held to it)."""
    values: frozenset[str] | None = None
    sources: list[str] = []
    selector = pod_spec.get("nodeSelector")
    if isinstance(selector, Mapping) and label in selector:
        values = frozenset({canonical(str(selector[label]))})
        sources.append(f"{field_path}.nodeSelector")
    affinity = pod_spec.get("affinity") or {}
    required = ((affinity.get("nodeAffinity") or {}) if isinstance(affinity, Mapping) else {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    terms = (required or {}).get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if isinstance(terms, list) and terms:
        union: set[str] = set()
        for term in terms:
            held = _labels_of_term(term, label) if isinstance(term, Mapping) else None
            if held is None:
                union = set()
                break
            union |= held
        else:
            values = frozenset(union) if values is None else values & union
            sources.append(f"{field_path}.affinity.nodeAffinity")
    return Selection(values, " and ".join(sources))


def _selector_expressions(request: Mapping[str, Any]) -> list[str]:
    expressions = []
    for selector in request.get("selectors") or ():
        cel = selector.get("cel") if isinstance(selector, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        if isinstance(expression, str):
            expressions.append(expression)
    return expressions


def _outside_literals(expression: str) -> str:
    return _LITERALS.sub("''", expression)


def expression_products(expression: str) -> frozenset[str] | None:
    """The GPU products a CEL device selector holds `productName` to, or None when it does not hold it
    (an `||`, `!` or `?` anywhere outside strings: the clauses could not be read as a conjunction)."""
    bare = _outside_literals(expression)
    if "||" in bare or "?" in bare or re.search(r"!(?!=)", bare):
        return None
    held: frozenset[str] | None = None
    for clause in expression.split("&&"):
        clause = clause.strip()
        found: frozenset[str] | None = None
        equals = _PRODUCT_EQUALS.match(clause)
        if equals is not None:
            literal = next(group for group in equals.groups() if group is not None)
            found = frozenset({canonical(literal)})
        listed = _PRODUCT_IN.match(clause)
        if listed is not None:
            found = frozenset(
                canonical(single or double) for single, double in _LITERALS.findall(listed.group(1))
            )
        if found is not None:
            held = found if held is None else held & found
    return held


def _request_products(request: Mapping[str, Any]) -> frozenset[str] | None:
    held: frozenset[str] | None = None
    for expression in _selector_expressions(request):
        found = expression_products(expression)
        if found is not None:
            held = found if held is None else held & found
    return held


def request_products(request: Mapping[str, Any]) -> frozenset[str] | None:
    """The GPU products one device request (or `firstAvailable` alternative) is held to by its
    selectors; None when they do not hold `productName`."""
    return _request_products(request)


def claim_products(claim_spec: Mapping[str, Any]) -> tuple[frozenset[str], ...]:
    """The GPU products each device request of a ResourceClaim spec is held to by its selectors, one
    set per request that holds `productName` (a `firstAvailable` request: the union of its
    alternatives, if every one holds it)."""
    devices = claim_spec.get("devices") or {}
    held: list[frozenset[str]] = []
    for request in (devices.get("requests") or ()) if isinstance(devices, Mapping) else ():
        if not isinstance(request, Mapping):
            continue
        alternatives = request.get("firstAvailable")
        if isinstance(alternatives, list) and alternatives:
            pinned = [_request_products(sub) for sub in alternatives if isinstance(sub, Mapping)]
            if pinned and all(item is not None for item in pinned):
                held.append(frozenset().union(*(item for item in pinned if item is not None)))
            continue
        exactly = request.get("exactly")
        found = _request_products(exactly if isinstance(exactly, Mapping) else request)
        if found is not None:
            held.append(found)
    return tuple(held)


def pod_placement(
    pod_spec: Mapping[str, Any], device_products: Sequence[frozenset[str]] = (), field_path: str = "spec"
) -> Placement:
    """Where a pod may land: its node selection per dimension; for GPUs further held by the products
    its DRA device requests select (`device_products`, one set per request)."""
    selections = {}
    for dimension in DIMENSIONS:
        selection = node_selection(pod_spec, dimension.node_label, field_path)
        if dimension is GPU and device_products:
            values = selection.values
            for products in device_products:
                values = products if values is None else values & products
            where = f"{field_path}.resourceClaims (device selectors)"
            selection = Selection(values, f"{selection.source} and {where}" if selection.source else where)
        selections[dimension.name] = selection
    return Placement(selections)


def takes(usage: Mapping[str, Decimal], dimension: Dimension) -> bool:
    """Whether `usage` takes the resource a dimension splits by model."""
    return any(usage.get(f"{prefix}{dimension.resource}") for prefix in dimension.prefixes)


def combined_placement(pods: Sequence[tuple[Placement, Mapping[str, Decimal]]]) -> Placement:
    """Where a workload of several pod templates may land (each template's placement with its per-pod
    usage): per dimension, the values any template taking that resource may land on; unnarrowed when one
    of them is."""
    selections = {}
    for dimension in DIMENSIONS:
        taking = [placement.of(dimension) for placement, usage in pods if takes(usage, dimension)]
        if not taking:
            continue
        if any(selection.values is None for selection in taking):
            selections[dimension.name] = Selection()
            continue
        values = frozenset().union(*(selection.values or frozenset() for selection in taking))
        sources = dict.fromkeys(selection.source for selection in taking if selection.source)
        selections[dimension.name] = Selection(values, " and ".join(sources))
    return Placement(selections)


def proven_models(selection: Selection) -> frozenset[str]:
    """The models every value of the selection matches (canonical): none for an unnarrowed selection."""
    if not selection.values:
        return frozenset()
    common: set[str] | None = None
    for value in selection.values:
        runs = _runs(value)
        common = runs if common is None else common & runs
    return frozenset(common or ())


def with_model_keys(usage: Mapping[str, Decimal], placement: Placement) -> dict[str, Decimal]:
    """`usage` plus, for each generic key a dimension splits (`requests.nvidia.com/gpu`, `limits.cpu`,
    ...), the same amount under every model the placement proves, in canonical spelling."""
    result = dict(usage)
    for dimension in DIMENSIONS:
        models = proven_models(placement.of(dimension))
        for prefix in dimension.prefixes:
            generic = f"{prefix}{dimension.resource}"
            if usage.get(generic):
                for model in models:
                    result[f"{generic}.{model}"] = usage[generic]
    return result


@dataclass(frozen=True)
class ModelKey:
    generic: str  # `requests.nvidia.com/gpu`
    model: str  # as the key spells it
    dimension: Dimension


def model_key(key: str) -> ModelKey | None:
    """The parts of a per-model key (a `cash/` budget of one too), None for any other key."""
    counted = key.removeprefix(_CASH)
    for dimension in DIMENSIONS:
        for prefix in dimension.prefixes:
            generic = f"{prefix}{dimension.resource}."
            if counted.startswith(generic):
                model = counted.removeprefix(generic)
                if model and model.lower() not in _NOT_MODELS:
                    return ModelKey(generic[:-1], model, dimension)
    return None


def device_model_key(key: str) -> tuple[str, str] | None:
    """(device class, model) of a per-model DRA key `<class>.deviceclass.resource.k8s.io/devices.<model>`
    (a `cash/` budget of one too), None for any other key."""
    device_class, found, model = key.removeprefix(_CASH).partition(f"{DEVICE_CLASS_KEY_SUFFIX}.")
    return (device_class, model) if found and device_class and model else None


def counted_key(key: str) -> str:
    """The key a usage holds the amount of `key` under: a model in canonical spelling, else `key`."""
    cash = _CASH if key.startswith(_CASH) else ""
    parts = model_key(key)
    if parts is None:
        device = device_model_key(key)
        if device is None:
            return key
        return f"{cash}{device[0]}{DEVICE_CLASS_KEY_SUFFIX}.{canonical(device[1])}"
    return f"{cash}{parts.generic}.{canonical(parts.model)}"


def restrict_to_keys(values: Mapping[str, Decimal], keys: Iterable[str]) -> dict[str, Decimal]:
    """The amounts of `values` under `keys`, each as the key spells it (models matched ignoring case)."""
    result = {}
    for key in keys:
        amount = values.get(key)
        if amount is None:
            amount = values.get(counted_key(key))
        if amount is not None:
            result[key] = amount
    return result


def _shown(values: Iterable[str]) -> str:
    return ", ".join(sorted(values))


def proof_problem(
    hard: Iterable[str], expected: Mapping[str, Decimal], placement: Placement
) -> tuple[str, str] | None:
    """The key, and why, a quota holding the keys `hard` cannot charge a workload that takes `expected`
    placed so (None when it can): for each per-model key whose resource the workload takes, every value
    it may land on must match the model, or none."""
    for key in sorted(hard):
        parts = model_key(key)
        if parts is None or not expected.get(parts.generic):
            continue
        dimension = parts.dimension
        selection = placement.of(dimension)
        label = dimension.node_label
        if selection.values is None:
            devices = " or a DRA device selector on productName" if dimension is GPU else ""
            return key, (
                f"{key} needs the {dimension.noun} proven, and nothing holds the pods to one: select nodes "
                f"by {label} (nodeSelector or required node affinity, operator In){devices}"
            )
        if not selection.values:
            return key, (
                f"{key} needs the {dimension.noun} proven, and {selection.source} leave no {label} value "
                "the pods could land on"
            )
        matching = {value for value in selection.values if model_matches(parts.model, value)}
        if matching and matching != selection.values:
            return key, (
                f"{key}: the pods may land on {label} {_shown(selection.values)} ({selection.source}), of "
                f"which only {_shown(matching)} is {parts.model}; select one model"
            )
    return None


def claimed_model_problem(claimed: str, placement: Placement) -> str:
    """Why a workload's `gpuforge.io/gpu-model` claim contradicts where its pods may land ("" if not)."""
    selection = placement.of(GPU)
    if not claimed or not selection.values:
        return ""
    other = {value for value in selection.values if not model_matches(claimed, value)}
    if not other:
        return ""
    return (
        f"label {GPU_MODEL_LABEL} says {claimed!r} but the pods may land on {GFD_PRODUCT_LABEL} "
        f"{_shown(other)} ({selection.source})"
    )
