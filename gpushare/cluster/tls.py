"""Serving certificates for the webhook: reuse the ones in the cert dir, or make a self-signed CA
and a certificate for the webhook's host names (so a developer needs no cert-manager)."""

import datetime as dt
import ipaddress
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpushare.api.errors import InvalidInputError
from gpushare.cluster.issuing import ca_builder
from gpushare.cluster.settings import is_ip

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_FILE = "ca.crt"
RENEW_BEFORE = dt.timedelta(days=30)
VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path
    ca: Path

    def ca_pem(self) -> bytes:
        return self.ca.read_bytes()

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


def _covers(cert: x509.Certificate, hosts: list[str]) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    names = set(san.get_values_for_type(x509.DNSName))
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return all((h in ips) if is_ip(h) else (h in names) for h in hosts)


def _usable(files: CertFiles, hosts: list[str], now: dt.datetime) -> bool:
    if not (files.cert.is_file() and files.key.is_file() and files.ca.is_file()):
        return False
    try:
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        x509.load_pem_x509_certificate(files.ca.read_bytes())
    except ValueError:
        return False
    return cert.not_valid_after_utc - now > RENEW_BEFORE and _covers(cert, hosts)


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    tmp.replace(path)


def ensure_certs(
    directory: Path,
    *,
    hosts: list[str],
    required: list[str] | None = None,
    now: dt.datetime | None = None,
) -> CertFiles:
    """Return usable serving files in ``directory``. Existing files are kept when valid for 30
    more days and covering ``required`` (default: all ``hosts``), e.g. ones cert-manager
    mounted; otherwise a new CA and a certificate for ``hosts`` are generated there."""
    now = now or dt.datetime.now(dt.UTC)
    files = CertFiles(directory / CERT_FILE, directory / KEY_FILE, directory / CA_FILE)
    if _usable(files, hosts if required is None else required, now):
        return files
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _generate(files, hosts, now)
    except OSError as exc:
        raise InvalidInputError(
            "--webhook-cert-dir",
            f"has no usable certificate for {', '.join(required or hosts)} and cannot be written "
            f"({exc.strerror})",
            "mount a certificate covering those names (tls.crt, tls.key, ca.crt) or a writable "
            "directory",
        ) from None
    return files


def _generate(files: CertFiles, hosts: list[str], now: dt.datetime) -> None:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = ca_builder(
        ca_key,
        "gpushare webhook CA",
        not_before=now - dt.timedelta(minutes=5),
        not_after=now + VALIDITY,
    ).sign(ca_key, hashes.SHA256())
    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = []
    for host in hosts:
        if is_ip(host):
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        else:
            alt.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    _write(files.ca, ca_cert.public_bytes(pem))
    _write(
        files.key,
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
        private=True,
    )
    _write(files.cert, cert.public_bytes(pem))


class ReloadingServerTls:
    """The SSLContext of a listener whose certificate files are rotated underneath it (a
    Secret updated by cert-manager or Helm). New connections pick the newest context through
    the SNI callback; connections already open keep theirs. With ``client_ca`` the listener
    requires a client certificate signed by it (mutual TLS); a rotated client CA is trusted
    alongside the previous one, so clients holding certificates of either work during the
    change."""

    def __init__(
        self,
        *,
        cert: Path,
        key: Path,
        client_ca: Path | None = None,
        client_optional: bool = False,
    ) -> None:
        self.cert = cert
        self.key = key
        self.client_ca = client_ca
        self.client_optional = client_optional
        """With ``client_ca``: a client may present no certificate (one it presents must be
        signed by the CA); the server then decides per request (the webhook's probes)."""
        self._previous_ca = b""
        self._seen = self.fingerprint()
        self.context = self._build()
        self.context.sni_callback = self._pick
        self._current = self.context
        self.reloads = 0

    def fingerprint(self) -> tuple[bytes, ...]:
        """The files' contents (kubelet swaps a Secret's files by symlink: content is what
        tells a change)."""
        paths = [self.cert, self.key, *([self.client_ca] if self.client_ca else [])]
        out: list[bytes] = []
        for path in paths:
            try:
                out.append(path.read_bytes())
            except OSError:
                out.append(b"")
        return tuple(out)

    def _build(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            ctx.verify_mode = ssl.CERT_OPTIONAL if self.client_optional else ssl.CERT_REQUIRED
            bundle = self.client_ca.read_bytes() + b"\n" + self._previous_ca
            ctx.load_verify_locations(cadata=bundle.decode())
        return ctx

    def _pick(self, sock: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: object) -> None:
        if self._current is not sock.context:
            sock.context = self._current

    def changed(self) -> bool:
        return self.fingerprint() != self._seen

    def reload(self) -> bool:
        """Load the files again; False (the old context kept) while they do not form a usable
        set yet (a rotation half written)."""
        seen = self.fingerprint()
        previous = self._seen[2] if self.client_ca is not None and len(self._seen) > 2 else b""
        keep = self._previous_ca
        if previous and previous != (seen[2] if len(seen) > 2 else b""):
            self._previous_ca = previous
        try:
            context = self._build()
        except (OSError, ssl.SSLError, ValueError):
            self._previous_ca = keep
            return False
        self._current = context
        self._seen = seen
        self.reloads += 1
        return True


def issued_by_one_of(cert_pem: bytes, bundle: bytes) -> bool:
    """Does a CA of the PEM ``bundle`` sign the first certificate of ``cert_pem``? (The
    webhook switches to a rotated certificate only once the API server trusts its CA.)"""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cas = x509.load_pem_x509_certificates(bundle)
    except ValueError:
        return False
    for ca in cas:
        if ca.subject != cert.issuer:
            continue
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False
