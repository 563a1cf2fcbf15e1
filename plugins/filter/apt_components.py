# Copyright: gpuforge maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Filter apt_component_edits: the apt source files to rewrite so that Debian's archive lists components."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: apt_component_edits
short_description: New text of the apt source files whose Debian entries lack components
description:
  - Takes the files read by M(gpuforge.nodes.node_state) (path to stat record with content) and returns, for each
    of O(paths) that exists and has an entry of the release O(codename) (with component main) lacking one of
    O(components), its text with those components added. Files already complete are left out.
  - deb822 (C(.sources)) and one-line files are both understood; other lines are kept byte for byte.
positional: paths, codename, components
options:
  _input:
    description: Files as node_state returns them.
    type: dict
    required: true
  paths:
    description: The source files to consider.
    type: list
    elements: str
    required: true
  codename:
    description: The release, e.g. C(bookworm).
    type: str
    required: true
  components:
    description: Components the entries must list.
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
edits: "{{ state.files | gpuforge.nodes.apt_component_edits(['/etc/apt/sources.list'], 'bookworm', ['contrib']) }}"
"""

RETURN = r"""
_value:
  description: Path to new file text, for the files that change.
  type: dict
"""

from ansible_collections.gpuforge.nodes.plugins.module_utils.apt_sources import component_edits


class FilterModule(object):
    def filters(self):
        return {"apt_component_edits": component_edits}
