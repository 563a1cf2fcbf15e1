"""The pure parts of `gpuforge status` / `gpuforge plan`: rows and ordered steps."""

from __future__ import annotations

from builders import DP, DRA, desired, gpu_pod, node, snapshot
from click.testing import CliRunner

from gpuforge.cli.main import cli
from gpuforge.cli.status import (
    desired_from_stack,
    names_in_short,
    plan_report,
    pod_query,
    pool_summary,
    status_rows,
    step_summary,
)
from gpuforge.upgrade import plan
from gpuforge.upgrade.model import FAILURE_ANNOTATION, IntOrPercent, Mode, NodeState, Policy


def test_status_rows() -> None:
    failed = node(
        "b",
        mode=DRA,
        state=NodeState.UPGRADE_FAILED,
        since=125,
        operand_ready=False,
        annotations={FAILURE_ANNOTATION: "not serving after 600s"},
    )
    rows = status_rows(snapshot(node("a", mode=DP), failed))
    assert [(r["node"], r["mode"], r["version"], r["state"], r["since"]) for r in rows] == [
        ("a", "devicePlugin", "v0.17.0", "-", "-"),
        ("b", "dra", "v25.12.0", "upgrade-failed", "2m"),
    ]
    assert rows[1]["failure"] == "not serving after 600s" and not rows[1]["ready"]


def test_plan_report_lists_steps_in_order_with_holds() -> None:
    nodes = [node("a", mode=DP, pods=[gpu_pod("j")]), node("b", mode=DP)]
    result = plan(
        snapshot(*nodes), desired(names=["a", "b"]), Policy(max_unavailable=IntOrPercent(1), max_parallel=0)
    )
    report = plan_report(result)
    assert [s["node"] for s in report["steps"]] == ["a", "b"]
    admitted = next(s for s in report["steps"] if s["to"] == "wait-old-gone")
    assert admitted["node"] == "b" and "cordon" in admitted["actions"]
    assert report["holds"][0]["reason"] == "MaxUnavailable" and report["holds"][0]["nodes"] == ["a"]


def test_plan_report_says_a_move_is_forward_only_before_its_steps() -> None:
    nodes = [node("a", mode=DRA, version="v25.12.0"), node("b", mode=DRA, version="v25.12.0")]
    versions = {DP: "v0.17.0", DRA: "v0.4.0"}
    result = plan(snapshot(*nodes), desired(names=["a", "b"], versions=versions), Policy(paused=True))
    report = plan_report(result)
    assert list(report)[:2] == ["target", "forwardOnly"]
    (warning,) = report["forwardOnly"]
    assert warning["from"] == "dra@v25.12.0" and warning["nodes"] == ["a", "b"]
    assert (
        "forward-only" in warning["message"] and "Rollback to v25.12.0 will be refused" in warning["message"]
    )
    # a move that can be undone says nothing
    assert plan_report(plan(snapshot(*nodes), desired(names=["a", "b"]), Policy()))["forwardOnly"] == []


def test_plan_report_names_the_nodes_left_to_another_installation() -> None:
    result = plan(snapshot(node("a", mode=DP)), desired(names=["a"]), Policy())
    why = "a device plugin gpuforge did not deploy advertises nvidia.com/gpu"
    report = plan_report(result, {"z": why, "b": why})
    assert report["servedElsewhere"] == [{"node": "b", "reason": why}, {"node": "z", "reason": why}]
    assert plan_report(result)["servedElsewhere"] == []


def test_desired_from_stack() -> None:
    stack = {"metadata": {"name": "gpus"}, "spec": {"mode": "dra", "dra": {"version": "v25.12.0"}}}
    want = desired_from_stack(stack, ["n1"])
    assert want.mode is Mode.DRA and want.versions[Mode.DRA] == "v25.12.0" and want.stack == "gpus"


def test_commands_are_wired() -> None:
    runner = CliRunner()
    for command in ("status", "plan"):
        result = runner.invoke(cli, [command, "--help"])
        assert result.exit_code == 0, result.output
        assert "--output" in result.output


