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


def _suite_of_release(suite, codename):
    return suite == codename or suite.startswith(codename + "-")


def _merged(present, wanted):
    return present + [component for component in wanted if component not in present]


def _deb822_with_components(text, codename, wanted):
    # Stanzas keep their separators, so everything but the changed Components lines stays byte for byte.
    parts = re.split(r"(\n[ \t]*\n)", text)
    for index in range(0, len(parts), 2):
        lines = parts[index].split("\n")
        fields = {}
        for number, raw in enumerate(lines):
            if raw.startswith("#") or raw[:1] in (" ", "\t"):
                continue
            key, sep, value = raw.partition(":")
            if sep:
                fields[key.strip().lower()] = (number, value.split())
        suites = fields.get("suites", (0, []))[1]
        if "components" not in fields or "enabled" in fields and fields["enabled"][1] == ["no"]:
            continue
        number, present = fields["components"]
        if "main" in present and any(_suite_of_release(suite, codename) for suite in suites):
            lines[number] = "Components: " + " ".join(_merged(present, wanted))
        parts[index] = "\n".join(lines)
    return "".join(parts)


def _one_line_with_components(text, codename, wanted):
    lines = text.split("\n")
    for number, raw in enumerate(lines):
        body, hash_sign, comment = raw.partition("#")
        words = body.split()
        if not words or words[0] not in ("deb", "deb-src"):
            continue
        start = 1
        if words[1:] and words[1].startswith("["):
            while start < len(words) and not words[start].endswith("]"):
                start += 1
            start += 1
        # deb [options] URI suite component...
        if len(words) < start + 3 or not _suite_of_release(words[start + 1], codename):
            continue
        components = words[start + 2 :]
        if "main" not in components:
            continue
        line = " ".join(words[: start + 2] + _merged(components, wanted))
        lines[number] = line + (" " + hash_sign + comment if hash_sign else "")
    return "\n".join(lines)


def with_components(path, text, codename, wanted):
    """The file's text with `wanted` components added to each entry of the release `codename`.

    An entry of the release lists one of its suites (bookworm, bookworm-updates, bookworm-security,
    bookworm-backports ...) and the component main, whatever the mirror: that is Debian's own archive. Entries
    of other releases or repositories, comments and disabled stanzas stay as they are; a file that already has
    the components comes back unchanged.
    """
    if path.endswith(".sources"):
        return _deb822_with_components(text, codename, wanted)
    return _one_line_with_components(text, codename, wanted)


def component_edits(files, paths, codename, wanted):
    """Of `files` (path -> stat record with content, as node_state returns them): the new text of each of
    `paths` that exists and lacks a wanted component on an entry of the release."""
    edits = {}
    for path in paths:
        record = files.get(path) or {}
        text = record.get("content")
        if not record.get("exists") or text is None:
            continue
        new = with_components(path, text, codename, wanted)
        if new != text:
            edits[path] = new
    return edits
