"""Access control on the data port: who a connection is, and what it may do.

The adapter around the pure ``headrace.security`` core: it reads the ACL file
and the cluster key, finds the TLS client certificate's common name, counts
denials (``headrace_acl_denials_total{operation}``) and raises the typed
errors. Three modes, fixed at start-up:

- open: no credentials asked (the default; the port is loopback unless told);
- shared tokens (``--auth-token``): any listed token may do anything;
- ACLs (``--acl-file``): every connection is a principal, every request is
  checked against its grants, and cohort member ids must be signed identities
  (``headrace.security.identities``).

The ACL file can be re-read without a restart (``Access.reload``: SIGHUP, or the
broker's file watch). A bad file keeps the grants in force and counts a failed
reload. Every connection notices a reload at its next request: it
re-authenticates with the credentials of its handshake, so a removed token or
principal is refused from then on, and its remembered decisions are dropped.

Checks run once per request, not per record, and a connection remembers its
answers (``ConnectionAccess._decisions``), so the produce path pays one dict
lookup per batch.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Protocol

import yaml

from headrace.broker.config import BrokerSettings
from headrace.broker.topics import canonical_topic_name
from headrace.errors import (
    AccessDenied,
    AdminDenied,
    AuthenticationFailed,
    ClusterDenied,
    ConsumeDenied,
    HeadraceError,
    InvalidMemberIdentity,
    InvalidRequest,
    ProduceDenied,
)
from headrace.security import identities
from headrace.security.acl import AclFile, Authorizer, Operation, Principal, parse_acl

log = logging.getLogger(__name__)

#: the cluster key's file name when it lives in a state directory
KEY_FILE_NAME: Final = "cluster.key"
#: decisions a connection remembers before it starts over (bounds memory per connection)
_MAX_DECISIONS: Final = 4096
#: the largest frame a connection may send before its handshake succeeds, when the broker
#: asks for credentials: a handshake is a small JSON object, and a stranger should not make
#: the broker buffer a 16 MiB frame per connection
PRE_AUTH_MAX_FRAME_BYTES: Final = 64 * 1024

_DENIAL: Final[dict[Operation, type[AccessDenied]]] = {
    Operation.PRODUCE: ProduceDenied,
    Operation.CONSUME: ConsumeDenied,
    Operation.ADMIN: AdminDenied,
    Operation.CLUSTER: ClusterDenied,
}


class DenialCounter(Protocol):
    """``prometheus_client.Counter`` with an ``operation`` label, as far as we use it."""

    def labels(self, operation: str) -> Any: ...


class ReloadCounter(Protocol):
    """``prometheus_client.Counter`` with a ``result`` label (``ok``, ``error``)."""

    def labels(self, result: str) -> Any: ...


def _file_signature(path: Path) -> tuple[int, int, int] | None:
    """What changes when the file is rewritten in place or replaced by a rename."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def load_acl_file(path: Path) -> AclFile:
    """Read and validate the ACL file (YAML; JSON is YAML too)."""
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidRequest(f"cannot read the ACL file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        # The parser's message quotes the offending line, which may hold a secret.
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise InvalidRequest(f"the ACL file {path} is not valid YAML{where}") from None
    return parse_acl(document, str(path))


def load_cluster_key(path: Path, *, create: bool) -> bytes:
    """The cluster key in ``path`` (64 hex digits, mode 0600), made when ``create`` and absent.

    A key readable by group or others is refused, as ssh refuses such a private key:
    whoever reads it can mint any identity."""
    if create and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it first: read theirs
        else:
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_hex(identities.KEY_BYTES) + "\n")
                out.flush()
                os.fsync(out.fileno())
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as exc:
        raise InvalidRequest(f"cannot read the cluster key {path}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InvalidRequest(
            f"the cluster key {path} is accessible by group or others"
            f" (mode {stat.S_IMODE(mode):04o}); chmod 600 it"
        )
    return identities.parse_key(text)


