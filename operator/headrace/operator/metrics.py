"""The operator's Prometheus metrics: what the cluster loops and the workload handler count.

The loops (``running``) and handlers (``handlers``) record into them; the surfaces
(``surfaces``) serve them at ``/metrics``, with the gauges read at scrape time.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

#: the kinds of reconcile counted: a control-loop step of a BrokerCluster, and an apply of
#: its workload (StatefulSet, Services, PDB, ConfigMap)
STEP: Final = "BrokerCluster"
WORKLOAD: Final = "Workload"


class OperatorMetrics:
    """The operator's Prometheus metrics, in a registry of its own (one per process;
    tests make their own)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "headrace_operator_reconciles",
            "Reconciles run, by kind (BrokerCluster: a control-loop step; Workload: an apply).",
            ["kind"],
            registry=self.registry,
        )
        self.errors = Counter(
            "headrace_operator_reconcile_errors",
            "Reconciles that raised, by kind.",
            ["kind"],
            registry=self.registry,
        )
        self.durations = Histogram(
            "headrace_operator_reconcile_duration_seconds",
            "How long a reconcile took, by kind.",
            ["kind"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=self.registry,
        )
        self.status_writes = Counter(
            "headrace_operator_status_writes",
            "Status (and finalizer) writes that the API server accepted.",
            registry=self.registry,
        )
        self.status_conflicts = Counter(
            "headrace_operator_status_conflicts",
            "Status writes refused with 409 (the object moved on; re-read and retried).",
            registry=self.registry,
        )

        for kind in (STEP, WORKLOAD):  # every series exists from the start, at 0
            for family in (self.reconciles, self.errors, self.durations):
                family.labels(kind)

    def render(self) -> bytes:
        return generate_latest(self.registry)
