"""The lists `gpuforge status` and `plan` read, as the real API server sends them in protobuf and in JSON:
the same objects give the same dicts, for every field the readers use (the field numbers of
`gpuforge.k8s.shapes_protobuf` checked against Kubernetes' own encoding)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from kubernetes import client

from gpuforge.cli.status import collections_read
from gpuforge.k8s import shapes, shapes_protobuf
from gpuforge.k8s.client import ApiError, Kube, ListFormat, Obj, continue_token

from ..devcluster.helpers import eventually, plugin_daemonset

pytestmark = pytest.mark.cluster

DEPLOY_LABEL = "test.gpuforge.io/lists"
HOLD = "test.gpuforge.io/hold"
JSON_FORMATS = {
    name: ListFormat("application/json", decode, continue_token)
    for name, decode in shapes.OF_COLLECTIONS.items()
}


def _by_uid(read: dict[str, list[Obj]]) -> dict[str, Obj]:
    return {item["metadata"]["uid"]: item for items in read.values() for item in items}


def _compared(kube: Kube, collections: dict[str, Any]) -> set[str]:
    """Read every collection in JSON, then in protobuf; fail on an object of the same resourceVersion
    read differently; the names of the objects compared (one changed in between is left out)."""
    as_json = _by_uid(kube.list_side_by_side(collections, JSON_FORMATS))
    as_protobuf = _by_uid(kube.list_side_by_side(collections, shapes_protobuf.OF_COLLECTIONS))
    compared = set()
    for uid, item in as_json.items():
        other = as_protobuf.get(uid)
        if other is None or other["metadata"].get("resourceVersion") != item["metadata"].get(
            "resourceVersion"
        ):
            continue
        assert other == item, item["metadata"]["name"]
        compared.add(item["metadata"]["name"])
    return compared


def _claimed_pod(name: str, template: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
            "initContainers": [
                {"name": "fetch", "image": "busybox:1", "resources": {"requests": {"cpu": "1"}}}
            ],
            "containers": [{"name": "c", "image": "cuda:12", "resources": {"claims": [{"name": "gpus"}]}}],
            "volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "info", "downwardAPI": {"items": []}}],
        },
    }


def test_protobuf_and_json_lists_read_alike(dev_cluster: Any, k8s_api: Any, namespace: str) -> None:
    core, apps, custom = (
        client.CoreV1Api(k8s_api),
        client.AppsV1Api(k8s_api),
        client.CustomObjectsApi(k8s_api),
    )
    node, cordoned = "h100-1", "a100-1"
    plugin, device_class = f"dra-{namespace}", f"{namespace}.gpu.nvidia.com"
    core.patch_node(node, {"metadata": {"labels": {DEPLOY_LABEL: plugin}}})
    core.patch_node(cordoned, {"spec": {"unschedulable": True}})
    apps.create_namespaced_daemon_set(
        namespace, plugin_daemonset(plugin, namespace, "dra-kubelet-plugin", DEPLOY_LABEL)
    )
    try:
        slices = eventually(
            lambda: custom.list_cluster_custom_object(
                "resource.k8s.io", "v1", "resourceslices", field_selector=f"spec.nodeName={node}"
            )["items"],
            what=f"ResourceSlices of {node}",
        )
        custom.create_cluster_custom_object(
            "resource.k8s.io",
            "v1",
            "deviceclasses",
            {
                "metadata": {"name": device_class},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
            },
        )
        custom.create_namespaced_custom_object(
            "resource.k8s.io",
            "v1",
            namespace,
            "resourceclaimtemplates",
            {
                "metadata": {"name": "one"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]
                        }
                    }
                },
            },
        )
        core.create_namespaced_pod(namespace, _claimed_pod("dra-user", "one"))
        leaving = {
            "metadata": {"name": "leaving", "finalizers": [HOLD]},
            "spec": {
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {"name": "c", "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
            },
        }
        core.create_namespaced_pod(namespace, leaving)
        core.delete_namespaced_pod("leaving", namespace)
        eventually(
            lambda: core.read_namespaced_pod("dra-user", namespace).status.phase == "Running",
            timeout=60,
            what="dra-user Running",
        )
        (claim,) = custom.list_namespaced_custom_object("resource.k8s.io", "v1", namespace, "resourceclaims")[
            "items"
        ]
        assert claim["status"]["allocation"]["devices"]["results"]

        kube = Kube.from_kubeconfig(str(dev_cluster.kubeconfig), plain=True)
        collections = collections_read(kube.served_versions(), status_only=False)
        for path, query in collections.values():  # answered in protobuf, not in the JSON it falls back to
            status, answer = kube.transport.request_sync(
                "GET", path, query={**(query or {}), "limit": "1"}, accept=shapes_protobuf.ACCEPT
            )
            assert status == 200 and answer.startswith(shapes_protobuf.MAGIC), path
        with pytest.raises(ApiError, match=r"400 .*unable to parse requirement"):  # an error, in protobuf too
            kube.list_side_by_side(
                {"nodes": ("/api/v1/nodes", {"labelSelector": "a in (("})}, shapes_protobuf.OF_COLLECTIONS
            )
        plugin_pods = {
            p.metadata.name for p in core.list_namespaced_pod(namespace, label_selector=f"app={plugin}").items
        }
        wanted = {
            node,
            cordoned,
            "dra-user",
            "leaving",
            claim["metadata"]["name"],
            *plugin_pods,
            *(s["metadata"]["name"] for s in slices),
        }
        eventually(lambda: wanted <= _compared(kube, collections), what=f"{sorted(wanted)} compared")
    finally:
        with contextlib.suppress(client.ApiException):  # the pod's finalizer off, or the namespace stays
            core.patch_namespaced_pod("leaving", namespace, {"metadata": {"finalizers": None}})
        core.delete_namespaced_pod("dra-user", namespace, grace_period_seconds=0)
        apps.delete_namespaced_daemon_set(plugin, namespace)
        custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", device_class)
        core.patch_node(cordoned, {"spec": {"unschedulable": None}})
        core.patch_node(node, {"metadata": {"labels": {DEPLOY_LABEL: None}}})
