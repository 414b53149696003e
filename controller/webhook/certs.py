"""TLS for the admission webhook: a CA and a serving certificate, made with `cryptography`.

The API server calls webhooks over HTTPS only and checks the serving certificate against the
`caBundle` it was given. kopf can self-sign, but through oscrypto, which fails on current
OpenSSL; so vramgate makes its own. A directory that already holds a certificate someone else
issued (a mounted `kubernetes.io/tls` Secret, cert-manager) is used as it is.

Files use the Secret key names: `tls.crt`, `tls.key`, `ca.crt`; `ca.key` marks a directory
vramgate generated itself, which it renews when the certificate no longer covers the
requested hosts or is about to expire.
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
VALIDITY = dt.timedelta(days=365)
#: Renew a generated certificate this long before it expires, so that a restart renews it.
RENEW_BEFORE = dt.timedelta(days=30)
LOCAL_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class ServingCert:
    """Paths of the CA certificate (the webhook's caBundle) and the serving key pair."""

    ca: Path
    cert: Path
    key: Path


def ensure_serving_cert(
    directory: Path, hosts: Iterable[str], now: dt.datetime | None = None
) -> ServingCert:
    """The serving certificate in `directory`, generated (or renewed) when needed.

    `hosts` are IP addresses and DNS names the certificate must cover, e.g. 127.0.0.1 and
    the Service name `vramgate-webhook.vramgate.svc`.
    """
    now = now or dt.datetime.now(dt.UTC)
    wanted = sorted(set(hosts) | set(LOCAL_HOSTS))
    paths = ServingCert(directory / CA_CERT, directory / TLS_CERT, directory / TLS_KEY)
    present = all(p.exists() for p in (paths.ca, paths.cert, paths.key))
    generated = (directory / CA_KEY).exists()
    if present and (not generated or _still_good(paths.cert, wanted, now)):
        return paths
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _make_ca(now)
    key, cert = _make_serving(ca_key, ca_cert, wanted, now)
    _write(directory / CA_KEY, _key_pem(ca_key), private=True)
    _write(paths.ca, ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(paths.key, _key_pem(key), private=True)
    _write(paths.cert, cert.public_bytes(serialization.Encoding.PEM))
    return paths


def covered_hosts(cert_path: Path) -> set[str]:
    """The IP addresses and DNS names a certificate's subjectAltName covers."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} | set(
        san.get_values_for_type(x509.DNSName)
    )


def _still_good(cert_path: Path, wanted: list[str], now: dt.datetime) -> bool:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    fresh = cert.not_valid_after_utc - RENEW_BEFORE > now
    return fresh and set(wanted) <= covered_hosts(cert_path)


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
        .not_valid_after(now + VALIDITY)
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
