"""The broker's serving certificates, re-read without a restart.

A listener's ``ssl.SSLContext`` is made once and kept: asyncio (and aiohttp) wrap every
new connection with it, so calling ``load_cert_chain`` on it again puts a renewed
certificate in force for every connection accepted from then on, while open
connections keep the session they negotiated. The certificate and its key are two
credential files of the reload machinery (``headrace.broker.reloading``): re-read on
SIGHUP and when either changes (a stat per file), as cert-manager's renewals reach a
pod through the kubelet's atomic swap of a Secret volume. A pair that does not load
(a key that does not match, a half-written file) is refused and the certificate in
force stays.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from headrace.broker.config import TlsSettings
from headrace.broker.reloading import CredentialFiles
from headrace.errors import InvalidRequest


def _load_pair(ctx: ssl.SSLContext, cert_file: Path, key_file: Path) -> None:
    try:
        ctx.load_cert_chain(str(cert_file), str(key_file))
    except (OSError, ssl.SSLError) as exc:
        raise InvalidRequest(
            f"cannot load the certificate {cert_file} with the key {key_file}: {exc}"
        ) from exc


def serving_context(tls: TlsSettings) -> ssl.SSLContext:
    """A server context with ``tls``'s certificate. With a client CA, clients present a
    certificate signed by it (or by ``tls.ca_file``, the CA of the brokers' own
    certificates, so brokers fetching from one another are let in with theirs):
    required, or only checked when given (``client_auth_required`` False)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load_pair(ctx, tls.cert_file, tls.key_file)
    if tls.client_ca_file is not None:
        ctx.load_verify_locations(str(tls.client_ca_file))
        if tls.ca_file is not None and tls.ca_file != tls.client_ca_file:
            ctx.load_verify_locations(str(tls.ca_file))
        ctx.verify_mode = ssl.CERT_REQUIRED if tls.client_auth_required else ssl.CERT_OPTIONAL
    return ctx


def watch(files: CredentialFiles, source: str, tls: TlsSettings, ctx: ssl.SSLContext) -> None:
    """Re-read ``tls``'s certificate and key into ``ctx`` when either changes (sources
    ``<source>_cert`` and ``<source>_key``)."""

    def read(_: Path) -> tuple[Path, Path]:
        # checked on a scratch context first: a bad pair must not touch the one in force
        _load_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), tls.cert_file, tls.key_file)
        return tls.cert_file, tls.key_file

    def apply(pair: tuple[Path, Path]) -> None:
        _load_pair(ctx, *pair)

    for suffix, path in (("cert", tls.cert_file), ("key", tls.key_file)):
        files.watch(f"{source}_{suffix}", path, read, apply, lambda _: "certificate in force")
