"""TLS for the client listener, the inter-broker links and the tools: proton's SSL layer (OpenSSL) on the transport.

Three pieces, each usable alone:

- `check_files` reads the certificate, key and CA files with Python's `ssl` module before anything starts, so a
  wrong path, a key that does not match its certificate or an expired certificate is a precise message at start-up
  (exit 2) rather than a vague "SSL failure" from proton later;
- `server_domain` / `client_domain` build proton `SSLDomain`s: the broker's listener (TLS only, or TLS and plain on
  one port), and the client side used by a backup towards its primary and by `ha-admin`/`ha-status`;
- `explain` turns OpenSSL's error text into the reason an operator can act on (wrong CA, expired, no client
  certificate, a plain client on a TLS-only port); both sides log it.

Peer checks: a client (a backup, a tool) verifies the server's certificate against `--ssl-ca` *and* its host name
(`VERIFY_PEER_NAME`: the name or IP address it connected to must be in the certificate's subjectAltName, or be its
common name), unless hostname checking is turned off, then only the chain is checked (`VERIFY_PEER`). The listener
verifies a client's certificate chain when `--ssl-require-client-cert` is set; it cannot check a client's host name
(the client has none to offer), so any certificate signed by `--ssl-ca` is accepted.
"""

from __future__ import annotations

import re
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from proton import SSLDomain, SSLException

if TYPE_CHECKING:
    from broker.config import BrokerConfig


class TlsError(Exception):
    """A TLS setting cannot be used; the message names the flag and says why."""


@dataclass(frozen=True, slots=True)
class ServerTls:
    """The listener's TLS settings (broker flags `--ssl-*`)."""

    cert: Path
    key: Path
    ca: Path | None = None
    require_client_cert: bool = False
    allow_plain: bool = False
    verify_hostname: bool = True
    key_password: str | None = None  # the passphrase of an encrypted key (--ssl-key-password-file)

    @property
    def mode(self) -> str:
        """`only`: plain connections are refused; `optional`: TLS or plain on the same port."""
        return "optional" if self.allow_plain else "only"


@dataclass(frozen=True, slots=True)
class ClientTls:
    """What a connecting side needs: the CA that signs the server's certificate, optionally its own certificate."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None
    verify_hostname: bool = True
    key_password: str | None = None


def from_config(cfg: BrokerConfig) -> ServerTls | None:
    """Raises TlsError if the key's password file cannot be read (`config_problems` says so before the start)."""
    if cfg.ssl_cert is None or cfg.ssl_key is None:
        return None
    password = read_password(cfg.ssl_key_password_file) if cfg.ssl_key_password_file is not None else None
    return ServerTls(cfg.ssl_cert, cfg.ssl_key, cfg.ssl_ca, cfg.ssl_require_client_cert, cfg.ssl_allow_plain,
                     cfg.ssl_verify_hostname, password)


def read_password(path: Path) -> str:
    """The first line of a password file (TlsError if it cannot be read or is empty)."""
    flag = "--ssl-key-password-file"
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise TlsError(f"{flag} {path}: {getattr(e, 'strerror', None) or e}") from None
    line = text.splitlines()[0] if text else ""
    if not line:
        raise TlsError(f"{flag} {path}: the first line (the passphrase) is empty")
    return line


def config_problems(cfg: BrokerConfig) -> list[str]:
    """The broker's certificate files, checked before it starts (`ha-broker` exits 2 on any)."""
    password = None
    if cfg.ssl_key_password_file is not None:
        try:
            password = read_password(cfg.ssl_key_password_file)
        except TlsError as e:
            return [str(e)]
    return check_files(cfg.ssl_cert, cfg.ssl_key, cfg.ssl_ca, password=password)


