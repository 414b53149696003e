"""TLS for the admission webhook: a CA and a serving certificate, made with `cryptography`.

The API server calls webhooks over HTTPS only and checks the serving certificate against the
`caBundle` it was given. kopf can self-sign, but through oscrypto, which fails on current
OpenSSL; so vramgate makes its own. A directory that already holds a certificate someone else
issued (a mounted `kubernetes.io/tls` Secret, cert-manager) is used as it is.

Files use the Secret key names: `tls.crt`, `tls.key`, `ca.crt`; `ca.key` marks a directory
vramgate generated itself, which it renews when the certificate no longer covers the
requested hosts or is about to expire. A renewal keeps the CA (ten years) and issues a new
serving certificate (one year) from it, so the caBundle registered with the API server stays
valid across renewals. `controller.webhook.cert_secret` keeps the same material in a Secret.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
#: The serving certificate's lifetime: renewed from the same CA, so it may be short.
VALIDITY = dt.timedelta(days=365)
#: The CA's lifetime: long, because a new CA means a new caBundle in every configuration.
CA_VALIDITY = dt.timedelta(days=3650)
#: Renew a generated certificate this long before it expires, so that a restart renews it.
RENEW_BEFORE = dt.timedelta(days=30)
LOCAL_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class ServingCert:
    """Paths of the CA certificate (the webhook's caBundle) and the serving key pair."""

    ca: Path
    cert: Path
    key: Path


@dataclass(frozen=True)
class TlsMaterial:
    """PEM bytes of a CA and a serving key pair; `ca_key` is None when someone else issued
    them (vramgate then cannot renew, only use them)."""

    ca_cert: bytes
    cert: bytes
    key: bytes
    ca_key: bytes | None = None


def wanted_hosts(hosts: Iterable[str]) -> list[str]:
    """The hosts a generated certificate covers: those asked for, and loopback."""
    return sorted(set(hosts) | set(LOCAL_HOSTS))


def generate(hosts: Iterable[str], now: dt.datetime, ca: TlsMaterial | None = None) -> TlsMaterial:
    """A serving certificate for `hosts`, issued by `ca` when it is vramgate's and fresh, else
    by a new CA."""
    wanted = wanted_hosts(hosts)
    if ca is not None and ca.ca_key is not None and ca_fresh(ca, now):
        ca_key = serialization.load_pem_private_key(ca.ca_key, password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        ca_cert = x509.load_pem_x509_certificate(ca.ca_cert)
    else:
        ca_key, ca_cert = _make_ca(now)
    key, cert = _make_serving(ca_key, ca_cert, wanted, now)
    return TlsMaterial(
        ca_cert=ca_cert.public_bytes(serialization.Encoding.PEM),
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=_key_pem(key),
        ca_key=_key_pem(ca_key),
    )


def ca_fresh(material: TlsMaterial, now: dt.datetime) -> bool:
    """Whether the CA outlives the renewal margin, so it may issue a new serving cert."""
    try:
        ca = x509.load_pem_x509_certificate(material.ca_cert)
    except ValueError:
        return False
    return ca.not_valid_after_utc - RENEW_BEFORE > now


def renewal_reason(material: TlsMaterial, hosts: Iterable[str], now: dt.datetime) -> str | None:
    """Why generated material must be renewed (expiring, hosts not covered, not issued by its
    CA, unreadable), or None when it is good."""
    try:
        cert = x509.load_pem_x509_certificate(material.cert)
        ca = x509.load_pem_x509_certificate(material.ca_cert)
        serialization.load_pem_private_key(material.key, password=None)
    except ValueError:
        return "unreadable"
    if cert.not_valid_after_utc - RENEW_BEFORE <= now:
        return f"expires {cert.not_valid_after_utc:%Y-%m-%d}"
    if not ca_fresh(material, now):
        return f"its CA expires {ca.not_valid_after_utc:%Y-%m-%d}"
    if cert.issuer != ca.subject:
        return "not issued by its CA"
    missing = sorted(set(wanted_hosts(hosts)) - _san(cert))
    if missing:
        return f"does not cover {', '.join(missing)}"
    return None


def unusable_reason(material: TlsMaterial, hosts: Iterable[str], now: dt.datetime) -> str | None:
    """Why the API server would refuse to call a webhook serving this material (expired,
    not yet valid, hosts not covered, unreadable), or None. For material the operator did not
    make and cannot renew (no CA key), where only a person can fix it."""
    try:
        cert = x509.load_pem_x509_certificate(material.cert)
    except ValueError:
        return "its certificate is unreadable"
    if cert.not_valid_after_utc <= now:
        return f"its certificate expired {cert.not_valid_after_utc:%Y-%m-%d}"
    if cert.not_valid_before_utc > now:
        return f"its certificate is valid only from {cert.not_valid_before_utc:%Y-%m-%d}"
    # The API server dials one name (the Service's <svc>.<ns>.svc, or the URL's host), and a
    # certificate made elsewhere (cert-manager's) covers only some of the names ours would.
    names = sorted(set(hosts) - set(LOCAL_HOSTS))
    if names and not set(names) & _san(cert):
        return f"its certificate covers none of {', '.join(names)}"
    return None


def write_files(directory: Path, material: TlsMaterial, with_ca_key: bool = False) -> ServingCert:
    """The material as files kopf's server reads (`ca.key` only when asked: a directory
    holding it is one `ensure_serving_cert` may renew)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = ServingCert(directory / CA_CERT, directory / TLS_CERT, directory / TLS_KEY)
    if with_ca_key and material.ca_key is not None:
        _write(directory / CA_KEY, material.ca_key, private=True)
    _write(paths.ca, material.ca_cert)
    _write(paths.key, material.key, private=True)
    _write(paths.cert, material.cert)
    return paths


def ensure_serving_cert(
    directory: Path, hosts: Iterable[str], now: dt.datetime | None = None
) -> ServingCert:
    """The serving certificate in `directory`, generated (or renewed) when needed.

    `hosts` are IP addresses and DNS names the certificate must cover, e.g. 127.0.0.1 and
    the Service name `vramgate-webhook.vramgate.svc`.
    """
    now = now or dt.datetime.now(dt.UTC)
    paths = ServingCert(directory / CA_CERT, directory / TLS_CERT, directory / TLS_KEY)
    present = all(p.exists() for p in (paths.ca, paths.cert, paths.key))
    generated = (directory / CA_KEY).exists()
    if present and not generated:
        return paths
    current = None
    if present:
        current = TlsMaterial(
            paths.ca.read_bytes(),
            paths.cert.read_bytes(),
            paths.key.read_bytes(),
            (directory / CA_KEY).read_bytes(),
        )
        if renewal_reason(current, hosts, now) is None:
            return paths
    return write_files(directory, generate(hosts, now, ca=current), with_ca_key=True)


def covered_hosts(cert_path: Path) -> set[str]:
    """The IP addresses and DNS names a certificate's subjectAltName covers."""
    return _san(x509.load_pem_x509_certificate(cert_path.read_bytes()))


def _san(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} | set(
        san.get_values_for_type(x509.DNSName)
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _make_ca(now: dt.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("vramgate-webhook-ca")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _make_serving(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    hosts: list[str],
    now: dt.datetime,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    dns = [h for h in hosts if not _is_ip(h)]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(dns[0] if dns else hosts[0]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """Write atomically: kopf's server reloads the files when they change, and must never
    read a half-written certificate."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o600 if private else 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
