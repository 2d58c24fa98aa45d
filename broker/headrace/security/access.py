"""Access control on the data port: who a connection is, and what it may do.

The adapter around this package's pure core (``acl``, ``identities``,
``keyrings``), configured by an ``AccessSettings``: it reads the ACL file and
the cluster key, finds the TLS client certificate's common name, counts denials
(``headrace_acl_denials_total{operation}``) and raises the typed errors. Three
modes, fixed at start-up:

- open: no credentials asked (the default; the port is loopback unless told);
- shared tokens (``--auth-token``): any listed token may do anything;
- ACLs (``--acl-file``): every connection is a principal, every request is
  checked against its grants, and cohort member ids must be signed identities
  (``headrace.security.identities``).

Every credential file is re-read without a restart (``Access.reload``: SIGHUP, or
the process's file watch; ``headrace.security.reloading``): the ACL file, the
shared tokens' ``--auth-token-file``, the ``--replication-token-file`` and the
cluster key. A token or key file may list several values while they rotate
(``headrace.security.keyrings``): all are accepted, the first is presented or
signs. A bad file keeps what is in force and counts a failed reload. Every
connection notices a reload at its next checked request: it re-authenticates with
the credentials of its handshake, so a removed token or principal is refused from
then on, and its remembered decisions are dropped.

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

from headrace.errors import (
    AccessDenied,
    AdminDenied,
    AuthenticationFailed,
    ClusterDenied,
    ConsumeDenied,
    InvalidMemberIdentity,
    InvalidRequest,
    ProduceDenied,
)
from headrace.records.topic_names import canonical_topic_name
from headrace.security import identities, keyrings, scram
from headrace.security.acl import AclFile, Authorizer, Operation, Principal, parse_acl
from headrace.security.reloading import CredentialFiles, ReloadCounter
from headrace.security.settings import AccessSettings

log = logging.getLogger(__name__)

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


def load_acl_file(path: Path) -> AclFile:
    """Read and validate the ACL file (YAML; JSON is YAML too)."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise InvalidRequest(f"cannot read the ACL file {path}: {reason}") from exc
    except yaml.YAMLError as exc:
        # The parser's message quotes the offending line, which may hold a secret.
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise InvalidRequest(f"the ACL file {path} is not valid YAML{where}") from None
    return parse_acl(document, str(path))


def load_token_file(path: Path) -> tuple[str, ...]:
    """The tokens of a token file (``headrace.security.keyrings``), the one to send first."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise InvalidRequest(f"cannot read the token file {path}: {reason}") from exc
    return keyrings.parse_tokens(text, f"the token file {path}")


def make_cluster_key(path: Path) -> None:
    """Write a fresh cluster key to ``path`` (mode 0600) unless it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # another process made it first: read theirs
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(identities.KEY_BYTES) + "\n")
        out.flush()
        os.fsync(out.fileno())


def load_cluster_keys(path: Path) -> tuple[bytes, ...]:
    """The keys in the cluster key file (64 hex digits a line, mode 0600), signing key first.

    A key accessible by others, or by a group this process is not in, is refused, as ssh
    refuses such a private key: whoever reads it can mint any identity. A group this
    process is in may read it: a Kubernetes Secret volume's files are ``root:<fsGroup>
    0440`` once the pod has an ``fsGroup``, the only way a non-root broker reads them."""
    try:
        st = path.stat()
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise InvalidRequest(f"cannot read the cluster key {path}: {reason}") from exc
    own_group = st.st_gid == os.getegid() or st.st_gid in os.getgroups()
    group_access = st.st_mode & (stat.S_IWGRP | stat.S_IXGRP if own_group else stat.S_IRWXG)
    if group_access or st.st_mode & stat.S_IRWXO:
        raise InvalidRequest(
            f"the cluster key {path} is accessible by others or another group"
            f" (mode {stat.S_IMODE(st.st_mode):04o}, group {st.st_gid}); chmod 600 it"
        )
    return keyrings.parse_keys(text, f"the cluster key {path}")


