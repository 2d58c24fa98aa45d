"""TLS client contexts that verify a fixed server name (an adapter, not pure).

On Kubernetes, brokers advertise their pod IPs (nothing else is stable on every
cluster: DNS names need cluster DNS), but a certificate is issued before any pod has
an IP: it names the cluster's Services (``<cluster>.<namespace>.svc``,
``*.<cluster>-brokers.<namespace>.svc``). So every TLS client of the brokers (the
client library, a broker fetching from a leader, the operator's heartbeat polls,
``headrace drain``) may verify each broker's certificate against one **server name**
instead of the address it dialled: the chain must still lead to the given CA, and the
certificate must name ``server_name``. What is dialled and what is verified are
then independent, as with ``--servername`` in openssl or ``tls.Config.ServerName`` in
Go.

``named_client_context`` returns an ``ssl.SSLContext`` whose ``wrap_socket`` and
``wrap_bio`` put ``server_name`` in place of the host the caller passes; asyncio,
uvloop, aiohttp and ``urllib`` all wrap through one of the two, so one context serves
every client here.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any


class _NamedContext(ssl.SSLContext):
    """An ``SSLContext`` that checks the peer's certificate against ``server_name``."""

    server_name: str

    def wrap_socket(self, sock: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["server_hostname"] = self.server_name
        return super().wrap_socket(sock, *args, **kwargs)

    def wrap_bio(self, incoming: Any, outgoing: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["server_hostname"] = self.server_name
        return super().wrap_bio(incoming, outgoing, *args, **kwargs)


def client_context(
    ca_file: Path | None,
    server_name: str | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    *,
    cadata: str | None = None,
) -> ssl.SSLContext:
    """A verifying TLS client context: the chain must lead to ``ca_file`` or ``cadata``
    (PEM; the system's CAs when neither) and the certificate must name ``server_name``
    (the dialled host when None); ``cert_file``/``key_file``: a client certificate for
    mutual TLS."""
    ctx: ssl.SSLContext
    cafile = str(ca_file) if ca_file else None
    if server_name is None:
        ctx = ssl.create_default_context(cafile=cafile, cadata=cadata)
    else:
        named = _NamedContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies chain and name
        named.server_name = server_name
        if cafile is None and cadata is None:
            named.load_default_certs(ssl.Purpose.SERVER_AUTH)
        else:
            named.load_verify_locations(cafile=cafile, cadata=cadata)
        ctx = named
    if cert_file is not None and key_file is not None:
        ctx.load_cert_chain(str(cert_file), str(key_file))
    return ctx
