# Copyright: gpuforge maintainers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Callback for the benchmark: counts the tasks that ran something on each host, and times every task.

Load-independent measures of the work a playbook does per node: "remote runs" are task results (loop items
counted one by one) of actions that execute on the host (each one a Python module run there, or a command);
controller-only actions (set_fact, assert, debug, include_*, meta) are counted apart; "tasks" counts every
task the controller evaluated for the host, skipped ones included (each costs a forked worker and
templating). Written as JSON to $GPUFORGE_WORK_REPORT at the end of the play.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: gpuforge_work
type: aggregate
short_description: Count remote task runs per host and time tasks (benchmark helper)
description:
  - Writes a JSON report to the file named by the environment variable GPUFORGE_WORK_REPORT.
requirements:
  - enable in the callbacks_enabled setting
"""

import collections
import json
import os
import time

from ansible.plugins.callback import CallbackBase

CONTROLLER_ONLY = frozenset(
    (
        "set_fact",
        "assert",
        "debug",
        "fail",
        "meta",
        "include_vars",
        "include_tasks",
        "import_tasks",
        "include_role",
        "import_role",
        "add_host",
        "group_by",
        "set_stats",
        "pause",
        "validate_argument_spec",
    )
)


def _short(action):
    return action.rsplit(".", 1)[-1]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpuforge_work"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super(CallbackModule, self).__init__()
        self._remote = collections.Counter()
        self._tasks = collections.Counter()
        self._controller = collections.Counter()
        self._by_action = collections.Counter()
        self._task_seconds = collections.OrderedDict()
        self._current = None
        self._started = None

    def _close_task(self):
        if self._current is not None:
            self._task_seconds[self._current] = self._task_seconds.get(self._current, 0.0) + (
                time.monotonic() - self._started
            )

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._close_task()
        self._current = "%s | %s" % (task.get_path() or "", task.get_name())
        self._started = time.monotonic()

    def v2_playbook_on_handler_task_start(self, task):
        self.v2_playbook_on_task_start(task, False)

    def _count(self, result):
        action = _short(result._task.action)
        host = result._host.get_name()
        self._tasks[host] += 1
        items = result._result.get("results")
        runs = len(items) if isinstance(items, list) and items else 1
        if action in CONTROLLER_ONLY:
            self._controller[host] += runs
        else:
            self._remote[host] += runs
            self._by_action[action] += runs

    def v2_runner_on_ok(self, result):
        self._count(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._count(result)

    def v2_runner_on_skipped(self, result):
        self._tasks[result._host.get_name()] += 1

    def v2_runner_on_unreachable(self, result):
        self._tasks[result._host.get_name()] += 1

    def v2_playbook_on_stats(self, stats):
        self._close_task()
        path = os.environ.get("GPUFORGE_WORK_REPORT")
        if not path:
            return
        report = {
            "remote_runs": dict(self._remote),
            "controller_runs": dict(self._controller),
            "tasks": dict(self._tasks),
            "remote_runs_by_action": dict(self._by_action.most_common()),
            "task_seconds": {name: round(seconds, 2) for name, seconds in self._task_seconds.items()},
        }
        with open(path, "w") as handle:
            json.dump(report, handle, indent=2)
