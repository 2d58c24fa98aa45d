"""What access control is configured with: credentials, TLS, who may read admin HTTP.

Values only, read once at start-up. A broker derives ``AccessSettings`` from its
``BrokerSettings`` (``BrokerSettings.access_settings``); the controller builds one from
its own settings, without a data directory, as it issues no member identities.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

#: the cluster key's file name when it lives in a state directory
KEY_FILE_NAME: Final = "cluster.key"


class AdminReadAccess(StrEnum):
    """Who may use the read-only admin HTTP routes (never ``/healthz``, ``/readyz``)."""

    #: whoever reaches the port: the default, as the port is loopback unless told otherwise
    OPEN = "open"
    #: a bearer token (or certificate) that authenticates on the data port
    AUTHENTICATED = "authenticated"


@dataclass(frozen=True, slots=True)
class TlsSettings:
    #: the serving certificate and its key; both re-read on change (``certificates``)
    cert_file: Path
    key_file: Path
    #: when set, clients must present a certificate signed by this CA (mutual TLS)
    client_ca_file: Path | None = None
    #: with a client CA: False checks a certificate only when the client presents one
    #: (others authenticate by token)
    client_auth_required: bool = True
    #: the CA this broker verifies the other brokers' certificates with when it fetches
    #: from them (None: the client CA, else its own certificate)
    ca_file: Path | None = None
    #: the name the other brokers' certificates must carry (None: the host dialled);
    #: on Kubernetes the cluster's Service name, as pods are dialled by IP
    server_name: str | None = None


@dataclass(frozen=True, slots=True)
class AccessSettings:
    """The credentials one process checks (``security.access.Access``): open when none."""

    #: the cluster signed member identities are bound to
    cluster_id: str = "standalone"
    #: tokens accepted in the handshake; empty = no authentication
    auth_tokens: frozenset[str] = frozenset()
    #: more accepted tokens, one per line, re-read on change; with ``auth_tokens`` or
    #: alone, it turns the shared-token mode on
    auth_token_file: Path | None = None
    #: principals, their credentials and grants (docs/security.md); None = no ACLs
    acl_file: Path | None = None
    #: the HMAC keys signing member identities, one per line (the first signs, any
    #: verifies), re-read on change
    cluster_key_file: Path | None = None
    #: where the cluster key is made on first start when ``cluster_key_file`` is None (a
    #: standalone broker's data directory). With neither, this process issues and checks
    #: no member identities (the controller: it authenticates admin requests only)
    cluster_key_dir: Path | None = None
    #: the token this broker presents to other brokers' data ports
    replication_token: str | None = None
    #: the replication tokens in a file, one per line, re-read on change: the first is
    #: presented, every one is accepted as the brokers'; replaces ``replication_token``
    replication_token_file: Path | None = None
    #: a cluster-mode broker: with ACLs, every broker must verify the others' identities,
    #: so the key cannot be one made in this broker's data directory
    cluster_mode: bool = False

    @property
    def key_file(self) -> Path | None:
        """The cluster key's file: the one given, else ``cluster.key`` in ``cluster_key_dir``."""
        if self.cluster_key_file is not None:
            return self.cluster_key_file
        if self.cluster_key_dir is not None:
            return self.cluster_key_dir / KEY_FILE_NAME
        return None
