"""What a producer does after a produce attempt fails: a pure decision, no I/O.

A partition's sender (``producer._PartitionSender``) describes the failure of its
oldest batch in flight (``Failure``, ``Attempt``) and asks ``decide`` what to do;
it then carries the decision out: it asks the cluster where the partition is,
waits, resends or fails the batch's receipt. As in aiokafka's sender, where a
response handler returns a backoff and the sender does the I/O, the rules live
here and can be read (and tested) as one table, in this order:

1. A Redirect naming another partitioning version than the batch's: a
   repartition's fence refused it. ``Reroute``: the sender asks which version is
   current and routes the records again if it is not the batch's. If it is, only
   the answering broker is behind: the sender waits and decides again with
   ``fence_checked``.
2. An ``OutOfOrderSequence`` after ``GAP_ATTEMPTS`` attempts: resending in order
   did not close the gap (the broker lost acknowledged batches, or its state for
   this producer), so the partition goes on under a new producer identity
   (``new_identity``, in a ``Retry`` or a ``Fail``).
3. A ``TokenRotated`` before the batch's delivery deadline: the broker refused the
   token the connection presented, before appending anything, and the client's token
   source yields a new one. ``Retry`` at once, without a refresh (where the partition
   is did not change): the resend goes on a new connection, which presents the new
   token. (A refusal of the token the source still yields is ``AuthenticationFailed``,
   not retriable: rule 5.)
4. A retriable error before the batch's delivery deadline: ``Retry`` the batch
   and every batch behind it, in order, after telling the routing cache what a
   Redirect said, refreshing the topology when the error says the cache may be
   wrong (or the leader may be deposed), and backing off unless the broker
   already said where to go (a Redirect) or what to send (a sequence gap). If
   the deadline passes while the sender refreshes or backs off, it decides
   again, out of time: a resend's answer could not be waited for. An
   ``UnknownTopic`` or ``UnknownPartition`` counts as retriable here while the
   client's routing names the partition (``Failure.routing_has_partition``): the
   controller publishes a topic (or a grow) to the brokers one by one, so a broker
   may answer before it has applied what the routing already shows. Once a
   refresh no longer names it, the topic is gone and the next failure is final.
5. Otherwise ``Fail`` the batch. A non-retriable error means the broker refused
   it before appending, so nothing behind it was appended either: the rest are
   renumbered from its sequence. So they are when the partition has just moved to
   a new identity, under which the batch was never sent. A retriable error out of
   time otherwise has an unknown outcome: the rest keep their numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from headrace.errors import (
    ConnectionClosed,
    HeadraceError,
    NotEnoughReplicas,
    NotLeader,
    OutOfOrderSequence,
    RequestTimedOut,
    TokenRotated,
    UnknownPartition,
    UnknownTopic,
)
from headrace.protocol import messages as msg

#: attempts after which a persisting sequence gap moves the partition to a new identity
GAP_ATTEMPTS = 3
#: the longest backoff between attempts (milliseconds), however many there were
MAX_BACKOFF_MS = 2000


class LeaderMoved(NotLeader):
    """The broker a batch went to has not answered, and the topology names another leader."""


@dataclass(frozen=True, slots=True)
class Failure:
    """Why an attempt failed."""

    error: HeadraceError
    #: the Redirect the broker answered with (``connection.RedirectReceived``), if any
    redirect: msg.Redirect | None = None
    #: the client's routing names the batch's partition (rule 4: a broker that does not
    #: know it yet is behind the topology, not right)
    routing_has_partition: bool = False

    @property
    def retriable(self) -> bool:
        if isinstance(self.error, UnknownTopic | UnknownPartition):
            return self.routing_has_partition
        return self.error.retriable


@dataclass(frozen=True, slots=True)
class Attempt:
    """The failed batch, as far as the decision depends on it."""

    topic: str
    partition: int
    #: the partitioning version its records were routed under
    version: int
    #: attempts made so far, the failed one included
    attempts: int
    #: monotonic seconds by which it must be acknowledged (``delivery_timeout_ms``)
    deadline: float


@dataclass(frozen=True, slots=True)
class Reroute:
    """The fence refused the batch: route the partition's batches of other versions again
    under the cluster's current version. If that is the batch's own version, wait
    ``backoff_s`` and decide again with ``fence_checked``."""

    redirect: msg.Redirect
    backoff_s: float


@dataclass(frozen=True, slots=True)
class Retry:
    """Resend the failed batch and every batch in flight behind it, in order."""

    #: a Redirect whose owner the routing cache is told first
    note_redirect: msg.Redirect | None
    #: ask the brokers for the topology before resending
    refresh: bool
    #: seconds to wait before resending; None: resend at once
    backoff_s: float | None
    #: continue under a new producer identity on this partition first
    new_identity: bool = False


@dataclass(frozen=True, slots=True)
class Fail:
    """Fail the batch's receipt with ``error``; the batches behind it go on."""

    error: HeadraceError
    #: the broker appended nothing from this batch on: renumber the rest from its sequence
    renumber_rest: bool
    #: continue under a new producer identity on this partition first
    new_identity: bool = False


Decision = Reroute | Retry | Fail


def decide(
    failure: Failure,
    attempt: Attempt,
    *,
    now: float,
    retry_backoff_ms: int,
    fence_checked: bool = False,
) -> Decision:
    """What the sender does about ``failure`` of ``attempt`` at monotonic time ``now``."""
    error, redirect = failure.error, failure.redirect
    if (
        redirect is not None
        and not fence_checked
        and redirect.partitioning_version != attempt.version
    ):
        return Reroute(redirect, retry_backoff_ms / 1000)
    if isinstance(error, TokenRotated) and now < attempt.deadline:
        return Retry(None, refresh=False, backoff_s=None)
    new_identity = isinstance(error, OutOfOrderSequence) and attempt.attempts >= GAP_ATTEMPTS
    if failure.retriable and now < attempt.deadline:
        # A leader that cannot replicate (NotEnoughReplicas) or does not answer may have
        # been deposed behind a partition that this client does not share: ask again.
        refresh = (
            error.invalid_metadata
            or redirect is not None
            or isinstance(error, ConnectionClosed | NotEnoughReplicas | RequestTimedOut)
        )
        told_what_to_do = redirect is not None or isinstance(error, OutOfOrderSequence)
        backoff = (
            None
            if told_what_to_do
            else min(retry_backoff_ms * attempt.attempts, MAX_BACKOFF_MS) / 1000
        )
        return Retry(redirect, refresh, backoff, new_identity)
    if error.retriable and (
        redirect is not None or isinstance(error, ConnectionClosed | LeaderMoved)
    ):
        # Out of time while the broker was unreachable or moving: say so. Otherwise the
        # last error itself (e.g. NotEnoughReplicas) tells the caller most.
        error = RequestTimedOut(
            f"batch for {attempt.topic}/{attempt.partition} not acknowledged in time: {error}"
        )
    # Refused before it was appended (not retriable), or never sent under the identity the
    # partition moves to now: either way nothing from this batch on was appended.
    renumber_rest = not failure.error.retriable or new_identity
    return Fail(error, renumber_rest=renumber_rest, new_identity=new_identity)