def load_cluster_key(path: Path, *, create: bool) -> bytes:
    """The signing key in ``path``, made when ``create`` and absent."""
    if create:
        make_cluster_key(path)
    return load_cluster_keys(path)[0]


def certificate_common_name(peercert: object) -> str | None:
    """The subject CN of a verified peer certificate (``SSLObject.getpeercert()``)."""
    if not isinstance(peercert, dict):
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def _count(what: str) -> Callable[[tuple[object, ...]], str]:
    return lambda values: f"{len(values)} {what} in force"


class Access:
    """A process's access policy (one per broker; the controller's API has one too)."""

    def __init__(
        self,
        settings: AccessSettings,
        denials: DenialCounter,
        *,
        reloads: ReloadCounter | None = None,
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        random_hex: Callable[[int], str] = secrets.token_hex,
    ) -> None:
        """With ACLs, the cluster key is loaded (or made) when ``settings`` say where it is
        (``AccessSettings.key_file``); the controller gives no key: it authenticates admin
        requests but issues no identities."""
        self.cluster_id = settings.cluster_id
        self.denials = denials
        #: bumped by every successful reload; a connection that saw an older one re-authenticates
        self.generation = 0
        self.acl_file = settings.acl_file
        #: the files re-read on SIGHUP and on change (``headrace.security.reloading``)
        self.files = CredentialFiles(reloads, self._reloaded)
        self._now_ms = now_ms
        self._random_hex = random_hex
        #: makes the salt a SCRAM exchange shows for an unknown user (``security.scram``)
        self.scram_decoy_key = secrets.token_bytes(32)
        self._acl: AclFile | None = None
        #: the replication tokens in force, the one this broker presents first
        self._broker_tokens: tuple[str, ...] = (
            (settings.replication_token,) if settings.replication_token else ()
        )
        self._option_tokens = tuple(settings.auth_tokens)
        self._file_tokens: tuple[str, ...] = ()
        #: the shared-token mode's accepted tokens (empty: another mode)
        self._shared_tokens: tuple[bytes, ...] = ()
        self._asks_shared = bool(settings.auth_tokens) or settings.auth_token_file is not None
        self.authorizer: Authorizer | None = None
        #: the cluster keys in force: the first signs identities, any verifies them
        self.keys: tuple[bytes, ...] = ()
        if settings.acl_file is None:
            if settings.cluster_key_file is not None:
                raise InvalidRequest("--cluster-key-file needs --acl-file")
        elif self._asks_shared:
            raise InvalidRequest(
                "--auth-token (or --auth-token-file) and --acl-file do not mix: give the"
                " tokens to principals in the ACL file"
            )
        elif settings.cluster_mode and settings.cluster_key_file is None:
            raise InvalidRequest(
                "a cluster-mode broker with --acl-file needs --cluster-key-file: every broker"
                " of the cluster must verify the identities the others issue"
            )
        if settings.replication_token_file is not None:
            self.files.watch(
                "replication_token",
                settings.replication_token_file,
                load_token_file,
                self._set_broker_tokens,
                _count("replication tokens"),
            )
        if settings.auth_token_file is not None:
            self.files.watch(
                "auth_tokens",
                settings.auth_token_file,
                load_token_file,
                self._set_file_tokens,
                _count("tokens"),
            )
        self._shared_tokens = self._shared()
        if settings.acl_file is None:
            return
        self.files.watch(
            "acl",
            settings.acl_file,
            load_acl_file,
            self._set_acl,
            lambda acl: f"{len(acl.principals)} principals in force",
        )
        key_file = settings.key_file
        if key_file is not None:
            if settings.cluster_key_file is None:
                make_cluster_key(key_file)
            self.files.watch(
                "cluster_key", key_file, load_cluster_keys, self._set_keys, _count("keys")
            )

    # ------------------------------------------------------------------ putting files in force

    def _reloaded(self) -> None:
        self.generation += 1

    def _set_acl(self, acl: AclFile) -> None:
        self.authorizer = Authorizer(acl, self._broker_tokens)  # raises: nothing changes
        self._acl = acl

    def _set_broker_tokens(self, tokens: tuple[str, ...]) -> None:
        if self._acl is not None:
            self.authorizer = Authorizer(self._acl, tokens)  # raises: nothing changes
        self._broker_tokens = tokens
        self._shared_tokens = self._shared()

    def _set_file_tokens(self, tokens: tuple[str, ...]) -> None:
        self._file_tokens = tokens
        self._shared_tokens = self._shared()

    def _set_keys(self, keys: tuple[bytes, ...]) -> None:
        self.keys = keys

    def _shared(self) -> tuple[bytes, ...]:
        """The shared-token mode's accepted tokens: the options', the file's, and the
        replication tokens (the brokers present those to each other)."""
        if not self._asks_shared:
            return ()
        tokens = {*self._option_tokens, *self._file_tokens, *self._broker_tokens}
        return tuple(t.encode() for t in sorted(tokens))

    def accepts_shared_token(self, token: str | None) -> bool:
        """Whether ``token`` is one of the shared tokens in force."""
        presented = (token or "").encode()
        # Compare with every token (no early exit) so timing says nothing of which matched.
        matched = False
        for expected in self._shared_tokens:
            matched |= hmac.compare_digest(presented, expected)
        return matched

    # ------------------------------------------------------------------ reloads

    def reload(self) -> bool:
        """Re-read every credential file (SIGHUP); on any error keep what is in force (and
        count it). Whether anything new is in force. A no-op without files."""
        return self.files.reload()

    def reload_if_changed(self) -> bool:
        """``reload`` the files that changed since their last read (a stat each, for the watch)."""
        return self.files.reload_if_changed()

    @property
    def reload_error(self) -> str | None:
        """The ACL file's last failed reload (None after a good one), shown by /v1/status."""
        return self.files.error("acl")

    @property
    def replication_token(self) -> str | None:
        """The token this broker presents to other brokers: the first in force."""
        return self._broker_tokens[0] if self._broker_tokens else None

    @property
    def key(self) -> bytes | None:
        """The cluster key new identities are signed with (None: identities are off)."""
        return self.keys[0] if self.keys else None

    # ------------------------------------------------------------------ modes

    @property
    def enabled(self) -> bool:
        """ACL mode: principals, grants and signed member identities."""
        return self.authorizer is not None

    @property
    def asks_credentials(self) -> bool:
        """ACLs or shared tokens: a connection is a stranger until its handshake."""
        return self.authorizer is not None or self._asks_shared

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

    __slots__ = ("_credentials", "_decisions", "_generation", "_scram", "access", "principal")

    def __init__(self, access: Access) -> None:
        self.access = access
        #: None until the handshake, and always in the open and shared-token modes
        self.principal: Principal | None = None
        #: (operation, topic as the request spelled it) -> allowed
        self._decisions: dict[tuple[Operation, str], bool] = {}
        #: the accepted handshake's (token, certificate CN), to authenticate again after a
        #: reload; None before one (and always in the open mode)
        self._credentials: tuple[str | None, str | None] | None = None
        #: after a SCRAM exchange instead: (principal name, the credential it proved),
        #: and ``_credentials`` holds the certificate CN only
        self._scram: tuple[str, scram.ScramCredential] | None = None
        #: the credentials generation ``principal`` (or the shared token) was checked in
        self._generation = access.generation

    def authenticate(self, token: str | None, peercert: object) -> None:
        access = self.access
        # A second handshake starts over: no decision of the previous principal survives it.
        self.principal = None
        self._decisions.clear()
        self._credentials = None
        self._scram = None
        self._generation = access.generation
        if access.authorizer is not None:
            common_name = certificate_common_name(peercert)
            principal = access.authorizer.authenticate(token, common_name)
            if principal is None:
                access.deny("authenticate")
                raise AuthenticationFailed(
                    "invalid or missing credentials (token or client certificate)"
                )
            self.principal = principal
            self._credentials = (token, common_name)
        elif access.asks_credentials:
            if not access.accepts_shared_token(token):
                access.deny("authenticate")
                raise AuthenticationFailed("invalid or missing auth token")
            self._credentials = (token, None)

    def scram_credentials(self, name: str) -> tuple[scram.ScramCredential, ...]:
        """Principal ``name``'s SCRAM credentials in force (none without an ACL file)."""
        authorizer = self.access.authorizer
        return () if authorizer is None else authorizer.scram_credentials(name)

    def authenticate_scram(
        self, name: str, credential: scram.ScramCredential, peercert: object
    ) -> None:
        """A SCRAM exchange proved ``credential`` of principal ``name``: the connection is
        that principal, unless the ACL file no longer says so (``AuthenticationFailed``)."""
        access = self.access
        self.principal = None
        self._decisions.clear()
        self._credentials = None
        self._scram = None
        self._generation = access.generation
        common_name = certificate_common_name(peercert)
        principal = (
            None
            if access.authorizer is None
            else access.authorizer.for_scram(name, credential, common_name)
        )
        if principal is None:
            access.deny("authenticate")
            raise AuthenticationFailed(f"invalid credentials for user {name!r}")
        self.principal = principal
        self._credentials = (None, common_name)
        self._scram = (name, credential)

    def _catch_up(self) -> None:
        """After a reload: authenticate again with the handshake's credentials under what
        is in force now (``AuthenticationFailed`` if they are no longer accepted)."""
        access = self.access
        generation = access.generation
        self._decisions.clear()
        if self._credentials is not None:
            token, common_name = self._credentials
            if access.authorizer is not None:
                if self._scram is not None:
                    name, credential = self._scram
                    principal = access.authorizer.for_scram(name, credential, common_name)
                else:
                    principal = access.authorizer.authenticate(token, common_name)
                if principal is None:
                    access.deny("authenticate")
                    name = self.principal.name if self.principal is not None else "?"
                    raise AuthenticationFailed(
                        f"the credentials of principal {name!r} are no longer valid"
                        " (the ACL file was reloaded)"
                    )
                self.principal = principal
            elif not access.accepts_shared_token(token):
                access.deny("authenticate")
                raise AuthenticationFailed(
                    "the auth token is no longer accepted (the token files were reloaded)"
                )
        # (no credentials: the open mode, or no handshake yet, which the server asks for
        # first.) Only now is the connection current: a refusal above leaves it stale, so
        # any later check refuses again instead of passing on the old principal.
        self._generation = generation

    @property
    def stale(self) -> bool:
        """Whether credentials were reloaded since this connection's last check."""
        return self._generation != self.access.generation

    def require(self, operation: Operation, topic: str) -> None:
        """Raise the typed denial unless the principal may do ``operation`` on ``topic``."""
        if self._generation != self.access.generation:
            self._catch_up()
        principal = self.principal
        if principal is None:
            return
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
        if self._generation != self.access.generation:
            self._catch_up()
        principal = self.principal
        if principal is not None and not principal.allows(Operation.CLUSTER):
            self.access.deny(Operation.CLUSTER.value)
            raise ClusterDenied(
                f"principal {principal.name!r} has no cluster grant (broker-to-broker operations)"
            )

    def may_see(self, topic: str) -> bool:
        """Whether cohort state of ``topic`` may be shown: a consume or admin grant."""
        if self._generation != self.access.generation:
            self._catch_up()
        principal = self.principal
        return principal is None or any(
            principal.allows(op, topic) for op in (Operation.CONSUME, Operation.ADMIN)
        )

    # ------------------------------------------------------------------ member identities

    @property
    def member_identities(self) -> bool:
        return bool(self.access.keys)

    def issue_identity(self, hint: str) -> tuple[str, str]:
        """A fresh member id bound to this principal, and its token."""
        access = self.access
        if self._generation != access.generation:
            self._catch_up()
        if access.key is None or self.principal is None:
            raise InvalidRequest("signed member identities are off on this broker")
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
        if not access.keys or self.principal is None:
            return
        try:
            if token is None:
                raise InvalidMemberIdentity(
                    f"member {member_id!r}: this cluster requires a signed identity; ask for"
                    " one (op IDENTITY) and join with the member id and token it returns"
                )
            identities.verify(
                access.keys,
                token,
                cluster_id=access.cluster_id,
                principal=self.principal.name,
                member_id=member_id,
            )
        except InvalidMemberIdentity:
            access.deny("identity")
            raise
