"""The Kubernetes Events of a cluster's decisions: aggregated per step, correlated over steps.

A step of the control loop can make hundreds of decisions of one kind (a broker lost:
``LeaderLost`` on every partition it led). One Event each would flood the API server
and ``kubectl describe``, so, as client-go's ``EventCorrelator`` does for its callers:

1. **Aggregate** (``aggregate``, pure): a step's decisions become one Event per object
   (the Topic a subject names, else the BrokerCluster) and kind, whose message counts
   the subjects and names the first few.
2. **Correlate** (``Correlator``, pure): an Event identical to one posted within
   ``window_ms`` (same object, type, reason and message) is that Event again: the
   stored one is rewritten with ``count`` + 1 and a new ``lastTimestamp``, not a second
   one created. The memory is bounded (least recently posted first out).
3. **Post** (``EventPoster``, the adapter): buffers what a step reports (it is the
   runtime's ``EventSink``) and, at ``flush``, server-side applies each Event through the
   operator's ``KubeApi`` (so a replica that does not hold the Lease posts nothing). A
   refused post is logged, never a failed step.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from headrace.control.documents import condition_time
from headrace.control.reconcile import Event
from headrace.operator.kube import KubeApi, KubeApiError

log = logging.getLogger(__name__)

#: the ``source.component`` of every Event the operator posts
COMPONENT: Final = "headrace-operator"
#: how many subjects an aggregated message names before it only counts the rest
NAMED_SUBJECTS: Final = 5
#: the API server keeps an Event's message to this many characters (events.k8s.io/v1)
MESSAGE_LIMIT: Final = 1024


@dataclass(frozen=True, slots=True)
class Target:
    """The object an Event is about (its ``involvedObject``)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Target:
        meta = body.get("metadata") or {}
        return cls(
            str(body.get("apiVersion", "")),
            str(body.get("kind", "")),
            str(meta.get("namespace", "default")),
            str(meta.get("name", "")),
            str(meta.get("uid", "")),
        )


@dataclass(frozen=True, slots=True)
class Note:
    """One Event's content: what ``aggregate`` makes of a step's decisions on one object."""

    target: Target
    #: Normal or Warning
    type: str
    reason: str
    message: str
    #: how many decisions it stands for
    decisions: int = 1


def event_type(kind: str) -> str:
    """Warning for a failure or an offline partition, Normal otherwise."""
    return "Warning" if "Fail" in kind or "Offline" in kind else "Normal"


def aggregate(events: Iterable[Event], target_of: Callable[[Event], Target | None]) -> list[Note]:
    """One Note per (object, kind), in the order each first appeared; events with no
    object to post on are dropped."""
    groups: dict[tuple[Target, str], list[Event]] = {}
    for event in events:
        target = target_of(event)
        if target is not None:
            groups.setdefault((target, event.kind), []).append(event)
    return [
        Note(target, event_type(kind), kind, _message(group), len(group))
        for (target, kind), group in groups.items()
    ]


def _message(group: Sequence[Event]) -> str:
    first = group[0]
    if len(group) == 1:
        return _clip(f"{first.subject}: {first.message}")
    subjects = list(dict.fromkeys(e.subject for e in group))
    noun = "partitions" if all(_is_partition(s) for s in subjects) else "subjects"
    named = ", ".join(subjects[:NAMED_SUBJECTS])
    rest = len(subjects) - NAMED_SUBJECTS
    more = f" and {rest} more" if rest > 0 else ""
    decisions = "" if len(group) == len(subjects) else f", {len(group)} decisions"
    return _clip(
        f"{len(subjects)} {noun}{decisions} ({named}{more}); {first.subject}: {first.message}"
    )


def _is_partition(subject: str) -> bool:
    return subject.rsplit("/", 1)[-1].isdigit() and subject.count("/") == 2


def _clip(message: str) -> str:
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 1] + "…"


