"""Every metric the Grafana dashboards in charts/headrace/dashboards query exists: a broker's
on a real broker's ``/metrics`` (a broker process on loopback, after some traffic), an
operator's (``headrace_operator_*``) in the exposition the operator's ``/metrics`` serves
(its ``Surfaces`` registry, rendered in-process: a live operator needs an API server,
and ``e2e/tests/operator/test_operator_e2e.py`` scrapes one)."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from headrace.operator.surfaces import Surfaces
from headrace.testing.procs import HEADRACE_CLI, BrokerProcess

DASHBOARDS = Path(__file__).resolve().parents[2] / "charts" / "headrace" / "dashboards"
#: a metric name in PromQL: ours all start with headrace_
METRIC = re.compile(r"\b(headrace_[a-z0-9_]+)\b")
OPERATOR_PREFIX = "headrace_operator_"
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "summary": ("_count", "_sum"),
}


def exposed_names(text: str) -> set[str]:
    """Every series name the exposition defines, sampled now or not (a gauge with labels
    has no sample until its first label set, a counter by type until its first error)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + s for s in SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


def dashboard_queries() -> dict[str, str]:
    queries = {}
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                queries[f"{path.name}: {panel['title']} ({target['refId']})"] = target["expr"]
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                queries[f"{path.name}: ${variable['name']}"] = variable["definition"]
    return queries


def test_every_dashboard_metric_exists_on_a_broker(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "broker")
    broker.start()
    try:
        broker.create_topic("dashboard", 2)
        subprocess.run(
            [
                *HEADRACE_CLI,
                "bench",
                "dashboard",
                "--records",
                "200",
                "--bootstrap",
                broker.bootstrap,
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        with urllib.request.urlopen(f"{broker.admin_url}/metrics", timeout=10) as resp:
            exposed = exposed_names(resp.read().decode())
    finally:
        broker.stop()
    # the operator's exposition, as its /metrics renders it (no sample needed: every family
    # writes its HELP and TYPE lines)
    operator = exposed_names(Surfaces("127.0.0.1", 0).metrics.render().decode())
    assert not any(name.startswith(OPERATOR_PREFIX) for name in exposed)

    def absent(expr: str) -> list[str]:
        return sorted(
            name
            for name in set(METRIC.findall(expr))
            if name not in (operator if name.startswith(OPERATOR_PREFIX) else exposed)
        )

    queries = dashboard_queries()
    assert len(queries) >= 10
    assert any(OPERATOR_PREFIX in expr for expr in queries.values())
    missing = {where: absent(expr) for where, expr in queries.items() if absent(expr)}
    assert missing == {}, f"dashboard queries name metrics nothing exposes: {missing}"
    # and no query is left without a metric of ours (a typo'd prefix would slip past above)
    assert all(METRIC.search(expr) for expr in queries.values())
