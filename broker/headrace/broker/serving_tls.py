"""The broker's TLS contexts: one per listener that serves a certificate, and the one
it dials other brokers with.

Serving contexts are kept, not rebuilt: a renewed certificate reloads into them
(``certificates.watch``), so listeners already bound serve it from then on.
"""

from __future__ import annotations

import ssl

from headrace import tlsnames
from headrace.broker import certificates
from headrace.broker.certificates import DistinguishedName
from headrace.broker.config import BrokerSettings
from headrace.security.reloading import CredentialFiles
from headrace.security.settings import TlsSettings


class ServingTls:
    def __init__(self, settings: BrokerSettings, credential_files: CredentialFiles) -> None:
        self._settings = settings
        self._files = credential_files
        #: the data listener's (and the Kafka listener's) context; None: plain TCP
        self.server = self._serving(settings.tls, "tls")
        #: the admin listener's context; None: plain HTTP
        self.admin = self._serving(settings.admin_tls, "admin_tls")
        #: the named listeners that serve a certificate of their own, by name
        self.listeners = {
            listener.name: ctx
            for listener in settings.listeners
            if (ctx := self._serving(listener.tls, f"listener_{listener.name}_tls")) is not None
        }
        #: the issuers whose client certificates name a principal on the data listener
        self.client_issuers: frozenset[DistinguishedName] = (
            certificates.client_issuers(settings.tls) if settings.tls else frozenset()
        )

    def listener(self, name: str) -> ssl.SSLContext | None:
        """The context named listener ``name`` serves (the data listener's unless its own)."""
        return self.listeners.get(name, self.server)

    def client(self) -> ssl.SSLContext | None:
        """The context this broker dials other brokers with (None: plain TCP)."""
        tls = self._settings.tls
        if tls is None:
            return None
        return tlsnames.client_context(
            tls.ca_file or tls.client_ca_file or tls.cert_file,
            tls.server_name,
            tls.cert_file,
            tls.key_file,
        )

    def _serving(self, tls: TlsSettings | None, source: str) -> ssl.SSLContext | None:
        if tls is None:
            return None
        ctx = certificates.serving_context(tls)
        certificates.watch(self._files, source, tls, ctx)
        return ctx
