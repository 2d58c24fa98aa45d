"""Certificates and keys for the test bed, generated locally with ``cryptography``.

One CA signs everything: etcd's and the API server's serving certificates, and the
client certificates that identify each component to the API server. Kubernetes derives
a client certificate's user from its CN and groups from its O fields, so those are the
identities RBAC sees (``system:kube-controller-manager`` and so on, which the API
server's bootstrap policy already grants what each component needs).

Files are written once and reused: a second ``up`` keeps the same CA, so kubeconfigs
handed out earlier stay valid.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from headrace.files import DEFAULT_MODE, write_atomic

#: Validity of every certificate. Long enough that a test bed left up never expires.
VALIDITY = datetime.timedelta(days=3650)

#: Names the API server's certificate answers to. 127.0.0.1 is what everyone dials;
#: the in-cluster names are there so clients that verify them are not surprised.
APISERVER_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class ClientIdentity:
    """Who a client certificate says its holder is (CN = user, O = groups)."""

    name: str  # file stem
    user: str
    groups: tuple[str, ...] = ()


#: Client identities the test bed issues. ``testbed-runner`` is in ``system:masters``
#: because it does the kubelet's job *and* a volume provisioner's, which no single
#: bootstrap role covers.
CLIENTS = (
    ClientIdentity("admin", "testbed-admin", ("system:masters",)),
    ClientIdentity("controller-manager", "system:kube-controller-manager"),
    ClientIdentity("scheduler", "system:kube-scheduler"),
    ClientIdentity("runner", "testbed-runner", ("system:masters",)),
    ClientIdentity("apiserver-etcd-client", "kube-apiserver-etcd-client"),
    ClientIdentity(
        "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
    ),
)


def _key() -> ec.EllipticCurvePrivateKey:
    # P-256: fast to generate (RSA-2048 costs ~100 ms each on this machine) and
    # accepted by etcd, Go's TLS stack and Python's ssl module alike.
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Signatures only (EC keys encipher nothing); a CA's sign certificates and CRLs too."""
    return x509.KeyUsage(
        digital_signature=True,
        key_encipherment=False,
        content_commitment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


@dataclass(frozen=True)
class CA:
    """The test bed's certificate authority, loaded or created in :func:`ensure`."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def issue(
        self,
        cn: str,
        orgs: tuple[str, ...] = (),
        *,
        server: bool = False,
        client: bool = False,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
    ) -> tuple[bytes, bytes]:
        """Issue a leaf certificate; returns (certificate PEM, key PEM)."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn, orgs))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(signs_certificates=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def new_ca(common_name: str = "headrace-testbed-ca") -> CA:
    """A fresh CA (the test bed keeps one on disk; tests may want their own, and name
    it apart when a broker must tell two CAs' certificates apart by issuer)."""
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CA(cert, key)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    write_atomic(path, data, sync=False, mode=0o600 if private else DEFAULT_MODE)


def ensure(pki_dir: Path) -> None:
    """Create every certificate and key under ``pki_dir`` that does not exist yet.

    Layout: ``ca.crt``/``ca.key``; ``etcd-server``, ``apiserver`` and ``runner-server``
    serving pairs; one ``<name>.crt``/``<name>.key`` per :data:`CLIENTS` entry; and
    ``sa.key``/``sa.pub``, the service-account signing pair (RSA, because that is what
    every Kubernetes release accepts for ``--service-account-signing-key-file``).
    """
    pki_dir.mkdir(parents=True, exist_ok=True)
    ca_crt, ca_key = pki_dir / "ca.crt", pki_dir / "ca.key"
    if ca_crt.exists() and ca_key.exists():
        ca = _load_ca(pki_dir)
    else:
        ca = new_ca()
        _write(ca_key, _pem_key(ca.key), private=True)
        _write(ca_crt, ca.cert.public_bytes(serialization.Encoding.PEM))

    def pair(stem: str, make: tuple[bytes, bytes] | None = None) -> None:
        crt, key = pki_dir / f"{stem}.crt", pki_dir / f"{stem}.key"
        if crt.exists() and key.exists():
            return
        assert make is not None
        _write(key, make[1], private=True)
        _write(crt, make[0])

    loopback = ("127.0.0.1",)
    for stem, dns in (
        ("etcd-server", ("localhost",)),
        ("apiserver", APISERVER_DNS),
        ("runner-server", ("localhost",)),
    ):
        if not (pki_dir / f"{stem}.crt").exists():
            pair(stem, ca.issue(stem, server=True, client=True, dns=dns, ips=loopback))
    for ident in CLIENTS:
        if not (pki_dir / f"{ident.name}.crt").exists():
            pair(ident.name, ca.issue(ident.user, ident.groups, client=True))

    sa_key, sa_pub = pki_dir / "sa.key", pki_dir / "sa.pub"
    if not (sa_key.exists() and sa_pub.exists()):
        rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        _write(sa_key, _pem_key(rsa_key), private=True)
        pub = rsa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        _write(sa_pub, pub)


def _load_ca(pki_dir: Path) -> CA:
    cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return CA(cert, key)


def ensure_serving(pki_dir: Path, stem: str, dns: tuple[str, ...], ips: tuple[str, ...]) -> None:
    """A serving pair ``<stem>.crt``/``.key`` from the test bed's CA (after :func:`ensure`)
    naming exactly ``dns`` and ``ips``; reissued when the names changed (a real node's
    certificate names the host's address, which may differ from one boot to the next)."""
    crt = pki_dir / f"{stem}.crt"
    wanted = {*dns, *ips}
    if crt.exists() and (pki_dir / f"{stem}.key").exists():
        cert = x509.load_pem_x509_certificate(crt.read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        have = {str(n.value) for n in sans}
        if have == wanted:
            return
    cert_pem, key_pem = _load_ca(pki_dir).issue(stem, server=True, client=True, dns=dns, ips=ips)
    _write(pki_dir / f"{stem}.key", key_pem, private=True)
    _write(crt, cert_pem)
