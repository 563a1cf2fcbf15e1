# Copyright: gpuforge maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Read a node's GPUs (sysfs PCI devices, nvidia-smi, EFI variables, loaded modules) into gpu_facts' result.

The I/O half shared by the gpu_facts and node_state modules; the parsing lives in gpu_features (pure).
"""

from __future__ import absolute_import, division, print_function

import os

from ansible_collections.gpuforge.nodes.plugins.module_utils import gpu_features

__metaclass__ = type

PCI_DEVICES = "/sys/bus/pci/devices"
EFIVARS = "/sys/firmware/efi/efivars"
MODULE_VERSION_FILES = ("/sys/module/nvidia/version", "/proc/driver/nvidia/version")


def _read(path, mode="r"):
    try:
        with open(path, mode) as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def read_pci_devices():
    devices = []
    try:
        addresses = sorted(os.listdir(PCI_DEVICES))
    except OSError:
        return devices
    for address in addresses:
        entry = {"address": address}
        for attribute in ("vendor", "device", "class"):
            entry[attribute] = (_read(os.path.join(PCI_DEVICES, address, attribute)) or "").strip()
        devices.append(entry)
    return devices


def loaded_module_version():
    text = _read(MODULE_VERSION_FILES[0])
    if text:
        return text.strip()
    text = _read(MODULE_VERSION_FILES[1]) or ""
    for word in text.split():
        if word.count(".") >= 1 and word.replace(".", "").isdigit():
            return word
    return None


def nouveau_loaded():
    return any(line.split(" ", 1)[0] == "nouveau" for line in (_read("/proc/modules") or "").splitlines())


def probe(module, nvidia_smi="nvidia-smi", feature_namespace="nvidia.com"):
    """Everything gpu_facts returns: GPU summary and list, PCI devices, nvidia-smi, Secure Boot, modules, features."""
    pci = gpu_features.pci_summary(read_pci_devices())
    smi_path = module.get_bin_path(nvidia_smi)
    smi = {"path": smi_path, "rc": None, "error": None}
    gpus = []
    cuda_version = None
    if smi_path:
        query = "--query-gpu=" + ",".join(gpu_features.QUERY_FIELDS)
        rc, out, err = module.run_command([smi_path, query, "--format=csv,noheader,nounits"])
        smi["rc"] = rc
        if rc == 0:
            try:
                gpus = gpu_features.parse_query_csv(out)
            except ValueError as exc:
                module.fail_json(msg="cannot parse nvidia-smi output: %s" % exc)
            _rc, banner, _err = module.run_command([smi_path])
            cuda_version = gpu_features.parse_cuda_version(banner)
        else:
            smi["error"] = (err or out).strip()[-500:]
    summary = gpu_features.summarize(gpus, pci, cuda_version)
    return {
        "gpu": summary,
        "gpus": gpus,
        "pci": pci,
        "nvidia_smi": smi,
        "secure_boot": gpu_features.secure_boot_state(
            _read(os.path.join(EFIVARS, gpu_features.SECURE_BOOT_EFIVAR), "rb")
        ),
        "loaded_module_version": loaded_module_version(),
        "nouveau_loaded": nouveau_loaded(),
        "features": gpu_features.features(summary, feature_namespace),
    }
