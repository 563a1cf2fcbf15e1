"""The leader's workload handler: template labels, label conflicts, pods/resize, LimitRange defaults."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuforge.quota.admission import Allowed, Denied
from gpuforge.quota.convert import quota_from_object
from gpuforge.quota.limitranges import ContainerDefaults
from gpuforge.webhook.review import AdmissionRequest

from .fakes import MemoryApi, Shell, quota

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LABEL = "gpuforge.io/quota"


def leading(api: MemoryApi) -> Shell:
    shell = Shell(api, lambda: NOW)
    shell.admitting()
    for raw in api.quotas.values():
        shell.leadership.ledger.load(quota_from_object(raw))
    return shell


def request(
    kind: str, obj: dict[str, Any], old: dict[str, Any] | None = None, sub: str = ""
) -> AdmissionRequest:
    return AdmissionRequest(
        uid="u1",
        kind=kind,
        resource=f"{kind.lower()}s",
        sub_resource=sub,
        operation="UPDATE" if old is not None else "CREATE",
        namespace="ns",
        name=obj["metadata"]["name"],
        dry_run=False,
        object=obj,
        old_object=old,
    )


def deployment(own: str, template: str, gpus: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "w", "namespace": "ns", "uid": "d1", "labels": {LABEL: own} if own else {}},
        "spec": {
            "replicas": 1,
            "template": {
                "metadata": {"labels": {LABEL: template} if template else {}},
                "spec": {
                    "containers": [{"name": "m", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]
                },
            },
        },
    }


async def test_a_label_on_the_pod_template_alone_is_checked() -> None:
    shell = leading(MemoryApi([quota("a", hard=1)]))
    assert isinstance(await shell.handlers.workloads(request("Deployment", deployment("", "a", 2))), Denied)
    assert isinstance(await shell.handlers.workloads(request("Deployment", deployment("", "a", 1))), Allowed)


async def test_object_and_template_naming_different_quotas_is_invalid() -> None:
    shell = leading(MemoryApi([quota("a"), quota("b")]))
    decision = await shell.handlers.workloads(request("Deployment", deployment("a", "b")))
    assert isinstance(decision, Denied) and decision.code == 422
    assert "'a' on the Deployment but 'b' on its pod template" in decision.message


def pod(cpu: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "p1", "generation": 2, "labels": {LABEL: "a"}},
        "spec": {
            "containers": [{"name": "m", "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}]
        },
    }


async def test_a_resize_that_grows_a_counted_request_is_checked() -> None:
    limited = quota("a")
    limited["spec"]["hard"]["requests.cpu"] = "2"
    shell = leading(MemoryApi([limited]))
    grow = await shell.handlers.workloads(request("Pod", pod("4"), old=pod("1"), sub="resize"))
    assert isinstance(grow, Denied) and "asks requests.cpu=3 but only 2 is left" in grow.message
    shrink = await shell.handlers.workloads(request("Pod", pod("500m"), old=pod("1"), sub="resize"))
    assert isinstance(shrink, Allowed)


class DefaultedApi(MemoryApi):
    """Namespace `ns` charges GPU workloads naming no quota to `default`."""

    def __init__(self, quotas: list[dict[str, Any]], default: str) -> None:
        super().__init__(quotas)
        self.default = default

    async def get_object(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        if kind == "Namespace":
            return {"metadata": {"name": name, "labels": {"gpuforge.io/default-quota": self.default}}}
        return await super().get_object(kind, namespace, name)


def unlabelled_pod(cpu: str, gpus: int = 1, owner: bool = False) -> dict[str, Any]:
    body = pod(cpu)
    del body["metadata"]["labels"][LABEL]
    if gpus:
        body["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
    if owner:  # made by a ReplicaSet, whose Deployment is counted from its template
        body["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "w-1", "uid": "rs1", "controller": True}
        ]
    return body


async def test_a_resize_of_an_unlabelled_pod_is_checked_against_the_default_quota() -> None:
    limited = quota("dflt")
    limited["spec"]["hard"]["requests.cpu"] = "2"
    for owner in (False, True):
        shell = leading(DefaultedApi([limited], "dflt"))
        grow = await shell.handlers.workloads(
            request(
                "Pod", unlabelled_pod("4", owner=owner), old=unlabelled_pod("1", owner=owner), sub="resize"
            )
        )
        assert isinstance(grow, Denied) and 'GpuQuota "dflt"' in grow.message, grow
        assert "asks requests.cpu=3 but only 2 is left" in grow.message
        fits = await shell.handlers.workloads(
            request(
                "Pod", unlabelled_pod("3", owner=owner), old=unlabelled_pod("1", owner=owner), sub="resize"
            )
        )
        assert isinstance(fits, Allowed) and fits.quota == "dflt"
        shrink = await shell.handlers.workloads(
            request(
                "Pod", unlabelled_pod("500m", owner=owner), old=unlabelled_pod("1", owner=owner), sub="resize"
            )
        )
        assert isinstance(shrink, Allowed)
    # A pod that takes no GPU is not charged to the default quota: its resize is not checked.
    shell = leading(DefaultedApi([limited], "dflt"))
    cpu_only = await shell.handlers.workloads(
        request("Pod", unlabelled_pod("4", gpus=0), old=unlabelled_pod("1", gpus=0), sub="resize")
    )
    assert isinstance(cpu_only, Allowed) and not cpu_only.quota


async def test_limit_range_defaults_are_counted() -> None:
    limited = quota("a")
    limited["spec"]["hard"]["limits.cpu"] = "1"
    shell = leading(MemoryApi([limited]))
    decision = await shell.handlers.workloads(request("Deployment", deployment("a", "")))
    assert isinstance(decision, Denied) and "must specify limits.cpu for: m" in decision.message
    shell.handlers.container_defaults = lambda _ns: ContainerDefaults(limits={"cpu": "2"})
    decision = await shell.handlers.workloads(request("Deployment", deployment("a", "")))
    assert isinstance(decision, Denied) and "asks limits.cpu=2 but only 1 is left" in decision.message


def test_an_unlabelled_gpu_workload_is_for_the_leader_where_a_default_quota_charges_it() -> None:
    from gpuforge.webhook.admission import trivially_allowed

    body = {
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {
            "replicas": 1,
            "template": {
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
            },
        },
    }
    request = AdmissionRequest(
        uid="u",
        kind="Deployment",
        resource="deployments",
        sub_resource="",
        namespace="ns",
        name="w",
        operation="CREATE",
        object=body,
        old_object=None,
        dry_run=False,
        user="",
        user_info={},
    )
    assert trivially_allowed(request)  # no default quota
    assert trivially_allowed(request, "")
    assert not trivially_allowed(request, "dflt")
    assert not trivially_allowed(request, None)  # the namespace is not known here: the leader reads it


def _rolled(replicas: int, image: str, strategy: dict[str, Any] | None = None) -> dict[str, Any]:
    body = deployment("a", "", gpus=1)
    body["spec"]["replicas"] = replicas
    body["spec"]["template"]["spec"]["containers"][0]["image"] = image
    if strategy is not None:
        body["spec"]["strategy"] = strategy
    body["status"] = {"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas}
    return body


async def test_an_update_that_rolls_charges_its_surge() -> None:
    old = _rolled(4, "x:1")
    # All 4 GPUs in use: a new image would surge one pod (25% of 4) above them.
    shell = leading(MemoryApi([quota("a", hard=4)], [old]))
    refused = await shell.handlers.workloads(request("Deployment", _rolled(4, "x:2"), old=old))
    assert isinstance(refused, Denied), refused
    assert "asks requests.nvidia.com/gpu=1 but only 0 is left" in refused.message
    assert "is its rolling update's surge (1 pod above spec.replicas" in refused.message
    # Without surge the same update takes nothing more.
    no_surge = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}
    fits = await shell.handlers.workloads(request("Deployment", _rolled(4, "x:2", no_surge), old=old))
    assert isinstance(fits, Allowed) and fits.status is None
    # A scale rolls nothing: it is charged its new pod only.
    shell = leading(MemoryApi([quota("a", hard=5)], [old]))
    scaled = await shell.handlers.workloads(request("Deployment", _rolled(5, "x:1"), old=old))
    assert isinstance(scaled, Allowed) and scaled.status is not None
    assert scaled.status.used["requests.nvidia.com/gpu"] == 5
