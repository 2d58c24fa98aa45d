"""Every metric the Grafana dashboard in charts/headrace/dashboards queries exists on a
real broker's ``/metrics`` (a broker process on loopback, after some traffic)."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.procs import HEADRACE_CLI, BrokerProcess

DASHBOARDS = Path(__file__).resolve().parents[2] / "charts" / "headrace" / "dashboards"
#: a metric name in PromQL: ours all start with headrace_
METRIC = re.compile(r"\b(headrace_[a-z0-9_]+)\b")
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
                queries[f"{path.name}: {panel['title']}"] = target["expr"]
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
    queries = dashboard_queries()
    assert len(queries) >= 10
    missing = {
        where: sorted(set(METRIC.findall(expr)) - exposed)
        for where, expr in queries.items()
        if set(METRIC.findall(expr)) - exposed
    }
    assert missing == {}, f"dashboard queries name metrics no broker exposes: {missing}"
    # and no query is left without a metric of ours (a typo'd prefix would slip past above)
    assert all(METRIC.search(expr) for expr in queries.values())
