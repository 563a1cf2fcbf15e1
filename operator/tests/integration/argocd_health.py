"""The Argo CD health checks of docs/install.md, run as Argo CD runs them: the Lua of
`resource.customizations.health.<group>_<kind>` in Lua 5.1 (Argo CD's gopher-lua speaks 5.1), with the
object as the global `obj`, returning {status, message}. Used by the unit tests (status tables) and by
the GitOps tests (the live objects the operator and the webhook reconciled)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from lupa import lua51

INSTALL = Path(__file__).resolve().parents[3] / "docs" / "install.md"
PREFIX = "resource.customizations.health."


def health_checks() -> dict[str, str]:
    """The argocd-cm data of the docs' YAML block: key -> Lua."""
    blocks = re.findall(r"```yaml\n(.*?)```", INSTALL.read_text(), re.DOTALL)
    config = next(yaml.safe_load(b) for b in blocks if "argocd-cm" in b)
    return {str(k): str(v) for k, v in config["data"].items()}


def health(obj: dict[str, Any]) -> tuple[str, str]:
    """(status, message) the docs' check for the object's kind gives it."""
    group = obj["apiVersion"].split("/")[0]
    script = health_checks()[f"{PREFIX}{group}_{obj['kind']}"]
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    runtime.globals().obj = _to_lua(runtime, obj)
    result = runtime.execute(script)
    return str(result["status"]), str(result["message"])


def _to_lua(runtime: Any, value: Any) -> Any:
    """JSON-like data as Lua tables (lists 1-based, as Argo CD hands them to the script)."""
    if isinstance(value, dict):
        return runtime.table_from({k: _to_lua(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([_to_lua(runtime, v) for v in value])
    return value
