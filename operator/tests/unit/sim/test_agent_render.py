from __future__ import annotations

import pytest

from gpuforge_lab.devcluster.pools import GpuSpec
from gpuforge_lab.sim.agent import WorkQueue, _semver, render_slice

NODE = {"metadata": {"name": "h100-0", "uid": "u-1"}}
H100 = GpuSpec(product="NVIDIA H100 80GB HBM3", count=2, memory_mib=81559, compute_capability="9.0")


@pytest.mark.parametrize(("text", "semver"), [("580.95.05", "580.95.5"), ("13.0", "13.0.0"), ("9", "9.0.0")])
def test_versions_are_published_as_semver(text: str, semver: str) -> None:
    assert _semver(text) == semver


@pytest.mark.parametrize("version", ["v1", "v1beta2"])
def test_v1_and_v1beta2_slices_are_flat(version: str) -> None:
    body = render_slice(NODE, H100, version)
    assert body["apiVersion"] == f"resource.k8s.io/{version}"
    assert body["spec"]["driver"] == "gpu.nvidia.com"
    assert body["spec"]["nodeName"] == "h100-0"
    device = body["spec"]["devices"][0]
    assert device["name"] == "gpu-0"
    assert device["attributes"]["type"] == {"string": "gpu"}
    assert device["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert device["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert device["capacity"]["memory"] == {"value": "81559Mi"}
    assert len(body["spec"]["devices"]) == 2
    assert body["metadata"]["ownerReferences"][0]["kind"] == "Node"


def test_v1beta1_slices_nest_under_basic() -> None:
    device = render_slice(NODE, H100, "v1beta1")["spec"]["devices"][1]
    assert set(device) == {"name", "basic"}
    assert device["basic"]["attributes"]["type"] == {"string": "gpu"}


def test_uuids_are_stable_and_distinct() -> None:
    first = render_slice(NODE, H100, "v1")["spec"]["devices"]
    again = render_slice(NODE, H100, "v1")["spec"]["devices"]
    uuids = [d["attributes"]["uuid"]["string"] for d in first]
    assert uuids == [d["attributes"]["uuid"]["string"] for d in again]
    assert len(set(uuids)) == 2 and all(u.startswith("GPU-") for u in uuids)


def test_work_queue_never_hands_one_node_to_two_workers() -> None:
    queue = WorkQueue()
    queue.put("a")
    queue.put("a")  # deduplicated while queued
    assert queue.get() == "a"
    queue.put("a")  # marked again while processing: not handed out now...
    queue.put("b")
    assert queue.get() == "b"
    queue.done("a")  # ...but once more after the first reconcile finished
    assert queue.get() == "a"


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_a_plugin_with_passthrough_also_offers_each_gpu_as_vfio(version: str) -> None:
    plain = render_slice(NODE, H100, version)["spec"]["devices"]
    devices = render_slice(NODE, H100, version, vfio=True)["spec"]["devices"]
    assert [d["name"] for d in plain] == ["gpu-0", "gpu-1"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-vfio-0", "gpu-vfio-1"]
    vfio = devices[2].get("basic", devices[2])
    assert vfio["attributes"]["type"] == {"string": "vfio"}
    gpu = devices[0].get("basic", devices[0])
    assert vfio["attributes"]["uuid"] == gpu["attributes"]["uuid"]
