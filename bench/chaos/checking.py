"""The campaign's independent checker (pure: no I/O, no clock).

Inputs are three plain facts gathered by the driver:

* ``acked``: every record the producer got an acknowledgement for, with the
  (partition, offset) the broker acknowledged it at;
* ``stored``: every partition read back from offset 0 with plain FETCH
  requests (no cohort), in offset order;
* ``deliveries``: the cohort members' delivery logs, in the order each member
  received the records.

A record's value is ``b"<key>:<seq>"``: its key and its per-key sequence
number, so the checker needs nothing else to tell records apart and to check
per-key order.

Optionally, ``in_order``: every delivery of every member in the one order the
consuming process handled them. A repartition moves a key to another
partition, so per-partition order says nothing about the cutover; this order
does: a key's records must be delivered for the first time in increasing
sequence, across partitions (a redelivery may go back; a first delivery may
not).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Acked:
    """One acknowledged record and where the broker said it put it."""

    value: bytes
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Delivery:
    """One record as a cohort member received it."""

    member: str
    partition: int
    offset: int
    value: bytes


def parse_value(value: bytes) -> tuple[bytes, int]:
    """``b"key:seq"`` -> (key, seq); ValueError for anything else (a corrupted record)."""
    key, sep, seq = value.rpartition(b":")
    if not sep or not seq.isdigit():
        raise ValueError(f"record value {value!r} is not key:seq")
    return key, int(seq)


def check(
    acked: Iterable[Acked],
    stored: Mapping[int, Sequence[tuple[int, bytes]]],
    deliveries: Iterable[Delivery],
    *,
    failed_sends: int = 0,
    in_order: Iterable[Delivery] | None = None,
) -> dict[str, Any]:
    """The verdict as a JSON-able dict; ``ok`` is true when every check holds.

    Checks (each counted, with up to 10 examples):

    * ``lost``: an acknowledged record not stored at the offset it was acknowledged at;
    * ``duplicated``: a value stored at more than one offset (acknowledged or not);
    * ``gaps``: a partition whose offsets are not exactly 0, 1, 2, ...;
    * ``order_violations``: two records of one key in a partition whose sequence
      numbers do not increase with the offset;
    * ``offsets_reused``: one (partition, offset) acknowledged for two values, or
      delivered with a value other than the stored one;
    * ``key_order_violations``: in ``in_order``, a record delivered for the first time
      after a record of the same key with a higher sequence number (across partitions:
      what a cutover must keep);
    * ``undelivered``: an acknowledged record no member delivered;
    * ``redeliveries``: deliveries beyond the first of a (partition, offset).
    """
    acked = list(acked)
    deliveries = list(deliveries)
    examples: dict[str, list[str]] = {}

    def note(kind: str, text: str) -> None:
        bucket = examples.setdefault(kind, [])
        if len(bucket) < 10:
            bucket.append(text)

    at: dict[tuple[int, int], bytes] = {}
    gaps = 0
    occurrences: Counter[bytes] = Counter()
    order_violations = 0
    corrupt = 0
    for partition, records in sorted(stored.items()):
        offsets = [o for o, _ in records]
        if offsets != list(range(len(offsets))):
            gaps += 1
            first_bad = next((i for i, o in enumerate(offsets) if o != i), len(offsets))
            note(
                "gaps",
                f"partition {partition}: offset {first_bad} expected, got {offsets[first_bad : first_bad + 3]}",
            )
        last_seq: dict[bytes, tuple[int, int]] = {}
        for offset, value in records:
            at[(partition, offset)] = value
            occurrences[value] += 1
            try:
                key, seq = parse_value(value)
            except ValueError:
                corrupt += 1
                note("corrupt", f"{partition}@{offset}: {value[:40]!r}")
                continue
            previous = last_seq.get(key)
            if previous is not None and seq <= previous[0]:
                order_violations += 1
                note(
                    "order_violations",
                    f"partition {partition}: key {key!r} seq {seq} at {offset}"
                    f" after seq {previous[0]} at {previous[1]}",
                )
            last_seq[key] = (seq, offset)
    duplicated = [v for v, n in occurrences.items() if n > 1]
    for v in duplicated[:10]:
        note("duplicated", f"{v!r} stored {occurrences[v]} times")

    lost = 0
    offsets_reused = 0
    acked_at: dict[tuple[int, int], bytes] = {}
    for a in acked:
        position = (a.partition, a.offset)
        other = acked_at.setdefault(position, a.value)
        if other != a.value:
            offsets_reused += 1
            note(
                "offsets_reused",
                f"{a.partition}@{a.offset} acknowledged for {other!r} and {a.value!r}",
            )
        if at.get(position) != a.value:
            lost += 1
            note(
                "lost",
                f"{a.value!r} acknowledged at {a.partition}@{a.offset}, stored there: {at.get(position)!r}",
            )

    delivered: Counter[tuple[int, int]] = Counter()
    for d in deliveries:
        position = (d.partition, d.offset)
        delivered[position] += 1
        stored_value = at.get(position)
        if stored_value is not None and stored_value != d.value:
            offsets_reused += 1
            note(
                "offsets_reused",
                f"{d.member} got {d.value!r} at {d.partition}@{d.offset}, stored: {stored_value!r}",
            )
    undelivered = 0
    for a in acked:
        if delivered[(a.partition, a.offset)] == 0:
            undelivered += 1
            note("undelivered", f"{a.value!r} at {a.partition}@{a.offset}")
    redeliveries = sum(n - 1 for n in delivered.values() if n > 1)
    key_order_violations = 0
    first_seen: set[tuple[int, int]] = set()
    highest: dict[bytes, tuple[int, int, int]] = {}
    for d in in_order or ():
        position = (d.partition, d.offset)
        if position in first_seen:
            continue  # a redelivery
        first_seen.add(position)
        try:
            key, seq = parse_value(d.value)
        except ValueError:
            continue  # counted as corrupt when stored
        previous = highest.get(key)
        if previous is not None and seq < previous[0]:
            key_order_violations += 1
            note(
                "key_order_violations",
                f"key {key!r} seq {seq} ({d.partition}@{d.offset}) delivered after seq"
                f" {previous[0]} ({previous[1]}@{previous[2]})",
            )
        else:
            highest[key] = (seq, d.partition, d.offset)
    acked_values = {a.value for a in acked}
    stored_total = sum(len(r) for r in stored.values())
    counts = {
        "acknowledged": len(acked),
        "failed_sends": failed_sends,
        "stored": stored_total,
        "stored_unacknowledged": sum(1 for v in occurrences if v not in acked_values),
        "lost": lost,
        "duplicated": len(duplicated),
        "gaps": gaps,
        "order_violations": order_violations,
        "key_order_violations": key_order_violations,
        "offsets_reused": offsets_reused,
        "corrupt": corrupt,
        "deliveries": len(deliveries),
        "undelivered": undelivered,
        "redeliveries": redeliveries,
        "max_redeliveries_of_one_record": max(delivered.values(), default=1) - 1,
    }
    bad = (
        "lost",
        "duplicated",
        "gaps",
        "order_violations",
        "key_order_violations",
        "offsets_reused",
        "corrupt",
        "undelivered",
    )
    return {
        "ok": all(counts[k] == 0 for k in bad),
        "counts": counts,
        "examples": examples,
    }


# ---------------------------------------------------------------------- the control plane
#
# The operator campaign (``bench.chaos.operator``) adds three facts about the control plane
# to the records' verdict above, gathered by polling while the faults ran and at the end.


@dataclass(frozen=True, slots=True)
class LeaderClaim:
    """One observation that ``leader`` leads ``partition`` at ``epoch``: from the Topic's
    status (``source`` "status") or from a broker's own heartbeat (``source`` "broker N")."""

    source: str
    partition: int
    epoch: int
    leader: int


