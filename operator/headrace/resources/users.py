"""User: one principal of a BrokerCluster and its grants, in the style of Strimzi's KafkaUser.

Pure data. A User is what one entry of a broker's ACL file says (``docs/security.md``):
how the principal authenticates and what it may do. The operator
(``headrace.operator.auth``, ``headrace.operator.principals``) creates the Secret holding
a token user's token, writes every User of a cluster into the brokers' ACL file with
:meth:`User.acl_principal`, and reports the Secret's name in the status.
The grant rules are the brokers' own (``headrace.security.acl``), so a User this model
accepts is one the brokers accept.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated, ClassVar, Final, Literal

from pydantic import Field, field_validator, model_validator

from headrace.resources.meta import (
    READY_COLUMNS,
    CelRule,
    ClusterReference,
    KindNames,
    Model,
    ObjectMeta,
    PrinterColumn,
    Resource,
    SecretReference,
    Status,
)
from headrace.security import acl


class AuthenticationType(enum.StrEnum):
    TOKEN = "token"
    TLS = "tls"


class UserAuthentication(Model):
    """How the principal proves who it is."""

    CEL_TWINS: ClassVar[Mapping[str, CelRule]] = {
        "_rotation_needs_a_token": CelRule(
            "self.type == 'token' || !has(self.rotateToken)",
            "rotateToken rotates a token; a tls User has none",
        )
    }

    type: AuthenticationType
    """``token``: the operator generates a token into a Secret named after the User;
    ``tls``: a client certificate whose subject CN is ``commonName``."""
    common_name: str | None = Field(default=None, min_length=1, max_length=256)
    """``tls`` only: the certificate's subject common name (default: the User's name)."""
    rotate_token: str | None = Field(default=None, min_length=1, max_length=253)
    """``token`` only: set it to a new value (a date, a ticket id) and the operator makes a
    new token, puts it in the Secret's ``token`` key and keeps the previous one valid for
    ``previousTokenGracePeriodSeconds``. The value a User is created with rotates
    nothing; clearing it rotates nothing."""
    previous_token_grace_period_seconds: int = Field(default=600, ge=0, le=2_592_000)
    """``token`` only: after a rotation the brokers still accept the previous token this
    long (10 minutes by default: time for clients to re-read the Secret), then refuse
    it; 0 refuses it at once (a leaked token). Counted from ``status.rotatedAt``, so a
    shorter value applies to a rotation already under way."""

    @model_validator(mode="after")
    def _rotation_needs_a_token(self) -> UserAuthentication:
        if self.type is not AuthenticationType.TOKEN and self.rotate_token is not None:
            raise ValueError("'rotateToken' rotates a token; this User authenticates by tls")
        return self


class UserOperation(enum.StrEnum):
    PRODUCE = "produce"
    CONSUME = "consume"
    ADMIN = "admin"


#: grants a User may list: a bound, so that the API server can bound the cost of the
#: CEL rule each grant carries
MAX_GRANTS: Final = 256


class UserGrant(Model):
    """Operations on the topics whose names match ``topics``."""

    CEL_TWINS: ClassVar[Mapping[str, CelRule]] = {
        "_cohorts_narrow_consume": CelRule(
            "!has(self.cohorts) || self.operations.exists(o, o == 'consume')",
            "cohorts narrows a consume grant; this grant has no consume",
            ".cohorts",
        )
    }

    operations: Annotated[list[UserOperation], Field(min_length=1, max_length=len(UserOperation))]
    """Any of ``produce``, ``consume``, ``admin``."""
    topics: Annotated[list[str], Field(min_length=1)]
    """Topic patterns matched against ``namespace/name``: ``*``, a prefix ending in ``*``
    (``team-a/*``), or one topic; without ``/`` a pattern is in namespace ``default``."""
    cohorts: list[str] | None = None
    """With ``consume``: the cohort name patterns it may join (default: any cohort)."""

    @field_validator("topics", "cohorts")
    @classmethod
    def _patterns(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            for pattern in value:
                acl.canonical_pattern(pattern)
        return value

    @model_validator(mode="after")
    def _cohorts_narrow_consume(self) -> UserGrant:
        if self.cohorts is not None and UserOperation.CONSUME not in self.operations:
            raise ValueError("'cohorts' narrows a consume grant; this grant has no consume")
        return self


class UserAuthorization(Model):
    """What the principal may do."""

    grants: list[UserGrant] = Field(default_factory=list, max_length=MAX_GRANTS)
    """The principal's grants; none means it may connect and do nothing else."""


class UserSpec(Model):
    """A principal of a BrokerCluster."""

    cluster_ref: ClusterReference
    """The BrokerCluster whose brokers know this principal."""
    authentication: UserAuthentication
    """Token or TLS client certificate."""
    authorization: UserAuthorization = Field(default_factory=UserAuthorization)
    """Grants on topic name patterns."""


class UserStatus(Status):
    """Where the credentials are, once the operator made them."""

    secret: SecretReference | None = None
    """``token`` users: the Secret holding the token (key ``token``)."""
    principal: str | None = None
    """The principal's name in the brokers' ACL file."""
    token_generation: int | None = None
    """``token`` users: 1 for the first token, + 1 per rotation."""
    rotated_at: str | None = None
    """``token`` users: when the current token replaced the previous one (RFC 3339)."""
    previous_token_expires_at: str | None = None
    """``token`` users, after a rotation: when the brokers stop accepting the previous
    token (RFC 3339); absent once it has expired."""


class User(Resource):
    """A principal of a BrokerCluster: its credentials and its grants (docs/security.md)."""

    KIND: ClassVar[str] = "User"
    NAMES: ClassVar[KindNames] = KindNames(
        plural="users",
        singular="user",
        short_names=("hru",),
        columns=(
            PrinterColumn("Authentication", "string", ".spec.authentication.type", "Token or TLS"),
            *READY_COLUMNS,
        ),
    )

    kind: Literal["User"] = "User"
    metadata: ObjectMeta
    spec: UserSpec
    status: UserStatus | None = None

    @property
    def principal_name(self) -> str:
        """The principal in the ACL file: ``<namespace>:<name>`` (unique in a cluster)."""
        return f"{self.metadata.namespace}:{self.metadata.name}"

    def acl_principal(
        self, token_hashes: list[str] | None = None, scram: list[str] | None = None
    ) -> acl.PrincipalSpec:
        """This User as an ACL file entry; ``token_hashes``: ``sha256:<hex>`` of its token(s),
        ``scram``: the SCRAM credentials derived from them (``control.tokens``)."""
        auth = self.spec.authentication
        grants = [
            acl.GrantSpec(
                operations=[acl.Operation(op.value) for op in grant.operations],
                topics=grant.topics,
                cohorts=grant.cohorts,
            )
            for grant in self.spec.authorization.grants
        ]
        return acl.PrincipalSpec(
            name=self.principal_name,
            tokens=list(token_hashes or []) if auth.type is AuthenticationType.TOKEN else [],
            scram=list(scram or []) if auth.type is AuthenticationType.TOKEN else [],
            certificates=[auth.common_name or self.metadata.name]
            if auth.type is AuthenticationType.TLS
            else [],
            grants=grants,
        )