# ----- start-up checks --------------------------------------------------------------------------------------------
def check_files(cert: Path | None, key: Path | None, ca: Path | None, *, prefix: str = "--ssl",
                now: float | None = None, password: str | None = None) -> list[str]:
    """Problems with the certificate files, one line each (empty: usable). `prefix` names the flags in messages."""
    problems: list[str] = []
    for flag, path in ((f"{prefix}-cert", cert), (f"{prefix}-key", key), (f"{prefix}-ca", ca)):
        if path is not None and not _readable(path):
            problems.append(f"{flag} {path}: {_why_unreadable(path)}")
    if problems:
        return problems
    if (cert is None) != (key is None):
        problems.append(f"{prefix}-cert and {prefix}-key go together")
        return problems
    if cert is not None and key is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            # A callable, never None: OpenSSL would prompt on the terminal for an encrypted key's passphrase
            ctx.load_cert_chain(str(cert), str(key), password=lambda: (password or "").encode())
        except ssl.SSLError as e:
            if _encrypted(key):  # OpenSSL says only "PEM lib": the file says why
                why = (f"the key is encrypted and {prefix}-key-password-file does not hold its passphrase"
                       if password is not None else
                       f"the key is encrypted: give its passphrase with {prefix}-key-password-file")
            else:
                why = _ssl_reason(e, "certificate")
            problems.append(f"{prefix}-cert {cert} / {prefix}-key {key}: {why}")
        else:
            expired = expiry_problem(cert, now)
            if expired:
                problems.append(f"{prefix}-cert {cert}: {expired}")
    if ca is not None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            ctx.load_verify_locations(cafile=str(ca))
        except ssl.SSLError as e:
            problems.append(f"{prefix}-ca {ca}: {_ssl_reason(e, 'CA')}")
    return problems


def _readable(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            f.read(1)
        return path.is_file()
    except OSError:
        return False


def _why_unreadable(path: Path) -> str:
    if not path.exists():
        return "no such file"
    if not path.is_file():
        return "not a file"
    try:
        open(path, "rb").close()
    except OSError as e:
        return e.strerror or str(e)
    return "cannot be read"


def _encrypted(key: Path) -> bool:
    """A PEM key file with an encrypted key (PKCS#8 or the traditional Proc-Type header)."""
    try:
        head = key.read_bytes()[:4096]
    except OSError:
        return False
    return b"BEGIN ENCRYPTED PRIVATE KEY" in head or b"Proc-Type: 4,ENCRYPTED" in head


def _ssl_reason(e: ssl.SSLError, what: str) -> str:
    reason = (e.reason or "").upper()
    if reason == "KEY_VALUES_MISMATCH":
        return "the key does not belong to the certificate"
    if reason == "NO_CERTIFICATE_OR_CRL_FOUND":
        return "no PEM certificate in the file"
    if "PEM" in str(e) or reason in ("NO_START_LINE", "BAD_BASE64_DECODE"):
        return f"not a PEM {what} and key"
    return f"cannot be loaded: {e.reason or e}"


def expiry_problem(cert: Path, now: float | None = None) -> str | None:
    """'expired on ...' / 'not valid before ...' for the first certificate in a PEM file, else None."""
    dates = cert_dates(cert)
    if dates is None:
        return None
    not_before, not_after = dates
    t = time.time() if now is None else now
    if t > not_after:
        return f"the certificate expired on {_utc(not_after)}"
    if t < not_before:
        return f"the certificate is not valid before {_utc(not_before)}"
    return None


def cert_dates(cert: Path) -> tuple[float, float] | None:
    """(notBefore, notAfter) as Unix seconds, or None when the file cannot be decoded here."""
    info = cert_info(cert)
    if info is None:
        return None
    try:
        return ssl.cert_time_to_seconds(info["notBefore"]), ssl.cert_time_to_seconds(info["notAfter"])
    except (KeyError, ValueError):
        return None


def cert_subject(cert: Path) -> str:
    info = cert_info(cert) or {}
    parts = [f"{_SHORT.get(k, k)}={v}" for rdn in info.get("subject", ()) for (k, v) in rdn]
    return ",".join(parts)


_SHORT = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
          "localityName": "L", "stateOrProvinceName": "ST"}