@dataclass(frozen=True, slots=True)
class Transition:
    """One transition a round started (a Repartition, an Unload, a rolling restart of a
    pod, a scale) and what became of it: ``finished`` when it reached its end state;
    ``times``: how many times it took effect (a partitioning version bump, an unload's
    incarnation bump, a pod's replacement, a change of the StatefulSet's replica count)."""

    round: int
    kind: str
    name: str
    finished: bool
    times: int
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ObjectHealth:
    """One object's conditions at the end: its Ready status, and Stalled with its reason."""

    kind: str
    name: str
    ready: str | None
    stalled: bool
    reason: str


def check_control(
    claims: Iterable[LeaderClaim],
    transitions: Iterable[Transition],
    objects: Iterable[ObjectHealth],
) -> dict[str, Any]:
    """The control plane's verdict as a JSON-able dict (``ok``, ``counts``, ``examples``):

    * ``split_epochs``: a (partition, epoch) claimed for two different leaders, across
      every source (the status and the brokers);
    * ``unfinished_transitions``: a transition that did not reach its end state;
    * ``repeated_transitions``: a finished transition that took effect other than once;
    * ``unhealthy_objects``: an object neither ``Ready=True`` nor ``Stalled`` with a reason.
    """
    examples: dict[str, list[str]] = {}

    def note(kind: str, text: str) -> None:
        bucket = examples.setdefault(kind, [])
        if len(bucket) < 10:
            bucket.append(text)

    leaders: dict[tuple[int, int], dict[int, str]] = {}
    for c in claims:
        leaders.setdefault((c.partition, c.epoch), {}).setdefault(c.leader, c.source)
    split = 0
    for (partition, epoch), by_leader in sorted(leaders.items()):
        if len(by_leader) > 1:
            split += 1
            note(
                "split_epochs",
                f"partition {partition} epoch {epoch}: "
                + ", ".join(f"broker {b} (seen by {s})" for b, s in sorted(by_leader.items())),
            )
    transitions = list(transitions)
    unfinished = [t for t in transitions if not t.finished]
    repeated = [t for t in transitions if t.finished and t.times != 1]
    for t in unfinished:
        note("unfinished_transitions", f"round {t.round} {t.kind} {t.name}: {t.detail}")
    for t in repeated:
        note("repeated_transitions", f"round {t.round} {t.kind} {t.name}: {t.times} times")
    unhealthy = [
        o for o in objects if not (o.ready == "True" or (o.stalled and o.reason.strip() != ""))
    ]
    for o in unhealthy:
        note("unhealthy_objects", f"{o.kind} {o.name}: Ready={o.ready} reason {o.reason!r}")
    counts = {
        "epochs_seen": len(leaders),
        "split_epochs": split,
        "transitions": len(transitions),
        "unfinished_transitions": len(unfinished),
        "repeated_transitions": len(repeated),
        "unhealthy_objects": len(unhealthy),
    }
    bad = ("split_epochs", "unfinished_transitions", "repeated_transitions", "unhealthy_objects")
    return {"ok": all(counts[k] == 0 for k in bad), "counts": counts, "examples": examples}
