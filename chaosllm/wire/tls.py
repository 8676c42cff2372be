"""TLS for every server (``--tls``, ``--certfile/--keyfile``): google-genai's live client
always dials ``wss://``, so a local server must speak TLS to be reached by it.

`self_signed` creates a certificate for the loopback names (``localhost``, 127.0.0.1,
::1) and its key, in a directory of the caller's (the CLI names the files at start);
it needs the ``cryptography`` package (``pip install 'chaosllm[tls]'``), imported only
then. `server_context` loads a certificate and key for the servers; a client trusts the
certificate with `client_context` (or ``SSL_CERT_FILE=<certfile>``)."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from pathlib import Path

from chaosllm.errors import ConfigError

__all__ = ["client_context", "self_signed", "server_context"]


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A new self-signed certificate and key for the loopback names in `directory`
    (``chaosllm-cert.pem``, ``chaosllm-key.pem``, the key readable by its owner only)."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigError(
            "--tls creates a certificate with the cryptography package: "
            "pip install 'chaosllm[tls]' (or give --certfile and --keyfile)"
        ) from exc
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "chaosllm localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    certfile, keyfile = directory / "chaosllm-cert.pem", directory / "chaosllm-key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return certfile, keyfile


def server_context(certfile: Path, keyfile: Path) -> ssl.SSLContext:
    """A server's TLS context; `ConfigError` when the files cannot be loaded."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load --certfile {certfile} / --keyfile {keyfile}: {exc}"
        ) from exc
    context.set_alpn_protocols(["http/1.1"])
    return context


def client_context(certfile: Path) -> ssl.SSLContext:
    """A client's TLS context that trusts `certfile` (the server's certificate)."""
    return ssl.create_default_context(cafile=str(certfile))
