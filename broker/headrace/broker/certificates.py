"""The broker's serving certificates, re-read without a restart.

A listener's ``ssl.SSLContext`` is made once and kept: asyncio (and aiohttp) wrap every
new connection with it, so calling ``load_cert_chain`` on it again puts a renewed
certificate in force for every connection accepted from then on, while open
connections keep the session they negotiated. The certificate and its key are two
credential files of the reload machinery (``headrace.security.reloading``): re-read on
SIGHUP and when either changes (a stat per file), as cert-manager's renewals reach a
pod through the kubelet's atomic swap of a Secret volume. A pair that does not load
(a key that does not match, a half-written file) is refused and the certificate in
force stays.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path

from headrace.errors import InvalidRequest
from headrace.security.reloading import CredentialFiles
from headrace.security.settings import TlsSettings


def _load_pair(
    ctx: ssl.SSLContext, cert_file: Path, key_file: Path, shown: tuple[Path, Path] | None = None
) -> None:
    """``shown``: the files to name in the error (those the bytes came from)."""
    cert_name, key_name = shown or (cert_file, key_file)
    try:
        ctx.load_cert_chain(str(cert_file), str(key_file))
    except (OSError, ssl.SSLError) as exc:
        raise InvalidRequest(
            f"cannot load the certificate {cert_name} with the key {key_name}: {exc}"
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


#: a certificate subject or issuer as ``getpeercert()`` spells it: a tuple of RDNs
DistinguishedName = tuple[tuple[tuple[str, str], ...], ...]


def client_issuers(tls: TlsSettings) -> frozenset[DistinguishedName]:
    """The subjects of the certificates in ``tls``'s client CA file: a client
    certificate's subject CN names a principal only when the certificate's issuer is one
    of them (``client_certificate``). The listener also accepts certificates of the
    brokers' own CA (``tls.ca_file``) at the handshake, so that brokers fetch from one
    another with theirs; those authenticate by token only, as the serving CA is often a
    cluster-wide issuer others can request certificates from with any CN. Read at start,
    as the verify locations are (docs/security.md §10)."""
    if tls.client_ca_file is None:
        return frozenset()
    scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        scratch.load_verify_locations(str(tls.client_ca_file))
    except (OSError, ssl.SSLError) as exc:
        raise InvalidRequest(f"cannot load the client CA {tls.client_ca_file}: {exc}") from exc
    return frozenset(
        _distinguished_name(cert.get("subject", ())) for cert in scratch.get_ca_certs()
    )


def _distinguished_name(rdns: object) -> DistinguishedName:
    if not isinstance(rdns, tuple):
        return ()
    return tuple(tuple((str(k), str(v)) for k, v in rdn) for rdn in rdns)


def client_certificate(peercert: object, issuers: frozenset[DistinguishedName]) -> object:
    """``peercert`` (``getpeercert()``'s dict) when the client CA issued it, else None:
    a certificate that chains only to another trusted CA names no principal."""
    if not isinstance(peercert, dict):
        return None
    if _distinguished_name(peercert.get("issuer", ())) not in issuers:
        return None
    return peercert


@contextlib.contextmanager
def _as_files(cert_pem: bytes, key_pem: bytes) -> Iterator[tuple[Path, Path]]:
    """``cert_pem`` and ``key_pem`` as paths ``load_cert_chain`` can read: anonymous
    in-memory files where the system has them (the key never touches a disk), else a
    private temporary directory."""
    if hasattr(os, "memfd_create"):
        fds = [os.memfd_create("headrace-tls", 0) for _ in range(2)]
        try:
            for fd, data in zip(fds, (cert_pem, key_pem), strict=True):
                os.write(fd, data)
            yield Path(f"/proc/self/fd/{fds[0]}"), Path(f"/proc/self/fd/{fds[1]}")
        finally:
            for fd in fds:
                os.close(fd)
        return
    with tempfile.TemporaryDirectory() as scratch:  # mode 0700
        cert, key = Path(scratch) / "tls.crt", Path(scratch) / "tls.key"
        cert.write_bytes(cert_pem)
        key.touch(0o600)
        key.write_bytes(key_pem)
        yield cert, key


def watch(files: CredentialFiles, source: str, tls: TlsSettings, ctx: ssl.SSLContext) -> None:
    """Re-read ``tls``'s certificate and key into ``ctx`` when either changes (sources
    ``<source>_cert`` and ``<source>_key``).

    The files are read once per re-read, and those bytes are what is checked on a
    scratch context and then loaded into ``ctx``: ``load_cert_chain`` failing on the
    context in force leaves it with the new certificate and no usable key (no handshake
    succeeds), so it must only ever be given a pair already known to load, not the files
    again (a renewal may land between the check and the load)."""

    shown = (tls.cert_file, tls.key_file)

    def read(_: Path) -> tuple[bytes, bytes]:
        try:
            pair = tls.cert_file.read_bytes(), tls.key_file.read_bytes()
        except OSError as exc:
            raise InvalidRequest(
                f"cannot read the certificate {tls.cert_file} or its key {tls.key_file}:"
                f" {exc.strerror}"
            ) from exc
        # checked on a scratch context first: a bad pair must not touch the one in force
        with _as_files(*pair) as (cert, key):
            _load_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), cert, key, shown)
        return pair

    def apply(pair: tuple[bytes, bytes]) -> None:
        with _as_files(*pair) as (cert, key):
            _load_pair(ctx, cert, key, shown)

    for suffix, path in (("cert", tls.cert_file), ("key", tls.key_file)):
        files.watch(f"{source}_{suffix}", path, read, apply, lambda _: "certificate in force")
