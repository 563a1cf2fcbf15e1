"""How the simulated agent starts plugin pods: which release, which config file, what status it writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuforge.compat.conformance import Verdict
from gpuforge_lab.devcluster.pools import GpuSpec
from gpuforge_lab.sim.agent import (
    config_file,
    crash_status,
    left_to_kwok,
    node_runtime,
    plugin_resources,
    release_of,
    running_status,
    verdict_of,
)


def _pod(labels: dict[str, str], image: str = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": labels},
        "spec": {
            "nodeName": "n",
            "initContainers": [{"name": "wait", "image": image}],
            "containers": [
                {
                    "name": "plugin",
                    "image": image,
                    "env": [{"name": "CONFIG_FILE", "value": "/etc/dp/config.yaml"}],
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/dp"}],
                }
            ],
            "volumes": [{"name": "config", "configMap": {"name": "dp-config"}}],
        },
    }


@pytest.mark.parametrize(
    ("labels", "image", "expected"),
    [
        (
            {"gpuforge.io/component": "device-plugin", "app.kubernetes.io/version": "v0.17.0"},
            "x:y",
            "v0.17.0",
        ),
        ({"gpuforge.io/component": "dra-kubelet-plugin"}, "registry.k8s.io/dra:v0.4.0", "v0.4.0"),
        ({"gpuforge.io/component": "dra-controller"}, "registry.k8s.io/dra:v25.12.0", "v25.12.0"),
        ({"gpuforge.io/component": "device-plugin"}, "registry.local/dp:v1", None),
        ({"gpuforge.io/component": "device-plugin"}, "registry.local/dp", None),
    ],
)
def test_the_release_comes_from_the_version_label_or_the_image_tag(
    labels: dict[str, str], image: str, expected: str | None
) -> None:
    release = release_of(_pod(labels, image))
    assert (release.version if release else None) == expected


def test_the_config_file_is_the_mounted_config_map_key_config_file_names() -> None:
    assert config_file(_pod({})) == ("dp-config", "config.yaml")
    pod = _pod({})
    pod["spec"]["containers"][0]["env"] = []
    assert config_file(pod) is None


def test_failure_injection_stays_with_kwok() -> None:
    assert not left_to_kwok(_pod({}))
    assert left_to_kwok(_pod({}, image="registry.local/dp:v2-sim-crash"))
    pod = _pod({})
    pod["metadata"]["annotations"] = {"sim.gpuforge.io/fail": "never-ready"}
    assert left_to_kwok(pod)


def test_node_runtime_reads_the_node_labels() -> None:
    node = {"metadata": {"labels": {"sim.gpuforge.io/nvidia-default-runtime": "true"}}}
    runtime = node_runtime(node)
    assert runtime.nvidia_default_runtime and not runtime.mig_enabled
    assert not node_runtime({"metadata": {}}).nvidia_default_runtime


def test_a_started_plugin_is_ready_and_a_crashing_one_shows_the_release_error() -> None:
    started = running_status(_pod({}), "t")
    assert started["phase"] == "Running"
    assert {c["type"]: c["status"] for c in started["conditions"]}["Ready"] == "True"
    assert started["containerStatuses"][0]["ready"] is True
    assert started["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"

    crashed = crash_status(_pod({}), Verdict(False, 'Required flag "image-name" not set'), 3, "t")
    assert {c["type"]: c["status"] for c in crashed["conditions"]}["Ready"] == "False"
    (container,) = crashed["containerStatuses"]
    assert container["ready"] is False
    assert container["restartCount"] == 3
    assert container["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert container["lastState"]["terminated"]["message"] == 'Required flag "image-name" not set'


GOLDEN = Path(__file__).parents[2] / "golden" / "render"


def _compute_domains_pod() -> dict[str, Any]:
    docs = yaml.safe_load_all((GOLDEN / "dra-compute-domains-mig.yaml").read_text())
    daemonset = next(d for d in docs if d and d["kind"] == "DaemonSet")
    template: dict[str, Any] = daemonset["spec"]["template"]
    return template


def test_a_compute_domains_container_without_node_name_crash_loops_the_pod() -> None:
    node = {"metadata": {"labels": {}}}
    pod = _compute_domains_pod()
    assert verdict_of(pod, node, None).ok
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "compute-domains")
    container["env"] = [e for e in container["env"] if e["name"] != "NODE_NAME"]
    assert verdict_of(pod, node, None) == Verdict(False, 'Required flag "node-name" not set')


MIG_NODE = {"metadata": {"labels": {"sim.gpuforge.io/mig-enabled": "true"}}}
PLAIN_NODE: dict[str, Any] = {"metadata": {"labels": {}}}


@pytest.mark.parametrize(
    ("node", "env", "config", "expected"),
    [
        (PLAIN_NODE, [], None, {"nvidia.com/gpu": 8}),
        # the config file's flags.migStrategy, unless MIG_STRATEGY overrides it
        (MIG_NODE, [], {"flags": {"migStrategy": "mixed"}}, {"nvidia.com/mig-1g.10gb": 56}),
        (
            MIG_NODE,
            [{"name": "MIG_STRATEGY", "value": "single"}],
            {"flags": {"migStrategy": "mixed"}},
            {"nvidia.com/gpu": 56},
        ),
        # a node not in MIG mode has no MIG devices to name
        (PLAIN_NODE, [{"name": "MIG_STRATEGY", "value": "mixed"}], None, {"nvidia.com/gpu": 8}),
        (
            PLAIN_NODE,
            [],
            {
                "sharing": {
                    "timeSlicing": {
                        "renameByDefault": True,
                        "resources": [{"name": "nvidia.com/gpu", "replicas": 4}],
                    }
                }
            },
            {"nvidia.com/gpu.shared": 32},
        ),
    ],
)
def test_a_device_plugin_pod_advertises_for_its_node_and_config(
    node: dict[str, Any], env: list[dict[str, str]], config: Any, expected: dict[str, int]
) -> None:
    pod = _pod({"gpuforge.io/component": "device-plugin"})
    pod["spec"]["containers"][0]["env"] += env
    assert plugin_resources(pod, GpuSpec(), node, config) == expected
