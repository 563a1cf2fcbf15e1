# Copyright: gpuforge maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Driver versions as dpkg and rpm write them, reduced to what can be compared.

Pure functions, no I/O. NVIDIA's RPMs carry epoch 3 ("3:580.95.05-1.el9"), its debs none ("580.95.05-1"), and
nvidia-smi and the loaded module report the upstream version alone ("580.95.05"): comparisons go through
upstream_version(), while version locks keep the epoch (dnf's versionlock matches it).
"""

from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type

_EPOCH = re.compile(r"^(?:\(none\)|[0-9]+):")


def split_epoch(version):
    """("3", "580.95.05-1.el9") from "3:580.95.05-1.el9"; epoch "0" when there is none."""
    match = _EPOCH.match(version or "")
    if not match:
        return "0", version or ""
    epoch = match.group(0)[:-1]
    return ("0" if epoch == "(none)" else epoch), version[match.end():]


def strip_epoch(version):
    return split_epoch(version)[1]


def upstream_version(version):
    """The driver's own version: "580.95.05" from "3:580.95.05-1.el9", "580.95.05-1" or "580.95.05"."""
    return re.sub(r"-[^-]*$", "", strip_epoch(version))


def dnf_version_specs(names, version):
    """dnf install arguments asking for exactly this driver version of each package ("nvidia-driver-580.95.05").

    Name and version without epoch or release: dnf matches every epoch, and the packages of the set differ in
    both (the fabric manager has no epoch 3).
    """
    upstream = upstream_version(version)
    return ["%s-%s" % (name, upstream) for name in names]


def rpm_lock_specs(rows, version):
    """versionlock entries "name-E:V-R.*" for every installed package of the driver's version.

    rows: [status, source package, package, epoch:version-release] as node_state's package_index returns
    them on rpm systems. The whole set dnf resolved carries the driver's version (nvidia-driver-libs,
    nvidia-kmod-common, nvidia-modprobe ...), not only the packages the role names, and every one is locked
    with its epoch: an entry without it stands for epoch 0, which no package of the set has.
    """
    upstream = upstream_version(version)
    specs = set()
    for row in rows:
        if len(row) != 4 or row[0] != "installed" or upstream_version(row[3]) != upstream:
            continue
        epoch, rest = split_epoch(row[3])
        specs.add("%s-%s:%s.*" % (row[2], epoch, rest))
    return sorted(specs)


def reboot_needed(loaded_version, installed_version):
    """Whether the loaded kernel module is another driver than the installed package (either may be empty)."""
    if not loaded_version or not installed_version:
        return False
    return upstream_version(loaded_version) != upstream_version(installed_version)
