"""``certificates.watch``: the pair a re-read checked is the pair put in force, even when
the files change between the check and the apply (a failed ``load_cert_chain`` on the
live context leaves it with a certificate and no usable key: no handshake succeeds)."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

from cryptography import x509

from e2e.testbed import pki
from headrace.broker import certificates
from headrace.security.reloading import CredentialFiles
from headrace.security.settings import TlsSettings


def _served_cn(ctx: ssl.SSLContext, ca_pem: bytes) -> str:
    """The CN a new TLS connection to ``ctx`` is served (raises if no handshake works)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        conn, _ = server.accept()
        try:
            with ctx.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)
        except (ssl.SSLError, OSError):
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = ssl.create_default_context(cadata=ca_pem.decode())
    client.check_hostname = False
    try:
        with client.wrap_socket(socket.create_connection(("127.0.0.1", port))) as tls:
            der = tls.getpeercert(binary_form=True)
            assert der is not None
    finally:
        thread.join(5)
        server.close()
    name = x509.load_der_x509_certificate(der).subject
    return str(name.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value)


def test_a_pair_changed_between_the_check_and_the_apply_keeps_the_context_serving(
    tmp_path: Path,
) -> None:
    from cryptography.hazmat.primitives import serialization

    ca = pki.new_ca()
    ca_pem = ca.cert.public_bytes(serialization.Encoding.PEM)
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_a, key_a = ca.issue("a", server=True)
    cert_file.write_bytes(cert_a)
    key_file.write_bytes(key_a)
    tls = TlsSettings(cert_file, key_file)
    ctx = certificates.serving_context(tls)
    files = CredentialFiles(None, lambda: None)
    certificates.watch(files, "tls", tls, ctx)
    assert _served_cn(ctx, ca_pem) == "a"

    cert_b, key_b = ca.issue("b", server=True)
    cert_file.write_bytes(cert_b)
    key_file.write_bytes(key_b)
    entry = files.files[0]
    checked = entry.read(entry.path)  # the re-read checks b's pair...
    cert_c, _ = ca.issue("c", server=True)
    cert_file.write_bytes(cert_c)  # ...and the next renewal's certificate lands before its key
    entry.apply(checked)  # what was checked goes in force, whatever the files hold now
    assert _served_cn(ctx, ca_pem) == "b"
