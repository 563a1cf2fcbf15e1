#!/usr/bin/python
# Copyright: gpuforge maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module installing what nvidia-ctk renders (runtime drop-ins, CDI spec) when it differs.

The decisions without I/O live in module_utils/nvidia_ctk.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: nvidia_ctk_config
short_description: Wire container runtimes and CDI to the NVIDIA Container Toolkit with one module run
version_added: 0.2.0
description:
  - Renders each runtime's NVIDIA configuration with C(nvidia-ctk runtime configure) into a scratch directory
    and installs it (mode 0644, owner root) only where it differs from the file in place, so C(changed) means
    a runtime really has a new configuration. containerd and CRI-O get drop-in files; Docker, which has none,
    gets a copy of its daemon configuration with only the nvidia keys merged in.
  - For containerd, adds one C(imports) line naming the drop-in directory to the main configuration when it
    lacks one (creating a minimal file when there is none) and otherwise leaves that file alone; fails without
    changing anything when the file has an C(imports) list of its own that does not name the directory.
    C(containerd config dump) is read before any change and again after one, so a caller can check that the
    drop-in kept every setting of the main configuration.
  - Generates the CDI spec of the node's GPUs with C(nvidia-ctk cdi generate), installs it where it differs,
    and reports the devices C(nvidia-ctk cdi list) offers afterwards.
  - Creates missing directories (mode 0755, owner root). Supports check mode and diff mode.
options:
  runtimes:
    description: Container runtimes to configure.
    type: list
    elements: str
    choices: [containerd, crio, docker]
    default: [containerd]
  set_as_default:
    description: Make the nvidia runtime the default runtime.
    type: bool
    default: false
  cdi_enabled:
    description: Enable CDI in the runtime configuration (containerd, Docker).
    type: bool
    default: true
  containerd_config:
    description: Main containerd configuration; only an C(imports) line is ever added to it.
    type: path
    default: /etc/containerd/config.toml
  containerd_drop_in:
    description: Drop-in file for containerd.
    type: path
    default: /etc/containerd/conf.d/99-nvidia.toml
  crio_drop_in:
    description: Drop-in file for CRI-O.
    type: path
    default: /etc/crio/crio.conf.d/99-nvidia.toml
  docker_config:
    description: Docker daemon configuration the nvidia keys are merged into.
    type: path
    default: /etc/docker/daemon.json
  cdi_spec:
    description: Where to install the generated CDI spec; no spec is generated (nor listed) when unset.
    type: path
  nvidia_ctk:
    description: Name or path of C(nvidia-ctk).
    type: str
    default: nvidia-ctk
author:
  - gpuforge maintainers
"""

EXAMPLES = r"""
- name: Wire containerd to the NVIDIA runtime and install the CDI spec
  gpuforge.nodes.nvidia_ctk_config:
    runtimes: [containerd]
    cdi_spec: /etc/cdi/nvidia.yaml
  register: ctk
"""

RETURN = r"""
changed_runtimes:
  description: Runtimes whose configuration changed (their daemons need a restart).
  returned: always
  type: list
  elements: str
files:
  description: Per file written or checked, whether it changed.
  returned: always
  type: dict
containerd_dump_before:
  description: C(containerd config dump) before any change (empty without containerd).
  returned: always
  type: str
containerd_dump_after:
  description: C(containerd config dump) after the change; the same text when nothing of containerd changed.
  returned: always
  type: str
cdi_devices:
  description: Fully qualified GPU device names C(nvidia-ctk cdi list) reports (empty without cdi_spec).
  returned: always
  type: list
  elements: str
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuforge.nodes.plugins.module_utils import nvidia_ctk

FILE_MODE = "0644"
DIR_MODE = "0755"


class Installer(object):
    """Puts rendered text in place where it differs, honouring check mode, and records diffs."""

    def __init__(self, module):
        self.module = module
        self.files = {}
        self.diffs = []

    def _attributes(self, path, mode):
        return {
            "path": path,
            "mode": mode,
            "owner": "root",
            "group": "root",
            "secontext": [None, None, None],
            "attributes": None,
        }

    def directory(self, path):
        changed = False
        if not os.path.isdir(path):
            parent = os.path.dirname(path)
            if parent and parent != path:
                changed = self.directory(parent) or changed
            if not self.module.check_mode:
                os.mkdir(path, 0o755)
            changed = True
        if os.path.exists(path):
            changed = self.module.set_fs_attributes_if_different(self._attributes(path, DIR_MODE), changed)
        return changed

    def text(self, path, text, keep_attributes=False):
        """Install `text` as `path`; True when the file (content or attributes) changed.

        keep_attributes: an existing file keeps its mode and owner (a file someone else manages).
        """
        current = _read(path)
        changed = self.directory(os.path.dirname(path))
        if current != text:
            if self.module._diff:
                self.diffs.append(
                    {
                        "before_header": path,
                        "after_header": path,
                        "before": current or "",
                        "after": text,
                    }
                )
            if not self.module.check_mode:
                scratch = os.path.join(self.module.tmpdir, "install." + os.path.basename(path))
                with open(scratch, "w") as handle:
                    handle.write(text)
                self.module.atomic_move(scratch, path)
            changed = True
        if os.path.exists(path) and not (keep_attributes and current is not None):
            changed = self.module.set_fs_attributes_if_different(self._attributes(path, FILE_MODE), changed)
        self.files[path] = changed
        return changed


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError):
        return None