def _row(name: str, pool: str, mode: str = "dra", state: str = "-", **extra: object) -> dict[str, object]:
    return {
        "node": name,
        "pool": pool,
        "mode": mode,
        "version": "v25.12.0" if mode == "dra" else "v0.17.0",
        "ready": True,
        "cordoned": False,
        "state": state,
        "failure": "",
        **extra,
    }


def test_pool_summary_counts_each_pool() -> None:
    rows = [
        _row("h-0", "h100", state="upgrade-done"),
        _row("h-1", "h100", mode="devicePlugin", state="wait-old-gone", ready=False, cordoned=True),
        _row("h-2", "h100", state="upgrade-done"),
        _row("a-0", "a100", state="upgrade-failed", failure="not serving after 600s"),
    ]
    a100, h100 = pool_summary(rows)
    assert a100 == {
        "pool": "a100",
        "nodes": 1,
        "modes": {"dra": 1},
        "versions": {"v25.12.0": 1},
        "states": {"upgrade-failed": 1},
        "notReady": 0,
        "cordoned": 0,
        "failed": ["a-0"],
    }
    assert h100["nodes"] == 3 and h100["notReady"] == 1 and h100["cordoned"] == 1 and h100["failed"] == []
    # most frequent first
    assert list(h100["states"].items()) == [("upgrade-done", 2), ("wait-old-gone", 1)]
    assert h100["modes"] == {"dra": 2, "devicePlugin": 1}


def test_pool_summary_of_no_nodes_is_empty() -> None:
    assert pool_summary([]) == []


def test_pool_summary_stays_small_on_thousands_of_nodes() -> None:
    rows = [_row(f"n-{i}", f"pool-{i % 4}", state="upgrade-done") for i in range(5000)]
    summary = pool_summary(rows)
    assert [p["nodes"] for p in summary] == [1250] * 4
    assert all(p["states"] == {"upgrade-done": 1250} for p in summary)


def test_step_summary_groups_by_pool_and_move_in_order() -> None:
    steps = [
        {"node": "h-0", "from": "upgrade-required", "to": "wait-old-gone"},
        {"node": "a-0", "from": "upgrade-required", "to": "wait-old-gone"},
        {"node": "h-1", "from": "upgrade-required", "to": "wait-old-gone"},
        {"node": "h-2", "from": "validation-required", "to": "upgrade-done"},
        {"node": "h-3", "from": "upgrade-required", "to": "wait-old-gone"},
        {"node": "h-4", "from": "upgrade-required", "to": "wait-old-gone"},
    ]
    pools = {"h-0": "h100", "h-1": "h100", "h-2": "h100", "h-3": "h100", "h-4": "h100", "a-0": "a100"}
    assert step_summary(steps, pools) == [
        {
            "pool": "h100",
            "from": "upgrade-required",
            "to": "wait-old-gone",
            "nodes": 4,
            "first": ["h-0", "h-1", "h-3"],
        },
        {"pool": "a100", "from": "upgrade-required", "to": "wait-old-gone", "nodes": 1, "first": ["a-0"]},
        {"pool": "h100", "from": "validation-required", "to": "upgrade-done", "nodes": 1, "first": ["h-2"]},
    ]
    # a node of no known pool is grouped under ""
    assert step_summary(steps[:1], {})[0]["pool"] == ""


def test_names_in_short() -> None:
    assert names_in_short([]) == ""
    assert names_in_short(["a", "b"]) == "a, b"
    assert names_in_short([f"n{i}" for i in range(8)], shown=3) == "n0, n1, n2 and 5 more"


def test_pods_are_chosen_by_the_api_server() -> None:
    assert pod_query(operand_pods_only=True) == {
        "fieldSelector": "status.phase!=Succeeded,status.phase!=Failed",
        "labelSelector": "gpuforge.io/component",
    }
    assert "labelSelector" not in pod_query(operand_pods_only=False)


def test_status_and_plan_take_nodes() -> None:
    runner = CliRunner()
    for command in ("status", "plan"):
        result = runner.invoke(cli, [command, "--help"])
        assert "--nodes" in result.output, result.output
