from decimal import Decimal
from typing import Any

import pytest

from gpuforge.quota.models import GPU as GPU_DIMENSION
from gpuforge.quota.models import claim_products
from gpuforge.quota.usage import (
    ClaimCatalog,
    WorkloadError,
    charged_quota,
    charged_to_owner,
    claim_usage,
    finish_status,
    holds_nothing,
    increase,
    is_controlled_by_workload,
    max_surge,
    resize_quota,
    rolling_out,
    starts_rollout,
    workload_usage,
)

GPU = "requests.nvidia.com/gpu"
DRA = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"


def container(
    requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "name": "c",
        "image": "x",
        "resources": {"requests": requests or {}, "limits": limits or {}},
        **extra,
    }


def pod_spec(
    *containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), **extra: Any
) -> dict[str, Any]:
    return {"containers": list(containers), "initContainers": list(init), **extra}


def workload(
    kind: str, spec: dict[str, Any], labels: dict[str, str] | None = None, **top: Any
) -> dict[str, Any]:
    metadata = {"name": "w", "namespace": "ns", "labels": {"gpuforge.io/quota": "team", **(labels or {})}}
    template = {"metadata": {"labels": {"app": "w"}}, "spec": spec}
    if kind == "Pod":
        return {"kind": kind, "metadata": metadata, "spec": spec}
    if kind in ("Deployment", "StatefulSet", "ReplicaSet"):
        return {"kind": kind, "metadata": metadata, "spec": {"template": template, **top}}
    if kind == "Job":
        return {"kind": kind, "metadata": metadata, "spec": {"template": template, **top}}
    return {
        "kind": kind,
        "metadata": metadata,
        "spec": {"jobTemplate": {"spec": {"template": template, **top}}},
    }


ONE_GPU = pod_spec(container({"cpu": "500m", "memory": "1Gi"}, {"nvidia.com/gpu": 1}))


@pytest.mark.parametrize(
    ("kind", "top", "gpus"),
    [
        ("Deployment", {"replicas": 3}, 3),
        ("Deployment", {}, 1),  # replicas default to 1
        ("Deployment", {"replicas": 0}, 0),
        ("StatefulSet", {"replicas": 2}, 2),
        ("ReplicaSet", {"replicas": 4}, 4),
        ("Job", {"parallelism": 3}, 3),
        ("Job", {"parallelism": 5, "completions": 2}, 2),
        ("Job", {}, 1),
        ("CronJob", {"parallelism": 2}, 0),  # a schedule: each of its Jobs is charged when created
        ("Pod", {}, 1),
    ],
)
def test_replicas_times_template(kind: str, top: dict[str, Any], gpus: int) -> None:
    usage = workload_usage(workload(kind, ONE_GPU, **top)).usage
    assert usage.get(GPU, Decimal(0)) == gpus
    assert usage.get("limits.nvidia.com/gpu", Decimal(0)) == gpus  # requests default to limits
    assert usage.get("requests.cpu", Decimal(0)) == Decimal("0.5") * gpus
    assert usage.get("cpu", Decimal(0)) == Decimal("0.5") * gpus
    assert usage.get("pods", Decimal(0)) == gpus


@pytest.mark.parametrize(
    ("spec", "cpu"),
    [
        # init containers run before the app: the larger wins
        (pod_spec(container({"cpu": "1"}), container({"cpu": "1"}), init=(container({"cpu": "3"}),)), "3"),
        (pod_spec(container({"cpu": "2"}), container({"cpu": "2"}), init=(container({"cpu": "3"}),)), "4"),
        # a sidecar (restartable init container) runs alongside everything after it
        (
            pod_spec(
                container({"cpu": "1"}),
                init=(container({"cpu": "500m"}, restartPolicy="Always"), container({"cpu": "2"})),
            ),
            "2.5",
        ),
        (pod_spec(container({"cpu": "1"}), overhead={"cpu": "250m"}), "1.25"),
        (
            pod_spec(container({"cpu": "1"}), container({"cpu": "1"}), resources={"requests": {"cpu": "3"}}),
            "3",
        ),
    ],
)
def test_pod_requests_like_resource_quota(spec: dict[str, Any], cpu: str) -> None:
    assert workload_usage(workload("Pod", spec)).usage["requests.cpu"] == Decimal(cpu)


