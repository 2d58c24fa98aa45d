"""The Helm chart's files that must agree with the code: CRDs, values and their schema.

``helm lint``/``helm template`` of every scenario run in ``e2e/tests/chart`` (they need
the test bed's helm); these checks are pure file reads.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from headrace.resources.crdgen import generated

CHART = Path(__file__).resolve().parents[3] / "charts" / "headrace"


def test_chart_crds_are_what_the_models_generate() -> None:
    # one source: `make generate` writes crds/ and charts/headrace/crds/ from the models
    committed = {p.name: p.read_text() for p in sorted((CHART / "crds").glob("*.yaml"))}
    assert committed == generated(), "charts/headrace/crds is stale: run `make generate`"


def _leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of values.yaml's keys, descending only into maps the chart defines."""
    paths = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        paths.append(path)
        # maps passed through to Kubernetes as they are (resources, securityContext...)
        # are values themselves; the chart's own sections are described key by key
        if isinstance(value, dict) and value and path not in PASSTHROUGH:
            paths += _leaves(value, f"{path}.")
    return paths


PASSTHROUGH = {
    "operator.resources",
    "operator.podSecurityContext",
    "operator.securityContext",
    "minio.podSecurityContext",
    "minio.securityContext",
}


def test_every_value_is_commented() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    values = yaml.safe_load("\n".join(lines))
    uncommented = []
    for path in _leaves(values):
        key = path.rsplit(".", 1)[-1]
        depth = path.count(".")
        pattern = re.compile(rf"^{' ' * (2 * depth)}{re.escape(key)}:")
        index = next(
            i for i, line in enumerate(lines) if pattern.match(line) and _under(lines, i, path)
        )
        if not lines[index - 1].lstrip().startswith("#"):
            uncommented.append(path)
    assert uncommented == [], f"values without a comment line above them: {uncommented}"


def _under(lines: list[str], index: int, path: str) -> bool:
    """Whether line ``index`` is the key ``path`` (its parents are the nearest less-indented keys)."""
    parents = path.split(".")[:-1]
    indent = len(lines[index]) - len(lines[index].lstrip())
    for parent in reversed(parents):
        indent -= 2
        index = next(
            i
            for i in range(index - 1, -1, -1)
            if lines[i].strip()
            and not lines[i].lstrip().startswith("#")
            and len(lines[i]) - len(lines[i].lstrip()) == indent
        )
        if lines[index].strip() != f"{parent}:":
            return False
    return True


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    paths = set()
    for key, sub in schema.get("properties", {}).items():
        paths.add(f"{prefix}{key}")
        if sub.get("type") == "object" and "properties" in sub:
            paths |= _schema_paths(sub, f"{prefix}{key}.")
    return paths


def test_schema_describes_exactly_the_values() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(_leaves(values)) == _schema_paths(schema)


def test_every_scenario_file_names_known_values() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    known = _schema_paths(schema)
    scenarios = sorted((CHART / "ci").glob("*-values.yaml"))
    assert len(scenarios) >= 4
    for scenario in scenarios:
        doc = yaml.safe_load(scenario.read_text()) or {}
        unknown = [p for p in _leaves(doc) if p not in known and p.rsplit(".", 1)[0] not in known]
        assert unknown == [], f"{scenario.name}: {unknown}"


def test_generate_writes_the_chart_copy_too(tmp_path: Path) -> None:
    # `make generate` passes charts/headrace/crds/ as an extra CRD directory
    from headrace.cli.generate import main

    root_crds, chart_crds = tmp_path / "crds", tmp_path / "chart-crds"
    assert main([str(root_crds), str(tmp_path / "reference.md"), str(chart_crds)]) == 0
    assert {p.name: p.read_text() for p in root_crds.iterdir()} == generated()
    assert {p.name: p.read_text() for p in chart_crds.iterdir()} == generated()