def _run(module, argv):
    rc, out, err = module.run_command(argv, environ_update={"LC_ALL": "C"})
    if rc != 0:
        module.fail_json(msg="%s failed (rc %d): %s" % (" ".join(argv), rc, (err or out).strip()[-2000:]))
    return out


def render_runtime(module, ctk, runtime, params):
    """The configuration nvidia-ctk renders for `runtime`, written into the module's scratch directory."""
    scratch = module.tmpdir
    argv = [ctk, "runtime", "configure", "--runtime=" + runtime]
    if runtime == "docker":
        rendered = os.path.join(scratch, "docker.json")
        if os.path.exists(params["docker_config"]):
            shutil.copyfile(params["docker_config"], rendered)
        argv.append("--config=" + rendered)
    else:
        rendered = os.path.join(scratch, runtime + "-drop-in.toml")
        argv += [
            "--config=" + os.path.join(scratch, runtime + "-main.toml"),
            "--config-source=" + ("command" if runtime == "containerd" else "file"),
            "--drop-in-config=" + rendered,
        ]
    if params["set_as_default"]:
        argv.append("--nvidia-set-as-default")
    if params["cdi_enabled"] and runtime != "crio":
        argv.append("--cdi.enabled")
    _run(module, argv)
    text = _read(rendered)
    if text is None:
        module.fail_json(msg="%s wrote no %s" % (" ".join(argv), rendered))
    return text


def main():
    module = AnsibleModule(
        argument_spec={
            "runtimes": {
                "type": "list",
                "elements": "str",
                "choices": ["containerd", "crio", "docker"],
                "default": ["containerd"],
            },
            "set_as_default": {"type": "bool", "default": False},
            "cdi_enabled": {"type": "bool", "default": True},
            "containerd_config": {"type": "path", "default": "/etc/containerd/config.toml"},
            "containerd_drop_in": {"type": "path", "default": "/etc/containerd/conf.d/99-nvidia.toml"},
            "crio_drop_in": {"type": "path", "default": "/etc/crio/crio.conf.d/99-nvidia.toml"},
            "docker_config": {"type": "path", "default": "/etc/docker/daemon.json"},
            "cdi_spec": {"type": "path"},
            "nvidia_ctk": {"type": "str", "default": "nvidia-ctk"},
        },
        supports_check_mode=True,
    )
    params = module.params
    ctk = module.get_bin_path(params["nvidia_ctk"], required=True)
    installer = Installer(module)
    changed_runtimes = []
    dump_before = dump_after = ""

    if "containerd" in params["runtimes"]:
        containerd = module.get_bin_path("containerd", required=True)
        # Before any change: what containerd loads from the main configuration as its owner left it.
        dump_before = dump_after = _run(module, [containerd, "config", "dump"])
        pattern = nvidia_ctk.drop_in_pattern(params["containerd_drop_in"])
        current = _read(params["containerd_config"])
        try:
            main_text = nvidia_ctk.containerd_main_text(current, pattern)
        except nvidia_ctk.ForeignImports:
            module.fail_json(
                msg="%s already has an `imports` list without \"%s\"; add it there (it is your file). "
                "Nothing was changed." % (params["containerd_config"], pattern)
            )
        if main_text is not None and installer.text(params["containerd_config"], main_text, keep_attributes=True):
            changed_runtimes.append("containerd")

    for runtime in params["runtimes"]:
        target = {
            "containerd": params["containerd_drop_in"],
            "crio": params["crio_drop_in"],
            "docker": params["docker_config"],
        }[runtime]
        if installer.text(target, render_runtime(module, ctk, runtime, params)) and runtime not in changed_runtimes:
            changed_runtimes.append(runtime)

    if "containerd" in changed_runtimes and not module.check_mode:
        # `config dump` reads the files, not the daemon: this is what containerd loads once restarted.
        dump_after = _run(module, [module.get_bin_path("containerd", required=True), "config", "dump"])

    cdi_devices = []
    if params["cdi_spec"]:
        generated = os.path.join(module.tmpdir, "cdi.yaml")
        _run(module, [ctk, "cdi", "generate", "--output=" + generated])
        installer.text(params["cdi_spec"], _read(generated) or "")
        cdi_devices = nvidia_ctk.cdi_device_names(_run(module, [ctk, "cdi", "list"]))

    result = {
        "changed": any(installer.files.values()),
        "changed_runtimes": changed_runtimes,
        "files": installer.files,
        "containerd_dump_before": dump_before,
        "containerd_dump_after": dump_after,
        "cdi_devices": cdi_devices,
    }
    if installer.diffs:
        result["diff"] = installer.diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
