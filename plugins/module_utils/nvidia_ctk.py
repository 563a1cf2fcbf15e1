# Copyright: gpuforge maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Decisions of the nvidia_ctk_config module that need no host: the containerd `imports` line, CDI names.

Pure functions, no I/O; tests/ansible/unit feeds them table-driven inputs.
"""

from __future__ import absolute_import, division, print_function

import posixpath
import re

__metaclass__ = type

IMPORTS_LINE = re.compile(r"(?m)^imports\s*=")


class ForeignImports(ValueError):
    """The main containerd configuration has an `imports` list that does not name our drop-in directory."""


def drop_in_pattern(drop_in):
    """The glob the main containerd configuration must import so that `drop_in` is loaded."""
    return posixpath.join(posixpath.dirname(drop_in), "*.toml")


def containerd_main_text(current, pattern):
    """The main containerd configuration with our `imports` line, or None when it needs no change.

    `current` is the file's text (None: no file). A new file holds only the version and the import; an
    existing one gets one line at the top (TOML keys must precede tables) and is otherwise left as its owner
    wrote it. An `imports` list that does not name `pattern` is the owner's: raise ForeignImports.
    """
    line = 'imports = ["%s"]\n' % pattern
    if current is None:
        return "version = 2\n" + line
    if IMPORTS_LINE.search(current):
        if pattern in current:
            return None
        raise ForeignImports(pattern)
    return line + current


def cdi_device_names(text, kind="nvidia.com/gpu"):
    """Fully qualified CDI device names of `kind` from `nvidia-ctk cdi list` output (log lines ignored)."""
    prefix = kind + "="
    return [line.strip() for line in text.splitlines() if line.strip().startswith(prefix)]
