"""``retry_policy.decide``: what a producer's sender does about each error a produce can meet.

One row per error class the broker (or the client's own connection) can raise, so a new
error class fails ``test_every_error_class_has_a_row`` until someone decides how a
producer treats it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from headrace import errors
from headrace.client import retry_policy as rp
from headrace.client.retry_policy import Fail, Reroute, Retry
from headrace.protocol import messages as msg

NOW = 1_000.0
IN_TIME = NOW + 60
OUT_OF_TIME = NOW - 1
BACKOFF_MS = 100
VERSION = 4


def attempt(*, attempts: int = 2, deadline: float = IN_TIME) -> rp.Attempt:
    return rp.Attempt("default/t", 3, VERSION, attempts, deadline)


def decide(
    error: errors.HeadraceError,
    *,
    redirect: msg.Redirect | None = None,
    attempts: int = 2,
    deadline: float = IN_TIME,
    fence_checked: bool = False,
) -> rp.Decision:
    return rp.decide(
        rp.Failure(error, redirect),
        attempt(attempts=attempts, deadline=deadline),
        now=NOW,
        retry_backoff_ms=BACKOFF_MS,
        fence_checked=fence_checked,
    )


@dataclass(frozen=True)
class Row:
    """How a producer treats one error class, in time and out of it."""

    error: type[errors.HeadraceError]
    #: in time: retried (with a refresh first, or not), or failed as is
    in_time: Retry | None
    #: out of time: the class the receipt raises, and whether the rest are renumbered
    fails_as: type[errors.HeadraceError]
    renumber_rest: bool


#: backoff after the second attempt: retry_backoff_ms times the attempts
BACKED_OFF = 2 * BACKOFF_MS / 1000

RETRY = Retry(None, refresh=False, backoff_s=BACKED_OFF)
RETRY_AFTER_REFRESH = Retry(None, refresh=True, backoff_s=BACKED_OFF)


def refused(error: type[errors.HeadraceError]) -> Row:
    """Refused before it was appended: failed at once, the rest renumbered."""
    return Row(error, None, error, renumber_rest=True)


ROWS = [
    refused(errors.HeadraceError),
    refused(errors.MalformedFrame),
    refused(errors.UnknownOperation),
    refused(errors.UnsupportedVersion),
    refused(errors.CorruptBatch),
    refused(errors.UnknownCodec),
    refused(errors.DecompressionFailed),
    refused(errors.InvalidRecordBatch),
    refused(errors.CodecUnavailable),
    refused(errors.BatchTooLarge),
    refused(errors.FrameTooLarge),
    refused(errors.InvalidRequest),
    refused(errors.PolicyViolation),
    refused(errors.AuthenticationFailed),
    refused(errors.IllegalSaslState),
    refused(errors.NotAuthenticated),
    refused(errors.AccessDenied),
    refused(errors.ProduceDenied),
    refused(errors.ConsumeDenied),
    refused(errors.AdminDenied),
    refused(errors.ClusterDenied),
    # a topic or partition the client's routing does not name either: not retried (a
    # broker behind the routing: test_a_broker_behind_the_routing_is_retried)
    refused(errors.UnknownTopic),
    refused(errors.UnknownPartition),
    refused(errors.TopicAlreadyExists),
    refused(errors.InvalidTopicSpec),
    refused(errors.OffsetOutOfRange),
    Row(
        errors.StalePartitioningVersion, RETRY_AFTER_REFRESH, errors.StalePartitioningVersion, False
    ),
    Row(errors.NotLeader, RETRY_AFTER_REFRESH, errors.NotLeader, False),
    Row(errors.StaleEpoch, RETRY_AFTER_REFRESH, errors.StaleEpoch, False),
    # a leader that cannot replicate may have been deposed behind a partition
    Row(errors.NotEnoughReplicas, RETRY_AFTER_REFRESH, errors.NotEnoughReplicas, False),
    Row(errors.RequestTimedOut, RETRY_AFTER_REFRESH, errors.RequestTimedOut, False),
    Row(errors.StorageError, RETRY, errors.StorageError, False),
    refused(errors.DuplicateSequence),
    # resent in order at once: the batches behind it close the gap
    Row(
        errors.OutOfOrderSequence,
        Retry(None, refresh=False, backoff_s=None),
        errors.OutOfOrderSequence,
        False,
    ),
    Row(errors.BrokerShuttingDown, RETRY, errors.BrokerShuttingDown, False),
    refused(errors.CorruptSegmentObject),
    Row(errors.PartitionMoving, RETRY_AFTER_REFRESH, errors.PartitionMoving, False),
    refused(errors.InvalidMemberId),
    Row(errors.MemberIdInUse, RETRY, errors.MemberIdInUse, False),
    refused(errors.UnknownMember),
    refused(errors.NotGateHolder),
    refused(errors.AlreadyJoined),
    refused(errors.CohortActive),
    refused(errors.InvalidMemberIdentity),
    refused(errors.UnsupportedDocument),
    # the broker went away: out of time, the caller hears that it timed out
    Row(errors.ConnectionClosed, RETRY_AFTER_REFRESH, errors.RequestTimedOut, False),
    # a Redirect without its body (the client could not follow it)
    Row(errors.Redirected, RETRY_AFTER_REFRESH, errors.Redirected, False),
    Row(rp.LeaderMoved, RETRY_AFTER_REFRESH, errors.RequestTimedOut, False),
    # the token source has a new token: resent at once on a new connection that presents
    # it; nowhere else to look (the partition did not move)
    Row(
        errors.TokenRotated,
        Retry(None, refresh=False, backoff_s=None),
        errors.RequestTimedOut,
        False,
    ),
]


def test_every_error_class_has_a_row() -> None:
    assert {row.error for row in ROWS} >= set(errors.all_error_classes().values())


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.error.__name__)
def test_in_time(row: Row) -> None:
    error = row.error("refused")
    decision = decide(error)
    if row.in_time is None:
        assert decision == Fail(error, renumber_rest=True)
    else:
        assert decision == row.in_time


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.error.__name__)
def test_out_of_time(row: Row) -> None:
    error = row.error("refused")
    decision = decide(error, deadline=OUT_OF_TIME)
    assert isinstance(decision, Fail)
    assert type(decision.error) is row.fails_as
    assert decision.renumber_rest is row.renumber_rest
    assert not decision.new_identity
    if row.fails_as is row.error:
        assert decision.error is error
    else:
        assert "default/t/3 not acknowledged in time: refused" in str(decision.error)


def redirect(version: int) -> msg.Redirect:
    return msg.Redirect("default/t", 3, None, version, 7, "not the leader")


def test_a_redirect_under_the_batch_s_version_is_noted_and_resent_at_once() -> None:
    r = redirect(VERSION)
    assert decide(errors.Redirected("x"), redirect=r) == Retry(r, refresh=True, backoff_s=None)


def test_a_redirect_under_another_version_reroutes_first() -> None:
    r = redirect(VERSION + 1)
    assert decide(errors.Redirected("x"), redirect=r) == Reroute(r, BACKOFF_MS / 1000)
    # the cluster's version is the batch's own: only the answering broker is behind
    assert decide(errors.Redirected("x"), redirect=r, fence_checked=True) == Retry(
        r, refresh=True, backoff_s=None
    )


def test_a_redirect_out_of_time_fails_as_timed_out_and_keeps_the_numbers() -> None:
    r = redirect(VERSION)
    decision = decide(errors.Redirected("moving"), redirect=r, deadline=OUT_OF_TIME)
    assert isinstance(decision, Fail)
    assert isinstance(decision.error, errors.RequestTimedOut)
    assert not decision.renumber_rest


def test_the_fence_reroutes_even_out_of_time() -> None:
    r = redirect(VERSION + 1)
    assert isinstance(decide(errors.Redirected("x"), redirect=r, deadline=OUT_OF_TIME), Reroute)


@pytest.mark.parametrize(
    ("attempts", "backoff_s"), [(1, 0.1), (2, 0.2), (19, 1.9), (20, 2.0), (50, 2.0)]
)
def test_the_backoff_grows_with_the_attempts_up_to_two_seconds(
    attempts: int, backoff_s: float
) -> None:
    decision = decide(errors.StorageError("disk"), attempts=attempts)
    assert isinstance(decision, Retry)
    assert decision.backoff_s == pytest.approx(backoff_s)


@pytest.mark.parametrize(
    ("attempts", "new_identity"), [(1, False), (2, False), (3, True), (7, True)]
)
def test_a_sequence_gap_that_persists_moves_to_a_new_identity(
    attempts: int, new_identity: bool
) -> None:
    gap = errors.OutOfOrderSequence("gap")
    assert decide(gap, attempts=attempts) == Retry(
        None, refresh=False, backoff_s=None, new_identity=new_identity
    )
    out_of_time = decide(gap, attempts=attempts, deadline=OUT_OF_TIME)
    assert isinstance(out_of_time, Fail)
    assert out_of_time.new_identity is new_identity
    # never sent under the new identity: the rest follow it from its sequence
    assert out_of_time.renumber_rest is new_identity


def test_the_deadline_is_exclusive() -> None:
    assert isinstance(decide(errors.StorageError("disk"), deadline=NOW), Fail)


@pytest.mark.parametrize("attempts", [1, 2, 7])
def test_a_rotated_token_is_resent_at_once_and_a_refused_one_fails(attempts: int) -> None:
    """The connection says which: ``TokenRotated`` when the client's token source yields
    another token than the refused one, else the broker's ``AuthenticationFailed``."""
    assert decide(errors.TokenRotated("no longer accepted"), attempts=attempts) == Retry(
        None, refresh=False, backoff_s=None
    )
    refused_token = errors.AuthenticationFailed("no longer accepted")
    assert decide(refused_token, attempts=attempts) == Fail(refused_token, renumber_rest=True)


@pytest.mark.parametrize("error", [errors.UnknownTopic, errors.UnknownPartition])
def test_a_broker_behind_the_routing_is_retried(error: type[errors.HeadraceError]) -> None:
    """The controller publishes a topic (or a grow) to the brokers one by one: a broker
    that does not know a partition the routing names has not applied it yet. Retried
    after a refresh until the deadline; out of time it fails as refused (nothing was
    appended, so the rest are renumbered)."""
    failure = rp.Failure(error("not here yet"), routing_has_partition=True)
    in_time = rp.decide(failure, attempt(), now=NOW, retry_backoff_ms=BACKOFF_MS)
    assert in_time == RETRY_AFTER_REFRESH
    out = rp.decide(failure, attempt(deadline=OUT_OF_TIME), now=NOW, retry_backoff_ms=BACKOFF_MS)
    assert out == Fail(failure.error, renumber_rest=True)
