"""Evaluate a role's variables and task expressions with Ansible's own templating, without a host.

For the paths no test machine can run (RHEL's dnf, Ubuntu's archives): the role's defaults and vars files
are loaded as Ansible loads them, the facts and the node_state read are given, and Ansible's Templar (the
engine ansible-playbook uses, with the collection's filters) renders what a task would receive.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader  # type: ignore[import-untyped]
from ansible.template import Templar, trust_as_template  # type: ignore[import-untyped]
from ansible.utils.collection_loader import AnsibleCollectionConfig  # type: ignore[import-untyped]
from ansible.utils.collection_loader._collection_finder import (  # type: ignore[import-untyped]
    _AnsibleCollectionFinder,
)

CHECKOUT = Path(__file__).resolve().parents[3]
ROLES = CHECKOUT / "roles"


def _install_collection_finder() -> None:
    # The collection's filters are found the way ansible-playbook finds them (conftest.py may have done it).
    if AnsibleCollectionConfig.collection_finder is None:
        _AnsibleCollectionFinder(paths=[os.fspath(CHECKOUT / "collections")])._install()


def _trust(value: Any) -> Any:
    # Ansible templates only strings it trusts (those of the role's own files): mark them as such.
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {key: _trust(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_trust(item) for item in value]
    return value


def facts(
    distribution: str, major: str, *, version: str = "", kernel: str = "6.8.0-45-generic"
) -> dict[str, Any]:
    family = {"Debian": "Debian", "Ubuntu": "Debian"}.get(distribution, "RedHat")
    return {
        "distribution": distribution,
        "distribution_major_version": major,
        "distribution_version": version or major,
        "distribution_release": "",
        "os_family": family,
        "kernel": kernel,
        "architecture": "x86_64",
    }


@cache
def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


class RoleRender:
    """A role's variables for one host, as its tasks see them after the preflight."""

    def __init__(self, role: str, ansible_facts: dict[str, Any], **overrides: Any) -> None:
        _install_collection_finder()
        self.role = ROLES / role
        self.loader = DataLoader()
        variables: dict[str, Any] = {}
        vars_file = self.role / "vars" / f"{ansible_facts['distribution']}.yml"
        if not vars_file.exists():
            vars_file = self.role / "vars" / f"{ansible_facts['os_family']}.yml"
        for path in (self.role / "defaults/main.yml", self.role / "vars/main.yml", vars_file):
            variables.update(_trust(_load_yaml(path)))
        variables.update(
            ansible_facts=ansible_facts,
            ansible_check_mode=False,
            inventory_hostname="node1",
            role_path=os.fspath(self.role),
        )
        variables.update(_trust(overrides))
        self.variables = variables

    def render(self, expression: str, **extra: Any) -> Any:
        variables = dict(self.variables)
        variables.update(_trust(extra))
        return Templar(loader=self.loader, variables=variables).template(trust_as_template(expression))

    def var(self, name: str) -> Any:
        return self.render("{{ " + name + " }}")

    def task(self, tasks_file: str, name: str) -> dict[str, Any]:
        """The task of that name in tasks/<tasks_file> (blocks searched too)."""
        tasks = _load_yaml(self.role / "tasks" / tasks_file)
        stack = list(tasks)
        while stack:
            task = stack.pop(0)
            if task.get("name") == name:
                return dict(task)
            stack.extend(task.get("block", []))
        raise KeyError(f"no task {name!r} in {tasks_file}")

    def task_value(self, tasks_file: str, name: str, *path: str, **extra: Any) -> Any:
        """A task argument (path: module name, then keys) rendered with the task's own vars."""
        task = self.task(tasks_file, name)
        value: Any = task
        for key in path:
            value = value[key]
        # The task's vars, unless the test sets one itself (to give what an earlier expression would yield).
        task_vars = dict(task.get("vars", {}))
        task_vars.update(extra)
        return self._render_tree(value, task_vars)

    def _render_tree(self, value: Any, task_vars: dict[str, Any]) -> Any:
        if isinstance(value, str):
            return self.render(value, **task_vars)
        if isinstance(value, list):
            return [self._render_tree(item, task_vars) for item in value]
        if isinstance(value, dict):
            return {key: self._render_tree(item, task_vars) for key, item in value.items()}
        return value

    def task_runs(self, tasks_file: str, name: str, **extra: Any) -> bool:
        """Whether the task's `when` conditions all hold."""
        task = self.task(tasks_file, name)
        when = task.get("when", [])
        conditions = when if isinstance(when, list) else [when]
        task_vars = dict(task.get("vars", {}))
        task_vars.update(extra)
        return all(self.render("{{ " + str(c) + " }}", **task_vars) for c in conditions)
