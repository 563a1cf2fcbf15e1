"""Shared test configuration.

The local control plane's fixtures (`dev_cluster`, `cluster_factory`, `namespace`, `k8s_api`, and the
`--no-cluster` option) come from the lab's pytest plugin, loaded here for the whole suite.

Property tests explore new random examples on every local run; under CI (CI=true) they run a fixed
(derandomized) set, so a pass or failure there is reproducible. Failures found locally are kept in
.hypothesis/ and replayed first.
"""

from __future__ import annotations

import os

from hypothesis import settings

pytest_plugins = ["gpuforge_lab.testing.plugin"]

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")
