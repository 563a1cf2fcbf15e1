#!/usr/bin/python
# Copyright: gpuforge maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module reading packages, services and files in one go; the parsing lives in module_utils/node_state."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: node_state
short_description: Read the state of packages, services and files with one module run
version_added: 0.2.0
description:
  - Reads, for any number of packages, services and files, what the roles otherwise ask with one command
    each (C(dpkg-query), C(apt-mark showhold), C(apt-cache policy), C(systemctl is-enabled), C(stat)). Each
    kind of question costs one command on the host, so a role reads its whole state once per phase.
  - Packages come from dpkg on apt systems and from rpm (holds from C(dnf versionlock)) otherwise.
  - Changes nothing; supports check mode.
options:
  packages:
    description: Packages whose installed version and hold state to report.
    type: list
    elements: str
    default: []
  candidates:
    description: Packages whose candidate version (what apt would install now) to report; apt systems only.
    type: list
    elements: str
    default: []
  owners:
    description: Paths, or names of commands looked up on C(PATH), whose owning package to report.
    type: list
    elements: str
    default: []
  services:
    description: systemd units (C(.service) may be left out) whose load, enablement and activity to report.
    type: list
    elements: str
    default: []
  files:
    description: Paths to stat; the content of regular files up to 64 KiB is returned as text.
    type: list
    elements: path
    default: []
  gpu_facts:
    description: Also gather what M(gpuforge.nodes.gpu_facts) returns (same module run, same result).
    type: bool
    default: false
  feature_namespace:
    description: Namespace of the NFD feature names in O(gpu_facts), as in M(gpuforge.nodes.gpu_facts).
    type: str
    default: nvidia.com
  package_index:
    description:
      - Also report every package dpkg knows in an installed or config-files state, with its source package
        (on rpm systems every installed package, with its source RPM's name and its epoch).
    type: bool
    default: false
  apt_sources:
    description:
      - Also report the apt source files naming one of these repository URIs, as M(gpuforge.nodes.apt_sources)
        does (apt systems only).
    type: list
    elements: str
    default: []
  apt_sources_exclude:
    description: Source files not to report under I(apt_sources) (the one the role manages itself).
    type: list
    elements: path
    default: []
author:
  - gpuforge maintainers
"""

EXAMPLES = r"""
- name: Read the driver packages and services
  gpuforge.nodes.node_state:
    packages: [nvidia-driver, nvidia-smi]
    candidates: [nvidia-smi]
    owners: [nvidia-smi]
    services: [nvidia-persistenced]
    files: [/etc/containerd/config.toml]
  register: state
"""

RETURN = r"""
packages:
  description: Per package, C(installed) (bool), C(version) (null when not installed) and C(held) (bool).
  returned: always
  type: dict
candidates:
  description: Per package, the candidate version or null when there is none.
  returned: always
  type: dict
owners:
  description: Per path or command name as given, the owning package or null (also when no such command).
  returned: always
  type: dict
services:
  description: Per unit, C(loaded) (bool), C(enabled) (UnitFileState) and C(active) (ActiveState).
  returned: always
  type: dict
files:
  description: Per path, C(exists), C(type) (file, directory, link, other), C(mode) (octal string), C(uid),
    C(gid) and C(content) (text of a regular file up to 64 KiB, else null).
  returned: always
  type: dict
gpu_facts:
  description: The result of M(gpuforge.nodes.gpu_facts) with default options; empty unless asked for.
  returned: always
  type: dict
package_index:
  description: >-
    With I(package_index), one item per package in an installed or config-files state:
    C([status, source package, package, version]) (status as dpkg's C(db:Status-Status)); on rpm systems every
    installed package, its version written C(epoch:version-release) (epoch 0 if it has none).
  returned: always
  type: list
  elements: list
apt_sources:
  description: With I(apt_sources), the files naming those URIs, as M(gpuforge.nodes.apt_sources) returns them.
  returned: always
  type: list
  elements: dict
"""

import glob
import os
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuforge.nodes.plugins.module_utils import apt_sources, gpu_probe, node_state

CONTENT_LIMIT = 65536


def _run(module, argv):
    # Exit codes tell "some package unknown" apart from nothing useful; the parsers only trust stdout lines.
    _rc, out, _err = module.run_command(argv, environ_update={"LC_ALL": "C"})
    return out


def read_packages(module, names):
    if not names:
        return {}
    dpkg = module.get_bin_path("dpkg-query")
    if dpkg:
        # dpkg-query and rpm expand the \t and \n escapes of their formats themselves.
        out = _run(module, [dpkg, "--show", "--showformat=" + node_state.DPKG_QUERY_FORMAT] + names)
        return node_state.parse_dpkg_query(out, names)
    rpm = module.get_bin_path("rpm", required=True)
    out = _run(module, [rpm, "--query", "--queryformat=" + node_state.RPM_QUERY_FORMAT] + names)
    dnf = module.get_bin_path("dnf")
    locks = _run(module, [dnf, "--quiet", "versionlock", "list"]) if dnf else ""
    return node_state.parse_rpm_query(out, names, locks)


def read_candidates(module, names):
    if not names:
        return {}
    apt_cache = module.get_bin_path("apt-cache")
    if not apt_cache:
        module.fail_json(msg="candidates need apt-cache (apt systems only)")
    return node_state.parse_apt_policy(_run(module, [apt_cache, "policy"] + names), names)


def read_owners(module, names):
    # A name without a slash is a command: its owner is the owner of the file PATH finds for it.
    resolved = dict((name, name if "/" in name else module.get_bin_path(name)) for name in names)
    paths = sorted(set(path for path in resolved.values() if path))
    if not paths:
        return dict((name, None) for name in names)
    dpkg = module.get_bin_path("dpkg-query")
    if dpkg:
        owners = node_state.parse_dpkg_search(_run(module, [dpkg, "--search"] + paths), paths)
    else:
        rpm = module.get_bin_path("rpm", required=True)
        out = _run(module, [rpm, "--query", "--file", "--queryformat=%{NAME}\\n"] + paths)
        owners = node_state.parse_rpm_owners(out, paths)
    return dict((name, owners.get(path) if path else None) for name, path in resolved.items())


def read_services(module, names):
    if not names:
        return {}
    systemctl = module.get_bin_path("systemctl", required=True)
    props = "--property=" + ",".join(node_state.SYSTEMCTL_PROPERTIES)
    units = [name if "." in name else name + ".service" for name in names]
    return node_state.parse_systemctl_show(_run(module, [systemctl, "show", props] + units), names)


def read_file(path):
    try:
        info = os.lstat(path)
    except OSError:
        return {"exists": False, "type": None, "mode": None, "uid": None, "gid": None, "content": None}
    if stat.S_ISREG(info.st_mode):
        kind = "file"
    elif stat.S_ISDIR(info.st_mode):
        kind = "directory"
    elif stat.S_ISLNK(info.st_mode):
        kind = "link"
    else:
        kind = "other"
    content = None
    if kind == "file" and info.st_size <= CONTENT_LIMIT:
        try:
            with open(path, "rb") as handle:
                content = handle.read().decode("utf-8", "replace")
        except (IOError, OSError):
            content = None
    return {
        "exists": True,
        "type": kind,
        "mode": "%04o" % stat.S_IMODE(info.st_mode),
        "uid": info.st_uid,
        "gid": info.st_gid,
        "content": content,
    }


PACKAGE_INDEX_FORMAT = "${db:Status-Status} ${source:Package} ${Package} ${Version}\\n"


def read_package_index(module):
    dpkg = module.get_bin_path("dpkg-query")
    if not dpkg:
        rpm = module.get_bin_path("rpm")
        if not rpm:
            return []
        query = [rpm, "--query", "--all", "--queryformat=" + node_state.RPM_INDEX_FORMAT]
        return node_state.parse_rpm_index(_run(module, query))
    out = _run(module, [dpkg, "--show", "--showformat=" + PACKAGE_INDEX_FORMAT])
    rows = [line.split() for line in out.splitlines()]
    return [row for row in rows if len(row) == 4 and row[0] in ("installed", "config-files")]


def read_apt_sources(module, uris, exclude):
    dpkg = module.get_bin_path("dpkg")
    if not uris or not dpkg:
        return []
    arch = _run(module, [dpkg, "--print-architecture"]).strip()
    paths = ["/etc/apt/sources.list"]
    for pattern in ("*.list", "*.sources"):
        paths += sorted(glob.glob(os.path.join("/etc/apt/sources.list.d", pattern)))
    files = {}
    for path in paths:
        record = read_file(path)
        if record["content"] is not None:
            files[path] = record["content"]
    return apt_sources.matching_files(files, uris, arch, exclude=exclude)


def main():
    module = AnsibleModule(
        argument_spec={
            "packages": {"type": "list", "elements": "str", "default": []},
            "candidates": {"type": "list", "elements": "str", "default": []},
            "owners": {"type": "list", "elements": "str", "default": []},
            "services": {"type": "list", "elements": "str", "default": []},
            "files": {"type": "list", "elements": "path", "default": []},
            "gpu_facts": {"type": "bool", "default": False},
            "feature_namespace": {"type": "str", "default": "nvidia.com"},
            "package_index": {"type": "bool", "default": False},
            "apt_sources": {"type": "list", "elements": "str", "default": []},
            "apt_sources_exclude": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    module.exit_json(
        changed=False,
        packages=read_packages(module, params["packages"]),
        candidates=read_candidates(module, params["candidates"]),
        owners=read_owners(module, params["owners"]),
        services=read_services(module, params["services"]),
        files=dict((path, read_file(path)) for path in params["files"]),
        gpu_facts=(
            gpu_probe.probe(module, feature_namespace=params["feature_namespace"]) if params["gpu_facts"] else {}
        ),
        package_index=read_package_index(module) if params["package_index"] else [],
        apt_sources=read_apt_sources(module, params["apt_sources"], params["apt_sources_exclude"]),
    )


if __name__ == "__main__":
    main()