def test_model_key_is_charged_with_the_generic_key() -> None:
    on_h100 = {**ONE_GPU, "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
    usage = workload_usage(workload("Deployment", on_h100, replicas=2)).usage
    assert usage[GPU] == 2
    assert usage[f"{GPU}.H100"] == 2
    assert usage[f"{GPU}.H100-80GB"] == 2  # every run of the product's words is a model it proves
    assert f"{GPU}.H10" not in usage


def test_model_label_alone_charges_no_model() -> None:
    """The label is a claim: a workload that may land anywhere proves no model."""
    obj = workload("Deployment", ONE_GPU, {"gpuforge.io/gpu-model": "H100"}, replicas=1)
    usage = workload_usage(obj)
    assert not [key for key in usage.usage if key.startswith(f"{GPU}.")]
    assert usage.placement.of(GPU_DIMENSION).values is None


def test_dra_selector_proves_the_model_of_a_template() -> None:
    template = {
        "devices": {
            "requests": [
                {
                    "name": "g",
                    "exactly": {
                        "deviceClassName": "gpu.nvidia.com",
                        "selectors": [
                            {
                                "cel": {
                                    "expression": "device.attributes['gpu.nvidia.com'].productName"
                                    " == 'NVIDIA A100-SXM4-40GB'"
                                }
                            }
                        ],
                    },
                }
            ]
        }
    }
    catalog = ClaimCatalog(
        templates={"t": claim_usage(template)}, template_products={"t": claim_products(template)}
    )
    spec = {**ONE_GPU, "resourceClaims": [{"name": "g", "resourceClaimTemplateName": "t"}]}
    counted = workload_usage(workload("Deployment", spec, replicas=1), catalog)
    assert counted.placement.of(GPU_DIMENSION).values == {"NVIDIA-A100-SXM4-40GB"}
    assert counted.usage[f"{GPU}.A100"] == 1


V1_TEMPLATE = {
    "devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}
}


@pytest.mark.parametrize(
    ("claim", "devices"),
    [
        (V1_TEMPLATE, 2),
        ({"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}, 1),
        (
            {
                "devices": {
                    "requests": [
                        {
                            "name": "g",
                            "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"},
                        }
                    ]
                }
            },
            32,
        ),
        (
            {"devices": {"requests": [{"name": "g", "deviceClassName": "gpu.nvidia.com", "count": 3}]}},
            3,
        ),  # v1beta1
        (
            {
                "devices": {
                    "requests": [
                        {
                            "name": "g",
                            "firstAvailable": [
                                {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 4},
                                {"name": "small", "deviceClassName": "gpu.nvidia.com", "count": 1},
                            ],
                        }
                    ]
                }
            },
            4,
        ),
    ],
)
def test_claim_devices(claim: dict[str, Any], devices: int) -> None:
    assert claim_usage(claim)[DRA] == devices


def test_job_with_claim_template_counts_devices_times_parallelism() -> None:
    spec = pod_spec(
        container({"cpu": "1"}), resourceClaims=[{"name": "gpus", "resourceClaimTemplateName": "two"}]
    )
    catalog = ClaimCatalog(templates={"two": claim_usage(V1_TEMPLATE)})
    usage = workload_usage(workload("Job", spec, parallelism=3), catalog).usage
    assert usage[DRA] == 6
    assert usage["count/resourceclaims.resource.k8s.io"] == 3


def test_shared_claim_counts_once() -> None:
    spec = pod_spec(container({"cpu": "1"}), resourceClaims=[{"name": "gpus", "resourceClaimName": "shared"}])
    catalog = ClaimCatalog(claims={"shared": claim_usage(V1_TEMPLATE)})
    assert workload_usage(workload("Deployment", spec, replicas=4), catalog).usage[DRA] == 2


def test_missing_claim_template_is_an_error_naming_it() -> None:
    spec = pod_spec(container(), resourceClaims=[{"name": "gpus", "resourceClaimTemplateName": "nope"}])
    with pytest.raises(WorkloadError, match="ResourceClaimTemplate 'nope' not found"):
        workload_usage(workload("Job", spec))


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (
            pod_spec(container({"cpu": "lots"})),
            r"spec\.template\.spec\.containers\[0\]\.resources\.requests\.cpu",
        ),
        (
            pod_spec(container(limits={"nvidia.com/gpu": "x"})),
            r"containers\[0\]\.resources\.limits\.nvidia\.com/gpu",
        ),
    ],
)
def test_garbage_quantities_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(WorkloadError, match=field):
        workload_usage(workload("Deployment", spec))


