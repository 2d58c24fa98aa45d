"""What the dashboard keeps between control-loop steps, for any controller (pure).

A controller (the local one, or the kopf operator) holds one ``Observer``,
calls ``observe`` after every step with the heartbeats it polled, and asks it
for the ``view`` whenever the page wants one. It keeps two things the loop does
not: the rates and lag of the last minutes (``rates.RateHistory``), and every
broker's last heartbeat, which the loop drops once a broker is gone, so the page
can still say when a dead broker was last heard from and what it last reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from headrace.control.looping import ControlLoop
from headrace.dashboard.rates import RateHistory
from headrace.dashboard.views import Observed, dashboard_view
from headrace.protocol.coordination import Heartbeat


def observed_of(loop: ControlLoop, now_ms: int) -> Observed:
    """What the loop holds now, as the view takes it: its own typed values, never its
    documents (``Observer.view`` adds the charts and the brokers it stopped hearing from)."""
    decision = loop.last_decision
    return Observed(
        state=loop.state,
        heartbeats=dict(loop.heartbeats),
        liveness=None if decision is None else decision.liveness,
        now_ms=now_ms,
        problems=() if decision is None else decision.problems,
        adoption_floor=None if decision is None else decision.adoption_floor,
        steps=loop.steps,
        unloads=[(r, loop.progress.get(r.name)) for r in loop.unload_requests()],
        repartitions=[
            (r, loop.repartition_progress.get(r.name)) for r in loop.repartition_requests()
        ],
    )


class Observer:
    def __init__(self, cluster_id: str, rates: RateHistory | None = None) -> None:
        self.cluster_id = cluster_id
        self.rates = rates or RateHistory()
        #: every broker's last heartbeat, by broker id (never forgotten: brokers are few)
        self.last_heard: dict[int, Heartbeat] = {}

    def observe(self, now_ms: int, heartbeats: Mapping[int, Heartbeat]) -> None:
        """After every control-loop step: the heartbeats it holds now."""
        self.last_heard.update(heartbeats)
        self.rates.observe(now_ms, heartbeats.values())

    def view(self, now: Observed) -> dict[str, Any]:
        """The view model (``views.dashboard_view``) of what the loop holds ``now``
        (``observed_of``), with this cluster's id and charts."""
        return dashboard_view(
            replace(
                now,
                # a dead broker's last word, which the view marks stale
                heartbeats={**self.last_heard, **now.heartbeats},
                cluster_id=self.cluster_id,
                charts=self.rates.charts(now.now_ms),
            )
        )
