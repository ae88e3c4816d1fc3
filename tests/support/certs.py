"""Test certificates made with the `openssl` command: a CA, a server and a client certificate signed by it, a
certificate signed by another CA, an expired one. EC P-256 keys (fast to make)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

# proton's host-name check reads only DNS entries (and the CN), never IP entries: an address is named twice.
SERVER_SAN = "subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:127.0.0.1"


@dataclass(frozen=True)
class Certs:
    dir: Path
    ca: Path  # the CA everybody trusts
    server: Path  # signed by `ca`, names localhost and 127.0.0.1
    server_key: Path
    client: Path  # signed by `ca`, a client certificate (CN=client)
    client_key: Path
    other_ca: Path  # a CA nobody trusts
    other: Path  # signed by `other_ca`, names localhost and 127.0.0.1
    other_key: Path
    expired: Path  # signed by `ca`, names localhost and 127.0.0.1, expired yesterday
    expired_key: Path
    wrong_name: Path  # signed by `ca`, names only elsewhere.example
    wrong_name_key: Path
    server_key_encrypted: Path  # server.key encrypted with AES-256 ...
    key_password: Path  # ... and a file whose first line is its passphrase


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _ca(d: Path, name: str) -> None:
    _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem",
         "-days", "30", "-subj", f"/CN={name}", cwd=d)


def _signed(d: Path, name: str, ca: str, cn: str, san: str | None, days: int = 30) -> None:
    _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
         "-subj", f"/CN={cn}", cwd=d)
    args = ["x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", str(days)]
    if san is not None:
        (d / f"{name}.ext").write_text(san + "\n")
        args += ["-extfile", f"{name}.ext"]
    _run(*args, cwd=d)
    (d / f"{name}.key").chmod(0o600)


def make_certs(d: Path) -> Certs:
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca")
    _ca(d, "other-ca")
    _signed(d, "server", "ca", "localhost", SERVER_SAN)
    _signed(d, "client", "ca", "client", None)
    _signed(d, "other", "other-ca", "localhost", SERVER_SAN)
    _signed(d, "expired", "ca", "localhost", SERVER_SAN, days=-1)  # notAfter before notBefore: expired
    _signed(d, "wrong-name", "ca", "elsewhere.example", "subjectAltName=DNS:elsewhere.example")
    _run("pkey", "-in", "server.key", "-aes256", "-passout", "pass:s3cret phrase", "-out", "server-enc.key", cwd=d)
    (d / "key-password").write_text("s3cret phrase\n")
    p = d.joinpath
    return Certs(d, p("ca.pem"), p("server.pem"), p("server.key"), p("client.pem"), p("client.key"),
                 p("other-ca.pem"), p("other.pem"), p("other.key"), p("expired.pem"), p("expired.key"),
                 p("wrong-name.pem"), p("wrong-name.key"), p("server-enc.key"), p("key-password"))