def test_bad_replicas() -> None:
    with pytest.raises(WorkloadError, match=r"spec\.replicas"):
        workload_usage(workload("Deployment", ONE_GPU, replicas="three"))


def test_scale_overrides_replicas() -> None:
    assert workload_usage(workload("Deployment", ONE_GPU, replicas=1), replicas=7).usage[GPU] == 7


def test_increase_counts_only_growth() -> None:
    old = {GPU: Decimal(2), "requests.cpu": Decimal(4)}
    new = {GPU: Decimal(3), "requests.cpu": Decimal(1), "pods": Decimal(1)}
    assert increase(old, new) == {GPU: Decimal(1), "pods": Decimal(1)}


@pytest.mark.parametrize(
    ("owners", "controlled"),
    [
        ([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "controller": True}], True),
        # A CronJob's Jobs are charged themselves, when created.
        ([{"apiVersion": "batch/v1", "kind": "CronJob", "controller": True}], False),
        ([{"apiVersion": "batch/v1", "kind": "Job", "controller": True}], True),
        ([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "controller": False}], False),
        ([{"apiVersion": "example.com/v1", "kind": "MyCustomThing", "controller": True}], False),
        # Same kind, another group: not a workload controller gpuforge charges.
        ([{"apiVersion": "example.com/v1", "kind": "Job", "controller": True}], False),
        ([{"apiVersion": "batch/v1", "kind": "Deployment", "controller": True}], False),
        ([{"apiVersion": "v1", "kind": "ReplicaSet", "controller": True}], False),
        ([{"kind": "ReplicaSet", "controller": True}], False),  # no group at all
        ([], False),
    ],
)
def test_objects_of_a_workload_are_charged_to_it(owners: list[dict[str, Any]], controlled: bool) -> None:
    assert is_controlled_by_workload({"metadata": {"ownerReferences": owners}}) is controlled


def _done(condition: str, status: str = "True") -> dict[str, Any]:
    return {"conditions": [{"type": condition, "status": status}, {"type": "Suspended", "status": "False"}]}


@pytest.mark.parametrize(
    ("kind", "top", "status", "held"),
    [
        ("Pod", {}, {"phase": "Running"}, True),
        ("Pod", {}, {"phase": "Pending"}, True),
        ("Pod", {}, {"phase": "Succeeded"}, False),
        ("Pod", {}, {"phase": "Failed"}, False),
        ("Job", {}, {}, True),
        ("Job", {}, _done("Complete"), False),
        ("Job", {}, _done("Failed"), False),
        ("Job", {}, _done("Complete", "False"), True),
        ("Job", {}, _done("SuccessCriteriaMet"), True),  # pods may still be running until Complete
        ("Job", {"suspend": True}, {}, False),
        ("Job", {"suspend": False}, {}, True),
        ("Deployment", {"replicas": 1}, {"phase": "Succeeded"}, True),  # phases are pods' alone
        ("CronJob", {"suspend": False}, {}, False),  # its Jobs are charged, each while it runs
    ],
)
def test_finished_work_holds_nothing(
    kind: str, top: dict[str, Any], status: dict[str, Any], held: bool
) -> None:
    obj = {**workload(kind, ONE_GPU, **top), "status": status}
    usage = workload_usage(obj)
    assert holds_nothing(obj) is not held
    assert (usage.usage.get(GPU, Decimal(0)) == 1) is held
    assert usage.replicas == (1 if held else 0)


@pytest.mark.parametrize(
    ("kind", "status", "kept"),
    [
        ("Pod", {"phase": "Running", "podIP": "10.0.0.1"}, {}),
        ("Pod", {"phase": "Failed", "reason": "Evicted"}, {"phase": "Failed"}),
        ("Job", {"active": 2}, {}),
        (
            "Job",
            {
                "succeeded": 1,
                "conditions": [
                    {"type": "SuccessCriteriaMet", "status": "True"},
                    {"type": "Complete", "status": "True"},
                ],
            },
            {"conditions": [{"type": "Complete", "status": "True"}]},
        ),
        ("Deployment", {"replicas": 3}, {}),
    ],
)
def test_finish_status_keeps_what_release_reads(
    kind: str, status: dict[str, Any], kept: dict[str, Any]
) -> None:
    obj = {**workload(kind, ONE_GPU), "status": status}
    assert finish_status(obj) == kept
    assert holds_nothing({**obj, "status": kept}) is holds_nothing(obj)


