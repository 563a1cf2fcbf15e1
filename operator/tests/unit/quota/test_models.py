"""Per-model keys: which models a workload's placement proves, and when a quota refuses it."""

from decimal import Decimal
from typing import Any

import pytest

from gpuforge.quota.models import (
    GPU,
    Placement,
    Selection,
    claim_products,
    claimed_model_problem,
    counted_key,
    expression_products,
    model_key,
    model_matches,
    node_selection,
    pod_placement,
    proof_problem,
    proven_models,
    restrict_to_keys,
    with_model_keys,
)

PRODUCT = "nvidia.com/gpu.product"
KEY = "requests.nvidia.com/gpu"
A100_80 = "NVIDIA-A100-SXM4-80GB"
A100_40 = "NVIDIA-A100-SXM4-40GB"
H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.mark.parametrize(
    ("model", "value", "matches"),
    [
        ("A100", A100_80, True),
        ("a100", A100_80, True),  # case is ignored
        ("A100-SXM4", A100_80, True),
        ("A100_SXM4", A100_80, True),  # `_` and `-` separate words alike
        ("NVIDIA-A100-SXM4-80GB", A100_80, True),
        ("A100-80GB", A100_80, False),  # words not adjacent
        ("A10", A100_80, False),  # a different GPU
        ("SXM", A100_80, False),
        ("L4", "NVIDIA-L40S", False),
        ("L4", "NVIDIA-L4", True),
        ("A100", "NVIDIA A100-SXM4-40GB", True),  # DRA's productName keeps the space
        ("A100", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", True),  # GFD's product under MIG's single strategy
        ("T4", "Tesla-T4", True),
        ("H100", "NVIDIA-H100-80GB-HBM3-SHARED", True),  # time slicing's product suffix
    ],
)
def test_model_matches_by_words(model: str, value: str, matches: bool) -> None:
    assert model_matches(model, value) is matches


def terms(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": expressions} for expressions in terms]
            }
        }
    }


def expr(operator: str, *values: str, key: str = PRODUCT) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


@pytest.mark.parametrize(
    ("spec", "values"),
    [
        ({}, None),
        ({"nodeSelector": {PRODUCT: A100_80}}, {A100_80}),
        ({"nodeSelector": {"other": "x"}}, None),
        ({"affinity": terms([expr("In", A100_80, A100_40)])}, {A100_80, A100_40}),
        ({"affinity": terms([expr("In", A100_80)], [expr("In", H100)])}, {A100_80, H100}),  # terms OR
        ({"affinity": terms([expr("In", A100_80)], [expr("In", "x", key="zone")])}, None),  # one term open
        ({"affinity": terms([expr("In", A100_80, H100), expr("NotIn", H100)])}, {A100_80}),
        ({"affinity": terms([expr("NotIn", H100)])}, None),  # NotIn alone proves nothing
        ({"affinity": terms([expr("Exists")])}, None),
        ({"affinity": terms([expr("In", A100_80, H100), expr("In", H100)])}, {H100}),  # AND within a term
        ({"nodeSelector": {PRODUCT: H100}, "affinity": terms([expr("In", A100_80, H100)])}, {H100}),
        ({"nodeSelector": {PRODUCT: H100}, "affinity": terms([expr("In", A100_80)])}, set()),
        ({"nodeSelector": {PRODUCT: "nvidia a100-sxm4-80gb"}}, {A100_80.upper()}),  # canonical spelling
    ],
)
def test_node_selection(spec: dict[str, Any], values: set[str] | None) -> None:
    selection = node_selection(spec, PRODUCT)
    assert (None if selection.values is None else set(selection.values)) == (
        None if values is None else {value.upper() for value in values}
    )


ATTR = "device.attributes['gpu.nvidia.com'].productName"


@pytest.mark.parametrize(
    ("expression", "products"),
    [
        (f"{ATTR} == 'NVIDIA A100-SXM4-40GB'", {A100_40}),
        (f"'NVIDIA A100-SXM4-40GB' == {ATTR}", {A100_40}),
        ('device.attributes["gpu.nvidia.com"]["productName"] == "NVIDIA H100 80GB HBM3"', {H100}),
        (f"{ATTR} in ['NVIDIA A100-SXM4-40GB', 'NVIDIA A100-SXM4-80GB']", {A100_40, A100_80}),
        (
            f"{ATTR} == 'NVIDIA A100-SXM4-40GB' && device.capacity['gpu.nvidia.com'].memory.compareTo("
            "quantity('40Gi')) >= 0",
            {A100_40},
        ),
        (f"{ATTR} == 'NVIDIA A100-SXM4-40GB' || true", None),  # an OR anywhere: not held
        (f"{ATTR} == 'NVIDIA A100-SXM4-40GB' && x || y", None),
        (f"!({ATTR} == 'NVIDIA A100-SXM4-40GB')", None),
        (f"{ATTR} != 'NVIDIA A100-SXM4-40GB'", None),
        (f"{ATTR}.startsWith('NVIDIA A100')", None),
        ("device.attributes['gpu.nvidia.com'].type == 'gpu'", None),
        (f"{ATTR} == 'a || b'", {"A-||-B"}),  # `||` inside a string is no OR
    ],
)
def test_device_selector_products(expression: str, products: set[str] | None) -> None:
    found = expression_products(expression)
    assert (None if found is None else set(found)) == products


