# Copyright: gpuforge maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Filters driver_upstream_version, dnf_version_specs and rpm_lock_specs (see module_utils/driver_versions.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: driver_upstream_version
short_description: The NVIDIA driver's own version from a package version
description:
  - C(3:580.95.05-1.el9), C(580.95.05-1) and C(580.95.05) all give C(580.95.05); the epoch and the release are
    dropped, so RPM and deb versions compare with what nvidia-smi and the loaded module report.
  - The same plugin file provides C(dnf_version_specs) (names to C(name-<driver version>) arguments for dnf) and
    C(rpm_lock_specs) (installed packages of the driver's version to epoch-aware versionlock entries).
options:
  _input:
    description: A package version.
    type: str
    required: true
"""

EXAMPLES = r"""
upstream: "{{ '3:580.95.05-1.el9' | gpuforge.nodes.driver_upstream_version }}"
specs: "{{ ['nvidia-driver'] | gpuforge.nodes.dnf_version_specs('580.95.05-1.el9') }}"
locks: "{{ state.package_index | gpuforge.nodes.rpm_lock_specs('580.95.05-1.el9') }}"
"""

RETURN = r"""
_value:
  description: The upstream version.
  type: str
"""

from ansible_collections.gpuforge.nodes.plugins.module_utils import driver_versions


class FilterModule(object):
    def filters(self):
        return {
            "driver_upstream_version": driver_versions.upstream_version,
            "dnf_version_specs": driver_versions.dnf_version_specs,
            "rpm_lock_specs": driver_versions.rpm_lock_specs,
        }