def _pod(quota: str, owner_uid: str = "rs-uid") -> dict[str, Any]:
    owner = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": "rs",
        "uid": owner_uid,
        "controller": True,
    }
    return {"kind": "Pod", "metadata": {"labels": {"gpuforge.io/quota": quota}, "ownerReferences": [owner]}}


def _owner(quota: str | None, uid: str = "rs-uid") -> dict[str, Any]:
    labels = {"gpuforge.io/quota": quota} if quota else {}
    return {"kind": "ReplicaSet", "metadata": {"name": "rs", "uid": uid, "labels": labels}}


@pytest.mark.parametrize(
    ("pod", "owner", "owner_pays"),
    [
        (_pod("team"), _owner("team"), True),
        (_pod("team"), None, False),  # a forged reference: no such controller
        (_pod("team"), _owner("team", uid="other"), False),  # another object of that name
        (_pod("team"), _owner(None), False),  # the controller is charged nowhere
        (_pod("team"), _owner("rival"), False),  # charged elsewhere: the pod pays its own quota
        ({"kind": "Pod", "metadata": {"labels": {"gpuforge.io/quota": "team"}}}, _owner("team"), False),
    ],
)
def test_a_pod_is_charged_to_its_controller_only_if_it_exists_with_the_quota(
    pod: dict[str, Any], owner: dict[str, Any] | None, owner_pays: bool
) -> None:
    assert charged_to_owner(pod, owner) is owner_pays


@pytest.mark.parametrize(
    ("obj", "default", "charged"),
    [
        (workload("Deployment", ONE_GPU), "dflt", "team"),  # names its own
        ({**workload("Deployment", ONE_GPU), "metadata": {"name": "w", "namespace": "ns"}}, "dflt", "dflt"),
        ({**workload("Deployment", ONE_GPU), "metadata": {"name": "w", "namespace": "ns"}}, "", ""),
        (  # takes no GPU: not charged to the default
            {**workload("Deployment", pod_spec(container({"cpu": "1"}))), "metadata": {"name": "w"}},
            "dflt",
            "",
        ),
        (  # made by a workload controller: charged to its owner
            {
                **workload("Pod", ONE_GPU),
                "metadata": {
                    "name": "p",
                    "ownerReferences": [
                        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "controller": True}
                    ],
                },
            },
            "dflt",
            "",
        ),
    ],
)
def test_charged_quota_falls_back_to_the_namespace_default(
    obj: dict[str, Any], default: str, charged: str
) -> None:
    assert charged_quota(obj, default) == charged
    assert workload_usage(obj, default_quota=default).quota == charged


_RS_OWNER = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "w-1", "uid": "rs1", "controller": True}]


@pytest.mark.parametrize(
    ("labels", "owners", "spec", "default", "quota"),
    [
        ({"gpuforge.io/quota": "team"}, [], ONE_GPU, "dflt", "team"),  # the label wins
        ({"gpuforge.io/quota": "team"}, _RS_OWNER, ONE_GPU, "", "team"),
        ({}, [], ONE_GPU, "dflt", "dflt"),  # unlabelled, takes a GPU: the default quota
        ({}, _RS_OWNER, ONE_GPU, "dflt", "dflt"),  # a controller's pod grows beyond its template
        ({}, [], ONE_GPU, "", ""),  # no default: not checked
        ({}, [], pod_spec(container({"cpu": "1"})), "dflt", ""),  # takes no GPU: not charged there
    ],
)
def test_a_resize_is_checked_against_the_label_else_the_default_quota(
    labels: dict[str, str], owners: list[dict[str, Any]], spec: dict[str, Any], default: str, quota: str
) -> None:
    pod = {
        "kind": "Pod",
        "metadata": {"name": "p", "labels": labels, "ownerReferences": owners},
        "spec": spec,
    }
    assert resize_quota(pod, default) == quota


def rolling(
    count: int, strategy: dict[str, Any] | None = None, status: dict[str, int] | None = None
) -> dict[str, Any]:
    obj = workload("Deployment", ONE_GPU, replicas=count)
    if strategy is not None:
        obj["spec"]["strategy"] = strategy
    obj["metadata"]["generation"] = 2
    if status:
        obj["status"] = status
    return obj


