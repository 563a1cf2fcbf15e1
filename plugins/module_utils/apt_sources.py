# Copyright: gpuforge maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Pure parsing of apt source files: which files already name a repository the roles are about to add.

apt (2.6, Debian 12) refuses to run when two entries for the same URI and suite disagree on Signed-By
("E: Conflicting values set for option Signed-By"). NVIDIA documents one-line `.list` files for its
repositories (cuda-keyring's `cuda-<distro>-<arch>.list`, the toolkit's `nvidia-container-toolkit.list`),
so a host prepared by hand already has them when a role adds its own deb822 `.sources` file.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

_OPTIONS = re.compile(r"^\[([^\]]*)\]\s*")


def normalize_uri(uri, arch):
    """The form apt compares: $(ARCH) substituted and one trailing slash."""
    return uri.replace("$(ARCH)", arch).rstrip("/") + "/"


def parse_one_line(text):
    """Entries of a one-line-style (.list) file: dicts with types, uri, suite, signed_by."""
    entries = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        if kind not in ("deb", "deb-src"):
            continue
        rest = rest.strip()
        options = {}
        match = _OPTIONS.match(rest)
        if match:
            for option in match.group(1).split():
                key, _, value = option.partition("=")
                options[key] = value
            rest = rest[match.end() :]
        words = rest.split()
        if len(words) < 2:
            continue
        entries.append(
            {"types": [kind], "uri": words[0], "suite": words[1], "signed_by": options.get("signed-by", "")}
        )
    return entries


def parse_deb822(text):
    """Entries of a deb822 (.sources) file; an inline Signed-By key is reported as "(inline key)"."""
    entries = []
    for stanza in re.split(r"\n\s*\n", text):
        fields = {}
        key = None
        for raw in stanza.splitlines():
            if raw.startswith("#"):
                continue
            if raw[:1] in (" ", "\t") and key:
                fields[key] += "\n" + raw.strip()
                continue
            key, sep, value = raw.partition(":")
            if not sep:
                key = None
                continue
            key = key.strip().lower()
            fields[key] = value.strip()
        if fields.get("enabled", "yes").lower() == "no" or "uris" not in fields:
            continue
        signed_by = fields.get("signed-by", "")
        if "\n" in signed_by or "BEGIN PGP" in signed_by:
            signed_by = "(inline key)"
        for uri in fields["uris"].split():
            for suite in fields.get("suites", "").split():
                entries.append(
                    {"types": fields.get("types", "").split(), "uri": uri, "suite": suite, "signed_by": signed_by}
                )
    return entries


def parse_file(path, text):
    return parse_deb822(text) if path.endswith(".sources") else parse_one_line(text)


def matching_files(files, uris, arch, exclude=()):
    """Files (path -> content) other than `exclude` with an entry for one of `uris`.

    Each result says which of the wanted URIs it names, its Signed-By values, and whether the file holds
    anything else (then it cannot be set aside as a whole without losing other repositories).
    """
    wanted = {normalize_uri(uri, arch) for uri in uris}
    results = []
    for path in sorted(files):
        if path in exclude:
            continue
        entries = parse_file(path, files[path])
        hits = [entry for entry in entries if normalize_uri(entry["uri"], arch) in wanted]
        if not hits:
            continue
        results.append(
            {
                "path": path,
                "uris": sorted({normalize_uri(entry["uri"], arch) for entry in hits}),
                "signed_by": sorted({entry["signed_by"] for entry in hits}),
                "other_entries": len(hits) != len(entries),
            }
        )
    return results
