"""The pure parts of `gpuforge status` / `gpuforge plan`: rows and ordered steps."""

from __future__ import annotations

from builders import DP, DRA, desired, gpu_pod, node, snapshot
from click.testing import CliRunner

from gpuforge.cli.main import cli
from gpuforge.cli.status import desired_from_stack, plan_report, status_rows
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
