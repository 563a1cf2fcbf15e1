"""Shared test configuration.

Property tests explore new random examples on every local run; under CI (CI=true) they run a fixed
(derandomized) set, so a pass or failure there is reproducible. Failures found locally are kept in
.hypothesis/ and replayed first.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")
