# Copyright: gpuforge maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Turn raw GPU observations (nvidia-smi output, PCI data, EFI variables) into facts and NFD features.

Pure functions, no I/O: the gpu_facts module gathers the raw text and calls these, and the unit tests in
tests/ansible/unit feed them table-driven inputs. Label names follow NVIDIA GPU Feature Discovery where it
has one, so NFD features written before the GFD pod runs agree with what GFD will publish.
"""

from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type

NVIDIA_PCI_VENDOR = "0x10de"
# PCI classes: 0x0300 VGA controller, 0x0302 3D controller (datacenter GPUs), 0x0680 other bridge (NVSwitch).
GPU_PCI_CLASSES = ("0x0300", "0x0302")
NVSWITCH_PCI_CLASS = "0x0680"
SECURE_BOOT_EFIVAR = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
QUERY_FIELDS = ("index", "name", "uuid", "memory.total", "driver_version", "compute_cap", "mig.mode.current")

# Compute capability major.minor -> architecture family, as GFD names them (nvidia.com/gpu.family).
_FAMILIES = (
    ((12, 0), "blackwell"),
    ((10, 0), "blackwell"),
    ((9, 0), "hopper"),
    ((8, 9), "ada-lovelace"),
    ((8, 0), "ampere"),
    ((7, 5), "turing"),
    ((7, 0), "volta"),
    ((6, 0), "pascal"),
    ((5, 0), "maxwell"),
    ((3, 0), "kepler"),
)
_LABEL_VALUE_INVALID = re.compile(r"[^A-Za-z0-9_.-]+")


def pci_summary(devices):
    """Count NVIDIA GPUs and NVSwitches in [{"address", "vendor", "class", "device"}] read from sysfs."""
    gpus = []
    nvswitches = []
    for device in devices:
        if device.get("vendor", "").lower() != NVIDIA_PCI_VENDOR:
            continue
        pci_class = device.get("class", "").lower()[:6]
        if pci_class in GPU_PCI_CLASSES:
            gpus.append(device)
        elif pci_class == NVSWITCH_PCI_CLASS:
            nvswitches.append(device)
    return {
        "gpu_count": len(gpus),
        "gpu_device_ids": sorted({d.get("device", "").lower() for d in gpus}),
        "nvswitch_count": len(nvswitches),
    }


def parse_query_csv(text):
    """Parse `nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits` into GPU dicts."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        values = [value.strip() for value in line.split(",")]
        if len(values) != len(QUERY_FIELDS):
            raise ValueError("unexpected nvidia-smi query line: %r" % line)
        row = dict(zip(QUERY_FIELDS, values))
        gpus.append(
            {
                "index": int(row["index"]),
                "name": row["name"],
                "uuid": row["uuid"],
                "memory_mib": _int_or_none(row["memory.total"]),
                "driver_version": row["driver_version"],
                "compute_capability": row["compute_cap"],
                # "[N/A]" means the GPU has no MIG mode at all; "Enabled"/"Disabled" means MIG capable.
                "mig_capable": row["mig.mode.current"] in ("Enabled", "Disabled"),
                "mig_enabled": row["mig.mode.current"] == "Enabled",
            }
        )
    return gpus


def parse_cuda_version(banner):
    """The CUDA version the driver supports, from the plain `nvidia-smi` banner, or None."""
    match = re.search(r"CUDA Version:\s*([0-9]+\.[0-9]+)", banner or "")
    return match.group(1) if match else None


def secure_boot_state(efivar_bytes):
    """True/False from the SecureBoot EFI variable (4 attribute bytes, then the value); None if absent."""
    if efivar_bytes is None or len(efivar_bytes) < 5:
        return None
    return bytearray(efivar_bytes)[4] == 1


def gpu_family(compute_capability):
    try:
        major, minor = (int(part) for part in compute_capability.split(".", 1))
    except (AttributeError, ValueError):
        return None
    for (fam_major, fam_minor), family in _FAMILIES:
        if (major, minor) >= (fam_major, fam_minor):
            return family
    return None


def label_value(text):
    """A Kubernetes label value: at most 63 of [A-Za-z0-9_.-], starting and ending alphanumeric."""
    value = _LABEL_VALUE_INVALID.sub("-", str(text).strip())[:63]
    return value.strip("-_.")


def summarize(gpus, pci, cuda_version):
    """Facts about the node's GPUs as a whole. The first GPU names the product (GFD does the same)."""
    count = len(gpus) if gpus else pci["gpu_count"]
    first = gpus[0] if gpus else {}
    products = sorted({gpu["name"] for gpu in gpus})
    return {
        "count": count,
        "product": first.get("name"),
        "mixed_products": len(products) > 1,
        "memory_mib": first.get("memory_mib"),
        "driver_version": first.get("driver_version"),
        "cuda_version": cuda_version,
        "compute_capability": first.get("compute_capability"),
        "family": gpu_family(first.get("compute_capability")),
        "mig_capable": any(gpu["mig_capable"] for gpu in gpus),
        "nvswitch_count": pci["nvswitch_count"],
    }


def features(summary, namespace="nvidia.com"):
    """NFD local features (name -> value) for a node; empty when it has no NVIDIA GPU."""
    if not summary["count"]:
        return {}
    ns = namespace.rstrip("/") + "/"
    result = {ns + "gpu.present": "true", ns + "gpu.count": str(summary["count"])}
    if summary.get("product"):
        result[ns + "gpu.product"] = label_value(summary["product"])
    if summary.get("memory_mib") is not None:
        result[ns + "gpu.memory"] = str(summary["memory_mib"])
    if summary.get("family"):
        result[ns + "gpu.family"] = summary["family"]
    if summary.get("compute_capability"):
        major, _, minor = summary["compute_capability"].partition(".")
        result[ns + "gpu.compute.major"] = major
        result[ns + "gpu.compute.minor"] = minor or "0"
    if summary.get("driver_version"):
        parts = summary["driver_version"].split(".")
        for key, part in zip(("major", "minor", "rev"), parts):
            result[ns + "cuda.driver-version." + key] = part
        result[ns + "cuda.driver-version.full"] = label_value(summary["driver_version"])
    if summary.get("cuda_version"):
        major, _, minor = summary["cuda_version"].partition(".")
        result[ns + "cuda.runtime-version.major"] = major
        result[ns + "cuda.runtime-version.minor"] = minor or "0"
        result[ns + "cuda.runtime-version.full"] = label_value(summary["cuda_version"])
    if summary.get("driver_version") is not None or summary.get("product"):
        result[ns + "mig.capable"] = "true" if summary.get("mig_capable") else "false"
    if summary.get("nvswitch_count"):
        result[ns + "gpu.nvswitch.count"] = str(summary["nvswitch_count"])
    return result


def _int_or_none(text):
    try:
        return int(float(text))
    except ValueError:
        return None
