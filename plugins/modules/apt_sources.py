#!/usr/bin/python
# Copyright: gpuforge maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module finding apt source files that already name a repository; parsing in module_utils."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: apt_sources
short_description: Find apt source files that already name a repository
version_added: 0.3.0
description:
  - Reads C(/etc/apt/sources.list) and every C(.list) and C(.sources) file in C(/etc/apt/sources.list.d) and
    reports those with an entry for one of I(uris), for example NVIDIA's documented
    C(cuda-debian12-x86_64.list) left by cuda-keyring. A second entry for the same repository with another
    Signed-By makes apt stop with C(Conflicting values set for option Signed-By).
  - C($(ARCH)) in a URI is substituted like apt does; a trailing slash does not matter.
  - Changes nothing; supports check mode.
options:
  uris:
    description: Repository URIs to look for.
    type: list
    elements: str
    required: true
  exclude:
    description: Source files not to report (the one the role manages itself).
    type: list
    elements: path
    default: []
  arch:
    description: The dpkg architecture that C($(ARCH)) stands for; the host's when left out.
    type: str
  directory:
    description: Where the source files are.
    type: path
    default: /etc/apt
author:
  - gpuforge maintainers
"""

EXAMPLES = r"""
- name: Find NVIDIA's CUDA repository in sources written by hand or by cuda-keyring
  gpuforge.nodes.apt_sources:
    uris: [https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/]
    exclude: [/etc/apt/sources.list.d/cuda.sources]
  register: found
"""

RETURN = r"""
files:
  description: >-
    One item per file naming one of the URIs, with C(path), C(uris) (normalized), C(signed_by) (list) and
    C(other_entries) (whether the file also names other repositories).
  returned: always
  type: list
  elements: dict
"""

import glob
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuforge.nodes.plugins.module_utils import apt_sources


def main():
    module = AnsibleModule(
        argument_spec={
            "uris": {"type": "list", "elements": "str", "required": True},
            "exclude": {"type": "list", "elements": "path", "default": []},
            "arch": {"type": "str"},
            "directory": {"type": "path", "default": "/etc/apt"},
        },
        supports_check_mode=True,
    )
    params = module.params
    arch = params["arch"]
    if not arch:
        _rc, out, _err = module.run_command(["dpkg", "--print-architecture"], check_rc=True)
        arch = out.strip()
    directory = params["directory"]
    paths = [os.path.join(directory, "sources.list")]
    paths += sorted(glob.glob(os.path.join(directory, "sources.list.d", "*.list")))
    paths += sorted(glob.glob(os.path.join(directory, "sources.list.d", "*.sources")))
    files = {}
    for path in paths:
        try:
            with open(path, "rb") as handle:
                files[path] = handle.read().decode("utf-8", "replace")
        except (IOError, OSError):
            continue
    found = apt_sources.matching_files(files, params["uris"], arch, exclude=params["exclude"])
    module.exit_json(changed=False, files=found)


if __name__ == "__main__":
    main()
