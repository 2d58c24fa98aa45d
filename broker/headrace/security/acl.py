"""Principals and their grants: the ACL file's model and the matcher (pure, no I/O).

The file (YAML or JSON, docs/security.md) names principals. Each is bound to
token hashes (``sha256:<hex>``: the broker never needs the plain token, so a
leaked ACL file does not leak credentials), SCRAM credentials derived from its
tokens (``security.scram``: the Kafka listener's SASL/SCRAM, under the principal's
name) and/or TLS client certificate subject common names, and holds grants:
operations on topic name patterns.

A pattern is matched against the canonical topic name ``namespace/name``:

- ``*`` matches every topic;
- ``prefix*`` (one ``*``, last) matches names starting with ``prefix``:
  ``team-a/*`` is the whole namespace ``team-a``, ``default/orders-*`` a family;
- anything else is one literal topic.

A pattern without ``/`` (other than ``*``) is in namespace ``default``, as topic
names are: ``orders`` is ``default/orders`` and ``orders-*`` is
``default/orders-*``.

Prefixes rather than full globs: a prefix says plainly what it covers, and
namespaces are prefixes. ``cluster`` is the broker-to-broker grant (replica
fetch, epoch queries); it takes no topics.

A ``consume`` grant may also name ``cohorts`` (same pattern rules, no
namespace): then joining a cohort of those topics is allowed only for those
cohort names, so two tenants reading one topic cannot join (and ack away) each
other's cohorts. Without ``cohorts`` a consume grant covers every cohort.

Checks run once per request (a produce request is one batch), never per record;
``Principal.allows`` is a handful of string comparisons and the connection
caches its answers (``headrace.security.access``).
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from headrace.errors import InvalidRequest
from headrace.security.scram import ScramCredential

#: principal names: what a member id or a log line may carry
PRINCIPAL_NAME: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
TOKEN_HASH: Final = re.compile(r"^sha256:[0-9a-f]{64}$")
#: the principal a broker's own replication token authenticates as (reserved)
BROKER_PRINCIPAL: Final = "headrace:broker"


class Operation(enum.StrEnum):
    PRODUCE = "produce"
    CONSUME = "consume"
    ADMIN = "admin"
    CLUSTER = "cluster"


def hash_token(token: str) -> str:
    """The form the ACL file stores a token in."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def canonical_pattern(pattern: str) -> str:
    """Validate a topic pattern; one without ``/`` (but ``*``) gains the ``default/`` namespace."""
    if not pattern:
        raise ValueError("a topic pattern may not be empty")
    stars = pattern.count("*")
    if stars > 1 or (stars == 1 and not pattern.endswith("*")):
        raise ValueError(f"topic pattern {pattern!r}: '*' may appear once, at the end (a prefix)")
    if pattern != "*" and "/" not in pattern:
        return f"default/{pattern}"
    return pattern


def pattern_matches(pattern: str, topic: str) -> bool:
    """Whether canonical ``pattern`` covers the canonical topic name ``topic``."""
    if pattern.endswith("*"):
        return topic.startswith(pattern[:-1])
    return topic == pattern


# ------------------------------------------------------------------------------ the file


class GrantSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    operations: Annotated[list[Operation], Field(min_length=1)]
    #: topic patterns (see the module docstring); ignored for ``cluster``
    topics: list[str] = Field(default_factory=list)
    #: cohort name patterns a ``consume`` grant may join; None = every cohort
    cohorts: list[str] | None = None

    @field_validator("topics")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        return [canonical_pattern(p) for p in value]

    @field_validator("cohorts")
    @classmethod
    def _cohort_patterns(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            for pattern in value:
                canonical_pattern(pattern)  # the same star rule; no namespace for cohorts
        return value

    @model_validator(mode="after")
    def _topics_needed(self) -> GrantSpec:
        if not self.topics and any(op is not Operation.CLUSTER for op in self.operations):
            raise ValueError("a produce, consume or admin grant needs topic patterns")
        if self.cohorts is not None and Operation.CONSUME not in self.operations:
            raise ValueError("'cohorts' narrows a consume grant; this grant has no consume")
        return self


class PrincipalSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    #: ``sha256:<hex>`` of each token this principal authenticates with
    tokens: list[str] = Field(default_factory=list)
    #: subject common names of TLS client certificates (mutual TLS) that are this principal
    certificates: list[str] = Field(default_factory=list)
    #: SCRAM credentials (``ScramCredential.text``) for the Kafka listener's SCRAM-SHA-256/512;
    #: the user name is the principal's name
    scram: list[str] = Field(default_factory=list)
    grants: list[GrantSpec] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not PRINCIPAL_NAME.fullmatch(value):
            raise ValueError(
                f"principal name {value!r}: 1-128 letters, digits, '.', '_', ':', '@', '-'"
            )
        if value == BROKER_PRINCIPAL:
            raise ValueError(f"{BROKER_PRINCIPAL!r} is reserved for the brokers themselves")
        return value

    @field_validator("tokens")
    @classmethod
    def _tokens(cls, value: list[str]) -> list[str]:
        for item in value:
            if not TOKEN_HASH.fullmatch(item):
                # Never echo the value: it may be a plain token pasted by mistake.
                raise ValueError(
                    "tokens are stored as 'sha256:<64 lower-case hex>' (headrace acl token"
                    " prints a fresh token and its hash); a plain token is not accepted"
                )
        return value

    @field_validator("scram")
    @classmethod
    def _scram(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                ScramCredential.parse(item)
            except InvalidRequest as exc:
                raise ValueError(exc.message) from None  # the message never quotes the keys
        return value

    @model_validator(mode="after")
    def _credentials(self) -> PrincipalSpec:
        if not self.tokens and not self.certificates and not self.scram:
            raise ValueError(
                f"principal {self.name!r} has no tokens, certificates or SCRAM credentials"
            )
        return self

    def scram_credentials(self) -> tuple[ScramCredential, ...]:
        return tuple(ScramCredential.parse(item) for item in self.scram)


class AclFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    principals: list[PrincipalSpec]

    @model_validator(mode="after")
    def _unique(self) -> AclFile:
        _no_duplicates((p.name for p in self.principals), "principal name")
        _no_duplicates((t for p in self.principals for t in p.tokens), "token hash")
        _no_duplicates((c for p in self.principals for c in p.certificates), "certificate name")
        return self


def _no_duplicates(values: Iterable[str], what: str) -> None:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            shown = value if what != "token hash" else value[:15] + "..."
            raise ValueError(f"{what} {shown!r} appears twice")
        seen.add(value)


def parse_acl(document: Any, source: str = "the ACL file") -> AclFile:
    """Validate a parsed YAML/JSON document; one typed error naming every problem."""
    try:
        return AclFile.model_validate(document)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidRequest(f"{source}: {problems}") from None


# ------------------------------------------------------------------------------ decisions


@dataclass(frozen=True, slots=True)
class PatternSet:
    """Topic patterns compiled for one C-level test each: a set of literals and a tuple of
    prefixes for ``str.startswith`` (``*`` is the empty prefix)."""

    literals: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def of(cls, patterns: Iterable[str]) -> PatternSet:
        patterns = list(patterns)
        return cls(
            frozenset(p for p in patterns if not p.endswith("*")),
            tuple(p[:-1] for p in patterns if p.endswith("*")),
        )

    def matches(self, topic: str) -> bool:
        return topic in self.literals or topic.startswith(self.prefixes)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a connection is, with its grants flattened to (operation -> patterns)."""

    name: str
    patterns: dict[Operation, PatternSet] = field(default_factory=dict)
    #: (topic pattern, cohort patterns or None for any) of each consume grant
    cohorts: tuple[tuple[str, tuple[str, ...] | None], ...] = ()

    def allows(self, operation: Operation, topic: str = "") -> bool:
        """``topic``: a canonical topic name (ignored for ``cluster``)."""
        patterns = self.patterns.get(operation)
        if patterns is None:
            return False
        if operation is Operation.CLUSTER:
            return True
        return patterns.matches(topic)

    def may_join(self, topic: str, cohort: str) -> bool:
        """Whether a consume grant covers joining ``cohort`` of the canonical ``topic``."""
        return any(
            pattern_matches(tp, topic)
            and (cps is None or any(pattern_matches(cp, cohort) for cp in cps))
            for tp, cps in self.cohorts
        )

    @classmethod
    def from_spec(cls, spec: PrincipalSpec) -> Principal:
        patterns: dict[Operation, list[str]] = {}
        cohorts: list[tuple[str, tuple[str, ...] | None]] = []
        for grant in spec.grants:
            for op in grant.operations:
                patterns.setdefault(op, []).extend(grant.topics)
            if Operation.CONSUME in grant.operations:
                names = tuple(grant.cohorts) if grant.cohorts is not None else None
                cohorts += [(topic, names) for topic in grant.topics]
        return cls(
            spec.name, {op: PatternSet.of(ps) for op, ps in patterns.items()}, tuple(cohorts)
        )


#: the brokers' own principal (their replication token): replication only
BROKER: Final = Principal(BROKER_PRINCIPAL, {Operation.CLUSTER: PatternSet.of(())})


class Authorizer:
    """Credentials -> principal, from a validated ACL file."""

    def __init__(self, acl: AclFile, broker_tokens: Iterable[str] = ()) -> None:
        """``broker_tokens``: the replication tokens in force (more than one while they
        rotate); each authenticates as ``headrace:broker``."""
        self.principals = {p.name: Principal.from_spec(p) for p in acl.principals}
        self._by_token = {t: self.principals[p.name] for p in acl.principals for t in p.tokens}
        self._by_certificate = {
            c: self.principals[p.name] for p in acl.principals for c in p.certificates
        }
        self._scram = {p.name: p.scram_credentials() for p in acl.principals if p.scram}
        for broker_token in broker_tokens:
            if hash_token(broker_token) in self._by_token:
                # It would silently become (or shadow) a client principal.
                raise InvalidRequest("the replication token is also a principal's token")
            self._by_token[hash_token(broker_token)] = BROKER

    def for_token(self, token: str) -> Principal | None:
        # A dict lookup on the token's SHA-256: timing reveals nothing usable about the token.
        return self._by_token.get(hash_token(token))

    def for_certificate(self, common_name: str) -> Principal | None:
        return self._by_certificate.get(common_name)

    def scram_credentials(self, name: str) -> tuple[ScramCredential, ...]:
        """The SCRAM credentials of principal ``name`` (none: unknown, or it has none)."""
        return self._scram.get(name, ())

    def for_scram(
        self, name: str, credential: ScramCredential, common_name: str | None
    ) -> Principal | None:
        """The principal a SCRAM exchange proved ``credential`` of, if it is still that
        principal's; a client certificate naming a principal must name the same one."""
        if credential not in self._scram.get(name, ()):
            return None
        by_cert = self.for_certificate(common_name) if common_name is not None else None
        principal = self.principals[name]
        if by_cert is not None and by_cert is not principal:
            return None
        return principal

    def authenticate(self, token: str | None, common_name: str | None) -> Principal | None:
        """The principal these credentials name, or None (refuse the connection).

        A token, when given, must name a principal; when a verified client certificate
        names one too, both must agree (a stolen token does not upgrade a certificate)."""
        by_cert = self.for_certificate(common_name) if common_name is not None else None
        if token is None:
            return by_cert
        by_token = self.for_token(token)
        if by_token is None or (by_cert is not None and by_cert is not by_token):
            return None
        return by_token