def test_claim_products_per_request() -> None:
    def request(expression: str | None, **extra: Any) -> dict[str, Any]:
        exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com"}
        if expression:
            exactly["selectors"] = [{"cel": {"expression": expression}}]
        return {"name": "r", "exactly": exactly, **extra}

    spec = {
        "devices": {
            "requests": [
                request(f"{ATTR} == 'NVIDIA A100-SXM4-40GB'"),
                request(None),  # not held: adds no set
                {
                    "name": "either",
                    "firstAvailable": [
                        {
                            "name": "a",
                            "deviceClassName": "gpu.nvidia.com",
                            "selectors": [{"cel": {"expression": f"{ATTR} == 'NVIDIA H100 80GB HBM3'"}}],
                        },
                        {
                            "name": "b",
                            "deviceClassName": "gpu.nvidia.com",
                            "selectors": [{"cel": {"expression": f"{ATTR} == 'NVIDIA A100-SXM4-80GB'"}}],
                        },
                    ],
                },
                {
                    "name": "v1beta1",
                    "deviceClassName": "gpu.nvidia.com",
                    "selectors": [{"cel": {"expression": f"{ATTR} == 'NVIDIA L4'"}}],
                },
            ]
        }
    }
    assert claim_products(spec) == (
        frozenset({A100_40}),
        frozenset({H100, A100_80}),
        frozenset({"NVIDIA-L4"}),
    )


def test_pod_placement_narrows_nodes_by_devices() -> None:
    spec = {"affinity": terms([expr("In", A100_40, A100_80)])}
    placement = pod_placement(spec, [frozenset({A100_40})])
    assert placement.of(GPU).values == {A100_40}
    assert "device selectors" in placement.of(GPU).source


@pytest.mark.parametrize(
    ("values", "models"),
    [
        (None, set()),
        (
            {A100_80},
            {
                "NVIDIA",
                "A100",
                "SXM4",
                "80GB",
                "NVIDIA-A100",
                "A100-SXM4",
                "SXM4-80GB",
                "NVIDIA-A100-SXM4",
                "A100-SXM4-80GB",
                "NVIDIA-A100-SXM4-80GB",
            },
        ),
        ({A100_80, A100_40}, {"NVIDIA", "A100", "SXM4", "NVIDIA-A100", "A100-SXM4", "NVIDIA-A100-SXM4"}),
        ({A100_80, H100}, {"NVIDIA", "80GB"}),
    ],
)
def test_proven_models(values: set[str] | None, models: set[str]) -> None:
    selection = Selection(None if values is None else frozenset(values))
    assert proven_models(selection) == models


def placed(*values: str) -> Placement:
    return Placement({"gpu": Selection(frozenset(values), "spec.template.spec.nodeSelector")})


def test_with_model_keys_follows_the_generic_key() -> None:
    usage = with_model_keys({KEY: Decimal(2), "requests.cpu": Decimal(1)}, placed(H100))
    assert usage[f"{KEY}.H100"] == 2
    assert "requests.cpu.H100" not in usage
    assert with_model_keys({"requests.cpu": Decimal(1)}, placed(H100)) == {"requests.cpu": Decimal(1)}


@pytest.mark.parametrize(
    ("key", "parts"),
    [
        (f"{KEY}.A100", (KEY, "A100")),
        (f"cash/{KEY}.a100", (KEY, "a100")),
        (f"{KEY}.shared", None),  # time-sliced GPUs: a resource, not a model
        (KEY, None),
        ("requests.cpu", None),
    ],
)
def test_model_key(key: str, parts: tuple[str, str] | None) -> None:
    found = model_key(key)
    assert (None if found is None else (found.generic, found.model)) == parts


def test_keys_are_matched_ignoring_case() -> None:
    assert counted_key(f"cash/{KEY}.a100-sxm4") == f"cash/{KEY}.A100-SXM4"
    usage = {KEY: Decimal(1), f"{KEY}.A100": Decimal(1)}
    assert restrict_to_keys(usage, [KEY, f"{KEY}.a100", f"{KEY}.H100"]) == {
        KEY: Decimal(1),
        f"{KEY}.a100": Decimal(1),
    }


