"""Per-model DRA device keys: `<class>.deviceclass.resource.k8s.io/devices.<model>`. Pure, no I/O.

ResourceQuota counts a claim's devices per DeviceClass (`<class>.deviceclass.resource.k8s.io/devices`);
gpuforge splits that count by GPU model the way it splits `requests.nvidia.com/gpu`: the devices of a
request are charged under a model when the request's own device selectors prove it (a CEL clause on
`device.attributes['gpu.nvidia.com'].productName`, read by gpuforge.quota.models), matched by words as
for node labels. The claim is the proof here, not the pod's node selection: a DeviceClass may hold
devices no node label describes, and a named ResourceClaim is shared by pods placed differently.

A request's model charges sit in its usage next to the device count. Two proof counts ride along, so
that whole workloads (templates times replicas, shared claims once) can be judged from their usage alone:
the devices of each class whose product is pinned, and per model the devices that may be of it. They are
under `proof:` keys, which no quota can hold (the key grammar has no `:`), so they are never charged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Final

from gpuforge.api.gpuquota import DEVICE_CLASS_KEY_SUFFIX
from gpuforge.quota.models import Selection, canonical, device_model_key, proven_models, words

PROOF_PREFIX: Final = "proof:"
ZERO: Final = Decimal(0)


def _pinned_key(device_class: str) -> str:
    return f"{PROOF_PREFIX}{device_class}/pinned"


def _may_key(device_class: str, model: str) -> str:
    return f"{PROOF_PREFIX}{device_class}/may.{model}"


def _every_run(products: frozenset[str]) -> set[str]:
    """Every model some product matches: each run of consecutive words of each product."""
    runs: set[str] = set()
    for product in products:
        have = words(product)
        runs |= {
            "-".join(have[start:end]) for start in range(len(have)) for end in range(start + 1, len(have) + 1)
        }
    return runs


def request_charges(device_class: str, count: int, products: frozenset[str] | None) -> dict[str, Decimal]:
    """What one device request of `count` devices of `device_class`, its selectors holding it to
    `products` (None: they do not), adds to a claim's usage besides the device count: the model keys it
    proves, and the proof counts."""
    if products is None:
        return {}
    amount = Decimal(count)
    charges = {_pinned_key(device_class): amount}
    for model in proven_models(Selection(products)):
        charges[f"{device_class}{DEVICE_CLASS_KEY_SUFFIX}.{model}"] = amount
    for model in _every_run(products):
        charges[_may_key(device_class, model)] = amount
    return charges


def is_proof_key(key: str) -> bool:
    return key.startswith(PROOF_PREFIX)


def device_proof_problem(hard: Iterable[str], expected: Mapping[str, Decimal]) -> tuple[str, str] | None:
    """The key, and why, a quota holding the keys `hard` cannot charge a workload that takes `expected`
    (None when it can): for each per-model DRA key whose class the workload takes devices of, every
    such device must be pinned to products by its request's selectors, and those products must all be
    the key's model or none of them."""
    for key in sorted(hard):
        parts = device_model_key(key)
        if parts is None:
            continue
        device_class, model = parts
        devices = expected.get(f"{device_class}{DEVICE_CLASS_KEY_SUFFIX}", ZERO)
        if devices <= 0:
            continue
        if expected.get(_pinned_key(device_class), ZERO) < devices:
            return key, (
                f"{key} needs the GPU model proven, and a device request of class {device_class} does not "
                "hold it: select the product in the request's device selectors (CEL on "
                "device.attributes['gpu.nvidia.com'].productName, == or in)"
            )
        wanted = canonical(model)
        proven = expected.get(f"{device_class}{DEVICE_CLASS_KEY_SUFFIX}.{wanted}", ZERO)
        if expected.get(_may_key(device_class, wanted), ZERO) > proven:
            return key, (
                f"{key}: a device request of class {device_class} may select products of other models "
                f"than {model} as well; select one model"
            )
    return None
