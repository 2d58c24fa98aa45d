"""The Argo CD health checks shipped in charts/headrace/docs/argocd-health, run by a real
Lua interpreter against recorded statuses (``health_fixtures/*.json``).

Each fixture is an object as the API server returns it (checked against our CRD's
schema here, so a fixture cannot drift from what the operator may write) with the
health Argo CD must show and the status kstatus must compute; the kstatus half runs on
live objects in ``e2e/tests/chart/test_kstatus.py``.

Without ``lua5.4`` this fails and says how to install it (``.ci/run`` does).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from argocd_lua import run_check

from headrace.resources.crdgen import generated

CHART = Path(__file__).resolve().parents[3] / "charts" / "headrace"
CHECKS = CHART / "docs" / "argocd-health"
FIXTURES = sorted((Path(__file__).parent / "health_fixtures").glob("*.json"))


@functools.cache
def crd_schema(kind: str) -> dict[str, Any]:
    for text in generated().values():
        crd = yaml.safe_load(text)
        if crd["spec"]["names"]["kind"] == kind:
            schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            return schema
    raise AssertionError(f"no CRD for {kind}")


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_argocd_health_of_recorded_status(fixture: Path) -> None:
    doc = json.loads(fixture.read_text())
    obj = doc["object"]
    jsonschema.validate(obj, crd_schema(obj["kind"]))
    status, message = run_check(obj["kind"], obj)
    assert status == doc["argocd"], message
    if "status" in obj and status != "Suspended":
        # the message carries the operator's reason, so the UI says why
        ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
        if obj["status"]["observedGeneration"] == obj["metadata"]["generation"]:
            assert ready["reason"] in message


def test_every_checked_kind_has_fixtures_of_each_health() -> None:
    seen: dict[str, set[str]] = {}
    for fixture in FIXTURES:
        doc = json.loads(fixture.read_text())
        seen.setdefault(doc["object"]["kind"], set()).add(doc["argocd"])
    assert {p.stem for p in CHECKS.glob("*.lua")} == {k.lower() for k in seen}
    for kind, healths in seen.items():
        assert {"Healthy", "Progressing", "Degraded"} <= healths, kind


def test_the_documented_argocd_config_embeds_the_checks_verbatim() -> None:
    # docs/argocd.md's argocd-cm snippet is what users paste: it must be these files
    doc = (CHART / "docs" / "argocd.md").read_text()
    for check in CHECKS.glob("*.lua"):
        body = "\n".join("    " + line if line else "" for line in check.read_text().splitlines())
        assert body in doc, f"{check.name} differs from its copy in charts/headrace/docs/argocd.md"