def certificate_common_name(peercert: object) -> str | None:
    """The subject CN of a verified peer certificate (``SSLObject.getpeercert()``)."""
    if not isinstance(peercert, dict):
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class Access:
    """The broker's access policy (one per broker)."""

    def __init__(
        self,
        settings: BrokerSettings,
        denials: DenialCounter,
        *,
        reloads: ReloadCounter | None = None,
        member_identities: bool = True,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        random_hex: Callable[[int], str] = secrets.token_hex,
    ) -> None:
        """``member_identities``: load (or make) the cluster key; off for the controller,
        which authenticates admin requests but issues no identities."""
        self.cluster_id = settings.cluster_id
        self.denials = denials
        self.reloads = reloads
        #: bumped by every successful reload; a connection that saw an older one re-authenticates
        self.generation = 0
        #: the last failed reload's message (None after a good one), shown by /v1/status
        self.reload_error: str | None = None
        self.acl_file = settings.acl_file
        self._broker_token = settings.replication_token
        self._acl_signature: tuple[int, int, int] | None = None
        self._now_ms = now_ms
        self._random_hex = random_hex
        self._shared_tokens = tuple(t.encode() for t in sorted(settings.auth_tokens))
        self.authorizer: Authorizer | None = None
        self.key: bytes | None = None
        if settings.acl_file is None:
            if settings.cluster_key_file is not None:
                raise InvalidRequest("--cluster-key-file needs --acl-file")
            return
        if settings.auth_tokens:
            raise InvalidRequest(
                "--auth-token and --acl-file do not mix: give the tokens to principals"
                " in the ACL file"
            )
        if settings.cluster_mode and settings.cluster_key_file is None:
            raise InvalidRequest(
                "a cluster-mode broker with --acl-file needs --cluster-key-file: every broker"
                " of the cluster must verify the identities the others issue"
            )
        self._acl_signature = _file_signature(settings.acl_file)
        self.authorizer = Authorizer(
            load_acl_file(settings.acl_file), broker_token=settings.replication_token
        )
        if member_identities:
            key_file = settings.cluster_key_file or settings.data_dir / KEY_FILE_NAME
            self.key = load_cluster_key(key_file, create=settings.cluster_key_file is None)

    def reload(self) -> bool:
        """Re-read the ACL file; on any error keep the grants in force (and count it).

        Returns whether the new file is in force. A no-op without ``--acl-file``."""
        if self.acl_file is None:
            return False
        self._acl_signature = _file_signature(self.acl_file)
        try:
            authorizer = Authorizer(load_acl_file(self.acl_file), broker_token=self._broker_token)
        except HeadraceError as exc:
            self.reload_error = exc.message
            if self.reloads is not None:
                self.reloads.labels("error").inc()
            log.error(
                "ACL reload failed, the previous grants stay in force: %s: %s",
                type(exc).__name__,
                exc.message,
            )
            return False
        self.authorizer = authorizer
        self.generation += 1
        self.reload_error = None
        if self.reloads is not None:
            self.reloads.labels("ok").inc()
        log.info(
            "ACL file %s reloaded: %d principals in force",
            self.acl_file,
            len(authorizer.principals),
        )
        return True

    def reload_if_changed(self) -> bool:
        """``reload`` when the file changed since the last read (a stat, for the watch)."""
        if self.acl_file is None or _file_signature(self.acl_file) == self._acl_signature:
            return False
        return self.reload()

    @property
    def enabled(self) -> bool:
        """ACL mode: principals, grants and signed member identities."""
        return self.authorizer is not None

    @property
    def asks_credentials(self) -> bool:
        """ACLs or shared tokens: a connection is a stranger until its handshake."""
        return self.authorizer is not None or bool(self._shared_tokens)

    def max_frame_bytes_before_handshake(self, max_frame_bytes: int) -> int:
        if self.asks_credentials:
            return min(max_frame_bytes, PRE_AUTH_MAX_FRAME_BYTES)
        return max_frame_bytes

    def session(self) -> ConnectionAccess:
        return ConnectionAccess(self)

    def deny(self, operation: str) -> None:
        self.denials.labels(operation).inc()


