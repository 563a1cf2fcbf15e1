"""Which namespaces may charge a quota: table by table, and the CRD keeps what the webhook reads."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from gpuforge.api.gpuquota import GpuQuota, LabelSelector, SelectorRequirement
from gpuforge.quota.admission import needs_root_permission, root_denied
from gpuforge.quota.convert import QuotaSpecError, quota_from_object, quota_to_object
from gpuforge.quota.tenancy import admit_namespace, needs_labels, selector_matches

from .test_crd_schema import prune, spec_schema

GPU = "requests.nvidia.com/gpu"
TEAM = {"gpuforge.io/team": "vision", "kubernetes.io/metadata.name": "vision-dev"}


def quota(
    name: str,
    parent: str = "",
    namespaces: tuple[str, ...] = (),
    selector: LabelSelector | None = None,
) -> GpuQuota:
    return GpuQuota(name, parent, {GPU: Decimal(8)}, namespaces=namespaces, namespace_selector=selector)


def requirement(key: str, operator: str, *values: str) -> LabelSelector:
    return LabelSelector(match_expressions=(SelectorRequirement(key, operator, values),))


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        (LabelSelector(), True),  # {} matches every namespace
        (LabelSelector({"gpuforge.io/team": "vision"}), True),
        (LabelSelector({"gpuforge.io/team": "speech"}), False),
        (LabelSelector({"gpuforge.io/team": "vision", "tier": "prod"}), False),
        (requirement("gpuforge.io/team", "In", "speech", "vision"), True),
        (requirement("gpuforge.io/team", "In", "speech"), False),
        (requirement("gpuforge.io/team", "NotIn", "speech"), True),
        (requirement("gpuforge.io/team", "NotIn", "vision"), False),
        (requirement("tier", "NotIn", "prod"), True),  # absent: not in
        (requirement("gpuforge.io/team", "Exists"), True),
        (requirement("tier", "Exists"), False),
        (requirement("tier", "DoesNotExist"), True),
        (requirement("gpuforge.io/team", "DoesNotExist"), False),
        (requirement("gpuforge.io/team", "Near"), False),
    ],
)
def test_label_selector(selector: LabelSelector, matches: bool) -> None:
    assert selector_matches(selector, TEAM) is matches


VISION = quota("vision", namespaces=("vision-dev", "vision-prod"))
BY_LABEL = quota("by-label", selector=LabelSelector({"gpuforge.io/team": "vision"}))
OPEN_ROOT = quota("org")  # names none: admits nothing itself, narrows nothing below
DEPT = quota("dept", "org", namespaces=("vision-dev",))


@pytest.mark.parametrize(
    ("lineage", "namespace", "labels", "refusal"),
    [
        ([VISION], "vision-dev", {}, None),
        ([VISION], "speech", {}, 'GpuQuota "vision" admits namespaces vision-dev, vision-prod'),
        ([BY_LABEL], "vision-dev", TEAM, None),
        ([BY_LABEL], "speech", {"gpuforge.io/team": "speech"}, "matching spec.namespaceSelector"),
        ([OPEN_ROOT], "vision-dev", TEAM, 'GpuQuota "org" names no namespace, so it admits none'),
        ([quota("leaf", "org", ("vision-dev",)), OPEN_ROOT], "vision-dev", {}, None),
        ([quota("leaf", "dept", ("vision-dev",)), DEPT, OPEN_ROOT], "vision-dev", {}, None),
        # The ancestor narrows: the leaf names vision-prod, its department does not.
        (
            [quota("leaf", "dept", ("vision-dev", "vision-prod")), DEPT, OPEN_ROOT],
            "vision-prod",
            {},
            'its ancestor GpuQuota "dept" admits namespaces vision-dev',
        ),
        # Either the list or the selector admitting is enough.
        (
            [quota("both", namespaces=("speech",), selector=LabelSelector({"gpuforge.io/team": "vision"}))],
            "vision-dev",
            TEAM,
            None,
        ),
    ],
)
def test_which_namespaces_may_charge(
    lineage: list[GpuQuota], namespace: str, labels: dict[str, str], refusal: str | None
) -> None:
    denied = admit_namespace(lineage, namespace, labels, "Deployment ns/w")
    if refusal is None:
        assert denied is None
        return
    assert denied is not None and denied.code == 403 and denied.quota == lineage[0].name
    assert f'namespace "{namespace}" may not charge GpuQuota "{lineage[0].name}"' in denied.message
    assert refusal in denied.message


def test_labels_are_read_only_when_a_selector_decides() -> None:
    assert not needs_labels([VISION, DEPT, OPEN_ROOT])
    assert needs_labels([quota("leaf", "by-label", ("x",)), BY_LABEL])


def spec(**extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": "q"}, "spec": {"hard": {GPU: "1"}, **extra}}


def test_namespaces_and_selector_round_trip_through_the_crd_schema() -> None:
    obj = spec(
        namespaces=["a", "b"],
        namespaceSelector={
            "matchLabels": {"team": "x"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["dev"]}],
        },
    )
    parsed = quota_from_object(obj)
    assert parsed.namespaces == ("a", "b")
    assert parsed.namespace_selector == LabelSelector(
        {"team": "x"}, (SelectorRequirement("tier", "In", ("dev",)),)
    )
    written = quota_to_object(parsed)["spec"]
    assert prune(written, spec_schema()) == written  # the API server keeps every field
    assert quota_from_object({"metadata": {"name": "q"}, "spec": written}) == parsed


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"namespaces": "ml"}, "spec.namespaces"),
        ({"namespaces": ["ml", ""]}, "spec.namespaces"),
        ({"namespaceSelector": []}, "spec.namespaceSelector"),
        ({"namespaceSelector": {"matchLabels": {"team": 1}}}, "spec.namespaceSelector.matchLabels.team"),
        (
            {"namespaceSelector": {"matchExpressions": [{"key": "t", "operator": "Near"}]}},
            "spec.namespaceSelector.matchExpressions[0].operator",
        ),
        (
            {"namespaceSelector": {"matchExpressions": [{"key": "t", "operator": "In"}]}},
            "spec.namespaceSelector.matchExpressions[0].values",
        ),
        (
            {
                "namespaceSelector": {
                    "matchExpressions": [{"key": "t", "operator": "Exists", "values": ["x"]}]
                }
            },
            "spec.namespaceSelector.matchExpressions[0].values",
        ),
    ],
)
def test_bad_tenancy_names_the_field(extra: dict[str, Any], field: str) -> None:
    with pytest.raises(QuotaSpecError, match=field.replace("[", r"\[").replace("]", r"\]")):
        quota_from_object(spec(**extra))


def test_a_quota_without_tenancy_fields_names_no_namespace() -> None:
    parsed = quota_from_object(spec())
    assert parsed.namespaces == () and parsed.namespace_selector is None
    assert not parsed.names_namespaces
    assert quota_from_object(spec(namespaceSelector={})).names_namespaces  # {} is every namespace


def _tree(name: str, parent: str = "", gpus: int = 8) -> GpuQuota:
    return GpuQuota(name, parent, {GPU: Decimal(gpus)})


@pytest.mark.parametrize(
    ("old", "new", "needed"),
    [
        (None, _tree("org"), True),  # a new tree
        (None, _tree("team", "org"), False),  # carved from its parent
        (_tree("org"), _tree("org", gpus=16), True),  # a root raised: quota from nothing
        (_tree("org"), _tree("org", gpus=4), False),  # lowering gives quota back
        (_tree("org"), _tree("org"), False),  # e.g. its namespaces changed
        (_tree("team", "org"), _tree("team", "org", gpus=16), False),  # the parent's carve-out rules
        (_tree("org"), None, False),
    ],
)
def test_minting_quota_at_a_root_needs_its_own_permission(
    old: GpuQuota | None, new: GpuQuota | None, needed: bool
) -> None:
    assert needs_root_permission(old, new) is needed


def test_the_root_refusal_names_the_verb_and_the_user() -> None:
    denied = root_denied("org", "alice", creating=True)
    assert denied.code == 403
    assert denied.message == (
        'creating root GpuQuota "org" needs the RBAC verb "root" on gpuquotas.gpuforge.io (user alice)'
    )


def test_default_quota_and_required_namespaces() -> None:
    from gpuforge.quota.tenancy import default_quota, quota_required

    assert default_quota({"gpuforge.io/default-quota": "team"}) == "team"
    assert default_quota({}) == ""
    required = {"gpuforge.io/quota-required": "true"}
    assert quota_required("ns", required, "Deployment ns/w", True) is not None
    # A namespace with a default quota charges the workload to it instead of refusing it.
    assert (
        quota_required("ns", {**required, "gpuforge.io/default-quota": "team"}, "Deployment ns/w", True)
        is None
    )


def test_lineage_follows_parents_and_stops_at_cycles() -> None:
    from gpuforge.quota.tenancy import lineage

    quotas = {
        "leaf": GpuQuota(name="leaf", parent="mid", hard={}),
        "mid": GpuQuota(name="mid", parent="root", hard={}),
        "root": GpuQuota(name="root", parent="", hard={}),
        "a": GpuQuota(name="a", parent="b", hard={}),
        "b": GpuQuota(name="b", parent="a", hard={}),
    }
    assert [q.name for q in lineage("leaf", quotas.get)] == ["leaf", "mid", "root"]
    assert [q.name for q in lineage("a", quotas.get)] == ["a", "b"]
    assert lineage("missing", quotas.get) == []