@pytest.mark.parametrize(
    ("hard", "expected", "placement", "problem"),
    [
        ({KEY: 1, f"{KEY}.A100": 1}, {KEY: 1}, placed(A100_80), None),
        ({KEY: 1, f"{KEY}.A100": 1}, {KEY: 1}, placed("NVIDIA-L4"), None),  # proven: not an A100
        ({KEY: 1, f"{KEY}.A100": 1}, {KEY: 1}, placed(A100_80, A100_40), None),  # both A100s
        ({KEY: 1, f"{KEY}.A100": 1}, {"requests.cpu": 1}, Placement(), None),  # takes no GPU
        ({KEY: 1}, {KEY: 1}, Placement(), None),  # no model key
        (
            {KEY: 1, f"{KEY}.A100": 1},
            {KEY: 1},
            Placement(),
            "requests.nvidia.com/gpu.A100 needs the GPU model proven, and nothing holds the pods to one: "
            "select nodes by nvidia.com/gpu.product (nodeSelector or required node affinity, operator In) "
            "or a DRA device selector on productName",
        ),
        (
            {KEY: 1, f"{KEY}.A100": 1},
            {KEY: 1},
            placed(A100_80, H100),
            "requests.nvidia.com/gpu.A100: the pods may land on nvidia.com/gpu.product "
            "NVIDIA-A100-SXM4-80GB, NVIDIA-H100-80GB-HBM3 (spec.template.spec.nodeSelector), of which only "
            "NVIDIA-A100-SXM4-80GB is A100; select one model",
        ),
        (
            {KEY: 1, f"{KEY}.A100-SXM4-80GB": 1},
            {KEY: 1},
            placed(A100_80, A100_40),
            "requests.nvidia.com/gpu.A100-SXM4-80GB: the pods may land on nvidia.com/gpu.product "
            "NVIDIA-A100-SXM4-40GB, NVIDIA-A100-SXM4-80GB (spec.template.spec.nodeSelector), of which only "
            "NVIDIA-A100-SXM4-80GB is A100-SXM4-80GB; select one model",
        ),
    ],
)
def test_proof_problem(
    hard: dict[str, int], expected: dict[str, int], placement: Placement, problem: str | None
) -> None:
    found = proof_problem(hard, {key: Decimal(value) for key, value in expected.items()}, placement)
    assert (None if found is None else found[1]) == problem


def test_proof_problem_of_contradicting_selections() -> None:
    empty = Placement({"gpu": Selection(frozenset(), "spec.nodeSelector and spec.affinity.nodeAffinity")})
    found = proof_problem({f"{KEY}.A100": 1}, {KEY: Decimal(1)}, empty)
    assert found is not None
    assert "leave no nvidia.com/gpu.product value" in found[1]


@pytest.mark.parametrize(
    ("claimed", "placement", "problem"),
    [
        ("A100", placed(A100_80), ""),
        ("", placed(A100_80), ""),
        (
            "A100",
            Placement(),
            "",
        ),  # a claim with no selection: nothing contradicts it (and it proves nothing)
        (
            "A100",
            placed(H100),
            "label gpuforge.io/gpu-model says 'A100' but the pods may land on nvidia.com/gpu.product "
            "NVIDIA-H100-80GB-HBM3 (spec.template.spec.nodeSelector)",
        ),
    ],
)
def test_claimed_model_problem(claimed: str, placement: Placement, problem: str) -> None:
    assert claimed_model_problem(claimed, placement) == problem


def test_cpu_and_memory_models_are_proven_by_their_node_labels() -> None:
    spec = {"nodeSelector": {"gpuforge.io/cpu-model": "A4", "gpuforge.io/memory-type": "DDR5"}}
    placement = pod_placement(spec)
    usage = with_model_keys(
        {"requests.cpu": Decimal(2), "limits.cpu": Decimal(4), "limits.memory": Decimal(8)}, placement
    )
    assert usage["requests.cpu.A4"] == 2
    assert usage["limits.cpu.A4"] == 4
    assert usage["limits.memory.DDR5"] == 8
    assert "requests.memory.DDR5" not in usage  # no memory request: nothing under it
    assert restrict_to_keys(usage, ["limits.cpu.a4"]) == {"limits.cpu.a4": Decimal(4)}


def test_cpu_model_key_needs_the_cpu_model_proven() -> None:
    found = proof_problem({"limits.cpu.A4": 4}, {"limits.cpu": Decimal(1)}, Placement())
    assert found == (
        "limits.cpu.A4",
        "limits.cpu.A4 needs the CPU model proven, and nothing holds the pods to one: select nodes by "
        "gpuforge.io/cpu-model (nodeSelector or required node affinity, operator In)",
    )
    on_a3 = pod_placement({"nodeSelector": {"gpuforge.io/cpu-model": "A3"}})
    assert proof_problem({"limits.cpu.A4": 4}, {"limits.cpu": Decimal(1)}, on_a3) is None
    # A workload that takes no CPU limit is not asked for the model (the unset rule refuses it first).
    assert proof_problem({"limits.cpu.A4": 4}, {"requests.cpu": Decimal(1)}, Placement()) is None