class ConnectionAccess:
    """One connection's principal and the decisions it has been given."""

    __slots__ = ("_credentials", "_decisions", "_generation", "access", "principal")

    def __init__(self, access: Access) -> None:
        self.access = access
        #: None until the handshake, and always in the open and shared-token modes
        self.principal: Principal | None = None
        #: (operation, topic as the request spelled it) -> allowed
        self._decisions: dict[tuple[Operation, str], bool] = {}
        #: the handshake's (token, certificate CN), to authenticate again after a reload
        self._credentials: tuple[str | None, str | None] = (None, None)
        #: the ACL generation ``principal`` was found in
        self._generation = access.generation

    def authenticate(self, token: str | None, peercert: object) -> None:
        access = self.access
        # A second handshake starts over: no decision of the previous principal survives it.
        self.principal = None
        self._decisions.clear()
        self._credentials = (None, None)
        if access.authorizer is not None:
            common_name = certificate_common_name(peercert)
            self._generation = access.generation
            principal = access.authorizer.authenticate(token, common_name)
            if principal is None:
                access.deny("authenticate")
                raise AuthenticationFailed(
                    "invalid or missing credentials (token or client certificate)"
                )
            self.principal = principal
            self._credentials = (token, common_name)
        elif access._shared_tokens:
            presented = (token or "").encode()
            # Compare with every token (no early exit) so timing says nothing of which matched.
            matched = False
            for expected in access._shared_tokens:
                matched |= hmac.compare_digest(presented, expected)
            if not matched:
                access.deny("authenticate")
                raise AuthenticationFailed("invalid or missing auth token")

    def _current(self) -> Principal:
        """The principal under the ACLs in force: after a reload, found again from the
        handshake's credentials (``AuthenticationFailed`` if they name no principal now)."""
        access = self.access
        assert access.authorizer is not None
        assert self.principal is not None
        self._decisions.clear()
        token, common_name = self._credentials
        principal = access.authorizer.authenticate(token, common_name)
        if principal is None:
            access.deny("authenticate")
            raise AuthenticationFailed(
                f"the credentials of principal {self.principal.name!r} are no longer valid"
                " (the ACL file was reloaded)"
            )
        self.principal = principal
        self._generation = access.generation
        return principal

    def require(self, operation: Operation, topic: str) -> None:
        """Raise the typed denial unless the principal may do ``operation`` on ``topic``."""
        principal = self.principal
        if principal is None:
            return
        if self._generation != self.access.generation:
            principal = self._current()
        key = (operation, topic)
        allowed = self._decisions.get(key)
        if allowed is None:
            name = canonical_topic_name(topic)
            allowed = principal.allows(operation, name)
            if len(self._decisions) >= _MAX_DECISIONS:
                self._decisions.clear()
            self._decisions[key] = allowed
        if not allowed:
            self.access.deny(operation.value)
            raise _DENIAL[operation](
                f"principal {principal.name!r} has no {operation.value} grant on topic {topic!r}"
            )

    def require_cohort(self, topic: str, cohort: str) -> None:
        """A join: ``consume`` on the topic, and a grant that covers the cohort name."""
        self.require(Operation.CONSUME, topic)  # also catches up with a reload
        principal = self.principal
        if principal is not None and not principal.may_join(canonical_topic_name(topic), cohort):
            self.access.deny(Operation.CONSUME.value)
            raise ConsumeDenied(
                f"principal {principal.name!r} may not join cohort {cohort!r} of topic {topic!r}"
            )

    def require_cluster(self) -> None:
        principal = self.principal
        if principal is not None and self._generation != self.access.generation:
            principal = self._current()
        if principal is not None and not principal.allows(Operation.CLUSTER):
            self.access.deny(Operation.CLUSTER.value)
            raise ClusterDenied(
                f"principal {principal.name!r} has no cluster grant (broker-to-broker operations)"
            )

    def may_see(self, topic: str) -> bool:
        """Whether cohort state of ``topic`` may be shown: a consume or admin grant."""
        principal = self.principal
        if principal is not None and self._generation != self.access.generation:
            principal = self._current()
        return principal is None or any(
            principal.allows(op, topic) for op in (Operation.CONSUME, Operation.ADMIN)
        )

    # ------------------------------------------------------------------ member identities

    @property
    def member_identities(self) -> bool:
        return self.access.key is not None

    def issue_identity(self, hint: str) -> tuple[str, str]:
        """A fresh member id bound to this principal, and its token."""
        access = self.access
        if access.key is None or self.principal is None:
            raise InvalidRequest("signed member identities are off on this broker")
        if self._generation != access.generation:
            self._current()
        assert self.principal is not None
        member_id = identities.member_id_for(hint, access._random_hex(identities.RANDOM_HEX // 2))
        token = identities.sign(
            access.key,
            identities.MemberIdentity(
                access.cluster_id, self.principal.name, member_id, access._now_ms()
            ),
        )
        return member_id, token

    def verify_member(self, member_id: str, token: str | None) -> None:
        access = self.access
        if access.key is None or self.principal is None:
            return
        try:
            if token is None:
                raise InvalidMemberIdentity(
                    f"member {member_id!r}: this cluster requires a signed identity; ask for"
                    " one (op IDENTITY) and join with the member id and token it returns"
                )
            identities.verify(
                access.key,
                token,
                cluster_id=access.cluster_id,
                principal=self.principal.name,
                member_id=member_id,
            )
        except InvalidMemberIdentity:
            access.deny("identity")
            raise
