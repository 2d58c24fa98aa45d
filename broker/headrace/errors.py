"""One error tree for everything headrace raises.

Every error that can cross the wire has a stable numeric code (``CODE``) and a
``retriable`` flag. The registry maps codes back to classes so a client raises
the same class the broker meant. Third-party exceptions are translated at the
adapter edge with ``raise ... from exc``.
"""

from __future__ import annotations

from typing import ClassVar


class HeadraceError(Exception):
    """Base of all headrace errors."""

    CODE: ClassVar[int] = 1
    retriable: ClassVar[bool] = False
    #: True when the client's routing cache must be refreshed before a retry.
    invalid_metadata: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.__class__.__name__)
        self.message = message or self.__class__.__name__


# --- framing and input (never retriable: the same bytes fail the same way) ---


class MalformedFrame(HeadraceError):
    """A frame or message body could not be decoded."""

    CODE = 2


class UnknownOperation(HeadraceError):
    """The frame's op code is not one this broker understands."""

    CODE = 3


class UnsupportedVersion(HeadraceError):
    """The peer speaks a protocol version this broker does not."""

    CODE = 4


class CorruptBatch(HeadraceError):
    """A record batch failed validation: bad CRC, bad magic or inconsistent lengths."""

    CODE = 5


class UnknownCodec(CorruptBatch):
    """A batch (or a producer option) names a compression codec this build does not know."""

    CODE = 11


class DecompressionFailed(CorruptBatch):
    """A compressed record section is not one well-formed stream of its declared size."""

    CODE = 12


class InvalidRecordBatch(CorruptBatch):
    """A batch that is intact (its CRC holds) but that this broker refuses to store: a
    Kafka batch that is transactional, a control batch, or whose offsets are not contiguous."""

    CODE = 18


class CodecUnavailable(HeadraceError):
    """Client side: a known codec whose library is not installed (the ``compression`` extra)."""

    CODE = 102


class BatchTooLarge(HeadraceError):
    """A batch exceeds the configured maximum batch size."""

    CODE = 6


class FrameTooLarge(HeadraceError):
    """A frame exceeds the configured maximum frame size; the connection is closed."""

    CODE = 7


class InvalidRequest(HeadraceError):
    """A well-formed request whose field values are not acceptable."""

    CODE = 8


class PolicyViolation(InvalidRequest):
    """A valid request this broker does not carry out by its own rules: a change that
    belongs to the controller, or one a standalone broker cannot make."""

    CODE = 48


class AuthenticationFailed(HeadraceError):
    """The handshake's credentials were rejected."""

    CODE = 9


class IllegalSaslState(AuthenticationFailed):
    """A SASL message out of its exchange's order: before the handshake chose a
    mechanism, or after the exchange ended (a replayed final message). Kafka listener
    only; the connection is closed."""

    CODE = 19


class NotAuthenticated(HeadraceError):
    """A request arrived before a successful handshake."""

    CODE = 10


# --- access control (docs/security.md); a denial never closes the connection ---


class AccessDenied(HeadraceError):
    """The authenticated principal holds no grant for this operation on this resource."""

    CODE = 13


class ProduceDenied(AccessDenied):
    """No ``produce`` grant on the topic: nothing of the batch was stored."""

    CODE = 14


class ConsumeDenied(AccessDenied):
    """No ``consume`` grant on the topic (fetch, cohort join, describe of its cohorts)."""

    CODE = 15


class AdminDenied(AccessDenied):
    """No ``admin`` grant on the topic (create, delete, cursor reset)."""

    CODE = 16


class ClusterDenied(AccessDenied):
    """A broker-to-broker operation (replica fetch, epoch queries) from a principal
    without the ``cluster`` grant."""

    CODE = 17


# --- topics and partitions ---


class UnknownTopic(HeadraceError):
    """The named topic does not exist (or not on this broker)."""

    CODE = 20
    invalid_metadata = True


class UnknownPartition(HeadraceError):
    """The partition index is outside the topic's partition count."""

    CODE = 21
    invalid_metadata = True


class TopicAlreadyExists(HeadraceError):
    CODE = 22


class InvalidTopicSpec(HeadraceError):
    """Topic name, partition count or settings are invalid."""

    CODE = 23


