# Copyright: gpuforge maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Parse what dpkg, apt, rpm and systemctl say about packages and services into plain dicts.

Pure functions, no I/O: the node_state module runs the commands (one of each per call, whatever the number of
packages or services) and hands their output here; tests/ansible/unit feeds them table-driven inputs.
"""

from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type

# One line per known package; `${db:Status-Abbrev}` is three letters: wanted (h = hold), state (i = installed).
DPKG_QUERY_FORMAT = "${Package}\\t${Version}\\t${db:Status-Abbrev}\\n"
RPM_QUERY_FORMAT = "%{NAME}\\t%{EPOCH}:%{VERSION}-%{RELEASE}\\n"
# Every installed package with its epoch and source RPM: the rows of node_state's package_index.
RPM_INDEX_FORMAT = "%{NAME}\\t%{EPOCH}:%{VERSION}-%{RELEASE}\\t%{SOURCERPM}\\n"
SYSTEMCTL_PROPERTIES = ("Id", "LoadState", "UnitFileState", "ActiveState")


def _absent():
    return {"installed": False, "version": None, "held": False}


def parse_dpkg_query(text, names):
    """{name: {installed, version, held}} for `names`, from `dpkg-query --show --showformat=DPKG_QUERY_FORMAT`."""
    result = dict((name, _absent()) for name in names)
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or fields[0] not in result:
            continue
        name, version, status = fields
        status = status.ljust(3)
        installed = status[1] == "i"
        result[name] = {
            "installed": installed,
            "version": version if installed else None,
            "held": status[0] == "h",
        }
    return result


def parse_rpm_query(text, names, versionlock_text=""):
    """Like parse_dpkg_query, from `rpm --query --queryformat=RPM_QUERY_FORMAT` and `dnf versionlock list`."""
    result = dict((name, _absent()) for name in names)
    locked = set()
    for line in versionlock_text.splitlines():
        # Entries look like "nvidia-driver-3:580.95.05-1.el9.*": the name is what precedes "-<epoch>:".
        match = re.match(r"^(\S+?)-(?:[0-9]+:)?[0-9][^-]*-\S+$", line.strip())
        if match:
            locked.add(match.group(1))
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 2 or fields[0] not in result:
            continue
        name, version = fields
        # Without the epoch (NVIDIA's RPMs carry 3:), like dpkg's versions; rpm_index keeps it for the locks.
        result[name] = {
            "installed": True,
            "version": re.sub(r"^(\(none\)|[0-9]+):", "", version),
            "held": name in locked,
        }
    return result


def parse_rpm_index(text):
    """[["installed", source, name, "epoch:version-release"]] from `rpm --query --all` with RPM_INDEX_FORMAT.

    The same rows as dpkg's package index; the source package is the source RPM's name
    ("nvidia-driver" from "nvidia-driver-580.95.05-1.el9.src.rpm") and the epoch is always written (0 if none).
    """
    rows = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 3:
            continue
        name, evr, source_rpm = fields
        evr = re.sub(r"^\(none\):", "0:", evr)
        source = re.sub(r"-[^-]+-[^-]+\.src\.rpm$", "", source_rpm) if source_rpm.endswith(".src.rpm") else name
        rows.append(["installed", source, name, evr])
    return rows


def parse_apt_policy(text, names):
    """{name: candidate version or None} from `apt-cache policy NAME...` (None: no candidate, or unknown)."""
    result = dict((name, None) for name in names)
    current = None
    for line in text.splitlines():
        if line and not line[0].isspace() and line.endswith(":"):
            current = line[:-1]
            continue
        match = re.match(r"^\s+Candidate:\s+(\S+)", line)
        if match and current in result:
            result[current] = None if match.group(1) == "(none)" else match.group(1)
    return result


def parse_dpkg_search(text, paths):
    """{path: owning package or None} from `dpkg-query --search PATH...` (diversions are skipped)."""
    result = dict((path, None) for path in paths)
    for line in text.splitlines():
        if line.startswith("diversion "):
            continue
        packages, sep, path = line.partition(": ")
        if sep and path in result:
            result[path] = packages.split(",")[0].split(":")[0].strip()
    return result


def parse_rpm_owners(text, paths):
    """{path: owning package or None} from `rpm --query --file --queryformat='%{NAME}\\n' PATH...`."""
    result = dict((path, None) for path in paths)
    for path, line in zip(paths, text.splitlines()):
        line = line.strip()
        if line and " " not in line:
            result[path] = line
    return result


def parse_systemctl_show(text, names):
    """{name: {loaded, enabled, active}} from `systemctl show --property=<SYSTEMCTL_PROPERTIES> NAME...`."""
    result = dict((name, {"loaded": False, "enabled": None, "active": None}) for name in names)
    for block in re.split(r"\n\s*\n", text.strip()):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        unit = props.get("Id", "")
        name = unit[: -len(".service")] if unit.endswith(".service") else unit
        key = name if name in result else unit
        if key not in result:
            continue
        result[key] = {
            "loaded": props.get("LoadState") == "loaded",
            "enabled": props.get("UnitFileState") or None,
            "active": props.get("ActiveState") or None,
        }
    return result
