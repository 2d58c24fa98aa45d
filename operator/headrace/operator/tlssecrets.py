"""A BrokerCluster's TLS Secrets as the operator sees them (docs/security.md §10).

With ``spec.tls.enabled`` the brokers serve from a ``kubernetes.io/tls`` Secret
(cert-manager's shape: ``tls.crt``, ``tls.key``, ``ca.crt``), mounted as a volume. The
operator checks that each Secret the spec names exists and holds its keys, and makes
the cluster ``Ready=False`` (and ``Stalled``: a person has to act) when not:

* ``TlsSecretMissing``: a Secret the spec names does not exist (the pods wait in
  ``ContainerCreating`` for it: nothing stored is lost, the other brokers keep serving);
* ``TlsSecretInvalid``: it lacks a key, or its ``ca.crt`` holds no certificate.

Of a serving Secret the operator reads only ``ca.crt``, which is public: it verifies the
brokers' admin certificates with it when it polls their heartbeats, pushes topologies
and drains them over HTTPS, against the cluster's Service name
(``workloads.tls_server_name``), since it dials pod IPs. ``tls.key`` is checked for
presence only, never decoded or kept. The answer of a ``get`` holds it nonetheless:
RBAC cannot grant one key of a Secret.

``check`` is pure; ``TlsChecks`` does the reads, at most every ``recheck_s`` (and at
once when the spec changes), and keeps the admin CA's client context.
"""

from __future__ import annotations

import base64
import logging
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from headrace import tlsnames
from headrace.operator import workloads
from headrace.operator.kube import KubeApi, ObjectRef
from headrace.resources.clusters import BrokerCluster

log = logging.getLogger(__name__)

TLS_MISSING: Final = "TlsSecretMissing"
TLS_INVALID: Final = "TlsSecretInvalid"
SERVING_KEYS: Final = (workloads.TLS_CERT_KEY, workloads.TLS_KEY_KEY, workloads.CA_KEY)
PEM_CERTIFICATE: Final = "-----BEGIN CERTIFICATE-----"


@dataclass(frozen=True, slots=True)
class TlsHealth:
    """What the operator found: a problem (reason, message) or None, and the admin
    port's CA (PEM) when admin HTTP serves TLS."""

    problem: tuple[str, str] | None = None
    admin_ca: str | None = None


def _needs(cluster: BrokerCluster) -> dict[str, tuple[tuple[str, ...], str]]:
    """Secret name -> the keys it must hold and the spec field that names it."""
    tls = cluster.spec.tls
    needed: dict[str, tuple[tuple[str, ...], str]] = {}
    if tls.client_auth.value != "none" and tls.client_ca_secret_name is not None:
        needed[tls.client_ca_secret_name] = ((workloads.CA_KEY,), "tls.clientCASecretName")
    admin = workloads.admin_tls_secret(cluster)
    if admin is not None:
        needed[admin] = (SERVING_KEYS, "tls.adminTls.secretName")
    external = workloads.external_tls_secret(cluster)
    if external is not None:
        needed[external] = (
            (workloads.TLS_CERT_KEY, workloads.TLS_KEY_KEY),
            "listeners.external.tls.secretName",
        )
    if tls.secret_name is not None:
        needed[tls.secret_name] = (SERVING_KEYS, "tls.secretName")
    return needed


def _value(secret: Mapping[str, Any], key: str) -> str | None:
    raw = (secret.get("data") or {}).get(key)
    if not raw:
        return None
    try:
        return base64.b64decode(raw).decode()
    except (ValueError, UnicodeDecodeError):
        return ""


def check(cluster: BrokerCluster, secrets: Mapping[str, Mapping[str, Any] | None]) -> TlsHealth:
    """The TLS Secrets' health, given each named Secret as read (None: not found)."""
    if not cluster.spec.tls.enabled:
        return TlsHealth()
    for name, (keys, field) in _needs(cluster).items():
        secret = secrets.get(name)
        if secret is None:
            return TlsHealth(
                (
                    TLS_MISSING,
                    f"Secret {name!r} ({field}) not found: the brokers wait for it (a"
                    f" kubernetes.io/tls Secret with {', '.join(keys)})",
                )
            )
        absent = [k for k in keys if not (secret.get("data") or {}).get(k)]
        if absent:
            return TlsHealth((TLS_INVALID, f"Secret {name!r} ({field}) lacks {', '.join(absent)}"))
        if workloads.CA_KEY in keys and PEM_CERTIFICATE not in (
            _value(secret, workloads.CA_KEY) or ""
        ):
            return TlsHealth(
                (TLS_INVALID, f"Secret {name!r} ({field}): ca.crt holds no PEM certificate")
            )
    admin = workloads.admin_tls_secret(cluster)
    admin_secret = secrets.get(admin) if admin is not None else None
    return TlsHealth(admin_ca=None if admin_secret is None else _value(admin_secret, "ca.crt"))


class TlsChecks:
    """The TLS Secrets of one cluster, read now and then; the admin client context."""

    def __init__(self, recheck_s: float = 10.0) -> None:
        self.recheck_s = recheck_s
        self.health = TlsHealth()
        #: verifies the brokers' admin certificates (None: plain HTTP)
        self.admin_context: ssl.SSLContext | None = None
        self._checked: tuple[str, float] | None = None  # (spec, when: monotonic)
        self._context_for: tuple[str, str] | None = None  # (CA PEM, server name)

    async def check(self, api: KubeApi, cluster: BrokerCluster) -> TlsHealth:
        """The health as last found; reads the Secrets when a check is due."""
        external = cluster.spec.listeners.external
        key = cluster.spec.tls.model_dump_json() + (
            "" if external is None or external.tls is None else external.tls.secret_name
        )
        now = time.monotonic()
        # while something is wrong, look again sooner: the fix should show within seconds
        every = self.recheck_s / 2 if self.health.problem is not None else self.recheck_s
        checked = self._checked
        if checked is not None and checked[0] == key and now - checked[1] < every:
            return self.health
        self._checked = (key, now)
        namespace = cluster.metadata.namespace
        found = {
            name: await api.get(ObjectRef("v1", "Secret", namespace, name))
            for name in workloads.tls_secrets(cluster)
        }
        self.health = check(cluster, found)
        self._update_context(cluster)
        return self.health

    def _update_context(self, cluster: BrokerCluster) -> None:
        ca = self.health.admin_ca
        if workloads.admin_tls_secret(cluster) is None:
            self.admin_context, self._context_for = None, None
            return
        if ca is None:
            # not readable now: keep what verified the brokers so far; with nothing so far
            # (an operator started while the Secret is missing), HTTPS that trusts no
            # certificate, never plain HTTP: the polls carry the replication token, which
            # must not cross the network in clear to admin ports that serve TLS
            if self.admin_context is None:
                self.admin_context = _trusting_nothing()
            return
        wanted = (ca, workloads.tls_server_name(cluster))
        if wanted == self._context_for:
            return
        try:
            context = tlsnames.client_context(None, wanted[1], cadata=ca)
        except (ssl.SSLError, ValueError) as exc:
            self.health = TlsHealth((TLS_INVALID, f"ca.crt does not load: {exc}"))
            if self.admin_context is None:
                self.admin_context = _trusting_nothing()  # as above: never plain HTTP
            return
        self.admin_context, self._context_for = context, wanted
        log.info(
            "%s/%s: admin ports over TLS, verifying %s",
            cluster.metadata.namespace, cluster.metadata.name, wanted[1],
        )  # fmt: skip


def _trusting_nothing() -> ssl.SSLContext:
    """A client context with no CA: every handshake fails before a request is sent."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