@dataclass(frozen=True, slots=True)
class Posting:
    """The Event to write for a Note: a new one, or a stored one again."""

    name: str
    note: Note
    count: int
    first_ms: int
    last_ms: int

    def manifest(self) -> dict[str, Any]:
        """The core/v1 Event, as ``KubeApi.apply`` takes it."""
        t = self.note.target
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": self.name, "namespace": t.namespace},
            "involvedObject": {
                "apiVersion": t.api_version,
                "kind": t.kind,
                "namespace": t.namespace,
                "name": t.name,
                **({"uid": t.uid} if t.uid else {}),
            },
            "type": self.note.type,
            "reason": self.note.reason,
            "message": self.note.message,
            "count": self.count,
            "firstTimestamp": condition_time(self.first_ms),
            "lastTimestamp": condition_time(self.last_ms),
            "source": {"component": COMPONENT},
        }


class Correlator:
    """client-go's ``EventCorrelator`` for the Events of one operator (pure; see the module).

    ``window_ms``: how long after its last posting an identical Event is counted again
    rather than created anew (client-go's aggregation interval, 10 minutes);
    ``capacity``: how many distinct Events it remembers (client-go's LRU size)."""

    def __init__(self, window_ms: int = 600_000, capacity: int = 4096) -> None:
        self.window_ms = window_ms
        self.capacity = capacity
        self._recent: OrderedDict[tuple[Target, str, str, str], Posting] = OrderedDict()

    def record(self, note: Note, now_ms: int) -> Posting:
        """What to write for ``note`` now: the remembered Event with its count raised, or
        a new one."""
        key = (note.target, note.type, note.reason, note.message)
        before = self._recent.pop(key, None)
        if before is not None and now_ms - before.last_ms <= self.window_ms:
            posting = Posting(before.name, note, before.count + 1, before.first_ms, now_ms)
        else:
            posting = Posting(_event_name(note, now_ms), note, 1, now_ms, now_ms)
        self._recent[key] = posting
        while len(self._recent) > self.capacity:
            self._recent.popitem(last=False)
        return posting


def _event_name(note: Note, now_ms: int) -> str:
    """``<object>.<hex>`` as client-go names Events; the hex also hashes the content, so two
    Events first posted in one millisecond do not share a name."""
    digest = hashlib.sha256(
        f"{note.target}\0{note.type}\0{note.reason}\0{note.message}".encode()
    ).hexdigest()[:8]
    return f"{note.target.name}.{now_ms:x}{digest}"


class EventPoster:
    """The runtime's ``EventSink`` that posts aggregated, correlated Events (see the module).

    ``target_of``: the object a decision's Event goes on (None: nowhere to post it)."""

    def __init__(
        self,
        api: KubeApi,
        target_of: Callable[[Event], Mapping[str, Any] | None],
        now_ms: Callable[[], int],
        correlator: Correlator | None = None,
    ) -> None:
        self.api = api
        self.target_of = target_of
        self.now_ms = now_ms
        self.correlator = correlator or Correlator()
        #: what the step reported, each with its object as it was when reported
        self.pending: list[tuple[Event, Target | None]] = []
        #: Events written (created or counted again), and posts the API server refused
        self.posted = 0
        self.refused = 0

    def __call__(self, event: Event) -> None:
        # The object is looked up now: a step that lets a Topic go (its finalizer removed)
        # reports why before the flush, and by then the Topic may have left the index.
        self.pending.append((event, self._target(event)))

    def _target(self, event: Event) -> Target | None:
        body = self.target_of(event)
        return None if body is None else Target.of(body)

    async def flush(self) -> None:
        """Post what the step reported: one Event per object and kind."""
        reported, self.pending = self.pending, []
        now = self.now_ms()
        targets = {id(event): target for event, target in reported}
        events = [event for event, _ in reported]
        for note in aggregate(events, lambda event: targets[id(event)]):
            posting = self.correlator.record(note, now)
            try:
                await self.api.apply(posting.manifest())
            except KubeApiError as exc:
                self.refused += 1
                log.warning("event %s on %s refused: %s", note.reason, note.target.name, exc)
                continue
            self.posted += 1
