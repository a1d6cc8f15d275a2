"""The certificates gpushare-controller issues (pure: no Kubernetes, no files): a CA, leaf
certificates it signs (serving or client), and what makes a stored one due for renewal.

:mod:`gpushare.cluster.certificates` keeps them in Secrets and renews them
(docs/chart.md, "Certificates"). ECDSA P-256 keys; certificates start :data:`BACKDATE` in the
past and are renewed when a third of their life is left, when another CA signed them or when
they name other hosts.
"""

import datetime as dt
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpushare.kube.certificates import StoredSecret

RENEW_ANNOTATION = "gpushare.io/renew"
"""On a certificate Secret: the leader renews that certificate now (then drops the mark)."""
CA_DAYS = 3650
CLIENT_NAME = "gpushare-scheduler"
BACKDATE = dt.timedelta(minutes=5)
"""Certificates start a little in the past, for clocks a little behind the controller's."""


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def ca_builder(
    key: ec.EllipticCurvePrivateKey,
    common_name: str,
    *,
    not_before: dt.datetime,
    not_after: dt.datetime,
) -> x509.CertificateBuilder:
    """A self-signed CA certificate of ``key``, to be signed with it: it signs certificates
    and CRLs, and no CA below it (also the webhook's own CA, gpushare.cluster.tls)."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
    )


def make_ca(*, now: dt.datetime, days: int = CA_DAYS) -> dict[str, bytes]:
    """A new CA: ``tls.crt`` (also as ``ca.crt``) and its ``tls.key``."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = ca_builder(
        key, "gpushare CA", not_before=now - BACKDATE, not_after=now + dt.timedelta(days=days)
    )
    cert = builder.add_extension(
        x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False
    ).sign(key, hashes.SHA256())
    pem = cert.public_bytes(serialization.Encoding.PEM)
    return {"ca.crt": pem, "tls.crt": pem, "tls.key": _pem_key(key)}


@dataclass(frozen=True)
class Leaf:
    """One certificate the controller keeps: a Secret, what it names, where it is served."""

    secret: str
    common_name: str
    hosts: tuple[str, ...] = ()
    """Server certificate for these names; empty: a client certificate."""
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @property
    def client(self) -> bool:
        return not self.hosts


def issue(ca: Mapping[str, bytes], leaf: Leaf, *, now: dt.datetime, days: int) -> dict[str, bytes]:
    """A certificate for ``leaf`` signed by ``ca`` (never outliving it), with ``ca.crt``."""
    ca_cert = x509.load_pem_x509_certificate(ca["tls.crt"])
    ca_key = serialization.load_pem_private_key(ca["tls.key"], password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = []
    for host in leaf.hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if leaf.client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, leaf.common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return {
        "ca.crt": ca["tls.crt"],
        "tls.crt": cert.public_bytes(serialization.Encoding.PEM),
        "tls.key": _pem_key(key),
    }


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return set(san.get_values_for_type(x509.DNSName)) | {
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)
    }


def _due(cert: x509.Certificate, now: dt.datetime) -> bool:
    """A third of its life or less left (cert-manager's default renewal point)."""
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    return cert.not_valid_after_utc - now <= life / 3


def ca_problem(stored: StoredSecret | None, *, now: dt.datetime) -> str | None:
    """Why the CA Secret cannot sign on (None: it can)."""
    if stored is None:
        return "missing"
    try:
        cert = x509.load_pem_x509_certificate(stored.data["tls.crt"])
        key = serialization.load_pem_private_key(stored.data["tls.key"], password=None)
    except (KeyError, ValueError, TypeError):
        return "unreadable"
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        return "its key does not match"
    if RENEW_ANNOTATION in stored.annotations:
        return f"asked for ({RENEW_ANNOTATION})"
    if cert.not_valid_after_utc - now < dt.timedelta(days=CA_DAYS // 10):
        return f"expires {cert.not_valid_after_utc:%Y-%m-%d}"
    return None


def leaf_problem(
    stored: StoredSecret | None, leaf: Leaf, ca: Mapping[str, bytes], *, now: dt.datetime
) -> str | None:
    """Why ``leaf``'s Secret needs a new certificate (None: it does not)."""
    if stored is None:
        return "missing"
    try:
        cert = x509.load_pem_x509_certificate(stored.data["tls.crt"])
        serialization.load_pem_private_key(stored.data["tls.key"], password=None)
        ca_cert = x509.load_pem_x509_certificate(ca["tls.crt"])
    except (KeyError, ValueError, TypeError):
        return "unreadable"
    if stored.data.get("ca.crt") != ca["tls.crt"]:
        return "another CA"
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return "another CA"
    if RENEW_ANNOTATION in stored.annotations:
        return f"asked for ({RENEW_ANNOTATION})"
    if set(leaf.hosts) != _names(cert):
        return "other names"
    if _due(cert, now):
        return f"expires {cert.not_valid_after_utc:%Y-%m-%d %H:%M}"
    return None