def _rolling_update(**fields: Any) -> dict[str, Any]:
    return {"type": "RollingUpdate", "rollingUpdate": fields}


@pytest.mark.parametrize(
    ("replicas", "strategy", "surge"),
    [
        (4, None, 1),  # default 25%
        (5, None, 2),  # 25% of 5, rounded up
        (1, None, 1),
        (0, None, 0),
        (8, _rolling_update(maxSurge=3), 3),
        (8, _rolling_update(maxSurge="50%"), 4),
        (8, _rolling_update(maxSurge=0, maxUnavailable=1), 0),
        (2, _rolling_update(maxSurge=5), 2),  # no more than replicas: old pods only go
        (2, _rolling_update(maxSurge="200%"), 2),
        (4, {"type": "Recreate"}, 0),  # old pods go before new ones start
        (4, {"type": "RollingUpdate"}, 1),
    ],
)
def test_a_rolling_update_surges_as_the_deployment_controller_does(
    replicas: int, strategy: dict[str, Any] | None, surge: int
) -> None:
    assert max_surge(rolling(replicas, strategy)) == surge
    running = workload_usage(rolling(replicas, strategy), surge=True)
    assert running.usage.get(GPU, Decimal(0)) == replicas + surge
    assert running.surge_pods == surge and running.surge.get(GPU, Decimal(0)) == surge
    assert workload_usage(rolling(replicas, strategy), surge=False).usage.get(GPU, Decimal(0)) == replicas


def test_a_malformed_max_surge_names_the_field() -> None:
    with pytest.raises(WorkloadError, match=r"spec.strategy.rollingUpdate.maxSurge: .*'lots'"):
        workload_usage(rolling(4, _rolling_update(maxSurge="lots")), surge=True)


@pytest.mark.parametrize(
    ("status", "running"),
    [
        ({}, False),  # just created: nothing to replace
        ({"observedGeneration": 2, "replicas": 4, "updatedReplicas": 4}, False),  # done
        ({"observedGeneration": 2, "replicas": 5, "updatedReplicas": 1}, True),  # old pods remain
        ({"observedGeneration": 2, "replicas": 4, "updatedReplicas": 2}, True),
        # Not acted on yet: most such changes are scales (the update that rolls reserved its surge).
        ({"observedGeneration": 1, "replicas": 4, "updatedReplicas": 4}, False),
        ({"observedGeneration": 2}, False),
    ],
)
def test_the_status_says_whether_a_rolling_update_runs(status: dict[str, int], running: bool) -> None:
    obj = rolling(4, status=status)
    assert rolling_out(obj) is running
    assert workload_usage(obj).usage[GPU] == (5 if running else 4)  # the surge while it runs
    assert not rolling_out({**obj, "kind": "StatefulSet"})


def _changed(
    obj: dict[str, Any], image: str = "", paused: bool | None = None, replicas: int = 0
) -> dict[str, Any]:
    import copy

    new = copy.deepcopy(obj)
    if image:
        new["spec"]["template"]["spec"]["containers"][0]["image"] = image
    if paused is not None:
        new["spec"]["paused"] = paused
    if replicas:
        new["spec"]["replicas"] = replicas
    return new


DONE = {"observedGeneration": 2, "replicas": 4, "updatedReplicas": 4}


@pytest.mark.parametrize(
    ("old", "new", "starts"),
    [
        (rolling(4, status=DONE), _changed(rolling(4, status=DONE), image="y"), True),  # a new pod template
        (
            rolling(4, status=DONE),
            _changed(rolling(4, status=DONE), replicas=6),
            False,
        ),  # a scale rolls nothing
        (rolling(4, status=DONE), rolling(4, status=DONE), False),
        (
            _changed(rolling(4, status=DONE), paused=True),
            _changed(rolling(4, status=DONE), paused=False),
            True,
        ),
        (
            rolling(4, status={"replicas": 5, "updatedReplicas": 2}),
            _changed(rolling(4), replicas=6),
            True,
        ),  # still rolling
    ],
)
def test_an_update_starts_a_rolling_update_when_it_changes_the_pods(
    old: dict[str, Any], new: dict[str, Any], starts: bool
) -> None:
    assert starts_rollout(old, new) is starts
