"""Run the chart's Argo CD health checks (Lua) the way Argo CD does: the object as the
global ``obj``, the script's returned table as the health. Shared by the unit test on
recorded statuses and the chart e2e test on live ones."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

CHECKS = Path(__file__).resolve().parents[3] / "charts" / "headrace" / "docs" / "argocd-health"
LUA = "lua5.4"


def lua_literal(value: Any) -> str:
    """``value`` (JSON data) as a Lua table constructor, the shape Argo CD hands ``obj`` in."""
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        assert math.isfinite(value)
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string with \" \\ \n \uXXXX escapes reads the same in Lua
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    return "{" + ", ".join(f"[{json.dumps(k)}] = {lua_literal(v)}" for k, v in value.items()) + "}"


def run_check(kind: str, obj: dict[str, Any]) -> tuple[str, str]:
    lua = shutil.which(LUA)
    if lua is None:
        pytest.fail(f"no {LUA} on PATH: apt-get install -y lua5.4 (.ci/run does)")
    script = (CHECKS / f"{kind.lower()}.lua").read_text()
    # Argo CD runs the script with the object as the global `obj` and takes what it returns
    program = (
        f"obj = {lua_literal(obj)}\n"
        f"local hs = (function()\n{script}\nend)()\n"
        'io.write(hs.status, "\\n", hs.message or "", "\\n")\n'
    )
    done = subprocess.run([lua, "-"], input=program, capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    status, message = done.stdout.split("\n", 2)[:2]
    return status, message
