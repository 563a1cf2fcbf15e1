#!/usr/bin/python
# Copyright: gpuforge maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module gathering a node's NVIDIA GPU facts (module_utils: gpu_probe reads, gpu_features parses)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU facts and the NFD features they imply
version_added: 0.1.0
description:
  - Reads PCI devices from sysfs (NVIDIA GPUs and NVSwitches, available before any driver is installed),
    queries C(nvidia-smi) when it is present (product, count, memory, driver and CUDA versions, compute
    capability, MIG capability), reads the Secure Boot state from the EFI variables, and reports which
    NVIDIA kernel module version is loaded.
  - Computes the Node Feature Discovery features for the node, named like GPU Feature Discovery's labels.
  - Changes nothing; supports check mode.
options:
  nvidia_smi:
    description: Name or path of C(nvidia-smi).
    type: str
    default: nvidia-smi
  feature_namespace:
    description: Namespace of the NFD feature names (C(nvidia.com) needs C(extraLabelNs) on nfd-master).
    type: str
    default: nvidia.com
author:
  - gpuforge maintainers
"""

EXAMPLES = r"""
- name: Gather GPU facts
  gpuforge.nodes.gpu_facts:
  register: gpu

- name: Show the product
  ansible.builtin.debug:
    msg: "{{ gpu.gpu.count }} x {{ gpu.gpu.product }}"
"""

RETURN = r"""
gpu:
  description: Summary of the node's GPUs.
  returned: always
  type: dict
  contains:
    count: {description: Number of GPUs (nvidia-smi, else PCI), type: int}
    product: {description: Product name of the first GPU, type: str}
    memory_mib: {description: Memory of the first GPU in MiB, type: int}
    driver_version: {description: Driver version reported by nvidia-smi, type: str}
    cuda_version: {description: CUDA version the driver supports, type: str}
    compute_capability: {description: Compute capability of the first GPU, type: str}
    family: {description: Architecture family (GFD naming), type: str}
    mig_capable: {description: Whether any GPU supports MIG, type: bool}
    nvswitch_count: {description: NVSwitch devices on PCI, type: int}
gpus:
  description: One entry per GPU reported by nvidia-smi.
  returned: always
  type: list
  elements: dict
pci:
  description: NVIDIA devices found on PCI (gpu_count, gpu_device_ids, nvswitch_count).
  returned: always
  type: dict
nvidia_smi:
  description: Path of nvidia-smi (null if absent), its return code and error output when it failed.
  returned: always
  type: dict
secure_boot:
  description: Secure Boot state from EFI variables; null on a non-EFI system.
  returned: always
  type: bool
loaded_module_version:
  description: Version of the loaded nvidia kernel module; null if it is not loaded.
  returned: always
  type: str
nouveau_loaded:
  description: Whether the nouveau module is loaded.
  returned: always
  type: bool
features:
  description: NFD feature names and values for this node (empty without NVIDIA GPUs).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuforge.nodes.plugins.module_utils import gpu_probe


def main():
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "feature_namespace": {"type": "str", "default": "nvidia.com"},
        },
        supports_check_mode=True,
    )
    facts = gpu_probe.probe(module, module.params["nvidia_smi"], module.params["feature_namespace"])
    module.exit_json(changed=False, **facts)


if __name__ == "__main__":
    main()
