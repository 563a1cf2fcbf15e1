"""Per-model keys on the local control plane: the model is proven by where the pods may land.

The webhook answers from the workload's node selection (GPU Feature Discovery's product label) and its
DRA device selectors; the usage controller counts the stored objects the same way.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from .conftest import GPU, PRODUCTS, Quotas, deployment, wait_for
from .test_quota_cluster import create

A100 = f"{GPU}.A100"


def _required_products(body: dict[str, Any], *products: str) -> dict[str, Any]:
    body["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "nvidia.com/gpu.product", "operator": "In", "values": list(products)}
                        ]
                    }
                ]
            }
        }
    }
    return body


def test_model_must_be_proven_by_node_selection(quotas: Quotas, namespace: str, api_client: Any) -> None:
    quotas.create("proof", {GPU: 8, A100: 2})
    apps = client.AppsV1Api(api_client)
    name = quotas.name("proof")
    anywhere = create(apps, namespace, deployment("anywhere", name))
    assert "requests.nvidia.com/gpu.A100 needs the GPU model proven" in anywhere
    assert "select nodes by nvidia.com/gpu.product" in anywhere
    # Held to A100 nodes by required node affinity: charged to the A100 key.
    pinned = _required_products(deployment("pinned", name), PRODUCTS["A100"])
    assert create(apps, namespace, pinned) == "admitted"
    # Either of two models: which one is not established.
    either = _required_products(deployment("either", name), PRODUCTS["A100"], PRODUCTS["H100"])
    refused = create(apps, namespace, either)
    assert "of which only NVIDIA-A100-SXM4-80GB is A100; select one model" in refused
    # Proven not to be an A100: only the generic key.
    assert create(apps, namespace, deployment("inference", name, model="L4")) == "admitted"
    wait_for("the controller to count 1 A100", lambda: quotas.used("proof", A100) == "1", timeout=10)
    assert quotas.used("proof") == "2"


def test_claimed_model_must_match_the_nodes(quotas: Quotas, namespace: str, api_client: Any) -> None:
    quotas.create("claim", {GPU: 8})
    apps = client.AppsV1Api(api_client)
    body = deployment("liar", quotas.name("claim"), model="H100")
    body["spec"]["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": PRODUCTS["L4"]}
    refused = create(apps, namespace, body)
    assert (
        "label gpuforge.io/gpu-model says 'H100' but the pods may land on nvidia.com/gpu.product NVIDIA-L4"
        in (refused)
    )


def test_moving_off_the_proven_model_is_checked(quotas: Quotas, namespace: str, api_client: Any) -> None:
    quotas.create("move", {GPU: 8, A100: 2})
    apps = client.AppsV1Api(api_client)
    assert create(apps, namespace, deployment("w", quotas.name("move"), model="A100")) == "admitted"
    # Dropping the selector takes nothing more, yet would leave the A100 key unproven.
    patch = {
        "metadata": {"labels": {"gpuforge.io/gpu-model": None}},
        "spec": {"template": {"spec": {"nodeSelector": None}}},
    }
    try:
        apps.patch_namespaced_deployment("w", namespace, patch)
        refused = ""
    except client.ApiException as error:
        refused = str(error.body)
    assert "requests.nvidia.com/gpu.A100 needs the GPU model proven" in refused


def test_dra_device_selector_proves_the_model(quotas: Quotas, namespace: str, api_client: Any) -> None:
    quotas.create("dra-model", {GPU: 8, A100: 1})
    custom = client.CustomObjectsApi(api_client)
    version = next(
        g.preferred_version.version
        for g in client.ApisApi(api_client).get_api_versions().groups
        if g.name == "resource.k8s.io"
    )
    expression = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-80GB'"
    request: dict[str, Any] = {"name": "gpu"}
    exact = {"deviceClassName": "gpu.nvidia.com", "selectors": [{"cel": {"expression": expression}}]}
    if version == "v1beta1":
        request.update(exact)
    else:
        request["exactly"] = exact
    custom.create_namespaced_custom_object(
        "resource.k8s.io",
        version,
        namespace,
        "resourceclaimtemplates",
        {
            "apiVersion": f"resource.k8s.io/{version}",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "an-a100"},
            "spec": {"spec": {"devices": {"requests": [request]}}},
        },
    )
    apps = client.AppsV1Api(api_client)
    body = deployment("dra", quotas.name("dra-model"))
    body["spec"]["template"]["spec"]["resourceClaims"] = [
        {"name": "gpu", "resourceClaimTemplateName": "an-a100"}
    ]
    assert create(apps, namespace, body) == "admitted"
    wait_for("the controller to count 1 A100", lambda: quotas.used("dra-model", A100) == "1", timeout=10)
    second = deployment("dra2", quotas.name("dra-model"))
    second["spec"]["template"]["spec"]["resourceClaims"] = [
        {"name": "gpu", "resourceClaimTemplateName": "an-a100"}
    ]
    assert "requests.nvidia.com/gpu.A100=1 but only 0 is left" in create(apps, namespace, second)


def test_cpu_model_key_is_proven_and_checked(quotas: Quotas, namespace: str, api_client: Any) -> None:
    quotas.create("cpus", {"limits.cpu": 10, "limits.cpu.A4": 4})
    apps = client.AppsV1Api(api_client)
    name = quotas.name("cpus")

    def cpu_work(short: str, cores: str, model: str = "") -> dict[str, Any]:
        body = deployment(short, name)
        body["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = cores
        if model:
            body["spec"]["template"]["spec"]["nodeSelector"] = {"gpuforge.io/cpu-model": model}
        return body

    assert "limits.cpu.A4 needs the CPU model proven" in create(apps, namespace, cpu_work("anywhere", "1"))
    assert create(apps, namespace, cpu_work("a4", "4", "a4")) == "admitted"  # case is ignored
    assert "limits.cpu.A4=1 but only 0 is left" in create(apps, namespace, cpu_work("more", "1", "A4"))
    assert create(apps, namespace, cpu_work("a3", "6", "A3")) == "admitted"  # not an A4: limits.cpu only
    wait_for(
        "the controller to count 4 A4 cores", lambda: quotas.used("cpus", "limits.cpu.A4") == "4", timeout=10
    )
    assert quotas.used("cpus", "limits.cpu") == "10"


def test_cpu_and_memory_model_keys_are_accepted(quotas: Quotas) -> None:
    quotas.create("machine-types", {"limits.cpu": 8, "limits.cpu.A4": 4, "limits.memory.DDR5": "64Gi"})

    def refusal(short: str, key: str) -> str:
        try:
            quotas.create(short, {key: 4})
        except client.ApiException as error:
            return str(error.body)
        return ""

    assert "a GpuQuota cannot count key cpu.A4" in refusal("alias", "cpu.A4")  # the CRD's rule
    assert "'A4-' is not a model name" in refusal("dash", "limits.cpu.A4-")  # the webhook's


def test_a_device_class_model_key_is_proven_by_the_claims_selectors(
    quotas: Quotas, namespace: str, api_client: Any
) -> None:
    """`<class>.deviceclass.resource.k8s.io/devices.<model>`: the devices a claim's selectors hold to
    the model are charged under it; a claim that does not hold its product is refused."""
    devices = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
    quotas.create("dra-class-model", {devices: 4, f"{devices}.A100": 1})
    team = quotas.name("dra-class-model")
    custom = client.CustomObjectsApi(api_client)
    version = next(
        g.preferred_version.version
        for g in client.ApisApi(api_client).get_api_versions().groups
        if g.name == "resource.k8s.io"
    )

    def claim_template(name: str, expression: str) -> None:
        exact: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com"}
        if expression:
            exact["selectors"] = [{"cel": {"expression": expression}}]
        request: dict[str, Any] = {"name": "gpu", **(exact if version == "v1beta1" else {"exactly": exact})}
        body = {
            "apiVersion": f"resource.k8s.io/{version}",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [request]}}},
        }
        custom.create_namespaced_custom_object(
            "resource.k8s.io", version, namespace, "resourceclaimtemplates", body
        )

    claim_template("an-a100", "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-80GB'")
    claim_template("any-gpu", "")
    apps = client.AppsV1Api(api_client)

    def claiming(name: str, template: str) -> dict[str, Any]:
        body = deployment(name, team)
        body["spec"]["template"]["spec"]["resourceClaims"] = [
            {"name": "gpu", "resourceClaimTemplateName": template}
        ]
        return body

    assert create(apps, namespace, claiming("a100", "an-a100")) == "admitted"
    wait_for(
        "the controller to count 1 A100 device",
        lambda: quotas.used("dra-class-model", f"{devices}.A100") == "1",
        timeout=10,
    )
    refused = create(apps, namespace, claiming("a100-2", "an-a100"))
    assert f"{devices}.A100=1 but only 0 is left" in refused, refused
    unproven = create(apps, namespace, claiming("any", "any-gpu"))
    assert (
        f"{devices}.A100 needs the GPU model proven, and a device request of class gpu.nvidia.com" in unproven
    )
    assert quotas.used("dra-class-model", devices) == "1"
