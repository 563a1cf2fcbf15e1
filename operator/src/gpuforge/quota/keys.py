"""Which keys `spec.hard` may hold, and what a misspelt one should have been. Pure, no I/O.

The keys are ResourceQuota's for pods, so a quota reads like the ResourceQuota people already write:
`requests.<resource>` and `limits.<resource>` for the standard compute resources, the aliases `cpu`,
`memory`, `ephemeral-storage`, `pods`; extended resources (`nvidia.com/gpu`) only as `requests.`
(ResourceQuota's rule: they cannot be overcommitted, so limits equal requests). gpuforge adds per-model
keys (`requests.nvidia.com/gpu.<model>`, `requests.cpu.<model>`/`limits.cpu.<model>`,
`requests.memory.<type>`/`limits.memory.<type>`: gpuforge.quota.models), DRA keys and `cash/` budgets
of any of these. A key outside
this set would silently limit nothing (nothing is ever counted under it), so it is refused with the
spelling that was probably meant.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Final

from gpuforge.api.gpuquota import CASH_PREFIX, DEVICE_CLASS_KEY_SUFFIX, RESOURCE_CLAIMS_COUNT_KEY
from gpuforge.constants import GPU_RESOURCE
from gpuforge.quota.models import MODEL_PATTERN, device_model_key, model_key

STANDARD_RESOURCES: Final = ("cpu", "memory", "ephemeral-storage")
# Resources the quota's `requests.`/`limits.` keys may name without a domain.
_HUGEPAGES = re.compile(r"^hugepages-[0-9]+(?:[KMGTPE]i?)?$")
# NVIDIA's device plugin advertises these: whole GPUs, time-sliced GPUs renamed `.shared`, MIG slices.
_NVIDIA_RESOURCE = re.compile(r"^nvidia\.com/(?:gpu(?:\.[A-Za-z0-9][-A-Za-z0-9_.]*)?|mig-[0-9]+g\.[0-9]+gb)$")
# A qualified resource name of another vendor: `<dns-subdomain>/<name>`.
_EXTENDED = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DEVICE_CLASS = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
# What a misspelt key is compared with for a suggestion.
COMMON_KEYS: Final = (
    f"requests.{GPU_RESOURCE}",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "cpu",
    "memory",
    "ephemeral-storage",
    "pods",
    RESOURCE_CLAIMS_COUNT_KEY,
)


def _is_standard(resource: str) -> bool:
    return resource in STANDARD_RESOURCES or bool(_HUGEPAGES.match(resource))


def _is_extended(resource: str) -> bool:
    if resource.startswith("nvidia.com/"):
        return bool(_NVIDIA_RESOURCE.match(resource))
    return "/" in resource and not resource.startswith("kubernetes.io/") and bool(_EXTENDED.match(resource))


def _suggestion(key: str) -> str:
    if "gpu" in key.lower():  # `gpu`, `requests.gpus`, `nvidia/gpu`: the GPU key
        return f"requests.{GPU_RESOURCE}"
    close = difflib.get_close_matches(key, COMMON_KEYS, n=1, cutoff=0.6)
    return close[0] if close else ""


def key_problem(key: str) -> str:
    """Why `key` cannot be in `spec.hard` ("" when it can), naming the spelling meant where one fits."""
    counted = key.removeprefix(CASH_PREFIX)
    if counted.startswith(CASH_PREFIX):
        return f"{key}: a budget of a budget is not counted"
    if counted in ("pods", RESOURCE_CLAIMS_COUNT_KEY) or counted in STANDARD_RESOURCES:
        return ""
    device_model = device_model_key(counted)
    if counted.endswith(DEVICE_CLASS_KEY_SUFFIX) or device_model is not None:
        device_class = device_model[0] if device_model else counted.removesuffix(DEVICE_CLASS_KEY_SUFFIX)
        if not _DEVICE_CLASS.match(device_class):
            return f"{key}: {device_class!r} is not a DeviceClass name"
        if device_model is not None and not MODEL_PATTERN.match(device_model[1]):
            return (
                f"{key}: {device_model[1]!r} is not a model name (letters and digits, words joined by -, _ "
                "or .)"
            )
        return ""
    prefix, _, resource = counted.partition(".")
    cash = CASH_PREFIX if key.startswith(CASH_PREFIX) else ""
    split = model_key(counted)
    if split is not None and split.dimension.resource in STANDARD_RESOURCES:
        if MODEL_PATTERN.match(split.model):
            return ""
        return f"{key}: {split.model!r} is not a model name (letters and digits, words joined by -, _ or .)"
    if prefix in ("cpu", "memory") and resource:  # the alias with a model: `cpu.A4`
        return f"{key}: not a key gpuforge counts; did you mean {cash}requests.{counted}"
    if prefix in ("requests", "limits") and resource:
        if _is_standard(resource):
            return ""
        if _is_extended(resource):
            if prefix == "requests":
                return ""
            return (
                f"{key}: extended resources are counted by requests only (they cannot be overcommitted); "
                f"did you mean {cash}requests.{resource}"
            )
    elif _is_extended(counted) or _is_standard(counted):  # `nvidia.com/gpu: 1`, `hugepages-2Mi: 1`
        meant = f"{cash}requests.{counted}"
        return f"{key}: not a key gpuforge counts; did you mean {meant}"
    meant = _suggestion(counted)
    hint = f"; did you mean {cash}{meant}" if meant else ""
    return (
        f"{key}: not a key gpuforge counts (requests.<resource>, limits.<resource>, cpu, memory, "
        f"ephemeral-storage, pods, <device-class>{DEVICE_CLASS_KEY_SUFFIX}, {RESOURCE_CLAIMS_COUNT_KEY}, "
        f"or cash/ of one){hint}"
    )


def hard_key_problems(hard: Iterable[str], already: Mapping[str, object] | Iterable[str] = ()) -> list[str]:
    """Problems with the keys of `hard` that `already` (the stored quota's keys) does not hold: a key
    admitted before this check existed stays editable."""
    kept = set(already)
    return [problem for key in sorted(hard) if key not in kept and (problem := key_problem(key))]