def cert_info(cert: Path) -> dict[str, Any] | None:
    # The standard library decodes a PEM certificate only through this helper (no `cryptography` here); without
    # it the dates are simply not checked at start-up (the peers still refuse an expired certificate).
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return None
    try:
        info = decode(str(cert))
    except (ssl.SSLError, OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


# ----- proton domains ---------------------------------------------------------------------------------------------
def server_domain(s: ServerTls) -> SSLDomain:
    d = SSLDomain(SSLDomain.MODE_SERVER)
    try:
        d.set_credentials(str(s.cert), str(s.key), s.key_password)
        if s.ca is not None:
            d.set_trusted_ca_db(str(s.ca))
        if s.require_client_cert:
            d.set_peer_authentication(SSLDomain.VERIFY_PEER, str(s.ca))
        else:
            d.set_peer_authentication(SSLDomain.ANONYMOUS_PEER)
        if s.allow_plain:  # proton's server transport tells TLS from plain itself; TLS-only is the engine's check
            d.allow_unsecured_client()
    except SSLException as e:
        raise TlsError(f"--ssl-cert {s.cert}: proton refused the TLS settings ({e})") from None
    return d


def client_domain(c: ClientTls, prefix: str = "--ssl") -> SSLDomain:
    d = SSLDomain(SSLDomain.MODE_CLIENT)
    try:
        if c.cert is not None and c.key is not None:
            d.set_credentials(str(c.cert), str(c.key), c.key_password)
        d.set_trusted_ca_db(str(c.ca))
        d.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME if c.verify_hostname else SSLDomain.VERIFY_PEER,
                                  str(c.ca))
    except SSLException as e:
        raise TlsError(f"{prefix}-ca {c.ca}: proton refused the TLS settings ({e})") from None
    return d


def domains(s: ServerTls) -> tuple[SSLDomain, SSLDomain | None]:
    """The listener's domain, and the one this broker connects to the others with (None without a CA)."""
    c = client_of(s)
    return server_domain(s), (client_domain(c) if c is not None else None)


def client_of(s: ServerTls) -> ClientTls | None:
    """How this broker connects to another (a backup to its primary): the same CA, its own certificate (so that a
    primary requiring client certificates accepts it)."""
    if s.ca is None:
        return None
    return ClientTls(s.ca, s.cert, s.key, s.verify_hostname, s.key_password)


# ----- errors -----------------------------------------------------------------------------------------------------
_REASONS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p, re.IGNORECASE), r) for p, r in (
    (r"wrong version number|packet length too long|unknown protocol|http request|record layer failure"
     r"|unexpected eof|not a TLS handshake",
     "not a TLS handshake: a plain (non-TLS) connection on a TLS-only port"),
    (r"alert certificate expired", "the {peer} refused our certificate: it has expired"),
    (r"alert unknown ca", "the {peer} does not trust our certificate: it is not signed by a CA in its --ssl-ca"),
    (r"alert certificate required|alert handshake failure.*certificate",
     "the {peer} requires a client certificate and we sent none"),
    (r"alert bad certificate|alert certificate unknown|alert decrypt error",
     "the {peer} refused our certificate"),
    (r"peer did not return a certificate|certificate required",
     "no client certificate: this broker requires one (--ssl-require-client-cert)"),
    (r"certificate has expired|certificate is not yet valid",
     "the {peer}'s certificate has expired (or is not valid yet)"),
    (r"unable to get local issuer|self.signed certificate|unable to verify the first certificate"
     r"|unable to get issuer|certificate signature failure",
     "the {peer}'s certificate is not signed by a trusted CA (--ssl-ca)"),
    (r"hostname|host name|does not match|name mismatch|peer name",
     "the {peer}'s certificate does not name the host connected to (subjectAltName / CN)"),
    # proton keeps only OpenSSL's summary on the verifying side: wrong CA, expired and wrong name all read so
    # (the other side hears the precise alert).
    (r"certificate verify failed", "the {peer}'s certificate could not be verified: {verify}"),
))


_VERIFY = {
    "client": "not signed by a CA in --ssl-ca, or expired",
    "broker": "not signed by a CA in --ssl-ca, expired, or not naming the host connected to",
}


def explain(description: str | None, peer: str = "broker") -> str:
    """The reason behind an OpenSSL/proton TLS error text, in the words of the docs (docs/tls.md). `peer` is who
    the other side is: `client` (on the listener) or `broker` (a backup, a tool)."""
    text = description or ""
    for pattern, reason in _REASONS:
        if pattern.search(text):
            return reason.format(peer=peer, verify=_VERIFY.get(peer, _VERIFY["broker"]))
    return "TLS handshake failed"


def is_tls_failure(condition: str | None, description: str | None) -> bool:
    """proton reports a failed handshake as a framing error whose text starts 'SSL Failure' (so does the engine's
    TLS-only check, broker.engine)."""
    return condition == "amqp:connection:framing-error" and (description or "").startswith("SSL Failure")