class OffsetOutOfRange(HeadraceError):
    """A fetch offset is below the log start or above the log end."""

    CODE = 24


class StalePartitioningVersion(HeadraceError):
    """Routed under an old partitioning version (normally answered with a Redirect)."""

    CODE = 25
    retriable = True
    invalid_metadata = True


class NotLeader(HeadraceError):
    """This broker does not lead the partition (normally answered with a Redirect)."""

    CODE = 26
    retriable = True
    invalid_metadata = True


class StaleEpoch(HeadraceError):
    """A request carried a leader epoch older than the partition's current one."""

    CODE = 27
    retriable = True
    invalid_metadata = True


class NotEnoughReplicas(HeadraceError):
    """acks=all cannot be honoured: the live replica set is below minInSync."""

    CODE = 28
    retriable = True


class RequestTimedOut(HeadraceError):
    CODE = 29
    retriable = True


class StorageError(HeadraceError):
    """The broker could not read or write its log (disk full, I/O error)."""

    CODE = 30
    retriable = True


class DuplicateSequence(HeadraceError):
    """Internal: a retried batch that was already appended (answered with its offset)."""

    CODE = 31


class OutOfOrderSequence(HeadraceError):
    """An idempotent producer's batch arrived with a sequence gap."""

    CODE = 32
    retriable = True


class BrokerShuttingDown(HeadraceError):
    CODE = 33
    retriable = True


class CorruptSegmentObject(HeadraceError):
    """A segment object in the object store failed its CRC or is truncated; the message names the object key."""

    CODE = 34


class PartitionMoving(HeadraceError):
    """The partition is being sealed for a move or reopened after one: retry once the
    topology names its new owner."""

    CODE = 36
    retriable = True
    invalid_metadata = True


# --- cohorts ---


class InvalidMemberId(HeadraceError):
    """A cohort member id is empty, too long or contains forbidden characters."""

    CODE = 40


class MemberIdInUse(HeadraceError):
    """Another live connection holds this member identity."""

    CODE = 41
    retriable = True


class UnknownMember(HeadraceError):
    """The member is not (or no longer) part of the cohort."""

    CODE = 42


class NotGateHolder(HeadraceError):
    """The member acked a partition whose delivery gate it does not hold."""

    CODE = 43


class AlreadyJoined(HeadraceError):
    """One member identity per connection: this connection already joined."""

    CODE = 44


class CohortActive(HeadraceError):
    """The cohort has live members on this broker, so its cursors may not be reset."""

    CODE = 45


class InvalidMemberIdentity(HeadraceError):
    """Signed identities are on and the member id is not backed by a valid identity token
    for the connection's principal (missing, forged, another cluster's, or issued to
    another principal or member id)."""

    CODE = 46


class UnsupportedDocument(HeadraceError):
    """An admin document (the controller's topology push) in a format newer than this
    broker reads: the controller runs a newer release than the broker."""

    CODE = 47


# --- client side only (never on the wire) ---


class ConnectionClosed(HeadraceError):
    CODE = 100
    retriable = True


class Redirected(HeadraceError):
    """The broker answered with a Redirect that the caller could not follow."""

    CODE = 101
    retriable = True
    invalid_metadata = True


class TokenRotated(ConnectionClosed):
    """The broker refused the token a connection presented (``AuthenticationFailed``), and
    the client's token source yields another one now: the connection is closed, and the
    next one presents the new token. Retriable, unlike the refusal itself: a client
    whose source still yields the refused token gets ``AuthenticationFailed``."""

    CODE = 103


_REGISTRY: dict[int, type[HeadraceError]] = {}


def _register(cls: type[HeadraceError]) -> None:
    for sub in cls.__subclasses__():
        if sub.CODE in _REGISTRY and _REGISTRY[sub.CODE] is not sub:
            raise RuntimeError(f"duplicate error code {sub.CODE}")
        _REGISTRY[sub.CODE] = sub
        _register(sub)


_REGISTRY[HeadraceError.CODE] = HeadraceError
_register(HeadraceError)


def error_for_code(code: int, message: str) -> HeadraceError:
    """Build the exception a wire error code stands for."""
    cls = _REGISTRY.get(code, HeadraceError)
    return cls(message)


def all_error_classes() -> dict[int, type[HeadraceError]]:
    return dict(_REGISTRY)
